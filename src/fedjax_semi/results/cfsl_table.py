"""CFSL's scenario table (the paper's Figs. 4-11 as numbers): every scenario and baseline with
mean / min / max test accuracy over workers, labeling accuracy, coverage and average energy, mean
± std over seeds, the energy saving against HFSL (paired by seed) beside the paper's, and the
claims of its Sec. VII checked on the runs.

Runs are the directories `ROOT/<setting>/seed_<s>/` that `fedjax-semi ... replicas=R
out_dir=ROOT/<setting>` writes (or `ROOT/<setting>/` for one seed), or any other run directories
under ROOT (a multirun's sweep dir), named by their run_config.json (:func:`setting_of`). A
setting's name is its label in the table: the eight scenarios `bmspgs` ... `emstrr`, and the
baselines `hfsl_sp`, `hfsl_st` (HFSL timed by Eq. 5 or Eq. 25), `cfl_gs` (labeled-only CFL,
greedy) and `bmspgs_random` (CFL + SSL with random selection). A second table gives the
mechanism: clusters, stopped clusters and training workers at the last round, and the first
round a cluster stopped. Accuracies are the mean of the last `--last` evaluations; energy is
the mean over rounds of E_r (Eq. 16, cloud uplinks included), the paper's "averaged energy".

    python -m fedjax_semi.results.cfsl_table ROOT [--last 3] [--out table.md] [--plot fig.png]
        [--per-run]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedjax_semi.algorithms.cfsl_config import SCENARIOS
from fedjax_semi.results.report import mean_std

SCENARIO_ORDER = (
    "bmspgs", "bmsprr", "bmstgs", "bmstrr", "emspgs", "emsprr", "emstgs", "emstrr",
    "bmspgs_random", "cfl_gs", "hfsl_sp", "hfsl_st",
)  # fmt: skip
# The paper's energy savings against HFSL (Fig. 10(a), FEMNIST, phi = 0.7, split-based timing).
PAPER_SAVING = {"bmspgs": 56.01, "bmsprr": 50.27, "emspgs": 47.22, "emsprr": 36.67}
ACC_KEYS = ("accuracy", "min_acc", "max_acc", "labeling_acc", "coverage")
# The mechanism at the last round: cluster slots in use, stopped clusters, workers that trained.
MECHANISM_KEYS = ("num_clusters", "num_stopped", "selected")


def baseline_of(setting: str) -> str:
    """The HFSL run a setting's energy saving is paired with: same prediction timing."""
    return "hfsl_st" if setting[2:4] == "st" else "hfsl_sp"


# Each axis value's two letters in a scenario's name (bmspgs: best, split, greedy).
_CODE = {v: name[2 * i : 2 * i + 2] for name, axes in SCENARIOS.items() for i, v in enumerate(axes)}


def setting_of(alg: dict) -> str:
    """The table label of a run's algorithm config (run_config.json's "algorithm"): the scenario
    with its axes overridden (HFSL: `hfsl_<timing>`, labeled-only CFL: `cfl_<selection>`, random
    selection: `<scenario>_random`)."""
    model, time, selection = SCENARIOS[alg["scenario"]]
    model = _CODE[alg.get("prediction_model") or model]
    time = alg.get("prediction_time") or time
    selection = alg.get("selection") or selection
    code = _CODE.get(selection, selection)
    if not alg.get("clustering", True):
        return "hfsl_" + _CODE.get(time, time)
    if time == "none":
        return "cfl_" + code
    if selection == "random":
        return f"{model}{_CODE[time]}gs_random"
    return model + _CODE[time] + code


def seed_dirs(root: Path, per_run: bool = False) -> dict[str, dict[int, Path]]:
    """setting -> {seed: run dir} for every run under root with a metrics.jsonl; `per_run`:
    every run its own row, named by its directory (a tuning sweep's trials)."""
    out: dict[str, dict[int, Path]] = {}
    for m in sorted(Path(root).glob("*/**/metrics.jsonl")):
        d = m.parent
        if per_run:
            out[str(d.relative_to(root))] = {0: d}
            continue
        setting = d.relative_to(root).parts[0]
        cfg = (
            json.loads((d / "run_config.json").read_text())
            if (d / "run_config.json").exists()
            else {}
        )
        if setting not in SCENARIO_ORDER and "algorithm" in cfg:
            setting = setting_of(cfg["algorithm"])
        seed = int(d.name[5:]) if d.name.startswith("seed_") else int(cfg.get("seed", 0))
        out.setdefault(setting, {})[seed] = d
    return out


