"""Ada-FedSemi's bandit at work: how often each P and C arm was played (Xu et al., Eqs. 17-18,
Fig. 10), per method, pooled over seeds and rounds.

    python -m fedjax_semi.results.ada_arms DIR      # DIR/ada_arms.md and DIR/ada_arms.png

A round counts until the run's first `done` row (the round that reached the target or spent a
budget; the rows after it repeat a frozen state), as in `fedjax-semi-ada-table`. Per method:
the share of rounds at each arm, the mean number of distinct P arms a seed played, and the
longest streak of one P arm (the bandit locking onto an arm shows as a streak near the run's
length). Fixed baselines show their one arm.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from fedjax_semi.results.ada_table import _groups, method_name, run_stats


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


def method_names(configs: list[dict]) -> list[str]:
    """Each run group's method name; groups of one method are told apart by the algorithm
    knobs whose values differ between them (e.g. "Ada-FedSemi (psi=1, q0=300)")."""
    names = [method_name(c) for c in configs]
    out = []
    for n, c in zip(names, configs, strict=True):
        same = [d.get("algorithm", {}) for m, d in zip(names, configs, strict=True) if m == n]
        if len(same) > 1:
            alg = c.get("algorithm", {})
            keys = sorted(k for k in alg if len({repr(a.get(k)) for a in same}) > 1)
            n += " (" + ", ".join(f"{k}={alg[k]:g}" if isinstance(alg[k], float) else
                                  f"{k}={alg[k]}" for k in keys) + ")"  # fmt: skip
        out.append(n)
    return out


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m fedjax_semi.results.ada_arms",
        description="Ada-FedSemi's P and C arms played, per method (DIR/ada_arms.md, .png).",
    )
    ap.add_argument("sweep_dir", type=Path, help="a multirun directory (or any folder of runs)")
    args = ap.parse_args(argv)
    try:
        print(arms(args.sweep_dir))  # a missing directory: _groups' one line
    except ValueError as e:
        print(f"ada_arms: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
