"""Property tests for CoFED's, CFSL's and Ada-FedSemi's partitions, and what every paper scheme
keeps (seeds, save/load, bad arguments)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.data.partitions import (
    Partition,
    apply_client_transforms,
    class_proportions,
)
from partition_helpers import (
    PAPER_SCHEMES,
    SYN,
    SYN_BIG,
    SYN_COARSE,
    all_labels,
    build,
    build_paper,
    check_paper_invariants,
    synthetic,
)

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
