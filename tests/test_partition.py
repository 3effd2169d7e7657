"""Property tests for fedjax_semi.data.partitions: the primitives, build_partition on the
generic schemes, and the paper schemes' defaults and presets (the schemes themselves:
test_partition_dofed.py, test_partition_paper.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.data.partitions import (
    PAPER_DEFAULTS,
    POOLED_FRACTIONS,
    Partition,
    build_partition,
    class_proportions,
    dirichlet_partition,
    iid_partition,
    labeled_split,
    shard_partition,
    split_by_proportions,
)
from fedjax_semi.data.registry import load_dataset
from partition_helpers import (
    DEFAULTS,
    SYN,
    SYN_BIG,
    all_labels,
    assert_sorted_i64,
    build,
    check_invariants,
    synthetic,
)

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


def test_paper_defaults_match_config():
    from dataclasses import asdict

    from fedjax_semi.config import PartitionConfig

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
