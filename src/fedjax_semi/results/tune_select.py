"""fedjax-semi-tune's second half: read the trials, choose per row, write what was chosen.

Selection: per row, the grid point with the best mean over the tuning seeds of the metric (its
final value, or the mean of its last K evaluations); a point with a missing or diverged seed is
not a candidate; equal means (to 6 significant digits: float32 metrics) go to the smaller lr,
then to the earlier point of the grid. A choice at the smallest or largest value of a numeric
grid axis is reported (`at_edge`): the protocol then adds the next value past it, which
`--extend-edges` does itself (`next_values`).
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedjax_semi.results.report import cut_value
from fedjax_semi.results.tune_grid import cell_text, grid_table
from fedjax_semi.results.tune_plan import LR, Plan, added_by_row, row_label, trial_id
from fedjax_semi.tuned import diverged, run_complete

__all__ = ["Choice", "PointResult", "collect", "select", "write_outputs"]


@dataclass
class PointResult:
    """One grid point of one row: the metric per tuning seed (None: not run or not finished;
    NaN: the run diverged) and the trial directories."""

    point: dict[str, str]
    values: list[float | None]
    dirs: list[str | None]

    @property
    def complete(self) -> bool:
        return all(v is not None and math.isfinite(v) for v in self.values)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.values)) if self.complete else None


@dataclass
class Choice:
    row: dict[str, str]
    point: dict[str, str] | None  # None: no point of the row finished without diverging
    mean: float | None


@dataclass(frozen=True)
class Cut:
    """Where a trial is read, as `fedjax-semi-report` reads a table's runs: the mean of the last
    `last_k` evaluations (default: the final value) with `sim_time <= budget_time` (optional)."""

    last_k: int | None = None
    budget_time: float | None = None

    def describe(self) -> str:
        if self.budget_time is None:
            return f"mean of the last {self.last_k} evaluations" if self.last_k else "final value"
        what = f"mean of the last {self.last_k} evaluations" if self.last_k else "last evaluation"
        return f"{what} with sim_time <= {self.budget_time:g} s"


def _at_cut(run_dir: Path, metric: str, cut: Cut) -> float | None:
    """The metric at the cut, from metrics.jsonl (report.cut_value)."""
    if not (run_dir / "metrics.jsonl").exists():
        return None
    value = cut_value(run_dir, metric, budget_time=cut.budget_time, last_k=cut.last_k)
    return None if value is None else value[0]


def _value(run_dir: Path, rounds: int, metric: str, cut: Cut) -> float | None:
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if not run_complete(summary, rounds, same_stop=True):
        return None
    if diverged(summary):
        return math.nan
    if cut.last_k is not None or cut.budget_time is not None:
        value = _at_cut(run_dir, metric, cut)
    elif metric == "best_accuracy":
        value = summary.get("best_accuracy")
    else:
        value = summary.get("final", {}).get(metric)
    if value is None:
        logged = sorted(k for k, v in summary.get("final", {}).items() if isinstance(v, float))
        raise ValueError(
            f"--metric={metric!r} is not allowed: trial {run_dir} did not log it (its final "
            f"evaluation has {logged})"
        )
    return float(value)


def collect(
    plan: Plan, found: dict[frozenset, Path], metric: str, cut: Cut
) -> list[list[PointResult]]:
    """Per row, per grid point: the metric of each tuning seed's trial."""

    const = plan.constant_keys()
    out = []
    for r, row in enumerate(plan.rows):
        points = []
        for p in plan.points(r):
            dirs = [found.get(trial_id({**row, **p, "seed": str(s)}, const)) for s in plan.seeds]
            values = [None if d is None else _value(d, plan.rounds[r], metric, cut) for d in dirs]
            points.append(PointResult(p, values, [None if d is None else str(d) for d in dirs]))
        out.append(points)
    return out


def select(plan: Plan, results: list[list[PointResult]], minimize: bool = False) -> list[Choice]:
    """Per row the best complete point (module docstring)."""
    choices = []
    for row, points in zip(plan.rows, results, strict=True):
        cands = [(i, p) for i, p in enumerate(points) if p.complete]
        if not cands:
            choices.append(Choice(row, None, None))
            continue
        sign = 1.0 if minimize else -1.0
        # Means equal to 6 significant digits tie: the metrics are float32 (about 7 digits), so
        # a gap of an ulp or two is summation order, not a better point.
        i, best = min(
            cands, key=lambda c: (sign * float(f"{c[1].mean:.6g}"), float(c[1].point[LR]), c[0])
        )
        choices.append(Choice(row, best.point, best.mean))
    return choices


def _edges(plan: Plan, r: int, choice: Choice) -> list[tuple[str, bool]]:
    """(key, is the largest) for each numeric grid axis on which row r's chosen value is the
    smallest or largest of its grid."""
    if choice.point is None:
        return []
    edges = []
    for key, values in plan.row_grid(r).items():
        try:
            nums = [float(v) for v in values]
        except ValueError:  # a categorical axis (server_exit_losses=all,final) has no edge
            continue
        if len(set(nums)) < 2:
            continue
        v = float(choice.point[key])
        if v in (min(nums), max(nums)):
            edges.append((key, v == max(nums)))
    return edges


