"""UM-pFSSL kernels against plain NumPy references (spec uncertainty_pfssl.md, AC1-AC7, AC10)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.kernels import selection, uncertainty
from fedjax_semi.models.zoo import make_model

# Jitted, as the methods call them (inside a compiled round): the property tests draw many
# shapes, and op-by-op dispatch would compile every op of every shape apart.
predictive_entropy = jax.jit(uncertainty.predictive_entropy)
aggregation_weights = jax.jit(uncertainty.aggregation_weights)
personalized_average = jax.jit(uncertainty.personalized_average)
helper_pseudo_labels = jax.jit(uncertainty.helper_pseudo_labels, static_argnames="hard")
mc_predict = jax.jit(uncertainty.mc_predict, static_argnames=("model", "num_samples"))
mc_logits = jax.jit(uncertainty.mc_logits, static_argnames="model")
mc_predict_rows = jax.jit(
    uncertainty.mc_predict_rows, static_argnames=("model", "num_samples", "block")
)
pair_stats = jax.jit(
    uncertainty.pair_stats,
    static_argnames=("model", "num_samples", "form", "reduction", "eps", "acc_mode"),
)


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def test_entropy_extremes():
    one_hot = jnp.asarray([[[50.0, -50.0, -50.0]]])
    uniform = jnp.zeros((1, 1, 3))
    assert float(predictive_entropy(one_hot)[1][0]) == pytest.approx(0.0, abs=1e-6)
    # float32 softmax, log and sum of O(1) terms: rel a few float32 ulps (approx's 1e-6 is ~8).
    assert float(predictive_entropy(uniform)[1][0]) == pytest.approx(np.log(3), rel=1e-5)


@functools.lru_cache
def resnet(dropout: float):
    model = make_model("resnet9", (8, 8, 1), 4, width=0.0625, dropout=dropout)
    # jitted: op-by-op dispatch of a ResNet's init compiles every op apart (tens of seconds)
    return model, jax.jit(model.init)(jax.random.PRNGKey(0))


def test_deterministic_limit():
    model, v = resnet(0.0)
    x = jax.random.randint(jax.random.PRNGKey(1), (5, 8, 8, 1), 0, 255).astype(jnp.uint8)
    p_bar, h = mc_predict(model, v, x, jax.random.PRNGKey(2), 4)
    logits, _ = jax.jit(model.apply)(v, x)
    np.testing.assert_allclose(p_bar, jax.nn.softmax(logits), atol=1e-5)
    again = mc_predict(model, v, x, jax.random.PRNGKey(2), 4)
    np.testing.assert_array_equal(p_bar, again[0])


def test_prefix_suffix_equals_whole_network():
    model, v = resnet(0.5)
    x = jax.random.randint(jax.random.PRNGKey(1), (6, 8, 8, 1), 0, 255).astype(jnp.uint8)
    keys = jax.random.split(jax.random.PRNGKey(3), 5)
    split = mc_logits(model, v, x, keys)
    whole = jax.jit(jax.vmap(lambda k: model.apply(v, x, mc=True, rng=k)[0]))(keys)
    np.testing.assert_allclose(split, whole, atol=1e-5)
    assert float(jnp.abs(split[0] - split[1]).max()) > 1e-4  # dropout is on


def np_corr(ent_u, mask_u, p_s, y_s, mask_s, mu, nc, form, reduction="mean", eps=1e-6):
    n_u, n_s = mask_u.sum(), mask_s.sum()
    h_bar = ent_u[mask_u].sum() / np.log(nc)
    if reduction == "mean":
        h_bar = h_bar / n_u if n_u else 0.0
    acc = (p_s.argmax(-1)[mask_s] == y_s[mask_s]).mean() if n_s else 0.0
    u = (1 - mu) / max(h_bar, eps) if form == "inverse" else (1 - mu) * (1 - h_bar)
    return (u if n_u else 0.0) + (mu * acc if n_s else 0.0), h_bar, acc


def test_relation_metric_limits():
    ent = jnp.asarray([0.2, 0.4])
    p_s = jnp.asarray([[0.9, 0.1], [0.2, 0.8]])
    m = jnp.ones(2, bool)
    at0 = uncertainty.relation_metric(ent, m, p_s, jnp.asarray([0, 1]), m, 0.0, 2)
    assert float(at0["corr"]) == pytest.approx(1 / (0.3 / np.log(2)), rel=1e-5)
    at1 = uncertainty.relation_metric(ent, m, p_s, jnp.asarray([0, 0]), m, 1.0, 2)
    assert float(at1["corr"]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="algorithm.corr_form"):
        uncertainty.relation_metric(ent, m, p_s, jnp.asarray([0, 0]), m, 1.0, 2, form="x")
    with pytest.raises(ValueError, match="algorithm.entropy_reduction"):
        uncertainty.relation_metric(ent, m, p_s, jnp.asarray([0, 0]), m, 1.0, 2, reduction="x")
    # The literal Eq. 12 sum is |D_k^u| times the mean, so the reciprocal term is 1/|D_k^u| of it.
    summed = uncertainty.relation_metric(
        ent, m, p_s, jnp.asarray([0, 1]), m, 0.0, 2, "inverse", "sum"
    )
    assert float(summed["corr"]) == pytest.approx(float(at0["corr"]) / 2, rel=1e-5)


def test_pair_stats_pads_with_inf_and_zero():
    model, v = resnet(0.5)
    x = jax.random.randint(jax.random.PRNGKey(1), (10, 8, 8, 1), 0, 255).astype(jnp.uint8)
    y = jnp.arange(10) % 4
    out = pair_stats(
        model,
        v,
        x,
        y,
        jnp.arange(6),
        jnp.int32(4),
        jnp.arange(6, 10),
        jnp.int32(3),
        jnp.float32(0.4),
        jax.random.PRNGKey(5),
        3,
    )
    assert np.isinf(np.asarray(out["ent_u"])[4:]).all()
    assert np.isfinite(np.asarray(out["ent_u"])[:4]).all()
    np.testing.assert_array_equal(np.asarray(out["p_bar_u"])[4:], 0.0)


def test_deterministic_acc_mode_uses_the_network_without_dropout():
    """acc_mode=deterministic: Acc(k|j) is the accuracy of the dropout-off network's argmax."""
    model, v = resnet(0.5)
    x = jax.random.randint(jax.random.PRNGKey(1), (12, 8, 8, 1), 0, 255).astype(jnp.uint8)
    logits = np.asarray(jax.jit(model.apply)(v, x)[0])
    y = jnp.asarray(logits.argmax(-1))
    y = y.at[:3].set((y[:3] + 1) % logits.shape[-1])  # 3 of the 6 labeled rows are wrong
    out = pair_stats(
        model, v, x, y, jnp.arange(6), jnp.int32(6), jnp.arange(6), jnp.int32(6),
        jnp.float32(1.0), jax.random.PRNGKey(5), 4, acc_mode="deterministic",
    )  # fmt: skip
    assert float(out["acc"]) == pytest.approx(0.5)
    assert float(out["corr"]) == pytest.approx(0.5)  # mu = 1: Corr = Acc
    with pytest.raises(ValueError, match="algorithm.acc_mode"):
        pair_stats(
            model, v, x, y, jnp.arange(6), jnp.int32(6), jnp.arange(6), jnp.int32(6),
            jnp.float32(1.0), jax.random.PRNGKey(5), 4, acc_mode="x",
        )  # fmt: skip


