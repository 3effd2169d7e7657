"""UM-pFSSL's switches where the paper is ambiguous, on the tiny setting of um_pfssl_tiny.py:
refresh_trigger (Sec. 4.2 vs Alg. 1 l.12), kl_direction (Eq. 5 vs Alg. 1 l.20),
aggregate_bn_stats and mc_bn_mode; the aggregation ablation."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.config import ConfigError
from um_pfssl_tiny import TINY, rounds

# ------------------------------------------------ the switches where the paper is ambiguous
# refresh_trigger (Sec. 4.2 vs Alg. 1 l.12), kl_direction (Eq. 5 vs Alg. 1 l.20),
# aggregate_bn_stats, mc_bn_mode (its kernel checks are in test_uncertainty_kernels.py).

SWITCH_DEFAULTS = {
    "refresh_trigger": "global_mod",
    "kl_direction": "target_to_model",
    "aggregate_bn_stats": True,
    "mc_bn_mode": "running",
    "aggregation": "corr",
}


def test_switch_defaults_and_bad_values():
    from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig

    composed = compose_config(*TINY).algorithm
    for key, value in SWITCH_DEFAULTS.items():
        assert getattr(composed, key) == value == getattr(UMPFSSLConfig(), key), key
    for key, value in (
        ("refresh_trigger", "sometimes"),
        ("kl_direction", "both"),
        ("mc_bn_mode", "train"),
        ("aggregation", "median"),
    ):
        with pytest.raises(ConfigError) as err:
            compose_config(*TINY, f"algorithm.{key}={value}")
        msg = str(err.value)
        assert msg.startswith(f"algorithm.{key}='{value}' is not allowed: one of [")
        assert len(msg.splitlines()) == 1
    with pytest.raises(ConfigError, match=r"^algorithm.aggregate_bn_stats='yes' .*true or false$"):
        UMPFSSLConfig(aggregate_bn_stats="yes")


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_refresh_trigger_per_client_elapsed():
    """per_client_elapsed: a sampled client refreshes when >= nu rounds have passed since its
    last refresh (the warm-up counts as round 0); its round of last refresh is in the state."""
    exp = experiment.build(
        compose_config(
            *TINY,
            "algorithm.refresh_trigger=per_client_elapsed",
            "algorithm.search_rounds=0",
            "algorithm.mc_samples=1",
        )
    )  # fmt: skip  (no search: two compiled round variants, refresh off and on)
    states, rows = rounds(exp.runner(chunk="all"), 3)
    nu, refreshed_odd = 2, False
    for t in range(1, 4):
        before = np.asarray(states[t - 1].last_refresh)
        after = np.asarray(states[t].last_refresh)
        cohort = np.asarray(rows[t - 1]["cohort"])
        due = np.zeros(6, bool)
        due[cohort] = (t >= nu) & (t - before[cohort] >= nu)
        np.testing.assert_array_equal(after, np.where(due, t, before))
        refreshed_odd |= t % nu != 0 and due.any()
    assert refreshed_odd  # a refresh global_mod would not have made
    assert int(rows[0]["comm_update_downloads"]) == 0


def _personal_extras(monkeypatch, *overrides):
    """The extras train_personal hands local_train (local_train replaced by a stub), for a
    client with 3 labeled and 4 unlabeled rows."""
    import types

    import jax.numpy as jnp

    from fedjax_semi.algorithms import um_pfssl_train
    from fedjax_semi.data.federated import RoleTable

    seen = []

    def stub(objective, tx, *, variables, opt_state, extras, **_):
        seen.append(extras)
        return variables, opt_state, {"loss": jnp.zeros(()), "steps": jnp.int32(0)}

    monkeypatch.setattr(um_pfssl_train, "local_train", stub)
    alg = experiment.build(compose_config(*TINY, *overrides)).alg
    inp = types.SimpleNamespace(
        id=jnp.int32(0),
        lab=RoleTable(jnp.arange(4), jnp.int32(3)),
        unl=RoleTable(jnp.arange(4, 9), jnp.int32(4)),
    )
    shared = types.SimpleNamespace(
        x=None, y=jnp.zeros(20, jnp.int32), round=jnp.int32(1), key=jax.random.PRNGKey(0)
    )
    params = {"params": {"w": jnp.zeros(2)}}
    y_hat = jnp.full((5, 10), 0.1)
    alg.train_personal(params, inp, shared, y_hat, jnp.ones(5, bool), jnp.float32(3 / 7))
    return seen


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_kl_direction(monkeypatch):
    """model_to_target is KL(f_w || y_hat) on a hand example, on the pseudo-labeled rows only
    (labeled rows keep CE); the default passes no flag, so its loss is today's KL(y_hat || f_w)."""
    import jax.numpy as jnp

    from fedjax_semi.engine.train import kl_divergence, reverse_kl_divergence

    logits = np.asarray([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], np.float32)
    q = np.asarray([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]], np.float32)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(reverse_kl_divergence(logits, q), (p * np.log(p / q)).sum(-1), 1e-5)
    np.testing.assert_allclose(kl_divergence(logits, q), (q * np.log(q / p)).sum(-1), 1e-5)

    # The flag reaches the loss: joint marks the unlabeled rows, alternating the KL pass.
    (joint,) = _personal_extras(monkeypatch, "algorithm.kl_direction=model_to_target")
    np.testing.assert_array_equal(joint["reverse"], np.arange(9) >= 3)
    lab_pass, unl_pass = _personal_extras(
        monkeypatch, "algorithm.kl_direction=model_to_target", "algorithm.loss_schedule=alternating"
    )
    assert "reverse" not in lab_pass and np.asarray(unl_pass["reverse"]).all()
    for extras in _personal_extras(monkeypatch) + _personal_extras(
        monkeypatch, "algorithm.loss_schedule=alternating"
    ):
        assert "reverse" not in extras

    # um_objective: reverse rows take KL(f_w || y_hat), the others KL(y_hat || f_w).
    exp = experiment.build(compose_config(*TINY, "algorithm.kl_direction=model_to_target"))
    v = exp.model.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 255, (4, 8, 8, 1)), jnp.uint8)
    target = jax.nn.softmax(jnp.asarray(rng.normal(size=(4, 10)), jnp.float32))
    reverse = jnp.asarray([False, True, False, True])
    batch = {"x": x, "target": target, "weight": jnp.ones(4), "valid": jnp.ones(4, bool)}
    key = jax.random.PRNGKey(1)
    out, _ = exp.model.apply(v, x, train=True, rng=key)
    fwd, rev = kl_divergence(out, target), reverse_kl_divergence(out, target)
    loss = lambda b: float(exp.alg.um_objective(v["params"], {}, b, key, None, True)[0])
    assert loss(batch) == pytest.approx(float(fwd.mean()), rel=1e-5)
    want = float(jnp.where(reverse, rev, fwd).mean())
    assert loss({**batch, "reverse": reverse}) == pytest.approx(want, rel=1e-5)
    assert abs(want - float(fwd.mean())) > 1e-4