def run_stats(run: Path, last: int) -> dict:
    """One run: the mean of the last `last` evaluations of ACC_KEYS, the average energy per
    round, and the per-round curves (round, accuracy) and (round, cumulative avg energy)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "accuracy" in r]
    out = {}
    for k in ACC_KEYS:
        vals = [r[k] for r in evals[-last:] if r.get(k) is not None and np.isfinite(r[k])]
        out[k] = float(np.mean(vals)) if vals else float("nan")  # NaN: nothing accepted
    out["avg_energy"] = float(np.mean([r["round_energy"] for r in rows]))
    for k in MECHANISM_KEYS:
        out[k] = float(rows[-1].get(k, np.nan))
    out["last_round"] = float(rows[-1]["round"])
    stops = [r["round"] for r in rows if r.get("num_stopped", 0) > 0]
    out["first_stop"] = float(stops[0]) if stops else float("nan")
    out["acc_curve"] = [(r["round"], r["accuracy"]) for r in evals]
    out["energy_curve"] = [(r["round"], r["avg_energy"]) for r in rows]
    return out


def collect(root: Path, last: int, per_run: bool = False) -> dict[str, dict[int, dict]]:
    return {
        s: {seed: run_stats(d, last) for seed, d in seeds.items()}
        for s, seeds in seed_dirs(root, per_run).items()
    }


def _cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    vals = [v for v in values if np.isfinite(v)]
    if not vals:
        return "–"
    mu, sd = mean_std(vals)
    return f"{scale * mu:.{digits}f} ± {scale * sd:.{digits}f}"


def savings(stats: dict[str, dict[int, dict]], setting: str) -> list[float]:
    """Per seed, 100 (E_base - E) / E_base against the HFSL run of the same seed and timing."""
    base = stats.get(baseline_of(setting), {})
    return [
        100 * (base[s]["avg_energy"] - r["avg_energy"]) / base[s]["avg_energy"]
        for s, r in stats[setting].items()
        if s in base
    ]


def table(stats: dict[str, dict[int, dict]]) -> str:
    header = (
        "| setting | seeds | mean acc (%) | min acc (%) | max acc (%) | labeling acc (%) | "
        "coverage (%) | avg energy (J / round) | saving vs HFSL (%) | paper saving (%) |"
    )
    lines = [header, "|" + "---|" * 10]
    order = [s for s in SCENARIO_ORDER if s in stats] + sorted(set(stats) - set(SCENARIO_ORDER))
    for s in order:
        rs = list(stats[s].values())
        cells = [s, str(len(rs))]
        cells += [_cell([r[k] for r in rs]) for k in ACC_KEYS]
        cells.append(_cell([r["avg_energy"] for r in rs], scale=1.0, digits=0))
        sv = savings(stats, s) if not s.startswith("hfsl") else []
        cells.append(_cell(sv, scale=1.0) if sv else "–")
        cells.append(f"{PAPER_SAVING[s]:.2f}" if s in PAPER_SAVING else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mechanism_table(stats: dict[str, dict[int, dict]]) -> str:
    """Clusters, stopped clusters and training workers at the last round, the last round and
    the first round with a stopped cluster (mean ± std over seeds; `never` when none stopped)."""
    lines = [
        "| setting | seeds | last round | clusters | stopped clusters | workers training | "
        "first stop (round) |",
        "|" + "---|" * 7,
    ]
    order = [s for s in SCENARIO_ORDER if s in stats] + sorted(set(stats) - set(SCENARIO_ORDER))
    for s in order:
        rs = list(stats[s].values())
        cells = [s, str(len(rs)), _cell([r["last_round"] for r in rs], 1.0, 0)]
        cells += [_cell([r[k] for r in rs], 1.0, 1) for k in MECHANISM_KEYS]
        firsts = [r["first_stop"] for r in rs]
        never = sum(not np.isfinite(f) for f in firsts)
        cell = _cell(firsts, 1.0, 1)
        cells.append(cell if not never else f"{cell} (never in {never})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean(stats, setting: str, key: str) -> float:
    vals = [r[key] for r in stats[setting].values() if np.isfinite(r[key])]
    return float(np.mean(vals)) if vals else float("nan")


def claims(stats: dict[str, dict[int, dict]]) -> list[str]:
    """The paper's orderings (Sec. VII), each stated as holding or not on these runs (means
    over seeds; the energy saving ordering on the paired per-seed savings)."""
    out = []
    scen = [s for s in SCENARIO_ORDER[:8] if s in stats]
    for key, what in (("accuracy", "mean test accuracy"), ("labeling_acc", "labeling accuracy")):
        for s in scen:
            b = baseline_of(s)
            if b in stats:
                a, h = _mean(stats, s, key), _mean(stats, b, key)
                if not np.isfinite(h):  # HFSL never labeled: nothing to compare
                    out.append(f"{s} above {b} in {what}: n/a ({b} accepted no pseudo-label)")
                    continue
                out.append(f"{s} above {b} in {what}: {'yes' if a > h else 'NO'} "
                           f"({100 * a:.1f} vs {100 * h:.1f})")  # fmt: skip
    if {"bmspgs", "cfl_gs"} <= set(stats):
        a, b = _mean(stats, "bmspgs", "accuracy"), _mean(stats, "cfl_gs", "accuracy")
        out.append(f"SSL (bmspgs) above labeled-only CFL (cfl_gs): {'yes' if a > b else 'NO'} "
                   f"({100 * a:.1f} vs {100 * b:.1f})")  # fmt: skip
    if {"bmspgs", "bmspgs_random"} <= set(stats):
        g, r = stats["bmspgs"], stats["bmspgs_random"]
        seeds = sorted(set(g) & set(r))  # paired: the same devices and fading per seed
        below = [
            100 * (r[s]["avg_energy"] - g[s]["avg_energy"]) / r[s]["avg_energy"] for s in seeds
        ]
        if below:
            d = float(np.mean(below))
            out.append(f"greedy below random selection in energy (bmspgs vs bmspgs_random): "
                       f"{'yes' if d > 0 else 'NO'} ({d:.2f}% less, paired over "
                       f"{len(seeds)} seeds)")  # fmt: skip
    sv = {s: float(np.mean(v)) for s in PAPER_SAVING if s in stats and (v := savings(stats, s))}
    pairs = (("bmspgs", "emspgs", "BM > EM"), ("bmsprr", "emsprr", "BM > EM"),
             ("bmspgs", "bmsprr", "greedy > RR"), ("emspgs", "emsprr", "greedy > RR"))  # fmt: skip
    for a, b, what in pairs:
        if a in sv and b in sv:
            out.append(f"energy saving {what} ({a} vs {b}): {'yes' if sv[a] > sv[b] else 'NO'} "
                       f"({sv[a]:.2f}% vs {sv[b]:.2f}%)")  # fmt: skip
    return out


def paired(a: dict[int, dict], b: dict[int, dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per seed both runs have: a - b in mean test accuracy (points) and a's energy relative to
    b's (%), the same devices and fading per seed."""
    seeds = sorted(set(a) & set(b))
    acc = np.array([100 * (a[s]["accuracy"] - b[s]["accuracy"]) for s in seeds])
    energy = np.array([100 * (a[s]["avg_energy"] / b[s]["avg_energy"] - 1) for s in seeds])
    return acc, energy


