"""Fig. 15 (Xu et al., Sec. 5.7): the teacher's test accuracy (the EMA of the intermediate
models, Eq. 12) against the global model's, round by round, from the runs of one directory
(`fedjax-semi-ada-table teacher DIR`; the runs of ada_fedsemi and fedsemi log both).

The paper draws the two curves and says the teacher's accuracy "improves more smoothly and
robustly". Per seed, over its evaluations up to its first `done` (and within `--time-budget`
minutes): each model's final accuracy, the mean absolute change between consecutive
evaluations (smoothness), the largest drop between two (robustness), and the share of
evaluations at which the teacher is above the global model. Cells: mean ± std over seeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_semi.results.ada_runs import TIME, _bad, _groups, _md, _ms, run_rows

MEASURES = (
    ("final", "final accuracy (%)"),
    ("step", "mean abs. change between evaluations (points)"),
    ("drop", "largest drop between evaluations (points)"),
)


def seed_curves(run: dict, time_budget: float = np.inf) -> dict[str, float]:
    """One seed's measures of the global model (`accuracy`) and the teacher (`teacher_acc`)."""
    rows = [r for r in run_rows(run) if r[TIME] <= time_budget]
    evals = [r for r in rows if r.get("accuracy") is not None and r.get("teacher_acc") is not None]
    if len(evals) < 2:
        raise ValueError(
            f"run {str(run['dir'])!r}: fewer than 2 rounds log both accuracy and teacher_acc "
            "within the budget (the rows of ada_fedsemi and fedsemi)"
        )
    out = {}
    for name, key in (("global", "accuracy"), ("teacher", "teacher_acc")):
        curve = 100 * np.array([float(r[key]) for r in evals])
        step = np.diff(curve)
        out[f"final_{name}"] = float(curve[-1])
        out[f"step_{name}"] = float(np.abs(step).mean())
        out[f"drop_{name}"] = float(max(0.0, -step.min()))
    above = [float(r["teacher_acc"]) > float(r["accuracy"]) for r in evals]
    out["teacher_above"] = 100 * float(np.mean(above))
    return out


def teacher(root: Path, time_budget: float | None = None) -> str:
    """The Markdown table: a row per setting (the report's labels), the global model's and the
    teacher's measures side by side, and the share of evaluations with the teacher above."""
    if time_budget is not None and not time_budget > 0:
        raise _bad("--time-budget", time_budget, "minutes > 0")
    budget = np.inf if time_budget is None else time_budget
    header = ["setting", "seeds"]
    for _, what in MEASURES:
        header += [f"global: {what}", f"teacher: {what}"]
    header.append("evaluations with the teacher above (%)")
    rows = []
    for label, runs in _groups(root):
        stats = [seed_curves(r, budget) for r in runs]
        cells = [label, str(len(stats))]
        for key, _ in MEASURES:
            cells += [_ms([s[f"{key}_{m}"] for s in stats], 2) for m in ("global", "teacher")]
        cells.append(_ms([s["teacher_above"] for s in stats], 0))
        rows.append(cells)
    return "\n".join(_md(header, rows))
