"""benchmarks/agreement.py's torch-free parts: the agreement statistic and table, the data
subset, the export of the engine's partition to the torch side, and that the torch side imports
nothing of the engine (make test never needs torch)."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import agreement  # noqa: E402
import agreement_stats as stats  # noqa: E402
from fedjax_semi.data.dataset import ArrayDataset  # noqa: E402
from fedjax_semi.data.partitions import build_partition  # noqa: E402

SAMPLE = [0.80, 0.82, 0.84]  # sd (ddof 1) 0.02; SE of a difference of two such means 0.0163


def test_agreement_statistic_by_hand():
    a = stats.agreement(SAMPLE, SAMPLE)
    assert a.diff == 0 and a.agree
    # float64 arithmetic on 3 values: 1e-12 covers the rounding of mean and sd.
    assert math.isclose(a.sd_e, 0.02, abs_tol=1e-12)
    assert math.isclose(a.se, math.sqrt(2 * 0.02**2 / 3), abs_tol=1e-12)
    # 2 SE = 0.03266: a shift of 0.03 is inside, 0.04 outside, either sign.
    assert stats.agreement([x + 0.03 for x in SAMPLE], SAMPLE).agree
    assert not stats.agreement([x + 0.04 for x in SAMPLE], SAMPLE).agree
    assert not stats.agreement(SAMPLE, [x + 0.04 for x in SAMPLE]).agree
    # unequal sample sizes use each side's own n
    b = stats.agreement(SAMPLE, [0.7, 0.7, 0.9, 0.9, 0.8])
    assert math.isclose(b.se, math.sqrt(0.02**2 / 3 + 0.01 / 5), abs_tol=1e-12)


@pytest.mark.parametrize("bad", [[0.5], [0.5, float("nan")], [[0.5, 0.6]]])
def test_agreement_needs_two_finite_values_per_side(bad):
    with pytest.raises(ValueError, match="engine accuracies"):
        stats.agreement(bad, SAMPLE)


def curve(acc):
    return {"rounds": [0, 5, 10], "acc": acc}


def test_table_marks_the_disagreeing_row_and_the_verdict():
    same = curve([[0.1, 0.5, x] for x in SAMPLE])
    shifted = curve([[0.1, 0.5, x + 0.1] for x in SAMPLE])
    lines, every = stats.table({"A": {"engine": same, "torch": same}}, [5, 10])
    assert every and len(lines) == 4 and "DISAGREE" not in "".join(lines)
    lines, every = stats.table({"A": {"engine": shifted, "torch": same}}, [10])
    assert not every
    assert lines[-1].startswith("| A | 10 | 92.00 ± 2.00 | 82.00 ± 2.00 | +10.00 |")
    assert lines[-1].endswith("DISAGREE |")
    with pytest.raises(ValueError, match="round 7 was not evaluated"):
        stats.at_round(same, 7)


def test_window_mean_averages_each_seed_over_the_rounds_in_the_window():
    c = curve([[0.1, 0.5, 0.7], [0.2, 0.6, 1.0]])
    # float64 means of two values: exact to 1e-12
    np.testing.assert_allclose(stats.window_mean(c, 5, 10), [0.6, 0.8], atol=1e-12)
    np.testing.assert_allclose(stats.window_mean(c, 0, 4), [0.1, 0.2], atol=1e-12)
    lines, every = stats.table({"A": {"engine": c, "torch": c}}, [], [(5, 10)])
    assert every and lines[-1].startswith("| A | 5-10 | 70.00 ± 14.14 | 70.00 ± 14.14 | +0.00 |")
    with pytest.raises(ValueError, match=r"no evaluated round in \[1, 4\]"):
        stats.window_mean(c, 1, 4)


def coded(n_train: int, n_test: int) -> ArrayDataset:
    """Images whose first two pixels spell their position in their file (base 256), so a row
    can be traced back to the file; 10 balanced classes."""
    rng = np.random.default_rng(0)

    def images(n):
        x = rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
        x[:, 0, 0, 0], x[:, 0, 1, 0] = np.arange(n) // 256, np.arange(n) % 256
        return x

    y_tr, y_te = (np.arange(n) % 10 for n in (n_train, n_test))
    rng.shuffle(y_tr)
    return ArrayDataset(
        "coded", images(n_train), y_tr.astype(np.int32), images(n_test), y_te.astype(np.int32),
        10, (0.5,), (0.25,),
    )  # fmt: skip


def position(x: np.ndarray) -> np.ndarray:
    return x[:, 0, 0, 0].astype(np.int64) * 256 + x[:, 0, 1, 0]


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_export_gives_the_torch_side_the_engines_rows_as_file_positions(scheme, tmp_path):
    full = coded(3000, 700)
    ds, train_pos, test_pos = agreement.subset(full, 500, 200, seed=0)
    assert ds.mean == full.mean and ds.std == full.std  # normalization of the full train set
    part = build_partition(
        ds, num_clients=5, scheme=scheme, alpha=0.5, classes_per_client=2,
        labeled_fraction=0.1, labeled_mode="fixed", label_ratio_alpha=0.5, split="official",
        val_fraction=0.0, min_client_size=10, seed=0,
    )  # fmt: skip
    agreement.export_partition(part, train_pos, test_pos, tmp_path / "p.npz")
    with np.load(tmp_path / "p.npz") as z:
        offsets, values, test = z["offsets"], z["values"], z["test"]
    assert len(offsets) == 6 and offsets[0] == 0 and offsets[-1] == len(values)
    for k in range(5):
        rows = values[offsets[k] : offsets[k + 1]]
        engine_rows = np.concatenate([part.clients["labeled"][k], part.clients["unlabeled"][k]])
        # The torch side's rows are the very images and labels the engine's client k trains on.
        assert sorted(position(full.x_train[rows])) == sorted(position(ds.x_train[engine_rows]))
        assert sorted(full.y_train[rows]) == sorted(ds.y_train[engine_rows])
    assert len(np.unique(values)) == len(values)  # no row given to two clients
    if scheme == "iid":
        assert sorted(values) == sorted(train_pos)
    n = len(ds.y_train)
    expected = position(ds.x_test[part.server["test_global"] - n])
    np.testing.assert_array_equal(position(full.x_test[test]), expected)
    np.testing.assert_array_equal(full.y_test[test], ds.y_test[part.server["test_global"] - n])


def test_subset_sizes_are_checked():
    with pytest.raises(SystemExit, match="--train-size=0 is not allowed"):
        agreement.subset(coded(100, 50), 0, 10, seed=0)
    with pytest.raises(SystemExit, match=r"--test-size=51 is not allowed: an integer in \[1, 50\]"):
        agreement.subset(coded(100, 50), 10, 51, seed=0)


def test_bad_arguments_are_one_line_before_any_work(capsys):
    with pytest.raises(SystemExit):
        agreement.parse(["--seeds", "1"])
    assert "--seeds=1 is not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        agreement.parse(["--check-rounds", "7"])
    assert "--check-rounds=[7] are not evaluated rounds" in capsys.readouterr().err
    assert agreement.parse(["--rounds", "12", "--check-rounds", "10", "12"]).rounds == 12


def test_the_torch_side_imports_nothing_of_the_engine():
    tree = ast.parse((BENCH / "agreement_torch.py").read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    allowed = {"__future__", "argparse", "copy", "gzip", "json", "math", "sys", "time", "pathlib"}
    assert roots - allowed == {"numpy", "torch"}


def test_report_pools_the_seeds_of_the_runs_it_is_given(tmp_path, capsys):
    path = tmp_path / "agreement.jsonl"
    rows = []
    for run, acc in (("r1", [[0.1, 0.5, 0.8], [0.1, 0.5, 0.82]]), ("r2", [[0.1, 0.5, 0.84]])):
        for side in ("engine", "torch"):
            rec = {"bench": "agreement", "run": run, "kind": "curve", "setting": "A"}
            rows.append(json.dumps({**rec, "side": side, "rounds": [0, 5, 10], "acc": acc}))
    path.write_text("\n".join(rows) + "\n")

    def args(*extra):
        a = agreement.parse(
            ["--report", "--out", str(path), "--check-rounds", "10", "--window", "5", "10", *extra]
        )
        a.plot = None
        return a

    agreement.report(args("--run", "r1", "r2"))
    assert "| A | 10 | 82.00 ± 2.00 | 82.00 ± 2.00 | +0.00 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="need 2 or more"):  # the latest run, r2: one seed
        agreement.report(args())
    with pytest.raises(SystemExit, match=r"--run=\['r3'\] has no curves"):
        agreement.report(args("--run", "r3"))
