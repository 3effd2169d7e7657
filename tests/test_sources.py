"""Tests for fedjax_semi.data.{registry,lookup,formats,fetch}: IDX I/O, lookup, loaders and
error messages."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from fedjax_semi.data import fetch, registry
from fedjax_semi.data.formats import read_idx, write_idx
from fedjax_semi.data.registry import (
    DATASETS,
    ArrayDataset,
    DatasetNotFoundError,
    dataset_names,
    load_dataset,
    search_dirs,
)

FILES = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
]


pytestmark = pytest.mark.usefixtures("isolated_data_env")


def _write_fixture(directory: Path, gz: bool, n_train: int = 30, n_test: int = 12, seed: int = 0):
    """Writes a tiny MNIST-format dataset; returns the arrays written."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_test)[::-1] % 10).astype(np.uint8),
    }
    for base, arr in arrays.items():
        write_idx(directory / (base + (".gz" if gz else "")), arr)
    return arrays


def test_write_idx_matches_official_header(tmp_path):
    write_idx(tmp_path / "x", np.zeros((3, 28, 28), np.uint8))
    raw = (tmp_path / "x").read_bytes()
    # Magic 0x00000803 then big-endian dims, exactly as in the MNIST spec.
    assert raw[:4] == b"\x00\x00\x08\x03"
    assert raw[4:16] == (3).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    assert len(raw) == 16 + 3 * 28 * 28
    write_idx(tmp_path / "y.gz", np.arange(5, dtype=np.uint8))
    with gzip.open(tmp_path / "y.gz", "rb") as f:
        assert f.read() == b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + bytes(range(5))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "int32", "float32", "float64"])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((4, 3, 2)) * 100).astype(dtype)
    path = tmp_path / f"a{suffix}"
    write_idx(path, arr)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype)
    assert out.dtype.byteorder in ("=", "|")
    np.testing.assert_array_equal(out, arr)


