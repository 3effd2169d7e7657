"""Your own data: `dataset.name=npz:PATH` (data/npz.py), the natural partition its client ids
feed, one-line refusals of bad files, and the not-prepared error of `tfds:NAME`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits

from conftest import compose_config, compose_hydra
from fedjax_semi.data.partitions import build_partition
from fedjax_semi.data.registry import (
    DatasetNotFoundError,
    is_known_dataset,
    load_dataset,
    locate,
    subsample,
)
from fedjax_semi.errors import ConfigError
from fedjax_semi.models.zoo import make_model

PARTITION = dict(
    scheme="natural", alpha=0.5, classes_per_client=2, labeled_fraction=0.5,
    labeled_mode="fixed", label_ratio_alpha=0.5, split="official", val_fraction=0.0,
    min_client_size=1, seed=0,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _cold_cache(isolated_data_env):
    yield


def digits_arrays(n_train: int = 600, n_test: int = 200) -> dict[str, np.ndarray]:
    """scikit-learn's 8x8 digits (real images, 0..16) as float images in [0, 1]."""
    d = load_digits()
    x, y = (d.images / 16.0).astype(np.float64), d.target.astype(np.int64)
    return {
        "x_train": x[:n_train], "y_train": y[:n_train],
        "x_test": x[n_train : n_train + n_test], "y_test": y[n_train : n_train + n_test],
    }  # fmt: skip


def write(tmp_path, file: str = "data.npz", **arrays) -> str:
    path = tmp_path / file
    np.savez(path, **arrays)
    return f"npz:{path}"


# ----------------------------------------------------------------------------- loading


def test_float_images_with_client_ids(tmp_path):
    a = digits_arrays()
    a["client_train"] = 100 + np.arange(600) % 15  # ids need not start at 0 nor be contiguous
    a["client_test"] = 100 + np.arange(200) % 15
    name = write(tmp_path, **a)
    ds = load_dataset(name)
    assert (ds.name, ds.kind, ds.num_classes) == (name, "image", 10)
    assert ds.x_train.shape == (600, 8, 8, 1) and ds.x_train.dtype == np.uint8
    np.testing.assert_array_equal(ds.x_train[..., 0], np.round(a["x_train"] * 255))
    assert ds.y_train.dtype == np.int32 and not ds.x_train.flags.writeable
    assert 0 < ds.mean[0] < 1 and 0 < ds.std[0] < 1
    assert ds.side["writers"].tolist() == list(range(100, 115))
    np.testing.assert_array_equal(ds.side["writers"][ds.side["writer_train"]], a["client_train"])
    np.testing.assert_array_equal(ds.side["writers"][ds.side["writer_test"]], a["client_test"])
    assert locate(name) == name[len("npz:") :]
    # dataset.fraction keeps each kept example's client id
    half = subsample(ds, 0.5, seed=0)
    assert len(half.side["writer_train"]) == len(half.y_train) < len(ds.y_train)
    # The CNN (the default model) takes them as they are.
    make_model("cnn", ds.x_train.shape[1:], ds.num_classes, input_kind=ds.kind)


def test_uint8_rgb_and_0_255_float_images(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (9, 5, 6, 3), dtype=np.uint8)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 3])
    ds = load_dataset(write(tmp_path, x_train=x, y_train=y, x_test=x[:4], y_test=y[:4]))
    assert ds.x_train.shape == (9, 5, 6, 3) and ds.num_classes == 4 and len(ds.mean) == 3
    np.testing.assert_array_equal(ds.x_train, x)
    f = load_dataset(
        write(tmp_path, "f.npz", x_train=x.astype(np.float32), y_train=y, x_test=x[:4],
              y_test=y[:4])
    )  # fmt: skip
    np.testing.assert_array_equal(f.x_train, x)  # floats beyond 1: already 0..255


