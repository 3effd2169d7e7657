"""Ada-FedSemi's bandit at work: how often each P and C arm was played (Xu et al., Eqs. 17-18,
Fig. 10), per method, pooled over seeds and rounds.

    python -m fedjax_semi.results.ada_arms DIR      # DIR/ada_arms.md and DIR/ada_arms.png
    python -m fedjax_semi.results.ada_arms DIR --by-phase   # DIR/ada_phases.md

A round counts until the run's first `done` row (the round that reached the target or spent a
budget; the rows after it repeat a frozen state), as in `fedjax-semi-ada-table`. Per method:
the share of rounds at each arm, the mean number of distinct P arms a seed played, and the
longest streak of one P arm (the bandit locking onto an arm shows as a streak near the run's
length). Fixed baselines show their one arm.

`--by-phase` splits each seed's rounds at the change of preference (Figs. 9-10: `phase` 0
before the switch, 1 after) and gives per method and phase the P arms played, the modal and
mean P, and the rounds, minutes and GB spent in the phase (the sums of `round_time_s` and
`round_traffic_gb`).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from fedjax_semi.results.ada_runs import _groups, method_names, run_rows, run_stats


def longest_streak(values: list[float]) -> int:
    """The longest run of equal consecutive values (0 for an empty list)."""
    best = run = 0
    for i, v in enumerate(values):
        run = run + 1 if i and v == values[i - 1] else 1
        best = max(best, run)
    return best


def arm_shares(values: list[float]) -> dict[float, float]:
    """Share of the entries at each value, in value order."""
    counts = Counter(round(float(v), 4) for v in values)
    total = sum(counts.values())
    return {a: counts[a] / total for a in sorted(counts)}


def method_arms(runs: list[dict]) -> dict:
    """One method's seeds: the P and C played each round, pooled, and per-seed statistics."""
    stats = [run_stats(r, [], np.inf, np.inf) for r in runs]
    p_all = [p for s in stats for p in s["P"]]
    c_all = [c for s in stats for c in s["C"]]
    return {
        "seeds": len(stats),
        "rounds": float(np.mean([len(s["P"]) for s in stats])),
        "P": arm_shares(p_all),
        "C": arm_shares(c_all),
        "distinct_p": float(np.mean([len(set(s["P"])) for s in stats])),
        "streak_p": float(np.mean([longest_streak(s["P"]) for s in stats])),
    }


def _shares_md(shares: dict[float, float]) -> str:
    return ", ".join(f"{a:g}: {100 * s:.0f}%" for a, s in shares.items())


def arms(root: Path, plot: bool = True) -> str:
    """The arm table as Markdown (root/ada_arms.md) and its bars (root/ada_arms.png)."""
    groups = _groups(root)
    names = method_names([runs[0]["config"] for _, runs in groups])
    table = [method_arms(runs) for _, runs in groups]
    lines = [
        "| method | seeds | rounds (mean) | P played (share of rounds) | C played | distinct P "
        "arms per seed | longest same-P streak |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, a in zip(names, table, strict=True):
        lines.append(
            f"| {n} | {a['seeds']} | {a['rounds']:.1f} | {_shares_md(a['P'])} | "
            f"{_shares_md(a['C'])} | {a['distinct_p']:.1f} | {a['streak_p']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    (Path(root) / "ada_arms.md").write_text(text)
    if plot:
        _bars(Path(root) / "ada_arms.png", names, table)
    return text


def _bars(path: Path, names: list[str], table: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, key in zip(axes, ("P", "C"), strict=True):
        arms_all = sorted({a for t in table for a in t[key]})
        width = 0.8 / max(1, len(names))
        for i, (n, t) in enumerate(zip(names, table, strict=True)):
            x = np.arange(len(arms_all)) + (i - (len(names) - 1) / 2) * width
            ax.bar(x, [100 * t[key].get(a, 0.0) for a in arms_all], width, label=n)
        ax.set_xticks(np.arange(len(arms_all)), [f"{a:g}" for a in arms_all], fontsize=7)
        ax.set_xlabel(f"{key} arm")
        ax.set_ylabel("share of rounds (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Arms played per round, pooled over seeds (Eqs. 17-18)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _seed_mean(seeds: list[list[dict]], key: str) -> float:
    """The mean over seeds of the sum of `key` over each seed's rows."""
    return float(np.mean([sum(r[key] for r in rows) for rows in seeds]))


def method_phases(runs: list[dict]) -> dict[int, dict]:
    """One method's seeds split by phase: {phase: the pooled P arms and per-seed rounds,
    minutes and GB spent in it, averaged over the seeds that reached the phase}."""
    per_seed: dict[int, list[list[dict]]] = {}
    for run in runs:
        rows = run_rows(run)
        for ph in sorted({int(r.get("phase", 0)) for r in rows}):
            per_seed.setdefault(ph, []).append([r for r in rows if int(r.get("phase", 0)) == ph])
    out = {}
    for ph, seeds in sorted(per_seed.items()):
        p_all = [r["P"] for rows in seeds for r in rows if "P" in r]
        shares = arm_shares(p_all)
        out[ph] = {
            "seeds": len(seeds),
            "rounds": float(np.mean([len(rows) for rows in seeds])),
            "P": shares,
            "modal_p": max(shares, key=shares.get) if shares else float("nan"),
            "mean_p": float(np.mean(p_all)) if p_all else float("nan"),
            "minutes": _seed_mean(seeds, "round_time_s") / 60,
            "gb": _seed_mean(seeds, "round_traffic_gb"),
        }
    return out


def phases(root: Path) -> str:
    """The per-phase table as Markdown (root/ada_phases.md)."""
    groups = _groups(root)
    names = method_names([runs[0]["config"] for _, runs in groups])
    lines = [
        "| method | phase | seeds | rounds (mean) | P played (share of rounds) | modal P | mean P "
        "| minutes in the phase | GB in the phase |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, (_, runs) in zip(names, groups, strict=True):
        for ph, a in method_phases(runs).items():
            lines.append(
                f"| {n} | {ph} | {a['seeds']} | {a['rounds']:.1f} | {_shares_md(a['P'])} | "
                f"{a['modal_p']:g} | {a['mean_p']:.2f} | {a['minutes']:.2f} | {a['gb']:.2f} |"
            )
    text = "\n".join(lines) + "\n"
    (Path(root) / "ada_phases.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fedjax_semi.results.ada_arms",
        description="Ada-FedSemi's P and C arms played, per method (DIR/ada_arms.md, .png).",
    )
    ap.add_argument("sweep_dir", type=Path, help="a multirun directory (or any folder of runs)")
    ap.add_argument(
        "--by-phase", action="store_true",
        help="split the rounds at the change of preference (DIR/ada_phases.md)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    try:  # a missing directory: _groups' one line
        print(phases(args.sweep_dir) if args.by_phase else arms(args.sweep_dir))
    except ValueError as e:
        print(f"ada_arms: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