@pytest.mark.slow  # make test-slow: the fast suite must stay under 12 minutes
def test_aggregate_bn_stats():
    """true (default): BatchNorm running statistics are Corr-averaged like the parameters, as
    before the knob; false: the client keeps its own, the parameters still averaged."""
    import dataclasses
    import types

    import jax.numpy as jnp

    from fedjax_semi.algorithms.um_pfssl import UMPFSSL
    from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig
    from fedjax_semi.kernels.uncertainty import aggregation_weights, personalized_average

    rng = np.random.default_rng(0)
    helpers = {
        "params": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)},
        "batch_stats": {"mean": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)},
    }
    own = jax.tree.map(lambda a: a[0], helpers)
    corr, valid = jnp.asarray([2.0, 1.0, 1.0]), jnp.ones(3, bool)
    omega = np.asarray([0.5, 0.25, 0.25])

    def agg(flag):
        alg = types.SimpleNamespace(
            cfg=dataclasses.replace(UMPFSSLConfig(), aggregate_bn_stats=flag)
        )
        return UMPFSSL.aggregate(alg, corr, valid, helpers, own)

    old = personalized_average(
        aggregation_weights(corr[None], valid[None]), jax.tree.map(lambda a: a[None], helpers)
    )
    on, off = agg(True), agg(False)
    for a, b in zip(jax.tree.leaves(on), jax.tree.leaves(old), strict=True):
        np.testing.assert_array_equal(a, b[0])
    np.testing.assert_allclose(
        on["batch_stats"]["mean"], omega @ helpers["batch_stats"]["mean"], 1e-6
    )
    np.testing.assert_array_equal(off["batch_stats"]["mean"], own["batch_stats"]["mean"])
    np.testing.assert_array_equal(off["params"]["w"], on["params"]["w"])
    no_bn = {"params": helpers["params"]}  # a model without BatchNorm: nothing to keep
    got = UMPFSSL.aggregate(
        types.SimpleNamespace(cfg=dataclasses.replace(UMPFSSLConfig(), aggregate_bn_stats=False)),
        corr, valid, no_bn, {"params": own["params"]},
    )  # fmt: skip
    np.testing.assert_array_equal(got["params"]["w"], on["params"]["w"])