def test_degenerate_weights_are_uniform():
    w = aggregation_weights(jnp.zeros((1, 3)), jnp.asarray([[True, True, False]]))
    np.testing.assert_allclose(w, [[0.5, 0.5, 0.0]])


def test_sample_excluding_never_returns_excluded():
    excluded = np.zeros((3, 10), bool)
    excluded[0, :7] = True
    excluded[1, ::2] = True
    ids = np.asarray(selection.sample_excluding(jax.random.PRNGKey(0), excluded, 3))
    for row, ex in zip(ids, excluded, strict=True):
        assert len(set(row.tolist())) == 3 and not ex[row].any()
    counts = np.zeros(10)
    for s in range(300):
        counts[np.asarray(selection.sample_excluding(jax.random.PRNGKey(s), excluded[1:2], 2))] += 1
    assert counts[::2].sum() == 0 and counts[1::2].min() > 80  # uniform: 120 expected each


def test_lowest_mask():
    m = selection.lowest_mask(jnp.asarray([[3.0, 1.0, 2.0, 1.0]]), 2)
    np.testing.assert_array_equal(m, [[False, True, False, True]])


def test_blockwise_mc_matches_whole_rows_and_ignores_padding():
    model, v = resnet(0.5)
    x = jax.random.randint(jax.random.PRNGKey(1), (40, 8, 8, 1), 0, 255).astype(jnp.uint8)
    idx = jnp.arange(20)
    key = jax.random.PRNGKey(7)
    p, h = mc_predict_rows(model, v, x, idx, jnp.int32(20), key, 3, block=20)
    ref_p, ref_h = mc_predict(model, v, x[idx], jax.random.fold_in(key, 0), 3)
    # float32 probabilities in [0, 1] and entropies <= log 4 from two XLA programs: atol for
    # values near 0, rtol for the entropies near log 4 (a few float32 ulps).
    np.testing.assert_allclose(p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h, ref_h, rtol=1e-5, atol=1e-6)
    # Padding the row (same block size) leaves the valid rows unchanged; the blocks past the
    # data (rows 20-39, and 40-44 with the last block's padding) are skipped: 0.
    padded = jnp.concatenate([idx, jnp.zeros(25, jnp.int32)])
    p2, h2 = mc_predict_rows(model, v, x, padded, jnp.int32(20), key, 3, block=20)
    np.testing.assert_allclose(p2[:20], p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h2[:20], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(p2)[20:], 0.0)
    np.testing.assert_array_equal(np.asarray(h2)[20:], 0.0)
    # A partly filled block (13 valid rows) is computed whole: its valid rows are those of the
    # full block (same rows, key and shape), the rows after it are skipped.
    p3, h3 = mc_predict_rows(model, v, x, padded, jnp.int32(13), key, 3, block=20)
    np.testing.assert_allclose(p3[:13], p[:13], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h3[:13], h[:13], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(p3)[20:], 0.0)


