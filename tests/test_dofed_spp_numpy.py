"""DoFed-SPP's kernels jitted and op by op (chex variants) against the NumPy loops of
dofed_references.py."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from dofed_references import (
    F32,
    SEEDS,
    dyadic,
    kb_instance,
    linear_loss,
    make_clients,
    np_candidates,
    np_flat,
    np_greedy,
    np_linear_loss,
    np_opt,
    np_softmax,
    np_sr,
    np_topb_value,
    random_stochastic,
)
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.kernels import similarity as sim


class TestAgainstNumPy(chex.TestCase):
    """The kernels jitted and op by op (chex variants) against the NumPy loops above; each
    variant draws about half the examples the property had before."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(13), deadline=None)
    @given(
        st.integers(1, 6),
        st.integers(1, 6),
        st.integers(1, 40),
        st.sampled_from([None, 1, 2]),
        SEEDS,
    )
    def test_pairwise_distances_match_double_loop(self, n, m, p, batch, seed):
        rng = np.random.default_rng(seed)
        providers = rng.normal(size=(m, p)).astype(np.float32)
        refs = (providers[rng.integers(0, m, n)] + rng.normal(scale=1e-3, size=(n, p))).astype(
            np.float32
        )  # tiny distances: the Gram trick would lose them
        distances = self.variant(sim.pairwise_distances, static_argnames="batch_size")
        got = np.asarray(distances(jnp.asarray(providers), refs, batch_size=batch))
        ref = np.array(
            [[np.linalg.norm(providers[i].astype(np.float64) - refs[r]) for i in range(m)]
             for r in range(n)]
        )  # fmt: skip
        assert got.shape == (n, m)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_cross_losses_and_sr_distances_match_double_loop(self):
        """Vectorized L_cross (with the own-model diagonal) and dist equal a double loop over
        (n, i)."""
        cache, data = make_clients(1)
        rec, _ = make_clients(2)
        rec_prev, _ = make_clients(3)
        x, y, m = data
        n = x.shape[0]

        @self.variant
        def kernels(cache, rec, rec_prev, data):
            l_cross = sim.cross_evaluate(linear_loss, cache, data, batch_size=2)
            l_cross = sim.set_diagonal(l_cross, jax.vmap(linear_loss)(rec, data))
            flat = [sim.flatten_clients(v) for v in (cache, rec, rec_prev)]
            return l_cross, sim.sr_distances(*flat)

        l_cross, dist = (np.asarray(a) for a in kernels(cache, rec, rec_prev, data))
        for nn in range(n):
            for i in range(n):
                src = rec if i == nn else cache  # own current model on the diagonal
                want = np_linear_loss(src["w"][i], src["b"][i], x[nn], y[nn], m[nn])
                # float32 O(1) mean cross-entropies and distances vs float64: abs for float32.
                assert l_cross[nn, i] == pytest.approx(want, rel=1e-5, abs=1e-6)
                want_d = np.linalg.norm(np_flat(src, i) - np_flat(rec_prev, nn))
                assert dist[nn, i] == pytest.approx(want_d, rel=1e-5, abs=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(15), deadline=None)
    @given(
        st.integers(1, 5),
        st.sampled_from([0.25, 0.5, 1.0]),
        st.sampled_from([0.0, 0.125]),
        st.sampled_from([0.0, 0.5, 3.0]),
        st.booleans(),
        st.sampled_from(["keep_previous", "uniform", "zeros"]),
        st.booleans(),
        st.booleans(),
        SEEDS,
    )
    def test_sr_matches_numpy_reference(self, n, gamma, g1, g2, excl, rule, first, use_valid, seed):
        """Dyadic inputs keep every numerator exact, so the sign (and the clipping) is the same in
        the kernel and in the literal reference; rows are normalized over all N, self included."""
        rng = np.random.default_rng(seed)
        loss_cross = dyadic(rng, 10, (n, n), 16)
        loss_own = dyadic(rng, 3, (n,), 16)
        dist = dyadic(rng, 4, (n, n), 16)  # zeros included: the eps floor
        prev = None if first else random_stochastic(rng, n)
        valid = rng.uniform(size=(n, n)) < 0.7 if use_valid else None
        ratios = self.variant(
            sim.similarity_ratios, static_argnames=("eps", "exclude_self", "degenerate")
        )
        got, deg = ratios(
            loss_cross, loss_own, dist, prev, gamma=gamma, g1=g1, g2=g2, exclude_self=excl,
            valid=valid, degenerate=rule,
        )  # fmt: skip
        ref, ref_deg = np_sr(
            loss_cross, loss_own, dist, prev, gamma, g1, g2, 1e-8, excl, valid, rule
        )
        got, deg = np.asarray(got), np.asarray(deg)
        np.testing.assert_array_equal(deg, ref_deg)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
        assert (got >= 0).all() and np.isfinite(got).all()
        sums = got.sum(-1)
        np.testing.assert_allclose(sums[~deg], 1.0, atol=1e-6)  # AC1
        if rule == "keep_previous" and prev is not None:
            np.testing.assert_array_equal(got[deg], prev[deg])

    @chex.variants(with_jit=True, without_jit=True)
    def test_fedfomo_weights_equal_naive_loop(self):
        """G1 = G2 = 0, gamma = 1, target = reference = the client's own previous model: the
        kernel's weights equal FedFomo's clipped, normalized first-order weights from a naive loop,
        including rows whose weights are all 0 (kept at 0: the client keeps theta_prev)."""
        n = 6
        prev, data = make_clients(6, n=n, scale=1.0)
        uploaded, _ = make_clients(7, n=n, scale=1.0)
        # Client 5's previous model is excellent on its own data: no peer helps it (degenerate row).
        x, y, m = data
        prev["w"][5] = 0.0
        prev["b"][5] = 40.0 * (np.arange(3) == 0)
        y[5] = 0
        rng = np.random.default_rng(8)
        valid = rng.uniform(size=(n, n)) < 0.6
        np.fill_diagonal(valid, False)
        valid[np.arange(n), (np.arange(n) + 1) % n] = True  # everyone downloads at least one model
        data = (x, y, m)
        loss_own = jax.vmap(linear_loss)(prev, data)
        loss_cross = sim.cross_evaluate(linear_loss, uploaded, data)
        dist = sim.pairwise_distances(sim.flatten_clients(uploaded), sim.flatten_clients(prev))
        w, deg = self.variant(fw.fedfomo_weights)(loss_cross, loss_own, dist, valid)
        w = np.asarray(w)
        for r in range(n):
            l_prev = np_linear_loss(prev["w"][r], prev["b"][r], x[r], y[r], m[r])
            raw = np.zeros(n)
            for i in range(n):
                if valid[r, i]:
                    l_i = np_linear_loss(uploaded["w"][i], uploaded["b"][i], x[r], y[r], m[r])
                    d = np.linalg.norm(np_flat(uploaded, i) - np_flat(prev, r))
                    raw[i] = max((l_prev - l_i) / d, 0.0)
            want = raw / raw.sum() if raw.sum() > 0 else raw
            np.testing.assert_allclose(w[r], want, rtol=1e-4, atol=1e-6)
            assert bool(deg[r]) == (raw.sum() == 0)
        assert bool(deg[5]) and (w[5] == 0).all()
        assert not np.asarray(deg).all()

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(15), deadline=None)
    @given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.booleans(), SEEDS)
    def test_greedy_structure_and_value(self, n, k, b, exact, seed):
        greedy = self.variant(sim.greedy_select, static_argnames=("fast_path",))
        n, k, b = kb_instance(n, k, b)
        rng = np.random.default_rng(seed)
        s = dyadic(rng, 1, (n, n)) if exact else rng.uniform(size=(n, n)).astype(np.float32)
        s[rng.uniform(size=(n, n)) < 0.3] = 0.0  # many zeros: the degenerate-gain case
        chosen, x, val = greedy(jnp.asarray(s), jnp.int32(k), jnp.int32(b))
        chosen, x = np.asarray(chosen), np.asarray(x)
        ids = np.flatnonzero(chosen)
        assert len(ids) == k and ((ids >= 0) & (ids < n)).all()  # AC9: k distinct ids in [0, N)
        assert (x.sum(1) <= b).all() and not (x & ~chosen[None, :]).any()
        for r in range(n):  # each row's ones are its top-b SRs within the chosen set
            vals = np.sort(s[r, ids])[::-1]
            assert np.sort(s[r, x[r]])[::-1].tolist() == vals[:b].tolist()
        # AC10. float32 sum of <= 64 values in [0, 1] vs float64: rel above float32 rounding.
        assert float(val) == pytest.approx(np_topb_value(s, ids, b), rel=1e-5, abs=1e-6)
        if exact:  # identical sums: the tie rule (lowest index) must match the reference greedy
            assert sorted(np_greedy(s, k, b)) == ids.tolist()

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(13), deadline=None)
    @given(st.integers(2, 8), st.integers(1, 8), st.integers(1, 8), SEEDS)
    def test_greedy_against_brute_force(self, n, k, b, seed):
        greedy = self.variant(sim.greedy_select, static_argnames=("fast_path",))
        n, k, b = kb_instance(n, k, b)
        rng = np.random.default_rng(seed)
        s = rng.uniform(size=(n, n)) ** 3  # skewed, like real SR rows
        s = (s / s.sum(1, keepdims=True)).astype(np.float32)
        _, _, val = greedy(jnp.asarray(s), jnp.int32(k), jnp.int32(b))
        opt = np_opt(s, k, b)
        assert float(val) >= (1 - 1 / math.e) * opt - 1e-6
        assert float(val) <= opt + 1e-5
        # With K = B greedy is optimal and equals top_k of the column sums (fast path).
        chosen_kk, x_kk, val_kk = greedy(jnp.asarray(s), jnp.int32(k), jnp.int32(k))
        assert float(val_kk) == pytest.approx(np_opt(s, k, k), rel=1e-5, abs=1e-6)  # float32 sum
        fast = sim.greedy_select(jnp.asarray(s), k, k)
        np.testing.assert_array_equal(fast[0], chosen_kk)
        np.testing.assert_array_equal(fast[1], x_kk)
        top = np.argsort(-s.sum(0), kind="stable")[:k]
        assert sorted(top.tolist()) == np.flatnonzero(np.asarray(fast[0])).tolist()

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(13), deadline=None)
    @given(
        st.integers(1, 5),
        st.floats(-1.0, 12.0, **F32),
        st.floats(0.0, 3.0, **F32),
        st.floats(0.0, 3.0, **F32),
        SEEDS,
    )
    def test_budget_selection(self, n, c1, c2, c3, seed):
        rng = np.random.default_rng(seed)
        s = dyadic(rng, 1, (n, n))
        ks, bs, valid = sim.budget_candidates(c1, c2, c3, n)
        got = [(int(k), int(b)) for k, b, v in zip(ks, bs, valid, strict=True) if v]
        want = np_candidates(c1, c2, c3, n)
        assert got == want
        for k, b in got:
            assert 1 <= b <= k <= n
            assert np.float32(b) * np.float32(c2) + np.float32(k) * np.float32(c3) <= np.float32(c1)
        sel = self.variant(sim.select_with_budget)(jnp.asarray(s), c1, c2, c3)
        if not want:  # infeasible budget
            assert bool(sel.budget_violated) and int(sel.k) == 1 and int(sel.b) == 1
            assert int(np.asarray(sel.chosen).sum()) == 1
            return
        assert not bool(sel.budget_violated)
        values = [np_topb_value(s, np_greedy(s, k, b), b) for k, b in want]
        best = int(np.argmax(values))  # first maximum: the smallest K
        assert (int(sel.k), int(sel.b)) == want[best]
        assert float(sel.value) == pytest.approx(values[best], abs=1e-6)
        assert sorted(np_greedy(s, *want[best])) == np.flatnonzero(np.asarray(sel.chosen)).tolist()

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(13), deadline=None)
    @given(
        st.integers(1, 5),
        st.integers(1, 4),
        st.sampled_from([1, 3]),
        st.sampled_from([2, 5]),
        SEEDS,
    )
    def test_pseudo_labels_match_numpy(self, n, b, du, q, seed):
        """Labels are the argmax of the SR-weighted probability sum (Eq. 20), invariant to scaling
        a row of W, and with B = 1 they are the single top model's argmax."""
        greedy = self.variant(sim.greedy_select, static_argnames=("fast_path",))
        pseudo_labels = self.variant(sim.pseudo_labels)
        rng = np.random.default_rng(seed)
        b = min(b, n)
        k = min(n, b + 1)
        sr = random_stochastic(rng, n)
        sr[rng.uniform(size=(n, n)) < 0.2] = 0.0
        chosen, x, _ = greedy(jnp.asarray(sr), jnp.int32(k), jnp.int32(b))
        w, deg = self.variant(sim.labeling_weights)(jnp.asarray(sr), x)
        w, x = np.asarray(w), np.asarray(x)
        for r in range(n):  # W = S * x, uniform over x's models in degenerate rows
            sel = x[r]
            want = sr[r] * sel if (sr[r] * sel).sum() > 0 else sel / sel.sum()
            np.testing.assert_allclose(w[r], want, rtol=1e-6)
            assert bool(deg[r]) == ((sr[r] * sel).sum() == 0)
        probs = np_softmax(rng.normal(scale=2, size=(n, n, du, q))).astype(
            np.float32
        )  # dense [N,N]
        labels, vote = pseudo_labels(jnp.asarray(probs), jnp.asarray(w))
        labels, vote = np.asarray(labels), np.asarray(vote)
        ref = np.zeros((n, du, q))
        for r in range(n):
            for i in range(n):
                ref[r] += w[r, i] * probs[r, i].astype(np.float64)
        np.testing.assert_allclose(vote, ref, rtol=1e-5, atol=1e-7)
        for r in range(n):
            for d in range(du):  # argmax of the kernel's own vote, first maximum
                assert labels[r, d] == int(np.argmax(vote[r, d]))
                top2 = np.sort(ref[r, d])[-2:] if q > 1 else None
                if top2[1] - top2[0] > 1e-5:
                    assert labels[r, d] == int(np.argmax(ref[r, d]))
        # Positive rescaling of rows of W (powers of two: exact) leaves the labels unchanged.
        scale = 2.0 ** rng.integers(-4, 5, size=(n, 1))
        again, _ = pseudo_labels(jnp.asarray(probs), jnp.asarray(w * scale))
        np.testing.assert_array_equal(again, labels)
        # The B gathered slots give the same vote as the dense N-provider form.
        ids, w_sel, valid = sim.selected_slots(jnp.asarray(x), jnp.asarray(w), b)
        gathered = np.take_along_axis(probs, np.asarray(ids)[:, :, None, None], axis=1)
        lab_b, vote_b = pseudo_labels(jnp.asarray(gathered), w_sel)
        np.testing.assert_allclose(vote_b, vote, rtol=1e-5, atol=1e-7)
        assert np.asarray(valid).all()  # |U| = k >= b: every slot is used
        if b == 1:
            top = np.asarray(ids)[:, 0]
            for r in range(n):
                np.testing.assert_array_equal(labels[r], np.argmax(probs[r, top[r]], -1))
                assert top[r] == np.flatnonzero(x[r])[0]