def test_aggregation_ablations():
    """corr (Alg. 1 l.15): omega proportional to Corr over the valid slots; uniform: equal
    weights over the valid slots; own: the client's own model, untouched."""
    import dataclasses
    import types

    import jax.numpy as jnp

    from fedjax_semi.algorithms.um_pfssl import UMPFSSL
    from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig

    rng = np.random.default_rng(1)
    helpers = {"params": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)}}
    own = jax.tree.map(lambda a: a[0] + 1.0, helpers)  # not a helper slot: own must be returned
    corr, valid = jnp.asarray([2.0, 1.0, 5.0]), jnp.asarray([True, True, False])
    w = np.asarray(helpers["params"]["w"])

    def agg(mode):
        alg = types.SimpleNamespace(cfg=dataclasses.replace(UMPFSSLConfig(), aggregation=mode))
        return np.asarray(UMPFSSL.aggregate(alg, corr, valid, helpers, own)["params"]["w"])

    # float32 sums of three terms of order 1: 1e-6 absolute covers their rounding
    np.testing.assert_allclose(agg("corr"), (2 * w[0] + w[1]) / 3, atol=1e-6)
    np.testing.assert_allclose(agg("uniform"), (w[0] + w[1]) / 2, atol=1e-6)
    np.testing.assert_array_equal(agg("own"), np.asarray(own["params"]["w"]))


@pytest.mark.parametrize("mode", ["running", "batch"])
def test_mc_bn_mode_reaches_the_mc_passes(monkeypatch, mode):
    """The algorithm hands algorithm.mc_bn_mode to every pair_stats call (the kernel's batch
    mode is checked in test_uncertainty_kernels.py::test_mc_bn_mode_batch)."""
    import types

    import jax.numpy as jnp

    from fedjax_semi.algorithms import um_pfssl
    from fedjax_semi.data.federated import RoleTable

    seen = []

    def stub(*args):
        seen.append(args[15])  # bn_mode, after acc_mode
        return {"corr": jnp.zeros(())}

    monkeypatch.setattr(um_pfssl, "pair_stats", stub)
    alg = experiment.build(compose_config(*TINY, f"algorithm.mc_bn_mode={mode}")).alg
    inp = types.SimpleNamespace(
        id=jnp.int32(0), lab=RoleTable(jnp.arange(2), 2), unl=RoleTable(jnp.arange(2), 2)
    )
    shared = types.SimpleNamespace(x=None, y=None, round=jnp.int32(1), key=jax.random.PRNGKey(0))
    alg.helper_stats(jnp.zeros((2, 3)), jnp.arange(2), 0, inp, shared, 0.5)
    assert seen and set(seen) == {mode}


# A ResNet-9 (BatchNorm) round compiles for tens of seconds on a CPU: make test-slow.
@pytest.mark.slow
def test_aggregate_bn_stats_false_after_a_round():
    """BatchNorm trains on batch statistics, so the running statistics a client starts its
    local training from do not change its parameters: aggregate_bn_stats=false gives the same
    parameters as the default after a round, and other running statistics (the default's start
    from the Corr average, false's from the client's own)."""
    bn = [
        "model=resnet9", "model.width=0.0625", "algorithm.search_rounds=0",
        "algorithm.mc_samples=1", "algorithm.lr=0.01",
    ]  # fmt: skip
    runs = {}
    for flag in ("true", "false"):
        exp = experiment.build(compose_config(*TINY, *bn, f"algorithm.aggregate_bn_stats={flag}"))
        runs[flag] = rounds(exp.runner(chunk="all"), 1)
    (s_on, rows), (s_off, _) = runs["true"], runs["false"]
    cohort = np.asarray(rows[0]["cohort"])
    for a, b in zip(
        jax.tree.leaves(s_on[1].w_k["params"]),
        jax.tree.leaves(s_off[1].w_k["params"]),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    on, off = (jax.tree.leaves(s.w_k["batch_stats"]) for s in (s_on[1], s_off[1]))
    gaps = [
        np.abs(np.asarray(a) - np.asarray(b))[cohort].max() for a, b in zip(on, off, strict=True)
    ]
    gap = float(max(gaps))
    assert gap > 1e-4
