"""fedjax-semi-data: list, check and describe (on sklearn digits and tmp_path fixtures)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from fedjax_semi.data import registry
from fedjax_semi.data.datacli import main
from fedjax_semi.data.partitions import Partition

pytestmark = pytest.mark.usefixtures("isolated_data_env")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(registry.dataset_names()) <= set(lines)
    assert "found" in lines["digits"] and "scikit-learn" in lines["digits"]
    assert "missing" in lines["cifar10"] and "xdg-cache" in lines["cifar10"]
    assert "tfds:NAME" in lines


def test_list_shows_where_found(tmp_path, monkeypatch, capsys):
    d = tmp_path / "data" / "stl10"
    d.mkdir(parents=True)
    for f in ("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin"):
        (d / f).write_bytes(b"")
    monkeypatch.setenv("FEDJAX_SEMI_DATA", str(tmp_path / "data"))
    assert main(["list"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("stl10 "))
    assert "found" in line and str(d) in line


def test_check_digits(capsys):
    assert main(["check", "digits"]) == 0
    out = capsys.readouterr().out
    assert "digits: image, 10 classes" in out
    ds = registry.load_dataset("digits")
    n, m = len(ds.y_train), len(ds.y_test)
    assert f"train: x uint8 [{n}, 8, 8, 1], y int32 [{n}]" in out
    assert f"test: x uint8 [{m}, 8, 8, 1]" in out
    assert f"class counts: {np.bincount(ds.y_test).tolist()}" in out
    assert "class counts:" in out and "mean:" in out and "std:" in out


def test_check_missing_is_one_clear_message(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["check", "cifar10", "--data-dir", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "data_batch_1" in err and "cifar-10-python.tar.gz" in err and str(tmp_path) in err
    assert "Traceback" not in err
    assert main(["check", "nope"]) == 2
    assert "dataset.name" in capsys.readouterr().err


def test_describe_digits(tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = ["describe", "dataset=digits", "model=mlp", "num_clients=10"]
    assert main([*argv, "partition.min_client_size=5", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.split()[:1] == ["client"])
    assert header.split() == ["client", "labeled", "unlabeled", "test", "classes"]
    rows = [line for line in out.splitlines() if re.match(r"^\s*\d+\s", line)]
    assert [int(r.split()[0]) for r in rows] == list(range(10))
    for stat in ("total", "min", "median", "max"):
        assert any(line.split()[:1] == [stat] for line in out.splitlines())
    png = out_dir / "partition.png"
    assert png.is_file() and png.stat().st_size > 1024
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    part = Partition.load(out_dir / "partition.npz")
    assert part.num_clients == 10
    # The table's totals match the saved partition.
    total = next(line for line in out.splitlines() if line.split()[:1] == ["total"]).split()
    counts = part.counts()
    assert [int(v) for v in total[1:4]] == [int(counts[r].sum()) for r in part.clients]
    n_train = len(registry.load_dataset("digits").y_train)
    assert int(np.sum(counts["labeled"] + counts["unlabeled"])) == n_train


def test_describe_bad_value_exits_2(capsys):
    assert main(["describe", "partition.alpha=0", "dataset=digits"]) == 2
    err = capsys.readouterr().err
    assert "partition.alpha" in err and len(err.strip().splitlines()) == 1


def test_describe_bad_override_key_exits_2(capsys):
    assert main(["describe", "partition.alfa=0.3", "dataset=digits"]) == 2
    err = capsys.readouterr().err
    assert "alfa" in err and "Traceback" not in err


def test_console_script_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedjax_semi.data.datacli", "describe", "partition.alpha=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "partition.alpha" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "partition.png").exists()
