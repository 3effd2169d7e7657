"""The kernels of DoFed-SPP's baselines against NumPy references: FedBE's Gaussian fit over the
clients' models, its samples and ensemble targets, FedFomo's update and epsilon schedule (spec
dofed_spp.md section 4). The baselines' rounds are tested in test_dofed_baselines.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dofed_references import np_softmax
from fedjax_semi.algorithms import fedbe_ensemble as fbe
from fedjax_semi.algorithms import fedfomo as ff


def random_tree(rng, lead=()):
    return {
        "params": {
            "a": {"kernel": rng.normal(size=(*lead, 3, 4)).astype(np.float32)},
            "b": {"bias": rng.normal(size=(*lead, 5)).astype(np.float32)},
        }
    }


def test_gaussian_fit_matches_numpy():
    rng = np.random.default_rng(0)
    stacked = random_tree(rng, (5,))["params"]
    w = np.array([3.0, 0.0, 1.0, 6.0, 2.0], np.float32)  # a zero weight drops a client
    mu, var = fbe.gaussian_fit(jax.tree.map(jnp.asarray, stacked), jnp.asarray(w))
    a = w / w.sum()
    leaves = (jax.tree.leaves(t) for t in (stacked, mu, var))
    for x, m, v in zip(*leaves, strict=True):
        ref_mu = np.einsum("k,k...->...", a, x.astype(np.float64))
        ref_var = np.einsum("k,k...->...", a, (x - ref_mu) ** 2)
        np.testing.assert_allclose(m, ref_mu, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v, ref_var, rtol=1e-5, atol=1e-6)
    # One client: mu is its model, sigma^2 = 0.
    mu1, var1 = fbe.gaussian_fit(jax.tree.map(lambda x: jnp.asarray(x[:1]), stacked), jnp.ones(1))
    assert all(float(jnp.abs(v).max()) == 0.0 for v in jax.tree.leaves(var1))
    np.testing.assert_allclose(mu1["a"]["kernel"], stacked["a"]["kernel"][0], rtol=1e-6)


def test_gaussian_sample_is_mean_plus_scaled_noise():
    rng = np.random.default_rng(1)
    mu = jax.tree.map(jnp.asarray, random_tree(rng)["params"])
    var = jax.tree.map(lambda x: jnp.asarray(np.abs(x) + 0.1), random_tree(rng)["params"])
    key = jax.random.PRNGKey(3)
    samples = fbe.gaussian_sample(key, mu, var, 7, scale=0.5)
    z = fbe.standard_normals(key, mu, 7)
    for s, m, v, e in zip(*(jax.tree.leaves(t) for t in (samples, mu, var, z)), strict=True):
        assert s.shape == (7, *m.shape)
        ref = np.asarray(m)[None] + 0.5 * np.sqrt(np.asarray(v))[None] * np.asarray(e)
        np.testing.assert_allclose(s, ref, rtol=1e-5, atol=1e-6)
    # z is N(0, I), independent across leaves and samples; other keys draw other models.
    big = fbe.standard_normals(key, {"w": jnp.zeros((50, 40))}, 40)["w"]
    assert abs(float(big.mean())) < 0.02 and abs(float(big.std()) - 1.0) < 0.02
    z2 = fbe.standard_normals(jax.random.PRNGKey(4), mu, 7)
    assert not np.allclose(z["a"]["kernel"], z2["a"]["kernel"])
    # Zero variance: every sample is the mean, exactly.
    zero = jax.tree.map(jnp.zeros_like, var)
    same = fbe.gaussian_sample(key, mu, zero, 3)
    for s, m in zip(jax.tree.leaves(same), jax.tree.leaves(mu), strict=True):
        np.testing.assert_array_equal(s, np.broadcast_to(m, s.shape))


def test_ensemble_average_and_distillation_targets():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(6, 9, 4)).astype(np.float32) * 3  # [E, P, Q]
    p = fbe.ensemble_average(lambda member: member, jnp.asarray(logits))
    ref = np_softmax(logits.astype(np.float64)).mean(0)
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(fbe.distill_targets(p, "soft"), p)
    hard = np.asarray(fbe.distill_targets(p, "hard"))
    np.testing.assert_array_equal(hard, np.eye(4)[ref.argmax(-1)])


def test_fomo_update_matches_numpy_and_keeps_model_on_zero_weights():
    rng = np.random.default_rng(3)
    own = jax.tree.map(jnp.asarray, random_tree(rng))
    models = jax.tree.map(jnp.asarray, random_tree(rng, (3,)))
    w = np.array([0.5, 0.0, 0.5], np.float32)
    new = ff.fomo_update(own, models, jnp.asarray(w))
    for a, b, c in zip(*(jax.tree.leaves(t) for t in (new, own, models)), strict=True):
        ref = np.asarray(b, np.float64) + sum(
            w[m] * (np.asarray(c[m], np.float64) - b) for m in range(3)
        )
        np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-6)
    kept = ff.fomo_update(own, models, jnp.zeros(3))
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(own), strict=True):
        np.testing.assert_array_equal(a, b)
    eps = [float(ff.epsilon_at(jnp.int32(t), 0.3, 0.05)) for t in (1, 2, 7, 8, 20)]
    np.testing.assert_allclose(eps, [0.3, 0.25, 0.0, 0.0, 0.0], atol=1e-7)
