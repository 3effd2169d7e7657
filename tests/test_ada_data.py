"""Ada-FedSemi's data settings (spec ada_fedsemi.md 4.2-4.3; acceptance check 18): the server
pool drawn on SVHN's extra split and STL-10's unlabeled split, STL-10 resized to 32x32, the
cross-dataset pool CIFAR10(STL10), the pool-share knob of Fig. 13, IMDB as tokens, and the
non-IID-zeta partition at the paper's sizes. Datasets are fixtures written in the real on-disk
formats (test_image_loaders' writers); nothing touches the network."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.config import PartitionConfig, check_partition, validate
from fedjax_semi.config_groups import AdaPartition
from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions import build_partition
from fedjax_semi.data.registry import load_dataset
from fedjax_semi.errors import ConfigError
from fedjax_semi.models import num_params
from test_image_loaders import write_cifar10, write_stl_bin, write_svhn_mat

pytestmark = pytest.mark.usefixtures("isolated_data_env")


def partition(ds: ArrayDataset, num_clients: int, seed: int = 0, **knobs):
    """The ada partition as experiment.make_partition builds it from a PartitionConfig."""
    cfg = dataclasses.asdict(PartitionConfig(scheme="ada", val_fraction=0.2))
    ada = {k: knobs.pop(k) for k in list(knobs) if k in cfg["ada"]}  # partition.ada's knobs
    cfg = {**cfg, **knobs, "ada": {**cfg["ada"], **ada}}
    cfg.pop("file")
    return build_partition(ds, num_clients=num_clients, seed=seed, **cfg)


# ----------------------------------------------------------------------------- fixtures


def write_svhn(root: Path, n_train: int = 120, n_test: int = 40, n_extra: int = 80) -> Path:
    d = root / "svhn"
    d.mkdir(parents=True)
    write_svhn_mat(d / "train_32x32.mat", n_train, seed=0)
    write_svhn_mat(d / "test_32x32.mat", n_test, seed=1)
    write_svhn_mat(d / "extra_32x32.mat", n_extra, seed=2)
    return root


def write_stl10(root: Path, n_train: int = 40, n_test: int = 40, n_unl: int = 60) -> Path:
    d = root / "stl10" / "stl10_binary"
    d.mkdir(parents=True)
    write_stl_bin(d / "train_X.bin", n_train, seed=0)
    write_stl_bin(d / "test_X.bin", n_test, seed=1)
    write_stl_bin(d / "unlabeled_X.bin", n_unl, seed=2)
    (np.arange(n_train) % 10 + 1).astype(np.uint8).tofile(d / "train_y.bin")
    (np.arange(n_test) % 10 + 1).astype(np.uint8).tofile(d / "test_y.bin")
    return root


def write_imdb(root: Path, per_class: int = 40) -> Path:
    """aclImdb/{train,test}/{pos,neg}/*.txt: words 'good'/'bad' tell the class, plus noise."""
    rng = np.random.default_rng(0)
    noise = [f"w{i}" for i in range(20)]
    for split in ("train", "test"):
        for lab, word in (("pos", "good"), ("neg", "bad")):
            d = root / "aclImdb" / split / lab
            d.mkdir(parents=True)
            for i in range(per_class):
                words = [word, *rng.choice(noise, 9)]
                (d / f"{i}_5.txt").write_text(" ".join(rng.permutation(words)))
    return root


# Every preset run here: 4 clients, the CPU, one seed, no files beyond the run's own.
TINY = ["num_clients=4", "hardware=cpu", "replicas=1", "save_partition=false", "writers=[jsonl]"]


# ----------------------------------------------------------------------------- SVHN


def test_svhn_pool_draws_on_the_extra_split(tmp_path):
    ds = load_dataset("svhn", data_dir=str(write_svhn(tmp_path)))
    n_train, n_base = 120, 160
    p = partition(ds, 4, labeled_fraction=0.25, server_unlabeled_extra=True,
                  server_unlabeled_size=100)  # fmt: skip
    pool, lab = p.server["server_unlabeled"], np.concatenate(p.clients["labeled"])
    assert len(pool) == 100 and len(lab) == 30
    rest = np.setdiff1d(np.arange(n_train), lab)
    candidates = np.concatenate([rest, n_base + np.arange(80)])  # 90 + 80 = 170
    assert np.isin(pool, candidates).all() and not np.isin(pool, lab).any()
    assert (pool >= n_base).sum() > 30 and (pool < n_train).sum() > 30  # both parts drawn on
    assert p.meta["index_layout"] == "concat(train, test, unlabeled split)"
    assert p.meta["pool_split_size"] == 80
    with pytest.raises(ValueError, match=r"^partition\.ada\.server_unlabeled_size=171 .*<= 170"):
        partition(ds, 4, labeled_fraction=0.25, server_unlabeled_extra=True,
                  server_unlabeled_size=171)  # fmt: skip


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_svhn_preset_builds_the_pool_with_hidden_labels_and_runs_a_round(tmp_path):
    root = write_svhn(tmp_path / "data")
    cfg = compose_config(
        "+experiment=ada_svhn", f"dataset.data_dir={root}", *TINY,
        "partition.labeled_fraction=0.25", "partition.val_fraction=0.25",
        "partition.ada.server_unlabeled_size=100", "model.width=0.25", "algorithm.local_steps=2",
        "rounds=1", small=False,
    )  # fmt: skip
    exp = experiment.build(cfg)
    ds, part, fed = exp.dataset, exp.partition, exp.fed
    virtual = part.server["server_unlabeled"]  # train rows, and 160 + j for extra row j
    pool = np.asarray(fed.server["server_unlabeled"])
    assert len(pool) == 100 and pool.min() >= 160  # appended after train and test
    x_all = np.concatenate([ds.x_train, ds.x_test, ds.side["x_extra"]])
    y_all = np.concatenate([ds.y_train, ds.y_test, ds.side["y_extra"]])
    np.testing.assert_array_equal(np.asarray(fed.x)[pool], x_all[virtual])
    np.testing.assert_array_equal(np.asarray(fed.eval_y)[pool], y_all[virtual])  # for pl_acc
    assert (np.asarray(fed.y)[pool] == -1).all()  # never visible to training
    # A saved partition with rows past the test split loads against the same dataset.
    part.save(tmp_path / "p.npz")
    experiment.load_partition_file(str(tmp_path / "p.npz"), ds, 4)

    summary = experiment.run(exp, tmp_path / "run")
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert summary["rounds_completed"] == 1 and 0 <= row["num_pseudo"] <= 100
    # SVHN's clock: 75 s a client round plus t_p per pseudo-labeled sample (docs/choices.md).
    assert row["round_time_s"] == pytest.approx(75.0 + 1.5e-4 * row["num_pseudo"], rel=1e-5)
    # Its traffic: the model's own size (4 bytes a parameter) both ways per participant.
    w = 4 * num_params(jax.eval_shape(exp.model.init, jax.random.key(0)))
    assert row["round_traffic_gb"] == pytest.approx(row["n"] * 2 * w / 1e9, rel=1e-5)


# ----------------------------------------------------------------------------- STL-10


def test_stl10_resized_to_32_with_its_unlabeled_split_as_the_pool(tmp_path):
    root = write_stl10(tmp_path)
    cfg = compose_config(
        "+experiment=ada_stl10", f"dataset.data_dir={root}", *TINY,
        "partition.ada.server_unlabeled_size=30", small=False,
    )  # fmt: skip
    exp = experiment.build(cfg)
    ds, part, fed = exp.dataset, exp.partition, exp.fed
    assert ds.x_train.shape == (40, 32, 32, 3) and np.asarray(fed.x).shape[1:] == (32, 32, 3)
    np.testing.assert_array_equal(exp.partition.counts()["labeled"], 10)  # all 40 train images
    virtual = part.server["server_unlabeled"]
    assert len(virtual) == 30 and virtual.min() >= 80  # only unlabeled_X.bin rows
    pool = np.asarray(fed.server["server_unlabeled"])
    raw = load_dataset("stl10", data_dir=str(root)).side["x_unlabeled"]
    want = experiment.resize_images(np.asarray(raw[virtual - 80]), (32, 32, 3))
    np.testing.assert_array_equal(np.asarray(fed.x)[pool], want)
    assert (np.asarray(fed.eval_y)[pool] == -1).all()  # STL-10's pool has no labels at all
    assert len(fed.server["server_val"]) == 10 and len(fed.server["test_global"]) == 30
    # Without its unlabeled split the pool would be empty: one line naming the setting.
    with pytest.raises(ConfigError, match=r"^partition\.labeled_fraction=1\.0 .*server_unlabeled"):
        experiment.build(compose_config(
            "+experiment=ada_stl10", f"dataset.data_dir={root}", *TINY,
            "partition.ada.server_unlabeled_extra=false", "partition.ada.server_unlabeled_size=0",
            small=False,
        ))  # fmt: skip


# ----------------------------------------------------------------------------- CIFAR10(STL10)


def test_cross_dataset_pool_is_stl10_unlabeled_resized_and_nested(tmp_path):
    write_cifar10(tmp_path / "cifar10", n=8, n_test=10)
    write_stl10(tmp_path / "s")

    def pool_images(fraction: float) -> np.ndarray:
        cfg = compose_config(
            "+experiment=ada_cross", f"dataset.data_dir={tmp_path}",
            f"dataset.server_pool_dir={tmp_path / 's'}", *TINY,
            f"partition.ada.server_unlabeled_fraction={fraction}", small=False,
        )  # fmt: skip
        fed = experiment.build(cfg).fed
        pool = np.asarray(fed.server["server_unlabeled"])
        assert pool.min() == 50 and (np.asarray(fed.eval_y)[pool] == -1).all()
        return np.asarray(fed.x)[pool]

    full, half = pool_images(1.0), pool_images(0.5)
    assert full.shape == (60, 32, 32, 3) and half.shape == (30, 32, 32, 3)  # unlabeled split only
    raw = load_dataset("stl10", data_dir=str(tmp_path / "s")).side["x_unlabeled"]
    np.testing.assert_array_equal(full, experiment.resize_images(np.asarray(raw), (32, 32, 3)))
    rows = {r.tobytes() for r in full}
    assert all(r.tobytes() in rows for r in half)  # a share is a subset of the whole
    with pytest.raises(ConfigError, match=r"^partition\.ada\.server_unlabeled_extra=True"):
        experiment.build(compose_config(
            "+experiment=ada_cross", f"dataset.data_dir={tmp_path}",
            f"dataset.server_pool_dir={tmp_path / 's'}", *TINY,
            "partition.ada.server_unlabeled_extra=true", small=False,
        ))  # fmt: skip


# ----------------------------------------------------------------------------- IMDB


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_imdb_preset_as_tokens_runs_a_round(tmp_path):
    root = write_imdb(tmp_path / "data")
    cfg = compose_config(
        "+experiment=ada_imdb_table7", f"dataset.data_dir={root}", *TINY,
        "dataset.vocab_size=40", "dataset.seq_len=10", "model.embed_dim=8", "model.width=0.1",
        "algorithm.local_steps=2", "rounds=1", small=False,
    )  # fmt: skip
    exp = experiment.build(cfg)
    assert exp.dataset.kind == "tokens" and exp.model.name == "text_cnn"
    assert np.asarray(exp.fed.x).shape[1:] == (10,)
    assert len(exp.fed.server["server_unlabeled"]) == 64  # 80 train reviews - 16 labeled
    assert len(exp.fed.server["server_val"]) == 16
    experiment.run(exp, tmp_path / "run")
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["round_time_s"] == pytest.approx(45.0 + 1.5e-4 * row["num_pseudo"], rel=1e-5)
    assert row["n"] == int(np.ceil(round(row["P"], 1) * 4))  # n = ceil(P M), M = 4
    with pytest.raises(ConfigError, match=r"^dataset\.image_size=32 .*tokens"):
        experiment.build(compose_config(
            "+experiment=ada_imdb_table7", f"dataset.data_dir={root}", *TINY,
            "dataset.image_size=32", small=False,
        ))  # fmt: skip


# ----------------------------------------------------------------------------- Fig. 13's knob


def _labels_only(y_train: np.ndarray, y_test: np.ndarray, n_extra: int = 0) -> ArrayDataset:
    """A dataset of 1x1 images with the given labels (partitions read only the labels)."""
    x = lambda n: np.zeros((n, 1, 1, 1), np.uint8)  # noqa: E731
    side = {"x_extra": x(n_extra)} if n_extra else {}
    return ArrayDataset("labels", x(len(y_train)), y_train.astype(np.int32), x(len(y_test)),
                        y_test.astype(np.int32), 10, (0.0,), (1.0,), side=side)  # fmt: skip


def test_pool_shares_are_nested_random_subsets():
    y = np.repeat(np.arange(10), 100)
    ds = _labels_only(y, y[:200])
    pools = {f: partition(ds, 20, server_unlabeled_fraction=f).server["server_unlabeled"]
             for f in (0.2, 0.4, 1.0)}  # fmt: skip
    # Shares of the 900 train samples the 10% labeled pool leaves.
    assert [len(pools[f]) for f in (0.2, 0.4, 1.0)] == [180, 360, 900]
    assert np.isin(pools[0.2], pools[0.4]).all() and np.isin(pools[0.4], pools[1.0]).all()
    # The labeled clients, validation and test sets do not move with the share.
    a, b = partition(ds, 20, server_unlabeled_fraction=0.2), partition(ds, 20)
    for role in ("labeled", "test"):
        for u, v in zip(a.clients[role], b.clients[role], strict=True):
            np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(a.server["server_val"], b.server["server_val"])
    # Its classes are not chosen: the 20% share holds every class.
    assert len(np.unique(y[pools[0.2]])) == 10


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, "half"])
def test_bad_pool_share_is_one_line(value):
    with pytest.raises(ConfigError) as e:
        check_partition(
            PartitionConfig(scheme="ada", ada=AdaPartition(server_unlabeled_fraction=value))
        )
    msg = str(e.value)
    assert msg.startswith(f"partition.ada.server_unlabeled_fraction={value!r}") and "(0, 1]" in msg
    assert "\n" not in msg


def test_other_bad_inputs_are_one_line(tmp_path):
    y = np.repeat(np.arange(10), 10)
    ds = _labels_only(y, y[:50])
    with pytest.raises(
        ValueError, match=r"^partition\.ada\.server_unlabeled_extra=True .*no unlabeled"
    ):
        partition(ds, 4, server_unlabeled_extra=True)
    with pytest.raises(ValueError, match=r"^partition\.val_fraction=0\.001 .*non-empty"):
        partition(ds, 4, val_fraction=0.001)
    with pytest.raises(ConfigError, match=r"^partition\.ada\.server_unlabeled_extra='yes'"):
        check_partition(
            PartitionConfig(scheme="ada", ada=AdaPartition(server_unlabeled_extra="yes"))
        )
    with pytest.raises(ConfigError, match=r"^dataset\.image_size=0 "):
        validate(compose_config("dataset.image_size=0"))
    # A share that keeps nothing of a small pool.
    with pytest.raises(ConfigError, match=r"^partition\.ada\.server_unlabeled_fraction=0\.0001 "):
        experiment.build(compose_config(
            "partition=ada", "algorithm=ada_fedsemi", "partition.val_fraction=0.2",
            "partition.ada.server_unlabeled_fraction=0.0001",
        ))  # fmt: skip


# ----------------------------------------------------------------------------- check 18


SVHN_TRAIN = [4948, 13861, 10585, 8497, 7458, 6882, 5727, 5595, 5045, 4659]  # 73,257
SVHN_TEST = [1744, 5099, 4149, 2882, 2523, 2384, 1977, 2019, 1660, 1595]  # 26,032


@pytest.mark.parametrize(
    ("name", "train", "test", "extra", "knobs", "sizes"),
    [
        # CIFAR-10: 10k labeled (500 a client), 40k pool, 2k validation, 8k test.
        ("cifar10", [5000] * 10, [1000] * 10, 0,
         dict(labeled_fraction=0.2, val_fraction=0.2, zeta=0.5), (500, 40_000, 2000, 8000)),
        # SVHN: 3,660 labeled (183), 100k of 69,597 + 531,131, 6,032 validation, 20,000 test.
        ("svhn", SVHN_TRAIN, SVHN_TEST, 531_131,
         dict(labeled_fraction=0.04996, val_fraction=0.23171, zeta=0.5,
              server_unlabeled_extra=True, server_unlabeled_size=100_000),
         (183, 100_000, 6032, 20_000)),
        # STL-10: the 5k train split labeled (250), non-IID-0.75; 2k validation, 6k test.
        ("stl10", [500] * 10, [800] * 10, 0,
         dict(labeled_fraction=1.0, val_fraction=0.25, zeta=0.75), (250, 0, 2000, 6000)),
    ],
)  # fmt: skip
def test_noniid_zeta_at_the_papers_sizes(name, train, test, extra, knobs, sizes):
    """Check 18: every client holds exactly N_L / M samples, round(zeta N_m) of its dominant
    class m mod Q; the clients' sets are disjoint and make up the labeled pool; the pool,
    validation and test sizes are the paper's (Sec. 5.2)."""
    y_tr = np.repeat(np.arange(10), train)
    y_te = np.repeat(np.arange(10), test)
    ds = _labels_only(y_tr, y_te, extra)
    p = partition(ds, 20, seed=3, **knobs)
    n_m, n_pool, n_val, n_test = sizes
    lab = p.clients["labeled"]
    assert [len(a) for a in lab] == [n_m] * 20
    flat = np.concatenate(lab)
    assert len(np.unique(flat)) == len(flat) == 20 * n_m and flat.max() < len(y_tr)
    dominant = int(round(knobs["zeta"] * n_m))
    assert [(y_tr[a] == m % 10).sum() for m, a in enumerate(lab)] == [dominant] * 20
    pool = p.server["server_unlabeled"]
    assert len(pool) == n_pool and not np.isin(pool, flat).any()
    assert len(p.server["server_val"]) == n_val and len(p.server["test_global"]) == n_test
    if name == "svhn":  # both parts of the 600,728-image pool are drawn on, in proportion
        share_extra = (pool >= len(y_tr) + len(y_te)).mean()
        assert share_extra == pytest.approx(531_131 / 600_728, abs=0.01)


def test_iid_histograms_are_close_to_uniform():
    """Check 18, IID: CIFAR-10's sizes, 500 samples a client, about 50 of each class."""
    y = np.repeat(np.arange(10), 5000)
    ds = _labels_only(y, np.repeat(np.arange(10), 1000))
    p = partition(ds, 20, labeled_fraction=0.2, variant="iid")
    hist = np.stack([np.bincount(y[a], minlength=10) for a in p.clients["labeled"]])
    assert (hist.sum(1) == 500).all()
    # Multinomial(500, 1/10): std ~6.7 a cell; 20 x 10 cells stay within 5 std of 50.
    assert np.abs(hist - 50).max() < 34
    assert hist.max(1).mean() < 70  # far from one dominant class (non-IID-0.5 gives 250)
