"""`fedjax-semi-ada-table teacher` (results/ada_teacher.py, Fig. 15) on run directories in the
real format: each measure against a NumPy reference on the same curves, the budget cut, the
first `done`, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_semi.results import ada_table
from fedjax_semi.results.ada_teacher import teacher
from test_ada_table import write_run


def add_teacher(job, seed: int, teacher_acc: list[float]) -> None:
    """Give seed_<seed>/'s rows a teacher_acc curve (write_run logs the global model's)."""
    path = job / f"seed_{seed}" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r, t in zip(rows, teacher_acc, strict=True):
        r["teacher_acc"] = t
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def reference(g: np.ndarray, t: np.ndarray) -> list[float]:
    """final, mean |step| and largest drop (points) of the global model and the teacher, then
    the share (%) of evaluations with the teacher above."""
    out = []
    for curve in (100 * g, 100 * t):
        d = np.diff(curve)
        out.append([curve[-1], np.mean(np.abs(d)), max(0.0, -d.min())])
    (fg, sg, dg), (ft, st, dt) = out
    return [fg, ft, sg, st, dg, dt, 100 * np.mean(t > g)]


def cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines()[2:]]


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(0)
    curves = {}
    for seed in range(3):
        g = rng.uniform(0.5, 0.9, 8)
        t = rng.uniform(0.5, 0.9, 8)
        curves[seed] = g, t
        write_run(tmp_path, seed, {"name": "ada_fedsemi"}, list(g), 2.0, 0.5, ["algorithm=x"])
        add_teacher(tmp_path, seed, list(t))
    return tmp_path, curves


def test_measures_match_numpy(runs):
    root, curves = runs
    (row,) = cells(teacher(root))
    assert row[1] == "3"  # seeds (one setting: labelled by its algorithm)
    per_seed = np.array([reference(*curves[s]) for s in range(3)])
    digits = [2] * 6 + [0]
    for cell, column, k in zip(row[2:], per_seed.T, digits, strict=True):
        assert cell == f"{column.mean():.{k}f} ± {column.std(ddof=1):.{k}f}"


def test_budget_and_done_end_the_curves(runs, tmp_path):
    root, curves = runs
    # 7 minutes: rounds 1-3 (2 minutes a round)
    (row,) = cells(teacher(root, time_budget=7.0))
    finals = [100 * curves[s][0][2] for s in range(3)]
    assert row[2] == f"{np.mean(finals):.2f} ± {np.std(finals, ddof=1):.2f}"
    # A run done at round 4: its rows after it (frozen) are not read.
    job = tmp_path / "done"
    g, t = curves[0]
    write_run(job, 0, {"name": "ada_fedsemi"}, list(g), 2.0, 0.5, ["algorithm=y"], done_at=4)
    add_teacher(job, 0, list(t))
    (row,) = cells(teacher(job))
    assert row[2] == f"{100 * g[3]:.2f}" and row[3] == f"{100 * t[3]:.2f}"


def test_bad_input_gets_one_line(runs, tmp_path, capsys):
    root, _ = runs
    for argv in (
        ["teacher", str(root), "--time-budget", "0"],
        ["teacher", str(root), "--time-budget", "1"],  # no round within 1 minute
        ["teacher", str(tmp_path / "missing")],
    ):
        with pytest.raises(SystemExit):
            ada_table.main(argv)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fedjax-semi-ada-table: error:")