def at_edge(plan: Plan, r: int, choice: Choice) -> list[str]:
    """The numeric grid axes on which row r's chosen value is its grid's smallest or largest:
    the best may lie past it, so the protocol adds the next value beyond it (the trials already
    run are reused). A value past the choice that diverged or scored lower is what makes it
    inside."""
    return [
        f"{key}={choice.point[key]} ({'largest' if up else 'smallest'})"
        for key, up in _edges(plan, r, choice)
    ]


def _step(nums: list[float], up: bool) -> float | None:
    """The value one step past the largest (up) or smallest positive value of a grid axis: on
    the log ladder 1, 3, 10, 30, ... when the axis lies on it (0.01, 0.03, 0.1 -> 0.3), else by
    the ratio of its two outermost values; None below a grid that reaches 0 or with one value."""
    pos = sorted(x for x in nums if x > 0)
    if len(pos) < 2 or (not up and min(nums) <= 0):
        return None
    edge = pos[-1] if up else pos[0]

    def rung(x: float) -> tuple[int, int] | None:  # x = m * 10**e with m in {1, 3}
        e = math.floor(math.log10(x) + 1e-9)
        m = x / 10.0**e
        return next(((e, k) for k in (1, 3) if math.isclose(m, k, rel_tol=1e-6)), None)

    if all(rung(x) for x in pos):
        e, m = rung(edge)
        if up:
            e, m = (e, 3) if m == 1 else (e + 1, 1)
        else:
            e, m = (e, 1) if m == 3 else (e - 1, 3)
        return m * 10.0**e
    ratio = pos[-1] / pos[-2] if up else pos[1] / pos[0]
    return edge * ratio if up else edge / ratio


def next_values(plan: Plan, choices: list[Choice]) -> list[dict[str, list[str]]]:
    """The edge rule, per row: for each numeric axis, the value past the edge of the row's own
    grid that its choice sits on (`at_edge`), written like the axis's values (integers stay
    integers, `1.0` not `1`, so a trial run before keeps its directory name). Only that row
    runs it."""
    out = []
    for r, choice in enumerate(choices):
        added: dict[str, list[str]] = {}
        for key, up in _edges(plan, r, choice):
            values = plan.row_grid(r)[key]
            x = _step([float(v) for v in values], up=up)
            if x is None:
                continue
            ints = all(v.lstrip("-").isdigit() for v in values)
            text = str(round(x)) if ints else repr(float(f"{x:.6g}"))
            if text not in values and text not in added.get(key, []):
                added.setdefault(key, []).append(text)
        out.append(added)
    return out


def _cell(p: PointResult, chosen: bool) -> str:
    if p.complete or any(v is None for v in p.values):
        return cell_text(p.values, chosen, digits=4, per_seed=False)
    return "diverged"  # every seed finished, one not finite: never a candidate


