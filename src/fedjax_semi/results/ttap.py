"""DoFed-SPP's Figure 3 from a sweep: accuracy against the simulated clock (time-to-accuracy
plot), one curve per method, mean over seeds shaded ± std (`fedjax-semi-report --ttap`)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedjax_semi.results.curves import step_values
from fedjax_semi.results.sweep_runs import _get, find_runs

TTAP_FIELDS = ("method", "dataset", "partition", "seed", "round", "clock", "cls_acc", "lab_acc")


def ttap_rows(root: Path) -> list[dict]:
    """One row per evaluated round of every run under root: the simulated clock against the
    classification (personal_acc) and labeling (pl_acc) accuracy, DoFed-SPP's Figure 3 data."""
    out = []
    for run in find_runs(root):
        cfg, path = run["config"], run["dir"] / "metrics.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            m = json.loads(line)
            if m.get("personal_acc") is None:
                continue
            out.append(
                {
                    "method": _get(cfg, "algorithm.name") or run["summary"].get("algorithm"),
                    "dataset": _get(cfg, "dataset.name"),
                    "partition": _get(cfg, "partition.scheme"),
                    "seed": _get(cfg, "seed"),
                    "round": m["round"],
                    "clock": m.get("sim_time"),
                    "cls_acc": m["personal_acc"],
                    "lab_acc": m.get("pl_acc"),
                }
            )
    return out


def ttap(root: Path, out_dir: Path | None = None) -> tuple[Path, Path]:
    """ttap.csv and ttap.png (one panel per dataset x partition, one curve per method: the mean
    over seeds of the last accuracy reached by each clock value, shaded ± its std over seeds)
    under out_dir (default root)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ttap_rows(root)
    if not rows or any(r["clock"] is None for r in rows):
        raise ValueError(
            f"sweep_dir={str(root)!r} has no run whose metrics.jsonl carries sim_time and "
            "personal_acc (the TTAP curve needs a simulated clock)"
        )
    out_dir = Path(out_dir or root)
    csv_path, png_path = out_dir / "ttap.csv", out_dir / "ttap.png"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TTAP_FIELDS)
        w.writeheader()
        w.writerows(rows)
    panels = sorted({(r["dataset"], r["partition"]) for r in rows}, key=str)
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, (ds, part) in zip(axes.flat, panels, strict=False):
        mine = [r for r in rows if (r["dataset"], r["partition"]) == (ds, part)]
        for method in sorted({r["method"] for r in mine}):
            curves = defaultdict(list)
            for r in mine:
                if r["method"] == method:
                    curves[r["seed"]].append((r["clock"], r["cls_acc"]))
            grid, acc = step_values(list(curves.values()))  # last value reached
            mean, std = np.nanmean(acc, axis=0), np.nanstd(acc, axis=0)
            line = ax.plot(grid, mean, drawstyle="steps-post", label=f"{method} ({len(acc)} seeds)")
            if len(acc) > 1:  # shaded: mean ± std over seeds
                ax.fill_between(
                    grid, mean - std, mean + std, step="post", alpha=0.2, color=line[0].get_color()
                )
        ax.set_title(f"{ds} {part}")
        ax.set_xlabel("simulated wall clock (s)")
        ax.set_ylabel("mean classification accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return csv_path, png_path
