"""The statistics, table and plot of `agreement.py` (numpy and matplotlib only: no jax, no torch).

The test: at a round, the engine's and PyTorch's mean accuracies over their seeds agree when
their difference is within two standard errors of a difference of two independent means,
2 sqrt(sd_e^2 / n_e + sd_t^2 / n_t), with sd the sample standard deviation (ddof 1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One comparison: engine and torch accuracies (fractions) at one round of one setting."""

    mean_e: float
    sd_e: float
    n_e: int
    mean_t: float
    sd_t: float
    n_t: int

    @property
    def diff(self) -> float:
        """Engine minus torch."""
        return self.mean_e - self.mean_t

    @property
    def se(self) -> float:
        """Standard error of the difference of the two means."""
        return math.sqrt(self.sd_e**2 / self.n_e + self.sd_t**2 / self.n_t)

    @property
    def agree(self) -> bool:
        return abs(self.diff) <= 2 * self.se


def agreement(engine: Sequence[float], torch: Sequence[float]) -> Agreement:
    """The comparison of two samples of accuracies (one per seed); each needs 2 seeds or more."""
    e, t = np.asarray(engine, np.float64), np.asarray(torch, np.float64)
    for name, a in (("engine", e), ("torch", t)):
        if a.ndim != 1 or len(a) < 2 or not np.isfinite(a).all():
            raise ValueError(f"{name} accuracies={a.tolist()}: need 2 or more finite values")
    return Agreement(
        float(e.mean()), float(e.std(ddof=1)), len(e), float(t.mean()), float(t.std(ddof=1)), len(t)
    )


def at_round(curve: dict, t: int) -> list[float]:
    """Per-seed accuracies at round t of a curve record {"rounds": [...], "acc": [[...]]}."""
    if t not in curve["rounds"]:
        raise ValueError(f"round {t} was not evaluated; evaluated rounds: {curve['rounds']}")
    i = curve["rounds"].index(t)
    return [row[i] for row in curve["acc"]]


def window_mean(curve: dict, lo: int, hi: int) -> list[float]:
    """Per-seed mean accuracy over the evaluated rounds in [lo, hi] of a curve record: less
    of the round-to-round swing of SGD than one round's accuracy."""
    cols = [i for i, t in enumerate(curve["rounds"]) if lo <= t <= hi]
    if not cols:
        raise ValueError(f"no evaluated round in [{lo}, {hi}]; evaluated rounds: {curve['rounds']}")
    return [float(np.mean([row[i] for i in cols])) for row in curve["acc"]]


def table(
    curves: dict[str, dict[str, dict]],
    rounds: Sequence[int],
    windows: Sequence[tuple[int, int]] = (),
) -> tuple[list[str], bool]:
    """Markdown rows (header first) of every setting x round (then x window: the per-seed mean
    over rounds lo..hi, shown as "lo-hi"), and whether all agree.
    curves: setting -> {"engine": curve, "torch": curve}. Accuracies are shown in percent."""
    lines = [
        "| setting | round | engine (mean ± sd) | torch (mean ± sd) | engine − torch | 2 SE "
        "| verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    every = True
    for name, sides in curves.items():
        e, t = sides["engine"], sides["torch"]
        cases = [(str(r), at_round(e, r), at_round(t, r)) for r in rounds]
        cases += [
            (f"{lo}-{hi}", window_mean(e, lo, hi), window_mean(t, lo, hi)) for lo, hi in windows
        ]
        for label, acc_e, acc_t in cases:
            a = agreement(acc_e, acc_t)
            every &= a.agree
            lines.append(
                f"| {name} | {label} | {100 * a.mean_e:.2f} ± {100 * a.sd_e:.2f} | "
                f"{100 * a.mean_t:.2f} ± {100 * a.sd_t:.2f} | {100 * a.diff:+.2f} | "
                f"{200 * a.se:.2f} | {'agree' if a.agree else 'DISAGREE'} |"
            )
    return lines, every


def plot(curves: dict[str, dict[str, dict]], path: Path, zoom_from: int = 20) -> None:
    """One column per setting: each side's mean accuracy over seeds, shaded ± one sd; the top
    row every evaluated round, the bottom row rounds >= zoom_from on their own scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(curves)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 6.4), squeeze=False)
    for col, (name, sides) in enumerate(curves.items()):
        for row, lo in enumerate((0, zoom_from)):
            ax = axes[row, col]
            for side, color in (("engine", "tab:blue"), ("torch", "tab:orange")):
                c = sides[side]
                keep = np.asarray(c["rounds"]) >= lo
                rounds = np.asarray(c["rounds"])[keep]
                acc = 100 * np.asarray(c["acc"])[:, keep]
                mean, sd = acc.mean(0), acc.std(0, ddof=1)
                ax.plot(rounds, mean, color=color, label=f"{side} ({len(acc)} seeds)")
                ax.fill_between(rounds, mean - sd, mean + sd, color=color, alpha=0.25)
            ax.set_title(name if row == 0 else f"{name}, rounds {lo}+")
            ax.set_xlabel("round")
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