def table(plan: Plan, results: list[list[PointResult]], choices: list[Choice]) -> str:
    """Markdown: a line per row (and knob setting), a column per value combination of any
    row's grid ("" where a row's grid lacks it: a value added past another row's edge);
    [chosen]."""
    grid = plan.all_values()
    keys = list(grid)
    combos = [dict(zip(keys, c, strict=True)) for c in itertools.product(*grid.values())]
    short = lambda k: k.split(".")[-1]  # noqa: E731
    heads = [" ".join(f"{short(k)}={c[k]}" for k in keys) for c in combos]
    lines = ["| row | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for r, (points, choice) in enumerate(zip(results, choices, strict=True)):
        by_point = {json.dumps(p.point, sort_keys=True): p for p in points}
        for s in plan.settings[r]:
            label = row_label(plan.rows[r]) + "".join(f" {short(k)}={v}" for k, v in s.items())
            found = [by_point.get(json.dumps({**s, **c}, sort_keys=True)) for c in combos]
            cells = ["" if p is None else _cell(p, choice.point == p.point) for p in found]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _added_text(plan: Plan) -> str:
    """The values --extend-edges added past a row's edge, per row ("" when none)."""
    parts = added_by_row(plan.rows, plan.added)
    if not parts:
        return ""
    return f"; added past a row's edge (--extend-edges), for that row only: {parts}"


def _typed(values: dict[str, str]) -> dict[str, Any]:
    return {k: yaml.safe_load(v) for k, v in values.items()}


def data_scope(task_extras: list[str]) -> dict[str, str]:
    """The user's overrides that change the data (`dataset`, `partition` and their keys, e.g.
    `partition.dofed.assignment=balanced`): values chosen on one reading of the data are written
    for that reading only, so they go into every entry's `where`."""
    scope = {}
    for o in task_extras:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key.split(".")[0] in ("dataset", "partition") and not o.startswith("~"):
            scope[key] = value
    return scope


def tuned_yaml(plan: Plan, choices: list[Choice], old: list[dict], header: list[str]) -> str:
    """conf/tuned/<preset>.yaml: the chosen values of every row with a choice, scoped to the
    data overrides of the tuning (`data_scope`); entries of earlier tunings for other rows (or
    other scopes) are kept."""
    scope = _typed(data_scope(plan.task_extras))
    new = [
        {"where": {**_typed(c.row), **scope}, "set": _typed(c.point)} for c in choices if c.point
    ]
    wheres = [e["where"] for e in new]
    kept = [e for e in old if e.get("where") not in wheres]
    body = yaml.safe_dump({"tuned": kept + new}, sort_keys=False, default_flow_style=None)
    notes = [f"{len(kept)} entries of earlier tunings kept (rows not tuned here)."] if kept else []
    return "\n".join(["# @package _global_", *(f"# {h}" for h in header + notes), body])


def write_outputs(
    plan: Plan,
    results: list[list[PointResult]],
    choices: list[Choice],
    conf_out: Path,
    metric: str,
    cut: Cut,
    command: str,
) -> int:
    """Prints the table, writes tuned.md and tuned.json in the sweep dir and, when every trial
    finished, conf_out/<preset>.yaml. Returns the exit code (1: trials missing)."""
    missing = [
        d or f"row {row_label(plan.rows[r])} point {p.point} seed {plan.seeds[i]}"
        for r, points in enumerate(results)
        for p in points
        for i, (v, d) in enumerate(zip(p.values, p.dirs, strict=True))
        if v is None
    ]
    date = datetime.date.today().isoformat()
    header = [
        f"Chosen by fedjax-semi-tune on {date}: per row the best mean over seeds {plan.seeds} of "
        f"{metric} ({cut.describe()}) on the validation split partition.holdout={plan.holdout} "
        "(held out of the clients' training rows; the test split is never read), ties to the "
        "smaller lr.",
        "Grid: "
        + "; ".join(f"{k} in [{', '.join(v)}]" for k, v in plan.grid.items())
        + (
            "; each method's SENSITIVE_KNOBS (--knobs)"
            if any(s != [{}] for s in plan.settings)
            else ""
        )
        + _added_text(plan),
        f"Command: {command}",
        f"Trials and table: {plan.sweep_dir}/tuned.md",
    ]
    md = table(plan, results, choices)
    print(md)
    for c in choices:
        if c.point is None:
            print(f"fedjax-semi-tune: warning: row {row_label(c.row)}: no grid point finished "
                  "on every seed without diverging; nothing chosen")  # fmt: skip
    edges = [at_edge(plan, r, c) for r, c in enumerate(choices)]
    edge_lines = [
        f"- {row_label(c.row)}: {', '.join(e)}" for c, e in zip(choices, edges, strict=True) if e
    ]
    if edge_lines:
        print("fedjax-semi-tune: chosen at the grid's edge (the best may lie past it; add the "
              "next value, the trials run are reused):", *edge_lines, sep="\n")  # fmt: skip
    record = {
        "preset": plan.preset, "date": date, "holdout": plan.holdout, "seeds": plan.seeds,
        "grid": plan.grid, "metric": metric, "last_k": cut.last_k,
        "budget_time": cut.budget_time, "command": command,
        "rows": [
            {"row": c.row, "grid": plan.row_grid(r), "chosen": c.point, "mean": c.mean,
             "at_edge": e, "points": [vars(p) for p in points]}
            for r, (c, e, points) in enumerate(zip(choices, edges, results, strict=True))
        ],
        "missing": missing,
    }  # fmt: skip
    (plan.sweep_dir / "tuned.json").write_text(json.dumps(record, indent=1))
    doc = ["# Tuning of " + plan.preset, "", *header, "", "[value] = chosen.", "", md]
    two_way = [k for k, v in plan.all_values().items() if len(v) > 1]
    if len(two_way) == 2 and all(s == [{}] for s in plan.settings):
        # A joint search over two knobs, laid out one down and one across (tune_grid.py).
        doc += ["", "Two-way (seed values in brackets):", ""]
        doc += [grid_table(record, *two_way, per_seed=True)]
    if edge_lines:
        doc += ["", "Chosen at the grid's edge (the best may lie past it):", *edge_lines]
    if missing:
        doc += ["", f"{len(missing)} trials not finished:", *(f"- {m}" for m in missing)]
    (plan.sweep_dir / "tuned.md").write_text("\n".join(doc) + "\n")
    if missing:
        print(f"fedjax-semi-tune: {len(missing)} trials did not finish (listed in "
              f"{plan.sweep_dir}/tuned.md); rerun the same command to run them; "
              f"{conf_out}/{plan.preset}.yaml not written")  # fmt: skip
        return 1
    path = conf_out / f"{plan.preset}.yaml"
    old = []
    if path.exists():
        old = (yaml.safe_load(path.read_text()) or {}).get("tuned") or []
    conf_out.mkdir(parents=True, exist_ok=True)
    path.write_text(tuned_yaml(plan, choices, old, header))
    print(f"wrote {plan.sweep_dir}/tuned.md, tuned.json and {path}")
    return 0
