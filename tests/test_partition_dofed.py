"""Property tests for DoFed-SPP's SUBSET and NORMAL partitions (its Sec. 6.1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from partition_helpers import (
    SYN_BIG,
    build,
    build_paper,
    check_paper_invariants,
    labels_of,
    synthetic,
)

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