def test_feature_vectors(tmp_path):
    a = digits_arrays()
    a["x_train"], a["x_test"] = a["x_train"].reshape(600, 64), a["x_test"].reshape(200, 64)
    ds = load_dataset(write(tmp_path, **a))
    assert (ds.kind, ds.x_train.shape, ds.x_train.dtype) == ("features", (600, 64), np.float32)
    np.testing.assert_allclose(ds.x_test, a["x_test"], rtol=1e-6)
    assert ds.side == {}
    make_model("mlp", ds.x_train.shape[1:], ds.num_classes, input_kind=ds.kind)
    with pytest.raises(ValueError, match=r"model\.name='cnn'.*'features': mlp"):
        make_model("cnn", ds.x_train.shape[1:], ds.num_classes, input_kind=ds.kind)


def test_token_ids(tmp_path):
    x = np.array([[5, 3, 0, 0], [2, 2, 9, 0], [1, 4, 4, 4]], dtype=np.int64)
    ds = load_dataset(
        write(tmp_path, x_train=x, y_train=np.array([0, 1, 1]), x_test=x[:1], y_test=[1])
    )
    assert (ds.kind, ds.vocab_size, ds.num_classes) == ("tokens", 10, 2)
    assert ds.x_train.dtype == np.int32
    np.testing.assert_array_equal(ds.x_train, x)
    make_model("text", ds.x_train.shape[1:], 2, vocab_size=ds.vocab_size, input_kind=ds.kind)


def test_a_rewritten_file_is_loaded_again(tmp_path):
    a = digits_arrays(30, 10)
    name = write(tmp_path, **a)
    assert len(load_dataset(name).y_train) == 30
    write(tmp_path, **digits_arrays(40, 10))
    assert len(load_dataset(name).y_train) == 40


# ----------------------------------------------------------------------------- natural clients


def test_natural_partition_of_client_ids(tmp_path):
    a = digits_arrays(300, 100)
    a["client_train"] = np.r_[np.zeros(100), np.ones(80), np.full(60, 2), np.full(60, 7)]
    a["client_train"] = a["client_train"].astype(int)
    a["client_test"] = np.arange(100) % 4 * (np.arange(100) % 4 != 3) + 7 * (
        np.arange(100) % 4 == 3
    )
    ds = load_dataset(write(tmp_path, **a))
    p = build_partition(ds, num_clients=3, **PARTITION)
    # the 3 largest clients, largest first (ties by id): ids 0, 1, 2
    assert ds.side["writers"][p.assignments["writer"]].tolist() == [0, 1, 2]
    for k, w in enumerate([0, 1, 2]):
        train = np.sort(np.concatenate([p.clients["labeled"][k], p.clients["unlabeled"][k]]))
        np.testing.assert_array_equal(train, np.flatnonzero(a["client_train"] == w))
        assert len(p.clients["labeled"][k]) == round(0.5 * len(train))
        np.testing.assert_array_equal(
            p.clients["test"][k], 300 + np.flatnonzero(a["client_test"] == w)
        )
    np.testing.assert_array_equal(p.server["test_global"], 300 + np.arange(100))
    held = build_partition(ds, num_clients=3, **{**PARTITION, "holdout": 0.25})
    for k, w in enumerate([0, 1, 2]):  # a tuning run validates on each client's own rows
        assert set(held.clients["test"][k]) <= set(np.flatnonzero(a["client_train"] == w))
    with pytest.raises(ValueError, match=r"^num_clients=5 .*4 natural clients"):
        build_partition(ds, num_clients=5, **PARTITION)
    # Without test client ids the test split is dealt by the clients' train class shares.
    del a["client_test"]
    p = build_partition(load_dataset(write(tmp_path, "b.npz", **a)), num_clients=4, **PARTITION)
    assert sorted(np.concatenate(p.clients["test"]).tolist()) == list(range(300, 400))
    assert p.meta["natural_test"] == "dealt"
    digits = load_dataset(write(tmp_path, "c.npz", **digits_arrays(50, 10)))
    with pytest.raises(ValueError, match=r"^partition\.scheme='natural' .*client ids"):
        build_partition(digits, num_clients=2, **PARTITION)