def test_read_idx_rejects_garbage(tmp_path):
    (tmp_path / "bad").write_bytes(b"<html>not found</html>")
    with pytest.raises(ValueError, match="IDX"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 4), np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(ValueError, match="payload"):
        read_idx(tmp_path / "short")


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("gz", [False, True])
def test_load_idx_dataset_from_data_dir(tmp_path, name, gz):
    arrays = _write_fixture(tmp_path / "data", gz=gz)
    ds = load_dataset(name, data_dir=str(tmp_path / "data"))
    assert isinstance(ds, ArrayDataset)
    assert ds.name == name and ds.num_classes == 10
    assert ds.x_train.shape == (30, 28, 28, 1) and ds.x_train.dtype == np.uint8
    assert ds.x_test.shape == (12, 28, 28, 1) and ds.x_test.dtype == np.uint8
    assert ds.y_train.dtype == np.int32 and ds.y_test.dtype == np.int32
    np.testing.assert_array_equal(ds.x_train[..., 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.y_train, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels-idx1-ubyte"])
    x = ds.x_train / 255.0
    assert ds.mean == pytest.approx((x.mean(),))
    assert ds.std == pytest.approx((x.std(),))


def test_subdirectory_env_var_and_cache(tmp_path, monkeypatch):
    _write_fixture(tmp_path / "root" / "mnist", gz=True)
    ds = load_dataset("mnist", data_dir=str(tmp_path / "root"))  # data_dir/<name>
    assert ds.x_train.shape[0] == 30
    assert load_dataset("mnist", data_dir=str(tmp_path / "root")) is ds  # cached
    monkeypatch.setenv("FEDJAX_SEMI_DATA", str(tmp_path / "root"))
    assert search_dirs("mnist")[:2] == [tmp_path / "root" / "mnist", tmp_path / "root"]
    assert load_dataset("mnist").x_test.shape[0] == 12


def test_user_cache_dir_is_searched(tmp_path):
    _write_fixture(tmp_path / "xdg-cache" / "fedjax_semi" / "mnist", gz=False, n_train=20)
    assert load_dataset("mnist").x_train.shape[0] == 20


def test_search_dirs_defaults():
    dirs = search_dirs("fashion_mnist")
    assert dirs[-1] == Path("/usr/share/datasets/fashion-mnist")
    assert all("fashion-mnist" not in str(d) for d in search_dirs("mnist"))


def test_missing_explicit_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DatasetNotFoundError, match="nope"):
        load_dataset("mnist", data_dir=str(missing))


def test_missing_files_message(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion_mnist", data_dir=str(tmp_path / "empty"))
    msg = str(info.value)
    assert str(tmp_path / "empty") in msg
    for f in FILES:
        assert f in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "FEDJAX_SEMI_DATA" in msg
    assert isinstance(info.value, FileNotFoundError)


def test_partial_files_not_accepted(tmp_path):
    _write_fixture(tmp_path / "d", gz=True)
    (tmp_path / "d" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", data_dir=str(tmp_path / "d"))


def test_unknown_name():
    with pytest.raises(ValueError, match=r"dataset\.name") as info:
        load_dataset("cifar1000")
    assert "cifar1000" in str(info.value) and "fashion_mnist" in str(info.value)


def test_registry():
    # Superset: other modules (text, tabular) may register more datasets.
    images = {"fashion_mnist", "mnist", "digits", "cifar10", "cifar100", "svhn", "stl10", "femnist"}
    assert images <= set(DATASETS)
    assert dataset_names() == sorted(DATASETS)
    for name in images:
        # Uniform loader signature: f(data_dir=None, **opts).
        assert DATASETS[name].__code__.co_varnames[0] == "data_dir"


def test_locate(tmp_path):
    assert registry.locate("digits") == "bundled with scikit-learn"
    _write_fixture(tmp_path / "d" / "mnist", gz=True)
    assert registry.locate("mnist", str(tmp_path / "d")) == str(tmp_path / "d" / "mnist")
    with pytest.raises(DatasetNotFoundError) as info:
        registry.locate("mnist")
    assert info.value.looked_in == tuple(search_dirs("mnist"))
    with pytest.raises(ValueError, match="dataset.name"):
        registry.locate("nope")


def test_unknown_dataset_data_dir_message_has_no_mnist_hint(tmp_path):
    # Other modules' datasets call search_dirs too; they must not get MNIST's instructions.
    with pytest.raises(DatasetNotFoundError) as info:
        search_dirs("imdb", str(tmp_path / "nope"))
    assert "dataset.data_dir" in str(info.value) and "lecun" not in str(info.value)


def test_digits():
    ds = load_dataset("digits")
    assert ds.x_train.shape[1:] == (8, 8, 1) and ds.x_train.dtype == np.uint8
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert len(ds.x_test) == pytest.approx(0.2 * 1797, abs=10)
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0
    assert set(np.unique(ds.y_train)) == set(range(10)) == set(np.unique(ds.y_test))
    # Stratified: every class has ~20% of its samples in test.
    frac = np.bincount(ds.y_test) / (np.bincount(ds.y_test) + np.bincount(ds.y_train))
    assert np.all(np.abs(frac - 0.2) < 0.02)
    # Deterministic across reloads (fresh cache).
    registry.clear_cache()
    again = load_dataset("digits")
    assert again is not ds
    np.testing.assert_array_equal(again.y_test, ds.y_test)
    np.testing.assert_array_equal(again.x_train, ds.x_train)
    assert not ds.x_train.flags.writeable


def test_ensure_reports_missing(tmp_path, capsys):
    assert fetch.ensure("mnist") == 1
    err = capsys.readouterr().err
    assert "mnist" in err and "train-images-idx3-ubyte" in err
    assert fetch.ensure("digits") == 0


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="dataset-fashion-mnist not installed",
)
def test_real_fashion_mnist():
    ds = load_dataset("fashion_mnist")
    assert ds.x_train.shape == (60000, 28, 28, 1)
    assert ds.x_test.shape == (10000, 28, 28, 1)
    np.testing.assert_array_equal(np.bincount(ds.y_train), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(ds.y_test), np.full(10, 1000))
    assert ds.mean[0] == pytest.approx(0.2860, abs=1e-3)
    assert ds.std[0] == pytest.approx(0.3530, abs=1e-3)


def test_subsample_keeps_a_share_of_every_class():
    from fedjax_semi.data.registry import load_dataset, subsample

    ds = load_dataset("digits")
    small = subsample(ds, 0.25, seed=3)
    for full, part in ((ds.y_train, small.y_train), (ds.y_test, small.y_test)):
        np.testing.assert_allclose(np.bincount(part), np.round(0.25 * np.bincount(full)), atol=0)
    assert small.x_train.shape[1:] == ds.x_train.shape[1:]
    assert len(small.x_train) == len(small.y_train)
    again = subsample(ds, 0.25, seed=3)
    np.testing.assert_array_equal(again.x_train, small.x_train)
    assert not np.array_equal(subsample(ds, 0.25, seed=4).x_train, small.x_train)
    assert subsample(ds, 1.0, seed=3) is ds


def test_digits_read_directly_equal_scikit_learns_loader():
    """The file is read without importing scikit-learn (about 2 s per process); the arrays are
    the ones its `load_digits` returns."""
    from sklearn.datasets import load_digits as sk_load_digits

    from fedjax_semi.data.image_loaders import _sklearn_digits

    images, target = _sklearn_digits()
    bunch = sk_load_digits()
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(target, bunch.target)
