"""Tables from a sweep: group runs by their overrides (seed excluded), mean +- std over seeds.

An experiment config may carry the paper's numbers as
    paper: [{where: {algorithm.name: fedavg, partition.alpha: 0.5}, accuracy: 0.71}, ...]
and the report prints them beside ours.
"""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

SEED_KEYS = ("seed",)


def _get(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _natural(path: Path) -> list:
    """Sort key that puts job 2 before job 10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_runs(root: Path) -> list[dict]:
    """Every run under root that has a summary.json, with its config and overrides."""
    runs = []
    for summary_path in sorted(Path(root).rglob("summary.json"), key=_natural):
        d = summary_path.parent
        cfg_path, ov_path = d / ".hydra" / "config.yaml", d / ".hydra" / "overrides.yaml"
        cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else {}
        overrides = yaml.safe_load(ov_path.read_text()) if ov_path.exists() else []
        runs.append(
            {
                "dir": d,
                "summary": json.loads(summary_path.read_text()),
                "config": cfg or {},
                "overrides": [
                    o for o in overrides or [] if o.split("=")[0].lstrip("+") not in SEED_KEYS
                ],
            }
        )
    return runs


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _settings(runs: list[dict]) -> list[str]:
    """A label per run: the overrides whose values vary across the sweep (seed excluded)."""
    values: dict[str, set] = defaultdict(set)
    for r in runs:
        for o in r["overrides"]:
            values[_split(o)[0]].add(_split(o)[1])
    varying = {k for k, v in values.items() if len(v) > 1}
    labels = []
    for r in runs:
        parts = sorted(o for o in r["overrides"] if _split(o)[0] in varying)
        labels.append(" ".join(parts) or str(r["summary"].get("algorithm", r["dir"].name)))
    return labels


def _paper_value(paper, cfg: dict, metric: str):
    for row in paper or []:
        where = row.get("where", {})
        if all(str(_get(cfg, k)) == str(v) for k, v in where.items()) and metric in row:
            return row[metric]
    return None


def mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def report(root: Path, metrics: list[str], csv_path: Path | None = None) -> str:
    runs = find_runs(root)
    if not runs:
        raise ValueError(f"sweep_dir={str(root)!r} holds no run with a summary.json")
    groups: dict[str, list[dict]] = defaultdict(list)
    for r, label in zip(runs, _settings(runs), strict=True):
        groups[label].append(r)
    metrics = [m for m in metrics if any(m in r["summary"].get("final", {}) for r in runs)]
    has_paper = any(r["config"].get("paper") for r in runs)
    header = ["setting", "seeds"] + [f"{m} (mean ± std)" for m in metrics]
    if has_paper:
        header += [f"paper {m}" for m in metrics]
    rows, csv_rows = [], []
    for setting, rs in groups.items():
        cells, csv_row = [setting, str(len(rs))], {"setting": setting, "seeds": len(rs)}
        for m in metrics:
            vals = [r["summary"]["final"].get(m) for r in rs]
            vals = [v for v in vals if v is not None]
            if vals:
                mu, sd = mean_std(vals)
                cells.append(f"{100 * mu:.2f} ± {100 * sd:.2f}")
                csv_row.update({f"{m}_mean": mu, f"{m}_std": sd})
            else:
                cells.append("–")
        if has_paper:
            for m in metrics:
                pv = _paper_value(rs[0]["config"].get("paper"), rs[0]["config"], m)
                cells.append("–" if pv is None else f"{100 * pv:.2f}")
                csv_row[f"paper_{m}"] = pv
        rows.append(cells)
        csv_rows.append(csv_row)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c) + " |" for c in rows]
    text = "\n".join(md)
    csv_path = csv_path or Path(root) / "report.csv"
    fields = sorted(
        {k for r in csv_rows for k in r}, key=lambda k: (k != "setting", k != "seeds", k)
    )
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(csv_rows)
    (Path(root) / "report.md").write_text(text + "\n")
    return text