# ----------------------------------------------------------------------------- end to end


# Enough local training that one round learns: every row labeled, 5 local epochs (a round
# compiles in seconds; the fast suite runs one).
LEARN = ("partition.labeled_fraction=1.0", "algorithm.local_epochs=5", "algorithm.lr=0.3")


def run_task(tmp_path, *overrides: str) -> dict:
    from fedjax_semi.cli import _task

    _task(compose_hydra(f"out_dir={tmp_path / 'run'}", "rounds=1", *overrides))
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_cli_run_on_npz_images_with_natural_clients(tmp_path):
    """`fedjax-semi dataset.name=npz:PATH partition.scheme=natural`: FedAvg, a round."""
    a = digits_arrays(480, 120)
    a["client_train"], a["client_test"] = np.arange(480) % 12, np.arange(120) % 12
    name = write(tmp_path, **a)
    summary = run_task(tmp_path, f"dataset.name={name}", "partition.scheme=natural",
                       "algorithm=fedavg", *LEARN)  # fmt: skip
    assert summary["final"]["accuracy"] > 0.3  # chance: 0.1


@pytest.mark.slow
@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_cli_run_on_npz_vectors_and_the_default_cnn(tmp_path, model):
    """Feature vectors with model=mlp; images with the default model (the CNN)."""
    a = digits_arrays(480, 120)
    if model == "mlp":
        a["x_train"], a["x_test"] = a["x_train"].reshape(480, 64), a["x_test"].reshape(120, 64)
    lr = "algorithm.lr=0.05" if model == "cnn" else "algorithm.lr=0.3"
    summary = run_task(tmp_path, f"dataset.name={write(tmp_path, **a)}", "partition=iid",
                       "algorithm=fedavg", f"model={model}", *LEARN, lr)  # fmt: skip
    assert summary["final"]["accuracy"] > 0.3


# ----------------------------------------------------------------------------- refusals


def _arrays(**changes):
    base = {
        "x_train": np.zeros((6, 4, 4), np.uint8), "y_train": np.array([0, 1, 2, 0, 1, 2]),
        "x_test": np.zeros((3, 4, 4), np.uint8), "y_test": np.array([0, 1, 2]),
    }  # fmt: skip
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


BAD_FILES = [
    ("missing y_test", _arrays(y_test=None), "array 'y_test' is missing (the file has ['x_test'"),
    ("lengths", _arrays(y_train=np.array([0, 1, 2])), "x_train has 6 examples but y_train 3"),
    ("float labels", _arrays(y_test=np.array([0.0, 1, 2])), "y_test is float64 [3]; labels are"),
    ("2-D labels", _arrays(y_test=np.zeros((3, 1), int)), "y_test is int64 [3, 1]; labels are"),
    ("negative labels", _arrays(y_train=np.array([0, 1, -1, 0, 1, 2])), "negative labels (min -1)"),
    ("shapes", _arrays(x_test=np.zeros((3, 5, 4), np.uint8)), "x_train examples are [4, 4] but"),
    ("rank", _arrays(x_train=np.zeros(6), x_test=np.zeros(3)), "images [N,H,W] or [N,H,W,C]"),
    ("client length", _arrays(client_train=np.zeros(5, int)), "client_train is int64 [5] for 6"),
    ("client dtype", _arrays(client_train=np.zeros(6)), "one integer client id per example"),
    (
        "client_test alone",
        _arrays(client_test=np.zeros(3, int)),
        "client_test without client_train",
    ),
    ("objects", _arrays(x_test=np.array(["a", "b", "c"])), "numeric arrays"),
]


