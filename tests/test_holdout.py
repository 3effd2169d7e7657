"""partition.holdout: the validation split a tuning run evaluates on instead of the test split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compose_config, examples
from fedjax_semi.data.federated import build_federated
from fedjax_semi.data.partitions import Partition
from fedjax_semi.data.partitions.holdout import HOLDOUT_ROLES, holdout_counts
from fedjax_semi.errors import ConfigError
from partition_helpers import SCHEME_KNOBS, SYN_BIG, all_labels, build, synthetic

# Labels with unequal class sizes, so that the per-class rounding has remainders to place.
SKEWED = synthetic(1500, 400)
SKEWED.y_train[:300] = 0


def _pair(ds, h: float, **kw) -> tuple[Partition, Partition]:
    """The partition without and with holdout (the same seed: the scheme's own draws agree)."""
    return build(ds, **kw), build(ds, holdout=h, **kw)


def check_holdout_partition(base: Partition, p: Partition, ds, h: float) -> None:
    """What every scheme's holdout promises, against the same partition without it."""
    held_roles, labeled_roles, train_roles = HOLDOUT_ROLES[p.meta["scheme"]]
    y = all_labels(ds)
    assert p.meta["holdout"] == h and base.meta["holdout"] == 0.0
    trained = np.concatenate([a for r in train_roles for a in p.clients[r]])
    for k in range(p.num_clients):
        test = p.clients["test"][k]
        held = []
        for r in train_roles:
            before, after = base.clients[r][k], p.clients[r][k]
            assert np.isin(after, before).all()  # rows only leave a training role
            out = np.setdiff1d(before, after)
            if r not in held_roles:
                assert len(out) == 0, r
                continue
            held.append(out)
            # The count of the rule (round half up, never the last row), where every row is
            # eligible (no other client holds it: the generic schemes, SYN_BIG's DoFed draws).
            assert len(out) == holdout_counts(len(before), h), (k, r)
            # Stratified: class c gives floor(h n_c) or one more.
            n_c = np.bincount(y[before], minlength=ds.num_classes)
            o_c = np.bincount(y[out], minlength=ds.num_classes)
            assert ((o_c >= np.floor(h * n_c)) & (o_c <= np.floor(h * n_c) + 1)).all(), (k, r)
        # The client's test role is exactly its held-out rows, disjoint from its training.
        np.testing.assert_array_equal(test, np.sort(np.concatenate(held)))
        for r in train_roles:
            assert not np.isin(test, p.clients[r][k]).any()
    # No held-out row is trained on by any client, and test_global is their union.
    test_global = p.server["test_global"]
    assert not np.isin(test_global, trained).any()
    np.testing.assert_array_equal(test_global, np.sort(np.concatenate(p.clients["test"])))
    # The real test split (the partition without holdout: its test_global) is not read; it is
    # listed as withheld, so a pool of "every row outside the server sets and test roles"
    # (FedBE's train_split) takes none of its inputs either.
    real = base.server["test_global"]
    assert not np.isin(test_global, real).any()
    np.testing.assert_array_equal(p.server["withheld_test"], real)
    held = np.zeros(len(y), bool)
    for idx in [*p.server.values(), *p.clients["test"]]:
        held[idx] = True
    assert not np.isin(real, np.flatnonzero(~held)).any()
    if p.meta["split"] == "official":
        assert (test_global < len(ds.y_train)).all()
    # mu: the labeled share of what is left for training.
    seen = np.array([sum(len(p.clients[r][k]) for r in labeled_roles) for k in range(len(p.mu))])
    total = np.array([sum(len(p.clients[r][k]) for r in train_roles) for k in range(len(p.mu))])
    np.testing.assert_allclose(p.mu, seen / total)
    assert p.meta["holdout_rows"] == len(test_global)


@settings(max_examples=examples(24), deadline=None)
@given(
    scheme=st.sampled_from(["iid", "dirichlet", "shards"]),
    split=st.sampled_from(["official", "pooled"]),
    h=st.sampled_from([0.1, 0.2, 0.35, 0.5]),
    num_clients=st.integers(2, 20),
    seed=st.integers(0, 1000),
)
def test_generic_schemes_hold_out_a_stratified_share(scheme, split, h, num_clients, seed):
    base, p = _pair(SKEWED, h, scheme=scheme, split=split, num_clients=num_clients, seed=seed)
    check_holdout_partition(base, p, SKEWED, h)
    if split == "pooled":  # the pooled split's val pool is not the test pool: it stays
        np.testing.assert_array_equal(p.server["val_global"], base.server["val_global"])


@pytest.mark.parametrize("scheme", ["subset", "normal"])
def test_dofed_schemes_hold_out_target_rows(scheme):
    base, p = _pair(SYN_BIG, 0.2, scheme=scheme, num_clients=12, **SCHEME_KNOBS[scheme])
    check_holdout_partition(base, p, SYN_BIG, 0.2)
    # D_train is untouched (above); the validation rows lie in each client's target classes.
    for k in range(12):
        target = p.assignments["target_classes"][k]
        assert target[all_labels(SYN_BIG)[p.clients["test"][k]]].all()


def test_ada_scheme_holds_out_client_rows_and_keeps_the_server_sets():
    base, p = _pair(SYN_BIG, 0.2, scheme="ada", num_clients=10, **SCHEME_KNOBS["ada"])
    check_holdout_partition(base, p, SYN_BIG, 0.2)
    # The pool and D_V (rewards, stop rule) are the algorithm's own server sets: unchanged.
    for key in ("server_unlabeled", "server_val"):
        np.testing.assert_array_equal(p.server[key], base.server[key])
        assert len(p.server[key]) > 0


@pytest.mark.parametrize("scheme", ["cofed", "cfsl"])
def test_cofed_and_cfsl_hold_out_client_rows(scheme):
    base, p = _pair(SYN_BIG, 0.2, scheme=scheme, num_clients=10, **SCHEME_KNOBS[scheme])
    check_holdout_partition(base, p, SYN_BIG, 0.2)
    # The assignments (CoFED's label spaces, CFSL's edges and clusters) and CoFED's public set
    # are the scheme's own draws: unchanged.
    for key, value in base.assignments.items():
        np.testing.assert_array_equal(p.assignments[key], value)
    for key in set(base.server) - {"test_global"}:
        np.testing.assert_array_equal(p.server[key], base.server[key])


def test_rows_other_clients_hold_are_never_held_out():
    """DoFed-SPP's overlap=allow shares rows once a class runs out: a shared row stays in
    training (another client trains on it), so no validation row is trained on."""
    ds = synthetic(600, 100)  # 60 train rows per class: clients share most of them
    kw = dict(
        scheme="normal", num_clients=8, train_per_class=20, target_per_class=10,
        target_labeled_fraction=0.1, test_per_class=5, seed=0, size_mode="per_class",
    )  # fmt: skip
    p = build(ds, holdout=0.3, **kw)
    train = [
        np.concatenate([p.clients[r][k] for r in HOLDOUT_ROLES["normal"][2]]) for k in range(8)
    ]
    everything = np.concatenate(train)
    assert len(np.unique(everything)) < len(everything)  # the draws do share rows
    assert not np.isin(p.server["test_global"], everything).any()
    assert len(p.server["test_global"]) > 0


def test_held_out_labels_are_hidden_from_training():
    p = build(SKEWED, holdout=0.25, scheme="dirichlet", num_clients=6)
    ds = SKEWED
    fed = build_federated(ds.x_train, ds.y_train, ds.x_test, ds.y_test, p, ds.num_classes)
    test = np.asarray(p.server["test_global"])
    assert (np.asarray(fed.y)[test] == -1).all()  # labeled rows held out lose their labels
    oracle = fed.train_view(oracle=True)  # fedavg_sl's view of the unlabeled rows
    assert (np.asarray(oracle.y)[test] == -1).all()
    np.testing.assert_array_equal(np.asarray(fed.eval_y)[test], all_labels(ds)[test])
    assert fed.test_in_global


def test_holdout_is_saved_with_the_partition(tmp_path):
    p = build(SKEWED, holdout=0.2, scheme="iid", num_clients=5)
    p.save(tmp_path / "p.npz")
    q = Partition.load(tmp_path / "p.npz")
    assert q.meta["holdout"] == 0.2
    np.testing.assert_array_equal(q.server["test_global"], p.server["test_global"])


def test_small_roles_keep_their_last_row():
    assert [holdout_counts(n, 0.5) for n in range(5)] == [0, 0, 1, 2, 2]
    assert [holdout_counts(n, 0.2) for n in (1, 2, 3, 7, 8)] == [0, 0, 1, 1, 2]


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(holdout=0.6), "partition.holdout=0.6 is invalid; must be a share in [0, 0.5]"),
        (dict(holdout=-0.1), "partition.holdout=-0.1 is invalid"),
        (dict(holdout=0.2, val_fraction=0.1), "partition.val_fraction=0.1 and split=official"),
    ],
)
def test_unsupported_holdout_is_one_line(kw, needle):
    with pytest.raises(ValueError) as e:
        build(SYN_BIG, **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_every_scheme_has_holdout_roles_and_others_are_refused():
    from fedjax_semi.data.partitions.holdout import check_holdout
    from fedjax_semi.data.partitions.registry import BUILDERS

    assert set(HOLDOUT_ROLES) == set(BUILDERS)
    with pytest.raises(ValueError, match="scheme 'plugin' has no validation split"):
        check_holdout("plugin", 0.2, "official", 0.0)


def test_config_refuses_a_bad_holdout_before_loading_data():
    from fedjax_semi.config import validate

    for overrides, needle in [
        (["partition.holdout=0.7"], "partition.holdout=0.7"),
    ]:
        with pytest.raises(ConfigError, match="partition.holdout") as e:
            validate(compose_config(*overrides))
        assert needle in str(e.value)


def test_partition_file_with_another_holdout_is_refused(tmp_path):
    from fedjax_semi.experiment import load_partition_file

    ds = SKEWED
    build(ds, holdout=0.2, scheme="iid", num_clients=5).save(tmp_path / "p.npz")
    assert load_partition_file(str(tmp_path / "p.npz"), ds, 5, holdout=0.2).meta["holdout"] == 0.2
    with pytest.raises(ConfigError, match=r"partition.file=.* holdout=0.2, partition.holdout=0.0"):
        load_partition_file(str(tmp_path / "p.npz"), ds, 5, holdout=0.0)
