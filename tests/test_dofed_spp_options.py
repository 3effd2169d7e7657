"""DoFed-SPP's options on the tiny SUBSET setup of dofed_setups.py: budget mode on NORMAL
(Ineq. 26 with Sec. 6.1's C1-C3), every non-default knob at once, the low-rank broadcast and the
systems group's bad values."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config
from dofed_setups import S_TRAIN, TINY, N, check_partition, client_rows_equal, counts, model_mb, run
from fedjax_semi import experiment
from fedjax_semi.algorithms.dofed_spp import low_rank
from fedjax_semi.config_groups import WirelessSystems
from fedjax_semi.errors import ConfigError


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_budget_mode_normal_partition(tmp_path):
    """selection_mode=budget on NORMAL: each round's (K, B) satisfies Ineq. 26 with C1, C2, C3
    of Sec. 6.1, the budget binds (K < N), and metrics.jsonl of experiment.run carries
    pl_acc, K, B and the clock."""
    s_infer = 1e-6  # cheap labeling next to the uploads, so B can be large and K is limited
    over = [
        *TINY, "partition=normal", "algorithm.selection_mode=budget", "rounds=2",
        f"systems.wireless.time_sec_per_infer_sample={s_infer}",
    ]  # fmt: skip
    exp = experiment.build(compose_config(*over, "algorithm.selection_time_per_round_s=1"))
    check_partition(exp, "normal")
    n_tr, n_l, n_u = counts(exp, "labeled", "target_labeled", "target_unlabeled")
    fixed = np.max((n_tr + n_u + n_l) * S_TRAIN + N * n_l * s_infer)
    c2, c3 = n_u.max() * s_infer, model_mb(exp) * math.log(5) / 8
    c1 = c2 + 4.5 * c3  # at most K = 4 uploads fit next to one labeling model
    exp = experiment.build(
        compose_config(*over, f"algorithm.selection_time_per_round_s={fixed + c1}")
    )
    experiment.run(exp, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert len(rows) == 2
    for r in rows:
        assert r["budget_c1"] == pytest.approx(c1, rel=1e-4)
        assert r["budget_c2"] == pytest.approx(c2, rel=1e-5)
        assert r["budget_c3"] == pytest.approx(c3, rel=1e-5)
        assert 1 <= r["B"] <= r["K"] <= 4 and not r["budget_violated"]
        assert r["B"] * c2 + r["K"] * c3 <= c1 + 1e-7
        assert 0 <= r["pl_acc"] <= 1 and 0 <= r["accuracy"] <= 1
    assert 0 < rows[0]["sim_time"] < rows[1]["sim_time"]


# Every non-default [rec] knob at once (docs/choices.md: DoFed-SPP).
KNOBS = [
    "algorithm.init_mode=per_client",
    "algorithm.sr_g1=auto",
    "algorithm.sr_target_version=post_update",
    "algorithm.sr_degenerate=uniform",
    "algorithm.sr_exclude_self=true",
    "algorithm.label_renormalize=true",
    "algorithm.pca_rank=2",
    "systems.wireless.mode=shannon",
]


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_every_knob_runs_and_is_used():
    """The knobs change what they should: per-client inits, S[n, n] = 0, the post-update target
    breaks AC7's equality, the cache keeps the un-reduced uploads while PCA is on, and uploads
    take m / r_i at the fixed Shannon rates."""
    exp = experiment.build(compose_config(*TINY, *KNOBS))
    init = exp.alg.init(exp.key, exp.fed)
    for models in (init.T, init.R):  # kernels differ (biases start at 0)
        kernels = [a for a in jax.tree.leaves(models["params"]) if a.ndim > 2]
        assert kernels and all(np.ptp(np.asarray(a), axis=0).max() > 0 for a in kernels)
    states, rows = run(exp.runner(chunk="all", eval_chunk="all"), 2)
    rates, m = np.asarray(init.clock.rate_mbps), model_mb(exp)
    for s in states:
        sr = np.asarray(s.S)
        np.testing.assert_allclose(sr.sum(1), 1.0, atol=1e-6)
        assert (np.diag(sr) == 0).all()
    # Small but real: G1 = auto (the largest model distance) swamps the loss term.
    change = np.asarray(states[1].S) - np.asarray(states[0].S)
    assert np.abs(change).max() > 1e-4
    for t, row in enumerate(rows, start=1):
        chosen = row["chosen"]
        np.testing.assert_allclose(row["upload_times"][chosen], m / rates[chosen], rtol=1e-5)
        for n in np.flatnonzero(chosen):
            assert client_rows_equal(states[t].cache, states[t - 1].R, n)
        assert np.isfinite(row["train_loss"]) and row["client_finite"].all()


def test_low_rank_broadcast_copies():
    rng = np.random.default_rng(0)
    v = {
        "params": {
            "w": jnp.asarray(rng.normal(size=(3, 2, 2, 4, 5)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
        }
    }
    out = low_rank(v, 2)
    np.testing.assert_array_equal(out["params"]["b"], v["params"]["b"])
    mats = np.asarray(out["params"]["w"]).reshape(3, -1, 5)
    assert all(np.linalg.matrix_rank(m, tol=1e-4) == 2 for m in mats)
    full = low_rank(v, 5)
    np.testing.assert_allclose(full["params"]["w"], v["params"]["w"], atol=1e-4)


# The clock's knobs (the systems group), shared by DoFed-SPP and its baselines.
SYSTEMS_BAD = [
    ("mode", "radio", "'empirical', 'shannon'"),
    ("rate_mbps", [10.0, 2.0], "low <= high"),
    ("distance_km", [0.0, 0.5], "0 < low"),
    ("power_w", 0.0, "> 0"),
    ("time_sec_per_train_sample", -1.0, ">= 0"),
]


@pytest.mark.parametrize(
    ("key", "value", "allowed"), SYSTEMS_BAD, ids=[f"{k}={v}" for k, v, _ in SYSTEMS_BAD]
)
def test_bad_systems_values_name_key_and_allowed(key, value, allowed):
    with pytest.raises(ConfigError, match=rf"systems\.wireless\.{key}=.*{allowed}"):
        WirelessSystems(**{key: value})
