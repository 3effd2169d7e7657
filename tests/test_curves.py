"""fedjax-semi-report --plot (results/curves.py): the seeds' step curves averaged on a common
grid, checked against a plain loop, on run directories written by the test (no training)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedjax_semi.cli import report_main
from fedjax_semi.results.curves import curve_rows, step_values


def _run(d, overrides, rows):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"final": {}, "algorithm": "x"}))


def _last_at(points, x):
    """The reference: the value of the last point at or before x, NaN before the first."""
    before = [v for px, v in sorted(points) if px <= x]
    return before[-1] if before else np.nan


def test_step_values_hold_each_curves_last_value():
    a = [(0.0, 1.0), (2.0, 3.0), (5.0, 4.0)]
    b = [(5.0, 7.0), (1.0, 2.0)]  # unsorted, starts later
    grid, vals = step_values([a, b])
    assert grid.tolist() == [0.0, 1.0, 2.0, 5.0]
    want = [[_last_at(p, x) for x in grid] for p in (a, b)]
    np.testing.assert_array_equal(vals, want)  # NaN == NaN in assert_array_equal


def test_curve_rows_mean_and_std_over_seeds_match_a_loop(tmp_path):
    """Two settings x three seeds; seed 2 evaluates every other round only, so its value holds
    between evaluations. Mean and std (ddof = 1) per setting and round as a plain loop has them;
    a metric no run logs is refused naming it."""
    rng = np.random.default_rng(0)
    points = {}
    for alg in ("a", "b"):
        for seed in range(3):
            rounds = range(0, 9, 2) if seed == 2 else range(9)
            acc = rng.uniform(0, 1, 9)
            rows = [{"round": t, "accuracy": float(acc[t]), "train_loss": 1.0 + t} for t in rounds]
            points[alg, seed] = [(t, float(acc[t])) for t in rounds]
            _run(tmp_path / f"{alg}{seed}", [f"algorithm={alg}", f"seed={seed}"], rows)
    got = {(r["setting"], r["x"]): r for r in curve_rows(tmp_path, ["accuracy"])}
    assert len(got) == 2 * 9
    for alg in ("a", "b"):
        for t in range(9):
            col = [_last_at(points[alg, s], t) for s in range(3)]
            row = got[f"algorithm={alg}", float(t)]
            assert row["seeds"] == 3
            assert row["mean"] == pytest.approx(np.mean(col))
            assert row["std"] == pytest.approx(np.std(col, ddof=1))
    with pytest.raises(ValueError, match="no run .* logs pl_acc against round"):
        curve_rows(tmp_path, ["accuracy", "pl_acc"])
    with pytest.raises(ValueError, match="--plot-x='clock' is not allowed"):
        curve_rows(tmp_path, ["accuracy"], x="clock")


def test_report_plot_writes_the_png_and_csv_and_refuses_a_missing_metric(tmp_path, capsys):
    for alg in ("a", "b"):
        rows = [{"round": t, "sim_time": 31.0 * t, "accuracy": 0.1 * t, "train_loss": 2.0 - t / 10}
                for t in range(5)]  # fmt: skip
        _run(tmp_path / alg, [f"algorithm={alg}", "seed=0"], rows)
    report_main([str(tmp_path), "--metrics", "accuracy", "--plot", "accuracy,train_loss",
                 "--plot-x", "sim_time"])  # fmt: skip
    assert f"wrote {tmp_path / 'curves.png'}" in capsys.readouterr().out
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    with open(tmp_path / "curves.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["metric"] for r in rows} == {"accuracy", "train_loss"} and len(rows) == 2 * 2 * 5
    last = [r for r in rows if r["metric"] == "train_loss" and r["x"] == "124.0"]
    assert [float(r["mean"]) for r in last] == [pytest.approx(1.6)] * 2
    assert all(r["std"] == "nan" for r in rows)  # one seed a setting: no spread
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), "--metrics", "accuracy", "--plot", "accuracy,val_acc"])
    assert "--plot='accuracy,val_acc' is not allowed" in capsys.readouterr().err


def test_curves_against_transfers_hold_each_seeds_accuracy_at_its_cost(tmp_path):
    """--plot-x comm_cost (UM-pFSSL's Table 3 trade-off): seeds that reach different transfer
    counts are averaged where each stands, a loop over the union of their costs as reference;
    rounds without an evaluation (no accuracy) add no point."""
    rng = np.random.default_rng(1)
    points = {}
    for seed in range(3):
        cost = np.cumsum(rng.integers(20, 60, 8))  # cumulative, as the counters log it
        acc = rng.uniform(0, 1, 8)
        rows = [{"round": t + 1, "comm_cost": int(cost[t])} for t in range(8)]
        for t in range(1, 8, 2):  # evaluated every other round
            rows[t]["personal_acc"] = float(acc[t])
        points[seed] = [(float(cost[t]), float(acc[t])) for t in range(1, 8, 2)]
        _run(tmp_path / f"s{seed}", ["algorithm=um", f"seed={seed}"], rows)
    got = curve_rows(tmp_path, ["personal_acc"], x="comm_cost")
    grid = sorted({c for p in points.values() for c, _ in p})
    assert [r["x"] for r in got] == grid
    for r in got:
        col = [v for v in (_last_at(points[s], r["x"]) for s in range(3)) if not np.isnan(v)]
        assert r["seeds"] == len(col)
        assert r["mean"] == pytest.approx(np.mean(col))


def test_a_repeated_x_keeps_the_later_round_and_a_setting_without_x_is_named(tmp_path, capsys):
    """Local logs comm_cost 0 every round: its curve is its last evaluation there, not its best.
    A setting that logs the metric but not the x axis is left out with a warning naming it."""
    acc = [0.5, 0.9, 0.6]
    _run(tmp_path / "local", ["algorithm=local", "seed=0"],
         [{"round": t + 1, "comm_cost": 0, "accuracy": a} for t, a in enumerate(acc)])  # fmt: skip
    _run(tmp_path / "other", ["algorithm=other", "seed=0"],
         [{"round": t + 1, "accuracy": a} for t, a in enumerate(acc)])  # fmt: skip
    got = curve_rows(tmp_path, ["accuracy"], x="comm_cost")
    assert [(r["setting"], r["x"], r["mean"]) for r in got] == [("algorithm=local", 0.0, 0.6)]
    assert "algorithm=other logs no comm_cost, left out" in capsys.readouterr().err
