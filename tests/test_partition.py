"""Property tests for fedjax_semi.data.partitions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.data.partitions import (
    PAPER_DEFAULTS,
    POOLED_FRACTIONS,
    SCHEME_GROUP,
    Partition,
    apply_client_transforms,
    build_partition,
    class_proportions,
    dirichlet_partition,
    iid_partition,
    labeled_split,
    shard_partition,
    split_by_proportions,
)
from fedjax_semi.data.registry import ArrayDataset, load_dataset

DEFAULTS = dict(
    num_clients=10,
    scheme="dirichlet",
    alpha=0.5,
    classes_per_client=2,
    labeled_fraction=0.1,
    labeled_mode="fixed",
    label_ratio_alpha=0.5,
    split="official",
    val_fraction=0.0,
    min_client_size=10,
    seed=0,
    holdout=0.0,
)


def synthetic(n_train: int = 2000, n_test: int = 500, num_classes: int = 10) -> ArrayDataset:
    """Balanced labels with 1x1 images: build_partition only looks at labels."""
    y_tr = (np.arange(n_train) % num_classes).astype(np.int32)
    y_te = (np.arange(n_test) % num_classes).astype(np.int32)
    x_tr = np.zeros((n_train, 1, 1, 1), np.uint8)
    x_te = np.zeros((n_test, 1, 1, 1), np.uint8)
    return ArrayDataset("synthetic", x_tr, y_tr, x_te, y_te, num_classes, (0.0,), (1.0,))


SYN = synthetic()


def build(ds: ArrayDataset = SYN, **overrides) -> Partition:
    """build_partition with DEFAULTS under `overrides`; a knob of the scheme's group (e.g.
    min_classes with scheme=cofed: partition.cofed.min_classes) goes into that group."""
    kw = {**DEFAULTS, **overrides}
    group = SCHEME_GROUP.get(kw["scheme"])
    own = {k: kw.pop(k) for k in list(kw) if group and k in PAPER_DEFAULTS[group]}
    if own:
        kw[group] = {**kw.get(group, {}), **own}
    return build_partition(ds, **kw)


def all_labels(ds: ArrayDataset) -> np.ndarray:
    return np.concatenate([ds.y_train, ds.y_test])


def assert_sorted_i64(lists):
    for a in lists:
        assert a.dtype == np.int64
        assert np.all(np.diff(a) > 0)


def check_invariants(p: Partition, ds: ArrayDataset) -> None:
    n_tr = len(ds.y_train)
    n_all = n_tr + len(ds.y_test)
    roles = list(p.clients)
    for r in roles:
        assert len(p.clients[r]) == p.num_clients
        assert_sorted_i64(p.clients[r])
    # Disjoint within and across clients and roles.
    everything = np.concatenate([a for r in roles for a in p.clients[r]])
    assert len(np.unique(everything)) == len(everything)
    assert everything.min() >= 0 and everything.max() < n_all
    train = np.concatenate(p.clients["labeled"] + p.clients["unlabeled"])
    evals = [np.concatenate(p.clients[r]) for r in roles if r in ("test", "val")]
    if p.meta["split"] == "official":
        # Every official train sample assigned exactly once to labeled ∪ unlabeled.
        np.testing.assert_array_equal(np.sort(train), np.arange(n_tr))
        np.testing.assert_array_equal(np.sort(np.concatenate(evals)), np.arange(n_tr, n_all))
    else:
        # Pooled: the three pools cover everything exactly once, 70/10/20.
        np.testing.assert_array_equal(np.sort(np.concatenate([train, *evals])), np.arange(n_all))
        assert len(train) == int(0.7 * n_all)
    np.testing.assert_array_equal(
        np.sort(np.concatenate(p.clients["test"])), p.server["test_global"]
    )
    assert p.mu.shape == (p.num_clients,)


# ----------------------------------------------------------------------------- primitives


@given(n=st.integers(0, 500), k=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_iid_partition(n, k, seed):
    parts = iid_partition(n, k, np.random.default_rng(seed))
    assert len(parts) == k
    assert_sorted_i64(parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=examples(40), deadline=None)
@given(
    num_classes=st.integers(2, 10),
    per_class=st.integers(10, 60),
    k=st.integers(1, 12),
    alpha=st.sampled_from([0.05, 0.3, 1.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_dirichlet_partition_properties(num_classes, per_class, k, alpha, seed):
    labels = np.repeat(np.arange(num_classes), per_class)
    n = len(labels)
    min_size = min(5, n // k)
    try:
        parts, props = dirichlet_partition(labels, k, alpha, np.random.default_rng(seed), min_size)
    except ValueError as e:  # allowed for very skewed draws; message must help
        assert "alpha" in str(e) and "min" in str(e)
        return
    assert_sorted_i64(parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    assert min(len(p) for p in parts) >= min_size
    assert props.shape == (num_classes, k)
    np.testing.assert_allclose(props.sum(axis=1), 1.0)
    # Realized class shares differ from the draw only by the integer cut (< 1 sample).
    realized = class_proportions(labels, parts, num_classes)
    assert np.abs(realized - props).max() <= 1.0 / per_class + 1e-9


def test_dirichlet_min_size_respected_and_error():
    labels = np.repeat(np.arange(10), 100)
    parts, _ = dirichlet_partition(labels, 20, 0.1, np.random.default_rng(0), min_size=20)
    assert min(len(p) for p in parts) >= 20
    with pytest.raises(ValueError, match="larger alpha"):
        dirichlet_partition(labels, 50, 0.001, np.random.default_rng(0), min_size=19)


def test_dirichlet_large_alpha_is_near_uniform():
    labels = np.repeat(np.arange(10), 1000)
    parts, props = dirichlet_partition(labels, 10, 1e5, np.random.default_rng(0))
    np.testing.assert_allclose(props, 0.1, atol=0.01)
    shares = class_proportions(labels, parts, 10)
    np.testing.assert_allclose(shares, 0.1, atol=0.01)


def test_dirichlet_small_alpha_is_skewed():
    labels = np.repeat(np.arange(10), 1000)
    parts, _ = dirichlet_partition(labels, 10, 0.05, np.random.default_rng(0))
    shares = class_proportions(labels, parts, 10)
    assert shares.max(axis=1).mean() > 0.5


@settings(max_examples=examples(30), deadline=None)
@given(
    num_classes=st.integers(2, 10),
    cpc=st.integers(1, 4),
    mult=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_shards_exact_classes_when_divisible(num_classes, cpc, mult, seed):
    cpc = min(cpc, num_classes)
    # num_clients * cpc shards, num_classes | num_shards and equal class sizes: pure shards.
    num_clients = num_classes * mult
    per_class = 3 * num_clients * cpc // num_classes
    labels = np.repeat(np.arange(num_classes), per_class)
    parts = shard_partition(labels, num_clients, cpc, np.random.default_rng(seed))
    assert len(parts) == num_clients
    assert_sorted_i64(parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    for p in parts:
        assert len(np.unique(labels[p])) == cpc


def test_shards_cover_when_not_divisible():
    labels = np.random.default_rng(0).integers(0, 7, 1003)
    parts = shard_partition(labels, 13, 3, np.random.default_rng(1))
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1003))


def test_class_proportions_zero_row():
    labels = np.array([0, 0, 1, 1, 1])
    props = class_proportions(labels, [np.array([0, 2]), np.array([1, 3, 4])], 3)
    np.testing.assert_allclose(props, [[0.5, 0.5], [1 / 3, 2 / 3], [0.0, 0.0]])


def test_split_by_proportions_follows_rows():
    labels = np.repeat(np.arange(3), 100)
    props = np.array([[1.0, 0.0], [0.25, 0.75], [0.0, 0.0]])  # class 2 absent from train
    parts = split_by_proportions(labels, props, np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    counts = np.stack([np.bincount(labels[p], minlength=3) for p in parts], axis=1)
    np.testing.assert_array_equal(counts, [[100, 0], [25, 75], [50, 50]])


@given(
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=20),
    fraction=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_labeled_split_fixed(sizes, fraction, seed):
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    clients = [np.arange(offsets[k], offsets[k + 1], dtype=np.int64) for k in range(len(sizes))]
    lab, unl, mu = labeled_split(clients, np.random.default_rng(seed), fraction=fraction)
    for c, l_, u, m in zip(clients, lab, unl, mu, strict=True):
        n = len(c)
        expected = min(n, max(1, round(fraction * n)))
        assert len(l_) == expected
        np.testing.assert_array_equal(np.sort(np.concatenate([l_, u])), c)
        assert len(np.intersect1d(l_, u)) == 0
        assert m == (expected / n if n else 0.0)


def test_labeled_split_dirichlet_is_u_shaped():
    clients = [np.arange(k * 200, (k + 1) * 200) for k in range(100)]
    _, _, mu = labeled_split(clients, np.random.default_rng(0), ratio_alpha=0.1)
    assert (mu < 0.05).sum() >= 10 and (mu > 0.95).sum() >= 10
    assert 0.3 < mu.mean() < 0.7
    with pytest.raises(ValueError):
        labeled_split(clients, np.random.default_rng(0))
    with pytest.raises(ValueError):
        labeled_split(clients, np.random.default_rng(0), fraction=0.1, ratio_alpha=0.1)


# ----------------------------------------------------------------------------- build


@settings(max_examples=examples(25), deadline=None)
@given(
    scheme=st.sampled_from(["iid", "dirichlet", "shards"]),
    split=st.sampled_from(["official", "pooled"]),
    labeled_mode=st.sampled_from(["fixed", "dirichlet"]),
    val_fraction=st.sampled_from([0.0, 0.2]),
    num_clients=st.integers(1, 30),
    seed=st.integers(0, 1000),
)
def test_build_partition_invariants(scheme, split, labeled_mode, val_fraction, num_clients, seed):
    p = build(
        scheme=scheme,
        split=split,
        labeled_mode=labeled_mode,
        val_fraction=val_fraction,
        num_clients=num_clients,
        seed=seed,
    )
    check_invariants(p, SYN)
    has_val = split == "pooled" or val_fraction > 0
    assert ("val" in p.clients) == has_val
    assert set(p.clients) >= {"labeled", "unlabeled", "test"}


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("split", ["official", "pooled"])
def test_build_on_real_digits(scheme, split):
    ds = load_dataset("digits")
    p = build(ds, scheme=scheme, split=split, num_clients=20, val_fraction=0.1)
    check_invariants(p, ds)
    if scheme == "shards":
        y = all_labels(ds)
        n_cls = [
            len(np.unique(y[np.concatenate([a, b])]))
            for a, b in zip(p.clients["labeled"], p.clients["unlabeled"], strict=True)
        ]
        assert np.mean(n_cls) <= 2.5  # mostly exactly 2; shards may straddle a class edge


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_seeds_reproduce(scheme):
    a, b = build(scheme=scheme, seed=3), build(scheme=scheme, seed=3)
    c = build(scheme=scheme, seed=4)
    for r in a.clients:
        for x, y in zip(a.clients[r], b.clients[r], strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.mu, b.mu)
    assert any(
        not np.array_equal(x, y)
        for x, y in zip(a.clients["labeled"], c.clients["labeled"], strict=True)
    )


def test_stages_are_independent():
    # Changing the labeled fraction must not move samples between clients.
    a, b = build(labeled_fraction=0.1), build(labeled_fraction=0.5)
    for la, ua, lb, ub in zip(
        a.clients["labeled"],
        a.clients["unlabeled"],
        b.clients["labeled"],
        b.clients["unlabeled"],
        strict=True,
    ):
        np.testing.assert_array_equal(np.union1d(la, ua), np.union1d(lb, ub))
    for x, y in zip(a.clients["test"], b.clients["test"], strict=True):
        np.testing.assert_array_equal(x, y)


def test_large_alpha_near_uniform_in_build():
    ds = synthetic(20000, 2000)
    p = build(ds, alpha=1e5, num_clients=10)
    y = all_labels(ds)
    train = [
        np.concatenate([a, b])
        for a, b in zip(p.clients["labeled"], p.clients["unlabeled"], strict=True)
    ]
    shares = class_proportions(y, train, 10)
    np.testing.assert_allclose(shares, 0.1, atol=0.01)


def test_min_client_size_respected_in_build():
    p = build(alpha=0.3, num_clients=20, min_client_size=40)
    sizes = p.counts()["labeled"] + p.counts()["unlabeled"]
    assert sizes.min() >= 40


def test_fixed_labeled_fraction_in_build():
    p = build(labeled_fraction=0.25, alpha=0.3)
    n = p.counts()["labeled"] + p.counts()["unlabeled"]
    expected = np.maximum(1, [round(0.25 * v) for v in n])
    np.testing.assert_array_equal(p.counts()["labeled"], expected)
    np.testing.assert_allclose(p.mu, expected / n)


def test_dirichlet_labeled_mode_u_shaped_in_build():
    ds = synthetic(20000, 2000)
    p = build(ds, scheme="iid", num_clients=100, labeled_mode="dirichlet", label_ratio_alpha=0.1)
    assert (p.mu < 0.05).any() and (p.mu > 0.95).any()


@pytest.mark.parametrize("split", ["official", "pooled"])
def test_test_histogram_follows_train(split):
    ds = synthetic(20000, 5000)
    p = build(ds, alpha=0.3, num_clients=20, split=split, val_fraction=0.2)
    y = all_labels(ds)

    def hist(lists):
        return np.stack([np.bincount(y[a], minlength=10) for a in lists]).astype(float)

    train = hist(
        [
            np.concatenate(ab)
            for ab in zip(p.clients["labeled"], p.clients["unlabeled"], strict=True)
        ]
    )
    for role in ("test", "val"):
        other = hist(p.clients[role])
        assert np.corrcoef(train.ravel(), other.ravel())[0, 1] > 0.95
        # Each client's eval share of a class is close to its train share.
        np.testing.assert_allclose(
            other / other.sum(0, keepdims=True), train / train.sum(0, keepdims=True), atol=0.02
        )


def test_save_load_round_trip(tmp_path):
    p = build(val_fraction=0.2, labeled_mode="dirichlet", label_ratio_alpha=0.1)
    path = tmp_path / "part.partition"  # no .npz suffix: must be written exactly here
    p.save(path)
    assert path.is_file()
    q = Partition.load(path)
    assert q.meta == p.meta and q.num_clients == p.num_clients
    assert list(q.clients) == list(p.clients) and list(q.server) == list(p.server)
    for r in p.clients:
        for x, y in zip(p.clients[r], q.clients[r], strict=True):
            assert y.dtype == np.int64
            np.testing.assert_array_equal(x, y)
    for s in p.server:
        np.testing.assert_array_equal(p.server[s], q.server[s])
    np.testing.assert_array_equal(p.mu, q.mu)
    for r, c in p.counts().items():
        np.testing.assert_array_equal(c, q.counts()[r])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"alpha": 0.0}, "partition.alpha"),
        ({"alpha": -1.0}, "partition.alpha"),
        ({"alpha": float("nan")}, "partition.alpha"),
        ({"labeled_fraction": 0.0}, "partition.labeled_fraction"),
        ({"labeled_fraction": 1.5}, "partition.labeled_fraction"),
        ({"scheme": "zipf"}, "partition.scheme"),
        ({"labeled_mode": "random"}, "partition.labeled_mode"),
        ({"label_ratio_alpha": 0}, "partition.label_ratio_alpha"),
        ({"split": "train"}, "partition.split"),
        ({"val_fraction": 1.0}, "partition.val_fraction"),
        ({"classes_per_client": 0}, "partition.classes_per_client"),
        ({"classes_per_client": 11}, "partition.classes_per_client"),
        ({"min_client_size": -1}, "partition.min_client_size"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 201}, "num_clients"),  # 2000 samples / min size 10
        ({"num_clients": 2.5}, "num_clients"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments(overrides, key):
    with pytest.raises(ValueError) as info:
        build(**overrides)
    msg = str(info.value)
    assert msg.startswith(key + "=")
    assert repr(next(iter(overrides.values()))) in msg


# ----------------------------------------------------------------------------- paper schemes

PAPER_SCHEMES = ["subset", "normal", "cofed", "cfsl", "ada"]
TRAIN_ROLES = ("labeled", "unlabeled", "target_labeled", "target_unlabeled", "val")
# Small per-class sizes so that synthetic data has room for many clients.
DOFED_SMALL = dict(train_per_class=20, target_per_class=20, target_labeled_fraction=0.1)
SCHEME_KNOBS = {
    "subset": dict(DOFED_SMALL, test_per_class=5),
    "normal": dict(DOFED_SMALL, test_per_class=5),
    "cofed": dict(samples_per_class=10, min_classes=3, max_classes=5),
    "cfsl": dict(split="pooled"),
    "ada": dict(labeled_fraction=0.2, val_fraction=0.2),
}


def synthetic_coarse(per_fine: int = 100, per_fine_test: int = 20) -> ArrayDataset:
    """20 fine classes in 5 superclasses of 4 (fine c -> coarse c // 4), CIFAR-100 style."""
    y_tr = np.repeat(np.arange(20), per_fine).astype(np.int32)
    y_te = np.repeat(np.arange(20), per_fine_test).astype(np.int32)
    x_tr = np.zeros((len(y_tr), 1, 1, 1), np.uint8)
    x_te = np.zeros((len(y_te), 1, 1, 1), np.uint8)
    return ArrayDataset(
        "synthetic_coarse", x_tr, y_tr, x_te, y_te, 20, (0.0,), (1.0,),
        side={"y_train_coarse": y_tr // 4, "y_test_coarse": y_te // 4},
    )  # fmt: skip


SYN_BIG = synthetic(20000, 5000)
SYN_COARSE = synthetic_coarse()


@pytest.fixture(scope="module")
def fmnist() -> ArrayDataset:
    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist) is not installed")
    return load_dataset("fashion_mnist")


def build_paper(scheme: str, ds: ArrayDataset = SYN_BIG, **overrides) -> Partition:
    return build(ds, scheme=scheme, **{**SCHEME_KNOBS[scheme], **overrides})


def check_paper_invariants(p: Partition, ds: ArrayDataset, cross_disjoint: bool = True) -> None:
    """Roles sorted, disjoint within a client (and across clients unless the scheme shares
    them), server sets disjoint from each other and from every client role, tests inside
    test_global, assignments with a leading client axis."""
    n_tr = len(ds.y_train)
    n_all = n_tr + len(ds.y_test)
    c = p.num_clients
    for r, lists in p.clients.items():
        assert len(lists) == c, r
        assert_sorted_i64(lists)
        for a in lists:
            assert len(a) == 0 or (a.min() >= 0 and a.max() < n_all)
    for k in range(c):  # disjoint within a client
        mine = np.concatenate([p.clients[r][k] for r in p.clients])
        assert len(np.unique(mine)) == len(mine)
    train_roles = [r for r in p.clients if r in TRAIN_ROLES]
    train_all = np.concatenate([a for r in train_roles for a in p.clients[r]])
    if cross_disjoint:
        assert len(np.unique(train_all)) == len(train_all)
        tests = np.concatenate(p.clients["test"])
        assert len(np.unique(tests)) == len(tests)
    glob = p.server["test_global"]
    for a in p.clients["test"]:
        assert np.isin(a, glob).all()
    assert not np.isin(train_all, glob).any()
    others = [v for name, v in p.server.items() if name != "test_global"]
    for i, v in enumerate(others):  # server sets: disjoint from everything else
        assert v.dtype == np.int64 and len(np.unique(v)) == len(v)
        assert not np.isin(v, train_all).any() and not np.isin(v, glob).any()
        for w in others[i + 1 :]:
            assert not np.isin(v, w).any()
    assert p.mu.shape == (c,)
    for name, a in p.assignments.items():
        assert a.shape[0] == c, name


def labels_of(ds: ArrayDataset, idx: np.ndarray) -> np.ndarray:
    return all_labels(ds)[idx]


def test_paper_defaults_match_config():
    from dataclasses import asdict

    from fedjax_semi.config import PartitionConfig
    from fedjax_semi.data.partitions import PAPER_DEFAULTS

    cfg = asdict(PartitionConfig())
    del cfg["file"]
    for group, knobs in PAPER_DEFAULTS.items():
        assert cfg[group] == knobs, group
    # Every PartitionConfig field is a build_partition keyword (experiment.make_partition).
    assert set(cfg) == set(DEFAULTS) - {"num_clients", "seed"} | set(PAPER_DEFAULTS)


@pytest.mark.parametrize("name", ["subset", "normal", "cofed", "cfsl", "ada", "um_pfssl"])
def test_presets_compose_and_build(name):
    from dataclasses import asdict

    from conftest import compose_config

    cfg = compose_config(f"partition={name}")
    knobs = {k: v for k, v in asdict(cfg.partition).items() if k != "file"}
    p = build_partition(SYN_BIG, num_clients=cfg.num_clients, seed=cfg.seed, **knobs)
    assert p.meta["scheme"] == cfg.partition.scheme
    if name == "um_pfssl":
        assert (cfg.partition.labeled_mode, cfg.partition.split) == ("dirichlet", "pooled")
        assert cfg.partition.val_fraction == pytest.approx(POOLED_FRACTIONS[1])


# --- DoFed-SPP


@settings(max_examples=examples(20), deadline=None)
@given(
    num_clients=st.integers(1, 15),
    n_clusters=st.integers(2, 5),
    assignment=st.sampled_from(["even", "balanced", "random"]),
    overlap=st.sampled_from(["allow", "none"]),
    seed=st.integers(0, 1000),
)
def test_subset_properties(num_clients, n_clusters, assignment, overlap, seed):
    ds = SYN_BIG  # 2000 train / 500 test samples per class: enough for disjoint draws
    p = build_paper(
        "subset", num_clients=num_clients, n_clusters=n_clusters, assignment=assignment,
        overlap=overlap, seed=seed,
    )  # fmt: skip
    check_paper_invariants(p, ds)  # pools suffice, so even "allow" shares nothing
    assert set(p.clients) == {"labeled", "target_labeled", "target_unlabeled", "test"}
    clusters = [np.array(c) for c in p.meta["clusters"]]
    np.testing.assert_array_equal(np.sort(np.concatenate(clusters)), np.arange(10))
    assert min(len(c) for c in clusters) == 10 // n_clusters
    a, b = p.assignments["train_cluster"], p.assignments["target_cluster"]
    assert ((a >= 0) & (a < n_clusters) & (b >= 0) & (b < n_clusters) & (a != b)).all()
    if assignment in ("even", "balanced"):
        np.testing.assert_array_equal(
            np.bincount(a, minlength=n_clusters).max(), -(-num_clients // n_clusters)
        )
    if assignment == "even":  # train and target counts per cluster differ by at most 1
        assert np.ptp(np.bincount(a, minlength=n_clusters)) <= 1
        assert np.ptp(np.bincount(b, minlength=n_clusters)) <= 1
    for k in range(num_clients):
        tr_cls, tg_cls = clusters[a[k]], clusters[b[k]]
        np.testing.assert_array_equal(np.flatnonzero(p.assignments["train_classes"][k]), tr_cls)
        np.testing.assert_array_equal(np.flatnonzero(p.assignments["target_classes"][k]), tg_cls)
        for role, cls, per in [
            ("labeled", tr_cls, 20),
            ("target_labeled", tg_cls, 2),
            ("target_unlabeled", tg_cls, 18),
            ("test", tg_cls, 5),
        ]:
            idx = p.clients[role][k]
            counts = np.bincount(labels_of(ds, idx), minlength=10)
            np.testing.assert_array_equal(np.flatnonzero(counts), cls)  # target ⊂ its cluster
            assert (counts[cls] == per).all(), role
        assert (p.clients["labeled"][k] < len(ds.y_train)).all()
        assert (p.clients["test"][k] >= len(ds.y_train)).all()
    n_tr, n_tg = p.assignments["train_classes"].sum(1), p.assignments["target_classes"].sum(1)
    np.testing.assert_allclose(p.mu, (20 * n_tr + 2 * n_tg) / (20 * n_tr + 20 * n_tg))


def test_subset_leftover_classes_join_clusters():
    p = build_paper("subset", num_clients=6, n_clusters=4)  # 10 classes: 2 leftovers
    sizes = sorted(len(c) for c in p.meta["clusters"])
    assert sum(sizes) == 10 and sizes[0] == 2 and sizes[-1] <= 4


def test_subset_default_sizes_on_fashion_mnist(fmnist):
    p = build(fmnist, scheme="subset", num_clients=25)  # spec sizes: 1000 / 20 / 380 / 200
    check_paper_invariants(p, fmnist)
    np.testing.assert_array_equal(p.counts()["labeled"], 1000)
    np.testing.assert_array_equal(p.counts()["target_labeled"], 20)
    np.testing.assert_array_equal(p.counts()["target_unlabeled"], 380)
    np.testing.assert_array_equal(p.counts()["test"], 200)
    assert np.bincount(p.assignments["train_cluster"], minlength=5).tolist() == [5] * 5
    assert np.bincount(p.assignments["target_cluster"], minlength=5).tolist() == [5] * 5


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_clients", [7, 25, 40])
def test_subset_even_assignment(num_clients, seed):
    """The default: each cluster trains about N / Kc clients and is the target of about
    N / Kc clients (counts differ by at most 1), never a client's own train cluster; seeded."""
    p = build_paper("subset", num_clients=num_clients, seed=seed)
    a, b = p.assignments["train_cluster"], p.assignments["target_cluster"]
    assert (a != b).all()
    for x in (a, b):
        counts = np.bincount(x, minlength=5)
        assert counts.min() >= num_clients // 5 and np.ptp(counts) <= 1
    q = build_paper("subset", num_clients=num_clients, seed=seed)
    np.testing.assert_array_equal(q.assignments["target_cluster"], b)
    pairs = {(int(i), int(j)) for i, j in zip(a, b, strict=True)}
    assert num_clients < 10 or len(pairs) > 5  # not one fixed shift for everyone


def test_normal_fixed_total_is_the_default_and_matches_subset_totals():
    """NORMAL's default sizes: SUBSET's per-client totals (train, target labeled / unlabeled)."""
    sub = build_paper("subset", num_clients=8, seed=3)
    nor = build_paper("normal", num_clients=8, seed=3)
    for role in ("labeled", "target_labeled", "target_unlabeled"):
        np.testing.assert_array_equal(nor.counts()[role], sub.counts()[role])
    old = build_paper("normal", num_clients=8, seed=3, size_mode="per_class")
    assert not np.array_equal(old.counts()["labeled"], sub.counts()["labeled"])


@settings(max_examples=examples(20), deadline=None)
@given(
    num_clients=st.integers(1, 12),
    reject=st.sampled_from(["identical", "subset"]),
    size_mode=st.sampled_from(["per_class", "fixed_total"]),
    seed=st.integers(0, 1000),
)
def test_normal_properties(num_clients, reject, size_mode, seed):
    ds = SYN_BIG
    p = build_paper(
        "normal", num_clients=num_clients, reject=reject, size_mode=size_mode,
        seed=seed,
    )  # fmt: skip
    check_paper_invariants(p, ds)
    tr_m, tg_m = p.assignments["train_classes"], p.assignments["target_classes"]
    assert tr_m.shape == tg_m.shape == (num_clients, 10) and tr_m.dtype == bool
    for k in range(num_clients):
        tr, tg = np.flatnonzero(tr_m[k]), np.flatnonzero(tg_m[k])
        assert 2 <= len(tr) <= 10 and 2 <= len(tg) <= 10
        assert not np.array_equal(tr, tg)
        if reject == "subset":
            assert not np.isin(tg, tr).all()
        lab = np.bincount(labels_of(ds, p.clients["labeled"][k]), minlength=10)
        tl = np.bincount(labels_of(ds, p.clients["target_labeled"][k]), minlength=10)
        tu = np.bincount(labels_of(ds, p.clients["target_unlabeled"][k]), minlength=10)
        te = np.bincount(labels_of(ds, p.clients["test"][k]), minlength=10)
        assert set(np.flatnonzero(lab)) == set(tr) and set(np.flatnonzero(tl + tu)) == set(tg)
        assert set(np.flatnonzero(te)) == set(tg) and (te[tg] == 5).all()
        if size_mode == "per_class":
            assert (lab[tr] == 20).all() and (tl[tg] == 2).all() and (tu[tg] == 18).all()
        else:  # SUBSET totals (Kc=5: 2 classes) split evenly over the drawn classes
            assert lab.sum() == 40 and (tl + tu).sum() == 40 and tl.sum() == 4
            assert np.ptp(lab[tr]) <= 1 and np.ptp((tl + tu)[tg]) <= 1


def test_normal_fixed_total_on_cifar100_sizes_names_per_class():
    """100 classes of 500 (CIFAR-100's train split): SUBSET's totals (20 classes' worth) on 2
    drawn classes need 2,000 target samples of a class; the error names the way out."""
    ds = synthetic(50_000, 10_000, num_classes=100)
    knobs = dict(scheme="normal", num_clients=2, max_classes=2)
    with pytest.raises(ValueError, match=r"^partition\.dofed\.target_per_class=200 .*size_mode"):
        build(ds, **knobs)
    p = build(ds, **knobs, size_mode="per_class")
    np.testing.assert_array_equal(p.counts()["target_unlabeled"], 2 * 190)


def test_normal_on_fashion_mnist_and_overlap_modes(fmnist):
    p = build(fmnist, scheme="normal", num_clients=25, seed=1, size_mode="per_class")
    # The spec's per-class sizes exceed Fashion-MNIST's 6000 images per class: clients share
    # samples, but never within a client and, since classes are large, unlabeled samples stay
    # out of every labeled set.
    check_paper_invariants(p, fmnist, cross_disjoint=False)
    lab = np.concatenate(p.clients["labeled"] + p.clients["target_labeled"])
    unl = np.concatenate(p.clients["target_unlabeled"])
    assert not np.isin(unl, lab).any()
    assert p.meta["train_capped"] == 0
    with pytest.raises(ValueError, match=r"^partition\.dofed\.overlap='none'"):
        build(
            fmnist, scheme="normal", num_clients=25, seed=1, overlap="none",
            size_mode="per_class",
        )  # fmt: skip


def test_normal_target_has_priority_and_train_is_capped():
    ds = synthetic(200, 100)  # 20 train samples per class
    p = build(
        ds, scheme="normal", num_clients=8, train_per_class=20, target_per_class=10,
        target_labeled_fraction=0.1, test_per_class=5, seed=0, size_mode="per_class",
    )  # fmt: skip
    check_paper_invariants(p, ds, cross_disjoint=False)
    tr_m, tg_m = p.assignments["train_classes"], p.assignments["target_classes"]
    both = tr_m & tg_m
    assert both.any()
    for k in range(8):
        t = np.bincount(labels_of(ds, p.clients["target_labeled"][k]), minlength=10)
        t += np.bincount(labels_of(ds, p.clients["target_unlabeled"][k]), minlength=10)
        lab = np.bincount(labels_of(ds, p.clients["labeled"][k]), minlength=10)
        assert (t[tg_m[k]] == 10).all()  # full target sets
        assert (lab[both[k]] == 10).all()  # train capped at 20 - 10
    assert p.meta["train_capped"] == 10 * both.sum()


# --- CoFED


@settings(max_examples=examples(15), deadline=None)
@given(
    num_clients=st.integers(2, 12),
    variant=st.sampled_from(["iid", "noniid"]),
    coarse=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_cofed_properties(num_clients, variant, coarse, seed):
    ds = SYN_COARSE if coarse else SYN_BIG
    hi = 4 if coarse else 5
    p = build_paper(
        "cofed", ds, num_clients=num_clients, variant=variant, max_classes=hi,
        seed=seed,
    )  # fmt: skip
    check_paper_invariants(p, ds, cross_disjoint=False)  # tests are shared, as in the paper
    train = np.concatenate(p.clients["labeled"])
    assert len(np.unique(train)) == len(train)  # private sets never overlap
    pub = p.server["public"]
    assert len(pub) == round(0.2 * len(ds.y_train)) and pub.max() < len(ds.y_train)
    fmap = np.arange(20) // 4 if coarse else np.arange(10)
    n_tasks = fmap.max() + 1
    spaces, lmap = p.assignments["label_space"], p.assignments["label_map"]
    assert spaces.shape == (num_clients, n_tasks) and spaces.dtype == bool
    np.testing.assert_array_equal(lmap, np.tile(fmap, (num_clients, 1)))
    assert ((spaces.sum(1) >= 3) & (spaces.sum(1) <= hi)).all()
    owners = spaces.sum(0)
    assert all((owners[spaces[k]] >= 2).any() for k in range(num_clients))  # paper Eq. 2
    y = all_labels(ds)
    for k in range(num_clients):
        fine = y[p.clients["labeled"][k]]
        tasks = np.bincount(fmap[fine], minlength=n_tasks)
        if coarse or variant == "iid":
            np.testing.assert_array_equal(tasks, 10 * spaces[k])
        else:  # fine tasks, non-IID: Dir(alpha) counts over the owned classes
            assert tasks.sum() == 10 * spaces[k].sum() and not tasks[~spaces[k]].any()
        if coarse:
            for t in np.flatnonzero(spaces[k]):
                per_sub = np.bincount(fine[fmap[fine] == t], minlength=20)[fmap == t]
                if variant == "iid":  # evenly over the 4 subclasses
                    assert np.ptp(per_sub) <= 1
                else:
                    assert (per_sub > 0).sum() in (1, 2)
        test_tasks = fmap[y[p.clients["test"][k]]]
        expected = np.flatnonzero(spaces[k][fmap[ds.y_test]]) + len(ds.y_train)
        np.testing.assert_array_equal(p.clients["test"][k], expected)
        assert spaces[k][test_tasks].all()
    np.testing.assert_array_equal(p.mu, 1.0)


def test_cofed_on_fashion_mnist(fmnist):
    for variant in ("iid", "noniid"):
        p = build(fmnist, scheme="cofed", num_clients=100, variant=variant)
        check_paper_invariants(p, fmnist, cross_disjoint=False)
        assert p.meta["task_source"] == "fine"
        sizes = p.assignments["label_space"].sum(1)
        assert sizes.min() >= 6 and sizes.max() <= 8
        np.testing.assert_array_equal(p.counts()["labeled"], 50 * sizes)
        assert len(p.server["public"]) == 12000


def test_cofed_large_alpha_near_uniform_noniid():
    p = build_paper("cofed", num_clients=10, variant="noniid", alpha=1e5, samples_per_class=200)
    y = all_labels(SYN_BIG)
    for k in range(10):
        counts = np.bincount(y[p.clients["labeled"][k]], minlength=10)
        own = p.assignments["label_space"][k]
        assert np.abs(counts[own] - 200).max() <= 2


def test_cofed_capacity_error():
    with pytest.raises(ValueError, match=r"^partition\.cofed\.samples_per_class=5000"):
        build_paper("cofed", num_clients=10, samples_per_class=5000)


# --- CFSL


@settings(max_examples=examples(15), deadline=None)
@given(
    num_clients=st.integers(3, 40),
    num_edges=st.integers(1, 3),
    groups=st.integers(1, 4),
    transform=st.sampled_from(["label_permutation", "rotation", "none"]),
    split=st.sampled_from(["official", "pooled"]),
    seed=st.integers(0, 1000),
)
def test_cfsl_properties(num_clients, num_edges, groups, transform, split, seed):
    ds = SYN
    p = build_paper(
        "cfsl", ds, num_clients=num_clients, num_edges=num_edges, clusters=groups,
        transform=transform, split=split, seed=seed,
    )  # fmt: skip
    check_paper_invariants(p, ds)
    n_tr, n_all = len(ds.y_train), len(ds.y_train) + len(ds.y_test)
    train = np.concatenate(p.clients["labeled"] + p.clients["unlabeled"])
    every = np.sort(np.concatenate([train, *p.clients["test"]]))
    if split == "pooled":
        np.testing.assert_array_equal(every, np.arange(n_all))
        for k in range(num_clients):
            n_k = len(p.clients["test"][k]) + p.counts()["labeled"][k] + p.counts()["unlabeled"][k]
            assert len(p.clients["test"][k]) == round(0.2 * n_k)
    else:
        np.testing.assert_array_equal(np.sort(train), np.arange(n_tr))
    n = p.counts()["labeled"] + p.counts()["unlabeled"]
    np.testing.assert_array_equal(p.counts()["labeled"], np.maximum(1, np.round(0.1 * n)))
    edge, cluster = p.assignments["edge"], p.assignments["cluster"]
    assert edge.dtype == cluster.dtype == np.int64
    assert np.ptp(np.bincount(edge, minlength=num_edges)) <= 1 and edge.max() < num_edges
    for j in range(num_edges):
        assert np.ptp(np.bincount(cluster[edge == j], minlength=groups)) <= 1
    lm, rot = p.assignments["label_map"], p.assignments["rotation"]
    assert lm.shape == (num_clients, 10) and rot.shape == (num_clients,)
    for k in range(num_clients):
        np.testing.assert_array_equal(np.sort(lm[k]), np.arange(10))  # a permutation
        ident = np.array_equal(lm[k], np.arange(10))
        if transform == "label_permutation":
            assert ident == (cluster[k] == 0)
            if cluster[k]:
                assert (lm[k] != np.arange(10)).all()  # a derangement
        else:
            assert ident
    if transform == "rotation":
        np.testing.assert_array_equal(rot, (4 * cluster) // groups)
        assert set(rot[cluster > 0]) <= {1, 2, 3}
    else:
        assert not rot.any()
    # Clients of one group share its transform; different groups' label maps differ.
    for g in range(groups):
        rows = lm[cluster == g]
        assert (rows == rows[:1]).all()
    if transform == "label_permutation":
        assert len({tuple(r) for r in lm}) == len(np.unique(cluster))


def test_cfsl_on_fashion_mnist(fmnist):
    p = build(fmnist, scheme="cfsl", num_clients=200, split="pooled", num_edges=3)
    check_paper_invariants(p, fmnist)
    assert sorted(np.bincount(p.assignments["edge"]).tolist()) == [66, 67, 67]
    y = all_labels(fmnist)
    n_cls = [
        len(np.unique(y[np.concatenate([a, b, c])]))
        for a, b, c in zip(
            p.clients["labeled"], p.clients["unlabeled"], p.clients["test"], strict=True
        )
    ]
    assert max(n_cls) <= 2  # 400 shards of 175 within 7000-image classes: exactly 2 classes
    assert p.counts()["labeled"].min() >= 1


def test_cfsl_large_alpha_near_uniform():
    p = build_paper("cfsl", SYN_BIG, base="dirichlet", alpha=1e5, num_clients=10)
    y = all_labels(SYN_BIG)
    train = [
        np.concatenate(ab) for ab in zip(p.clients["labeled"], p.clients["unlabeled"], strict=True)
    ]
    np.testing.assert_allclose(class_proportions(y, train, 10), 0.1, atol=0.01)


def test_apply_client_transforms():
    ds = synthetic(400, 100)
    x = np.arange(500 * 2 * 3).reshape(500, 2, 3, 1).astype(np.int32)
    x = np.pad(x, ((0, 0), (0, 1), (0, 0), (0, 0)))  # 3x3 so that rot90 keeps the shape
    y = all_labels(ds)
    for transform in ("label_permutation", "rotation"):
        p = build_paper("cfsl", ds, num_clients=8, transform=transform, clusters=2)
        x2, y2 = apply_client_transforms(x, y, p)
        lm, rot = p.assignments["label_map"], p.assignments["rotation"]
        for r in p.clients:
            for k, idx in enumerate(p.clients[r]):
                np.testing.assert_array_equal(y2[idx], lm[k, y[idx]])
                np.testing.assert_array_equal(x2[idx], np.rot90(x[idx], rot[k], axes=(1, 2)))
        assert (y2 != y).any() if transform == "label_permutation" else (x2 != x).any()
    q = build(ds)  # generic partitions: identity
    x3, y3 = apply_client_transforms(x, y, q)
    assert x3 is x and np.array_equal(y3, y)


# --- Ada-FedSemi


@settings(max_examples=examples(15), deadline=None)
@given(
    num_clients=st.integers(10, 30),  # >= Q: a class can fill its dominant clients' shares
    variant=st.sampled_from(["iid", "noniid"]),
    zeta=st.sampled_from([0.0, 0.5, 0.75]),
    pool=st.sampled_from([0, 500]),
    seed=st.integers(0, 1000),
)
def test_ada_properties(num_clients, variant, zeta, pool, seed):
    ds = SYN_BIG
    p = build_paper(
        "ada", ds, num_clients=num_clients, variant=variant, zeta=zeta,
        server_unlabeled_size=pool, seed=seed,
    )  # fmt: skip
    check_paper_invariants(p, ds)
    n_tr, n_te = len(ds.y_train), len(ds.y_test)
    lab = np.sort(np.concatenate(p.clients["labeled"]))
    assert len(lab) == round(0.2 * n_tr)
    sizes = p.counts()["labeled"]
    assert np.ptp(sizes) <= 1  # N_m = N_L / M
    s_unl, s_val = p.server["server_unlabeled"], p.server["server_val"]
    if pool:
        assert len(s_unl) == pool
    else:
        np.testing.assert_array_equal(np.sort(np.concatenate([lab, s_unl])), np.arange(n_tr))
    assert len(s_val) == round(0.2 * n_te)
    np.testing.assert_array_equal(
        np.sort(np.concatenate([s_val, p.server["test_global"]])), np.arange(n_tr, n_tr + n_te)
    )
    np.testing.assert_array_equal(p.counts()["unlabeled"], 0)
    np.testing.assert_array_equal(p.mu, 1.0)
    y = all_labels(ds)
    if variant == "noniid" and -(-num_clients // 10) * round(zeta * sizes.max()) <= min(
        np.bincount(y[lab], minlength=10)
    ):  # no class runs out of samples for its dominant clients: shares are exact
        for m in range(num_clients):
            assert (y[p.clients["labeled"][m]] == m % 10).sum() == round(zeta * sizes[m])
        np.testing.assert_array_equal(p.assignments["dominant_class"], np.arange(num_clients) % 10)


def test_ada_on_fashion_mnist(fmnist):
    p = build(fmnist, scheme="ada", num_clients=20, labeled_fraction=0.2, val_fraction=0.2)
    check_paper_invariants(p, fmnist)
    np.testing.assert_array_equal(p.counts()["labeled"], 600)
    assert len(p.server["server_unlabeled"]) == 48000 and len(p.server["server_val"]) == 2000
    y = all_labels(fmnist)
    dom = [(y[a] == m % 10).mean() for m, a in enumerate(p.clients["labeled"])]
    np.testing.assert_array_equal(dom, 0.5)  # spec §7 test 18: exactly round(zeta N_m)
    q = build(fmnist, scheme="ada", num_clients=20, labeled_fraction=0.2, val_fraction=0.2,
              variant="iid")  # fmt: skip
    hist = np.stack([np.bincount(y[a], minlength=10) for a in q.clients["labeled"]])
    assert hist.min() > 30  # near uniform: 60 per class expected


def test_server_val_labels_visible_to_training():
    from fedjax_semi.data.federated import LABELED_ROLES, build_federated

    assert "server_val" in LABELED_ROLES and "target_labeled" in LABELED_ROLES
    ds = SYN
    p = build_paper("ada", ds, num_clients=5)
    fed = build_federated(ds.x_train, ds.y_train, ds.x_test, ds.y_test, p, 10)
    y, eval_y = np.asarray(fed.y), np.asarray(fed.eval_y)
    np.testing.assert_array_equal(y[p.server["server_val"]], eval_y[p.server["server_val"]])
    assert (y[p.server["server_unlabeled"]] == -1).all()
    assert (y[p.server["test_global"]] == -1).all()


# --- all paper schemes


@pytest.mark.parametrize("scheme", PAPER_SCHEMES)
def test_paper_seeds_reproduce(scheme):
    a, b, c = (build_paper(scheme, num_clients=10, seed=s) for s in (3, 3, 4))
    for r in a.clients:
        for x, y in zip(a.clients[r], b.clients[r], strict=True):
            np.testing.assert_array_equal(x, y)
    for name in a.server:
        np.testing.assert_array_equal(a.server[name], b.server[name])
    for name in a.assignments:
        np.testing.assert_array_equal(a.assignments[name], b.assignments[name])
    assert a.meta == b.meta
    assert any(
        not np.array_equal(x, y)
        for x, y in zip(a.clients["labeled"], c.clients["labeled"], strict=True)
    )


@pytest.mark.parametrize("scheme", PAPER_SCHEMES)
def test_paper_save_load_round_trip(scheme, tmp_path):
    p = build_paper(scheme, num_clients=7)
    path = tmp_path / f"{scheme}.npz"
    p.save(path)
    q = Partition.load(path)
    assert q.meta == p.meta
    assert list(q.clients) == list(p.clients) and list(q.server) == list(p.server)
    assert list(q.assignments) == list(p.assignments) and p.assignments
    for r in p.clients:
        for x, y in zip(p.clients[r], q.clients[r], strict=True):
            np.testing.assert_array_equal(x, y)
    for name in p.server:
        np.testing.assert_array_equal(p.server[name], q.server[name])
    for name, a in p.assignments.items():
        assert q.assignments[name].dtype == a.dtype and q.assignments[name].shape == a.shape
        np.testing.assert_array_equal(q.assignments[name], a)
    np.testing.assert_array_equal(p.mu, q.mu)


def test_old_npz_without_assignments_loads(tmp_path):
    p = build()
    assert p.assignments == {}
    path = tmp_path / "old.npz"
    p.save(path)
    with np.load(path) as z:  # rewrite it the way files were written before assignments
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["header"]))
    del header["assignments"]
    arrays["header"] = np.array(json.dumps(header))
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    q = Partition.load(path)
    assert q.assignments == {}
    for x, y in zip(p.clients["labeled"], q.clients["labeled"], strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"scheme": "subset", "n_clusters": 1}, "partition.dofed.n_clusters"),
        ({"scheme": "subset", "n_clusters": 11}, "partition.dofed.n_clusters"),
        ({"scheme": "subset", "assignment": "greedy"}, "partition.dofed.assignment"),
        ({"scheme": "subset", "train_per_class": 0}, "partition.dofed.train_per_class"),
        ({"scheme": "subset", "target_per_class": 2.5}, "partition.dofed.target_per_class"),
        (
            {"scheme": "subset", "target_labeled_fraction": 0.0},
            "partition.dofed.target_labeled_fraction",
        ),
        ({"scheme": "subset", "test_per_class": 0}, "partition.dofed.test_per_class"),
        ({"scheme": "subset", "overlap": "some"}, "partition.dofed.overlap"),
        ({"scheme": "subset", "split": "pooled"}, "partition.split"),
        ({"scheme": "subset", "val_fraction": 0.1}, "partition.val_fraction"),
        ({"scheme": "normal", "max_classes": 1}, "partition.dofed.max_classes"),
        (
            {"scheme": "normal", "min_classes": 11, "max_classes": 12},
            "partition.dofed.min_classes",
        ),
        ({"scheme": "normal", "reject": "never"}, "partition.dofed.reject"),
        ({"scheme": "normal", "size_mode": "total"}, "partition.dofed.size_mode"),
        ({"scheme": "subset", "assignment": "evenly"}, "partition.dofed.assignment"),
        ({"scheme": "cofed", "variant": "niid"}, "partition.cofed.variant"),
        (
            {"scheme": "cofed", "min_classes": 11, "max_classes": 12},
            "partition.cofed.min_classes",
        ),
        ({"scheme": "cofed", "max_classes": 5}, "partition.cofed.max_classes"),
        ({"scheme": "cofed", "samples_per_class": 0}, "partition.cofed.samples_per_class"),
        ({"scheme": "cofed", "max_subclasses": 0}, "partition.cofed.max_subclasses"),
        ({"scheme": "cofed", "public_fraction": 1.0}, "partition.cofed.public_fraction"),
        ({"scheme": "cfsl", "num_edges": 0}, "partition.cfsl.num_edges"),
        ({"scheme": "cfsl", "num_edges": 11}, "partition.cfsl.num_edges"),
        ({"scheme": "cfsl", "clusters": 0}, "partition.cfsl.clusters"),
        (
            {"scheme": "cfsl", "transform": "rotation", "clusters": 5},
            "partition.cfsl.clusters",
        ),  # fmt: skip
        ({"scheme": "cfsl", "transform": "flip"}, "partition.cfsl.transform"),
        ({"scheme": "cfsl", "base": "cfsl"}, "partition.cfsl.base"),
        ({"scheme": "cfsl", "local_test_fraction": -0.1}, "partition.cfsl.local_test_fraction"),
        ({"scheme": "ada", "variant": "mixed"}, "partition.ada.variant"),
        ({"scheme": "ada", "zeta": 1.5}, "partition.ada.zeta"),
        ({"scheme": "ada", "server_unlabeled_size": -1}, "partition.ada.server_unlabeled_size"),
        ({"scheme": "ada", "server_unlabeled_size": 1801}, "partition.ada.server_unlabeled_size"),
        ({"scheme": "ada", "val_fraction": 0.0}, "partition.val_fraction"),
        ({"scheme": "ada", "labeled_fraction": 0.001}, "partition.labeled_fraction"),
        ({"scheme": "iid", "bogus_knob": 1}, "partition.bogus_knob"),
    ],
)
def test_paper_bad_arguments(overrides, key):
    defaults = {"ada": {"val_fraction": 0.2, "labeled_fraction": 0.1}}.get(overrides["scheme"], {})
    with pytest.raises(ValueError) as info:
        build(**{**defaults, **overrides})
    msg = str(info.value)
    assert msg.startswith(key + "="), msg
    value = overrides[key.split(".")[-1]]
    assert repr(value) in msg


def test_config_validate_checks_paper_knobs():
    from fedjax_semi.config import ConfigError, PartitionConfig, check_partition
    from fedjax_semi.config_groups import AdaPartition

    check_partition(PartitionConfig(scheme="cfsl"))
    with pytest.raises(ConfigError, match=r"^partition\.ada\.zeta=2\.0"):
        check_partition(PartitionConfig(scheme="ada", ada=AdaPartition(zeta=2.0)))
    with pytest.raises(ConfigError, match=r"^partition\.scheme='zipf'"):
        check_partition(PartitionConfig(scheme="zipf"))
