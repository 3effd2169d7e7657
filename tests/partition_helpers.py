"""Shared pieces of the partition tests (test_partition*.py): synthetic datasets in the real
ArrayDataset shape, build wrappers with small defaults, and the invariants every scheme keeps."""

from __future__ import annotations

import numpy as np

from fedjax_semi.data.partitions import (
    PAPER_DEFAULTS,
    SCHEME_GROUP,
    Partition,
    build_partition,
)
from fedjax_semi.data.registry import ArrayDataset

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