def paired_line(name_a: str, a: dict[int, dict], name_b: str, b: dict[int, dict]) -> str:
    acc, energy = paired(a, b)
    sd = lambda v: float(v.std(ddof=1)) if len(v) > 1 else 0.0  # noqa: E731
    return (f"paired {name_a} - {name_b} over {len(acc)} seeds: accuracy {acc.mean():+.1f} ± "
            f"{sd(acc):.1f} points ({int((acc > 0).sum())} above), energy {energy.mean():+.1f} ± "
            f"{sd(energy):.1f}% ({int((energy < 0).sum())} lower)")  # fmt: skip


def plot(stats: dict[str, dict[int, dict]], path: Path) -> None:
    """Mean test accuracy and average energy over rounds, mean over seeds, per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for s in [s for s in SCENARIO_ORDER if s in stats]:
        runs = list(stats[s].values())
        style = "--" if s.startswith(("hfsl", "cfl", "bmspgs_")) else "-"
        for ax, key in ((ax1, "acc_curve"), (ax2, "energy_curve")):
            n = min(len(r[key]) for r in runs)
            x = [p[0] for p in runs[0][key][:n]]
            y = np.mean([[p[1] for p in r[key][:n]] for r in runs], axis=0)
            ax.plot(x, y, style, label=s)
    ax1.set(xlabel="round", ylabel="mean test accuracy over workers", title="accuracy")
    ax2.set(xlabel="round", ylabel="average energy per round (J)", title="energy (Eq. 16)")
    ax2.set_yscale("log")
    ax1.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m fedjax_semi.results.cfsl_table")
    ap.add_argument("root", type=Path, help="directory of <setting>/seed_<s>/ runs")
    ap.add_argument("--last", type=int, default=3, help="evaluations averaged (default 3)")
    ap.add_argument("--out", type=Path, default=None, help="write the table (Markdown) here")
    ap.add_argument("--plot", type=Path, default=None, help="accuracy and energy over rounds")
    ap.add_argument(
        "--per-run", action="store_true", help="a row per run directory (a tuning sweep's trials)"
    )
    ap.add_argument(
        "--paired", action="append", default=[], metavar="A=B",
        help="also A - B paired by seed; a side is a setting of root or DIR:setting",
    )  # fmt: skip
    args = ap.parse_args(argv)
    stats = collect(args.root, args.last, args.per_run)
    sides = {}
    for pair in args.paired:
        for side in pair.split("="):
            where, _, setting = side.rpartition(":")
            runs = collect(Path(where), args.last) if where else stats
            if "=" not in pair or setting not in runs:
                ap.error(f"--paired={pair!r}: {side!r} names no setting with runs")
            sides[side] = runs[setting]
    if not stats:
        raise SystemExit(f"root={str(args.root)!r} holds no run with a metrics.jsonl")
    text = (
        table(stats)
        + "\n\n"
        + mechanism_table(stats)
        + "\n\n"
        + "\n".join(f"- {c}" for c in claims(stats))
        + "\n"
        + "".join(
            f"- {paired_line(a, sides[a], b, sides[b])}\n"
            for a, b in (p.split("=") for p in args.paired)
        )
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.plot:
        plot(stats, args.plot)


if __name__ == "__main__":
    main()