def check_one_line(err: Exception, name: str, needle: str) -> None:
    msg = str(err)
    assert msg.startswith(f"dataset.name={name!r} is not allowed: "), msg
    assert needle in msg and "expected npz:PATH" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("arrays,needle", [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_bad_file_fails_with_one_line(tmp_path, arrays, needle):
    name = write(tmp_path, **arrays)
    for call in (is_known_dataset, load_dataset):
        with pytest.raises(ConfigError) as info:
            call(name)
        check_one_line(info.value, name, needle)


def test_no_file_and_not_a_npz(tmp_path):
    for name, needle in [
        (f"npz:{tmp_path / 'nope.npz'}", f"no file '{tmp_path / 'nope.npz'}'"),
        (f"npz:{tmp_path}", "is not a file"),
        ("npz:", "no path after 'npz:'"),
    ]:
        with pytest.raises(ConfigError) as info:
            is_known_dataset(name)
        check_one_line(info.value, name, needle)
    with pytest.raises(ConfigError, match=r"^dataset\.name='data\.npz' .*: npz:data\.npz \(your"):
        is_known_dataset("data.npz")
    (tmp_path / "x.npz").write_text("x_train,y_train\n1,2\n")
    with pytest.raises(ConfigError) as info:
        load_dataset(f"npz:{tmp_path / 'x.npz'}")
    check_one_line(info.value, f"npz:{tmp_path / 'x.npz'}", "is not a .npz file (not a zip")


def test_bad_values_found_on_loading(tmp_path):
    name = write(tmp_path, **_arrays(x_train=np.full((6, 4, 4), 300.0)))
    with pytest.raises(ConfigError, match=r"x_train has values in \[300\.0, 300\.0\]"):
        load_dataset(name)
    name = write(
        tmp_path, "t.npz", **_arrays(x_train=np.full((6, 4), -1), x_test=np.ones((3, 4), int))
    )
    with pytest.raises(ConfigError, match=r"token ids in \[-1, 1\]"):
        load_dataset(name)


def test_cli_refuses_a_bad_file_before_any_work(tmp_path, capsys):
    from fedjax_semi.cli import _task

    name = write(tmp_path, **_arrays(y_test=None))
    cfg = compose_hydra(f"out_dir={tmp_path / 'run'}", f"dataset.name={name}")
    with pytest.raises(SystemExit) as exit_:
        _task(cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("fedjax-semi: error: dataset.name=") and len(err.strip().splitlines()) == 1
    )
    assert "array 'y_test' is missing" in err and not (tmp_path / "run").exists()
    assert compose_config(f"dataset.name={write(tmp_path, 'ok.npz', **_arrays())}").dataset.name


# ----------------------------------------------------------------------------- tfds:NAME


def test_tfds_dataset_not_prepared_in_an_empty_data_dir(tmp_path, monkeypatch, capsys):
    """No network: the empty data dir is refused before TFDS is asked, with the command."""
    empty = tmp_path / "tfds"
    empty.mkdir()
    monkeypatch.setenv("TFDS_DATA_DIR", str(empty))
    for data_dir in (str(empty), None):  # dataset.data_dir, or $TFDS_DATA_DIR
        with pytest.raises(DatasetNotFoundError) as info:
            load_dataset("tfds:mnist", data_dir)
        msg = str(info.value)
        assert msg.startswith(
            f"dataset.name='tfds:mnist': not prepared in the TFDS data dir '{empty}'"
        )
        assert f"`tfds build mnist --data_dir={empty} --file_format=array_record`" in msg
        assert "\n" not in msg and info.value.looked_in == (empty / "mnist",)
    from fedjax_semi.cli import _task

    cfg = compose_hydra(f"out_dir={tmp_path / 'run'}", "dataset.name=tfds:mnist",
                        f"dataset.data_dir={empty}")  # fmt: skip
    with pytest.raises(SystemExit):
        _task(cfg)
    err = capsys.readouterr().err
    assert (
        "not prepared" in err and "tfds build mnist" in err and len(err.strip().splitlines()) == 1
    )
