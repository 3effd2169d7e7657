"""HeteroAda-FedSemi against Ada-FedSemi and Semi-HFL (Xu et al., Sec. 5.8): Fig. 17's mean
round time and waiting ratio (Eq. 34), Fig. 16's time to test-accuracy targets and the
speed-ups, from the runs of one directory (`fedjax-semi-ada-table hetero DIR`, e.g. a multirun
of hetero_ada_record).

Per run (one seed), over its rounds up to its first `done` (the round that spent the budget):
the mean `round_time_s`, the last `wait_ratio_cum` (Eq. 34 over the whole run), the simulated
minutes to the first round at test accuracy >= each target, the final and best test accuracy
and the traffic spent. Cells are mean ± std (sample std) over seeds. The speed-up to a target
is a baseline's time (Ada-FedSemi's, Semi-HFL's) over HeteroAda's, paired by seed (all meet
the same devices for a seed), over the seeds where both reached it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_semi.results.ada_runs import (
    TIME,
    TRAFFIC,
    _bad,
    _groups,
    _md,
    _ms,
    _reach_cell,
    method_names,
    run_rows,
    run_stats,
)

HETERO, ADA, SEMI_HFL = "HeteroAda-FedSemi", "Ada-FedSemi", "Semi-HFL"
# Fig. 17 (CIFAR-10, VGG-9 on TX2s): mean round time (s) and waiting ratio (%); Fig. 16: the
# time to target, the baseline's over HeteroAda's (CIFAR-10; 1.7 and 1.2 on STL-10).
PAPER = {
    HETERO: {"round_time_s": 45.0, "wait_ratio": 6.7},
    ADA: {"round_time_s": 67.0, "wait_ratio": 38.7},
    SEMI_HFL: {"round_time_s": 52.0, "wait_ratio": 10.4},
}
PAPER_SPEEDUP = {ADA: 1.5, SEMI_HFL: 1.3}


def seed_stats(run: dict, targets: list[float], time_budget: float) -> dict:
    """One seed's round time, waiting ratio, accuracies, traffic and times to the targets."""
    rows = run_rows(run)
    if any("round_time_s" not in r or "wait_ratio_cum" not in r for r in rows):
        raise ValueError(
            f"run {str(run['dir'])!r}: metrics.jsonl lacks round_time_s / wait_ratio_cum (the "
            "rows of ada_fedsemi and hetero_ada)"
        )
    evals = [r for r in rows if r.get("accuracy") is not None]
    base = run_stats(run, targets, time_budget, np.inf, rows)
    return {
        **base,
        "seed": run["seed"],
        "rounds": len(rows),
        "round_time_s": float(np.mean([r["round_time_s"] for r in rows])),
        "wait_ratio": float(rows[-1]["wait_ratio_cum"]),
        "final": 100 * float(evals[-1]["accuracy"]),
        "minutes": float(rows[-1][TIME]),
        "traffic": float(rows[-1][TRAFFIC]),
    }


def speedups(hetero: list[dict], base: list[dict], t: float) -> list[float]:
    """The baseline's time to target t over HeteroAda's, per seed both runs reached it."""
    base_by_seed = {s["seed"]: s for s in base}
    out = []
    for h in hetero:
        a = base_by_seed.get(h["seed"])
        if a is not None and h["reach"][t] is not None and a["reach"][t] is not None:
            out.append(a["reach"][t][0] / h["reach"][t][0])
    return out


def hetero(root: Path, targets: list[float], time_budget: float | None = None) -> str:
    """The Markdown table (rows: measures; columns: each method, the paper's numbers)."""
    if not targets:
        raise _bad("--targets", targets, "test accuracies (%) to time, e.g. 45,50,60")
    groups = _groups(root)
    names = method_names([runs[0]["config"] for _, runs in groups])
    budget = time_budget if time_budget is not None else np.inf
    stats = {n: [seed_stats(r, targets, budget) for r in runs] for n, (_, runs) in
             zip(names, groups, strict=True)}  # fmt: skip
    header = ["", *(f"{n} ({len(s)} seeds)" for n, s in stats.items()), "paper (CIFAR-10)"]

    def paper(key: str) -> str:
        return " / ".join(f"{PAPER[n][key]:g}" for n in stats if n in PAPER) or "-"

    def cells(key: str, digits: int | None = None) -> list[str]:
        return [_ms([s[key] for s in v], digits) for v in stats.values()]

    rows = [
        ["rounds", *cells("rounds", 1), "-"],
        ["simulated minutes", *cells("minutes"), "-"],
        ["mean round time (s)", *cells("round_time_s"), paper("round_time_s")],
        ["waiting ratio (%, Eq. 34)", *cells("wait_ratio"), paper("wait_ratio")],
        *([f"minutes to {t:g}%", *(_reach_cell(v, t, 0, budget) for v in stats.values()), "-"]
          for t in targets),
        ["final test accuracy (%)", *cells("final", 1), "-"],
        ["best test accuracy (%)", *cells("best", 1), "-"],
        ["traffic (GB)", *cells("traffic"), "-"],
    ]  # fmt: skip
    lines = _md(header, rows)
    for base in (b for b in PAPER_SPEEDUP if HETERO in stats and b in stats):
        lines += ["", f"Speed-up to a target ({base}'s minutes / HeteroAda's, paired by seed; "
                      f"the paper: {PAPER_SPEEDUP[base]:g}x on CIFAR-10):", ""]  # fmt: skip
        for t in targets:
            r = speedups(stats[HETERO], stats[base], t)
            faster = sum(x > 1 for x in r)
            text = f"{_ms(r, 2)}x, HeteroAda faster in {faster}/{len(r)} seeds" if r else "-"
            lines.append(f"* {t:g}%: {text}")
    return "\n".join(lines)