def test_mc_bn_mode_batch():
    """mc_bn_mode (docs/choices.md, UM-pFSSL). running (default) is the old call; batch:
    BatchNorm normalizes with the statistics of the valid rows, as training does (the
    prefix/suffix split equals the whole network with train=True), padded rows change nothing,
    and a model without BatchNorm gives the same logits either way."""
    model, v = resnet(0.5)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 255, (6, 8, 8, 1)), jnp.uint8)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    mask = jnp.asarray([True] * 4 + [False] * 2)
    logits = jax.jit(uncertainty.mc_logits, static_argnames=("model", "bn_mode"))
    running = logits(model, v, x, keys)
    np.testing.assert_array_equal(running, logits(model, v, x, keys, bn_mode="running"))
    batch = logits(model, v, x, keys, bn_mode="batch", mask=mask)
    whole = jax.jit(jax.vmap(lambda k: model.apply(v, x, train=True, rng=k, mask=mask)[0]))(keys)
    # float32 batch statistics, two programs: a few ulps of O(1)-O(10) logits
    np.testing.assert_allclose(batch[:, :4], whole[:, :4], rtol=1e-4, atol=1e-4)
    assert float(jnp.abs(batch - running).max()) > 1e-3
    # Padded rows stay out of the statistics: other values there leave the valid rows alone.
    x2 = x.at[4:].set(255 - x[4:])
    again = logits(model, v, x2, keys, bn_mode="batch", mask=mask)
    np.testing.assert_allclose(again[:, :4], batch[:, :4], rtol=1e-4, atol=1e-4)
    mlp = make_model("mlp", (8, 8, 1), 4, dropout=0.5, hidden=(16,))
    w = mlp.init(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(
        logits(mlp, w, x, keys), logits(mlp, w, x, keys, bn_mode="batch", mask=mask)
    )
    with pytest.raises(ValueError, match="algorithm.mc_bn_mode='train'"):
        uncertainty.mc_logits(mlp, w, x, keys, bn_mode="train")


class TestAgainstNumPy(chex.TestCase):
    """The kernels jitted and op by op (chex variants) against NumPy; each variant draws
    about half the examples the property had before."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(15), deadline=None)
    @given(st.integers(1, 6), st.integers(1, 5), st.integers(2, 7), st.integers(0, 10**6))
    def test_predictive_entropy_matches_numpy_and_bounds(self, t, n, nc, seed):
        logits = np.random.default_rng(seed).normal(scale=3, size=(t, n, nc)).astype(np.float32)
        p_bar, h = self.variant(predictive_entropy)(jnp.asarray(logits))
        ref_p = np_softmax(logits.astype(np.float64)).mean(0)
        ref_h = -(ref_p * np.log(ref_p)).sum(-1)
        np.testing.assert_allclose(p_bar, ref_p, atol=1e-5)
        np.testing.assert_allclose(h, ref_h, atol=1e-4)
        assert np.all(np.asarray(h) >= 0) and np.all(np.asarray(h) <= np.log(nc) + 1e-6)  # AC1
        np.testing.assert_allclose(np.asarray(p_bar).sum(-1), 1.0, atol=1e-5)
        # AC4: the entropy of the average is at least the average entropy of the samples.
        p_t = np_softmax(logits.astype(np.float64))
        assert np.all(np.asarray(h) + 1e-4 >= (-(p_t * np.log(p_t)).sum(-1)).mean(0))

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(20), deadline=None)
    @given(
        st.integers(0, 6),
        st.integers(0, 6),
        st.floats(0, 1),
        st.sampled_from(["inverse", "complement"]),
        st.sampled_from(["mean", "sum"]),
        st.sampled_from([1e-6, 0.05]),
        st.integers(0, 10**6),
    )
    def test_relation_metric_matches_numpy(self, n_u, n_s, mu, form, reduction, eps, seed):
        rng = np.random.default_rng(seed)
        nc, pad = 4, 3
        ent_u = rng.uniform(0, np.log(nc), size=n_u + pad).astype(np.float32)
        mask_u = np.arange(n_u + pad) < n_u
        p_s = np_softmax(rng.normal(size=(n_s + pad, nc))).astype(np.float32)
        y_s = rng.integers(0, nc, size=n_s + pad)
        mask_s = np.arange(n_s + pad) < n_s
        relation_metric = self.variant(uncertainty.relation_metric, static_argnums=(6, 7, 8, 9))
        got = relation_metric(
            jnp.asarray(ent_u), mask_u, jnp.asarray(p_s), y_s, mask_s, mu, nc, form, reduction, eps
        )
        corr, h_bar, acc = np_corr(ent_u, mask_u, p_s, y_s, mask_s, mu, nc, form, reduction, eps)
        assert float(got["corr"]) == pytest.approx(corr, rel=1e-4, abs=1e-5)
        assert 0 <= float(got["h_bar"]) <= (1 if reduction == "mean" else max(n_u, 1)) + 1e-5
        # The kernel computes in float32, where a mu just below 1 (0.9999999999999999) is 1.
        if n_u and np.float32(mu) < 1 and form == "inverse":
            assert float(got["corr"]) > 0
        # Padding does not change Corr: different padding values give the same result.
        ent_u2 = np.where(mask_u, ent_u, 123.0).astype(np.float32)
        again = relation_metric(
            jnp.asarray(ent_u2), mask_u, jnp.asarray(p_s), y_s, mask_s, mu, nc, form, reduction, eps
        )
        assert float(again["corr"]) == pytest.approx(float(got["corr"]))

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(15), deadline=None)
    @given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 10**6))
    def test_aggregation(self, s, m, seed):
        rng = np.random.default_rng(seed)
        corr = rng.uniform(0, 3, size=(s, m)).astype(np.float32)
        valid = rng.uniform(size=(s, m)) < 0.7
        valid[:, 0] = True  # self is always valid
        average = self.variant(personalized_average)
        w = np.asarray(self.variant(aggregation_weights)(jnp.asarray(corr), jnp.asarray(valid)))
        assert (w >= 0).all() and np.allclose(w.sum(-1), 1, atol=1e-6)
        assert (w[~valid] == 0).all()
        ref = np.where(valid, corr, 0) / np.where(valid, corr, 0).sum(-1, keepdims=True)
        np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-6)  # float32 weights in [0, 1]
        helpers = {"k": rng.normal(size=(s, m, 3)).astype(np.float32)}
        avg = average(jnp.asarray(w), helpers)["k"]
        np.testing.assert_allclose(avg, np.einsum("sm,smd->sd", w, helpers["k"]), atol=1e-5)
        perm = rng.permutation(m)  # permuting helper slots leaves the result unchanged
        avg_p = average(jnp.asarray(w[:, perm]), {"k": helpers["k"][:, perm]})
        np.testing.assert_allclose(avg_p["k"], avg, atol=1e-5)
        same = {"k": np.repeat(helpers["k"][:, :1], m, axis=1)}  # identical models -> that model
        np.testing.assert_allclose(average(jnp.asarray(w), same)["k"], same["k"][:, 0], atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(15), deadline=None)
    @given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.integers(0, 10**6))
    def test_pseudo_labels(self, s, m, nu, seed):
        rng = np.random.default_rng(seed)
        nc = 3
        p_bar = np_softmax(rng.normal(size=(s, m, nu, nc))).astype(np.float32)
        ent = rng.uniform(0, 1, size=(s, m, nu)).astype(np.float32)
        ent[:, -1] = ent[:, 0]  # the last helper ties with self: ties must go to the lower slot
        valid = rng.uniform(size=(s, m)) < 0.6
        valid[:, 0] = True
        pseudo_labels = self.variant(helper_pseudo_labels, static_argnums=3)
        out = pseudo_labels(jnp.asarray(p_bar), jnp.asarray(ent), valid)
        y_hat, chosen, confidence = (np.asarray(a) for a in out)
        for a in range(s):
            for i in range(nu):
                masked = np.where(valid[a], ent[a, :, i], np.inf)
                assert chosen[a, i] == int(np.argmin(masked))  # first minimum, valid only
                np.testing.assert_allclose(y_hat[a, i], p_bar[a, chosen[a, i], i])
                assert confidence[a, i] == pytest.approx(p_bar[a, chosen[a, i], i].max())
        np.testing.assert_allclose(y_hat.sum(-1), 1, atol=1e-5)
        hard, hard_chosen, hard_conf = pseudo_labels(
            jnp.asarray(p_bar), jnp.asarray(ent), valid, True
        )
        np.testing.assert_array_equal(np.asarray(hard), np.eye(nc)[y_hat.argmax(-1)])
        np.testing.assert_array_equal(hard_chosen, chosen)
        np.testing.assert_array_equal(hard_conf, confidence)  # of the soft label, before one-hot

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(20), deadline=None)
    @given(st.integers(1, 4), st.integers(0, 10**6))
    def test_merge_best_equals_greedy_swap(self, r, seed):
        rng = np.random.default_rng(seed)
        inc_corr = rng.integers(0, 4, size=(1, r)).astype(np.float32)  # small ints: many ties
        cand_corr = rng.integers(0, 4, size=(1, r)).astype(np.float32)
        inc_ids, cand_ids = np.arange(r)[None], 100 + np.arange(r)[None]
        ids, corr, pos = self.variant(selection.merge_best)(inc_ids, inc_corr, cand_ids, cand_corr)
        new = np.asarray(pos) >= r
        # Alg. 2: swap the best remaining candidate for the worst incumbent while strictly better
        # (among tied incumbents the later slot goes, as top_k keeps lower indices first).
        order = lambda p: (p[0], -p[1])
        pool = sorted(zip(inc_corr[0], inc_ids[0], strict=True), key=order)
        for c, cid in sorted(zip(cand_corr[0], cand_ids[0], strict=True), key=order, reverse=True):
            if c > pool[0][0]:
                pool[0] = (c, cid)
                pool.sort(key=order)
        assert sorted(np.asarray(corr[0]).tolist()) == sorted(p[0] for p in pool)
        assert sorted(np.asarray(ids[0]).tolist()) == sorted(int(p[1]) for p in pool)
        # The sorted Corr of the slots never decreases element by element.
        assert (np.sort(np.asarray(corr[0])) >= np.sort(inc_corr[0])).all()
        assert (np.asarray(ids[0])[np.asarray(new[0])] >= 100).all()
