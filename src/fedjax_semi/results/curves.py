"""Curves of a sweep (`fedjax-semi-report DIR --plot M1,M2`): per metric one panel, per setting
the mean over seeds of the metric against the round, the simulated clock or the whole-model
transfers so far (`comm_cost`, UM-pFSSL's Table 3 trade-off), shaded ± its std over seeds
(ddof = 1, as the tables), written to DIR/curves.png with the plotted points in DIR/curves.csv.
A seed's curve is a step function (its last value at or before each x), so seeds evaluated at
different clocks are averaged where each stands, as in the TTAP plot."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from fedjax_semi.results.report import eval_rows
from fedjax_semi.results.sweep_runs import grouped_runs

# Each x is non-decreasing along a run (comm_cost is cumulative): a seed's curve is a step function.
X_AXES = {
    "round": "round",
    "sim_time": "simulated time (s)",
    "comm_cost": "whole-model transfers so far (comm_cost)",
}
CURVE_FIELDS = ("setting", "metric", "x", "mean", "std", "seeds")


def step_values(points: list[list[tuple[float, float]]]) -> tuple[np.ndarray, np.ndarray]:
    """The union grid of every curve's x [G] and each curve's last value at or before each grid
    point [S, G] (NaN before its first point). ``points``: per curve, its (x, value) pairs."""
    grid = np.unique([x for pts in points for x, _ in pts])
    out = np.full((len(points), len(grid)), np.nan)
    for i, pts in enumerate(points):
        # by x alone, stably: where x repeats (Local's comm_cost stays 0) the later round wins
        xs, vs = np.array(sorted(pts, key=lambda p: p[0]), dtype=float).reshape(-1, 2).T
        pos = np.searchsorted(xs, grid, side="right") - 1
        out[i] = np.where(pos >= 0, vs[np.maximum(pos, 0)], np.nan)
    return grid, out


def _short(labels: list[str]) -> dict[str, str]:
    """Legend labels: a setting's `key=default` tokens dropped where that keeps them apart."""
    short = {lab: " ".join(t for t in lab.split() if not t.endswith("=default")) for lab in labels}
    if len(set(short.values())) < len(labels):
        return {lab: lab for lab in labels}
    return {lab: s or lab for lab, s in short.items()}


def curve_rows(root: Path, metrics: list[str], x: str = "round") -> list[dict]:
    """The plotted points: per setting, metric and x, the mean and std over the seeds that have
    reached x (std NaN with one seed). A setting that logs a metric but not x (most methods
    count no `comm_cost`) is left out of that panel with a warning on stderr."""
    if x not in X_AXES:
        raise ValueError(f"--plot-x={x!r} is not allowed: one of {', '.join(X_AXES)}")
    out = []
    for label, runs in grouped_runs(root).items():
        rows = [eval_rows(r["dir"]) for r in runs]
        for m in metrics:
            pts = [[(r[x], r[m]) for r in rs if r.get(m) is not None and x in r] for rs in rows]
            pts = [p for p in pts if p]
            if not pts:
                if any(r.get(m) is not None for rs in rows for r in rs):
                    print(f"fedjax-semi-report: warning: --plot {m}: {label} logs no {x}, "
                          "left out", file=sys.stderr)  # fmt: skip
                continue
            grid, vals = step_values(pts)
            for g, col in zip(grid, vals.T, strict=True):
                col = col[~np.isnan(col)]
                std = float(np.std(col, ddof=1)) if len(col) > 1 else float("nan")
                out.append(
                    {"setting": label, "metric": m, "x": float(g), "mean": float(np.mean(col)),
                     "std": std, "seeds": len(col)}
                )  # fmt: skip
    missing = [m for m in metrics if not any(r["metric"] == m for r in out)]
    if missing:
        raise ValueError(
            f"--plot={','.join(metrics)!r} is not allowed: no run under {str(root)!r} logs "
            f"{', '.join(missing)} against {x}"
        )
    return out


def plot(root: Path, metrics: list[str], x: str = "round") -> tuple[Path, Path]:
    """DIR/curves.csv and DIR/curves.png (one panel per metric, one curve per setting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = curve_rows(root, metrics, x)
    root = Path(root)
    csv_path, png_path = root / "curves.csv", root / "curves.png"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CURVE_FIELDS)
        w.writeheader()
        w.writerows(rows)
    labels = list(dict.fromkeys(r["setting"] for r in rows))
    legend = _short(labels)
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.2), squeeze=False)
    for ax, m in zip(axes.flat, metrics, strict=True):
        for i, lab in enumerate(labels):
            mine = [r for r in rows if r["setting"] == lab and r["metric"] == m]
            if not mine:
                continue
            g, mu, sd = (np.array([r[k] for r in mine]) for k in ("x", "mean", "std"))
            color = f"C{i % 10}"
            ax.plot(g, mu, drawstyle="steps-post", color=color, label=legend[lab])
            ax.fill_between(g, mu - sd, mu + sd, step="post", alpha=0.2, color=color)
        ax.set_xlabel(X_AXES[x])
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return csv_path, png_path
