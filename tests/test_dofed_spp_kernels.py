"""DoFed-SPP kernels against plain NumPy references (spec dofed_spp.md sections 1.5, 2.2-2.4, 2.8;
acceptance checks AC1-AC6, AC8-AC15, AC25, AC26)."""

from __future__ import annotations

import itertools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.kernels import similarity as sim
from fedjax_semi.systems import wireless as wl

SEEDS = st.integers(0, 2**31 - 1)


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------- references


def np_sr(loss_cross, loss_own, dist, sr_prev, gamma, g1, g2, eps, exclude_self, valid, rule):
    """Eq. 19 literally, one (n, i) pair at a time, with docs/choices.md's degenerate-row rule."""
    n_rows, n_cols = loss_cross.shape
    out = np.zeros((n_rows, n_cols))
    degenerate = np.zeros(n_rows, bool)
    for n in range(n_rows):
        a = np.zeros(n_cols)
        allowed = np.ones(n_cols, bool)
        for i in range(n_cols):
            allowed[i] = (valid is None or valid[n, i]) and not (exclude_self and i == n)
            if allowed[i]:
                num = gamma * (loss_own[n] - loss_cross[n, i]) + g1 + gamma * g2
                a[i] = max(num / max(dist[n, i], eps), 0.0)
        if a.sum() > 0:
            out[n] = a / a.sum()
        else:
            degenerate[n] = True
            if rule == "zeros":
                out[n] = 0.0
            elif rule == "keep_previous" and sr_prev is not None:
                out[n] = sr_prev[n]
            elif allowed.any():
                out[n] = allowed / allowed.sum()
    return out, degenerate


def np_topb_value(s, chosen_ids, b):
    """F(U) by brute force: sort each row's SRs within U and sum the B largest."""
    ids = list(chosen_ids)
    if not ids:
        return 0.0
    return float(sum(np.sort(row[ids])[::-1][:b].sum() for row in s))


def np_greedy(s, k, b):
    """Algorithm 1 by marginal gains F(U + i) - F(U) recomputed from scratch; ties -> lowest i."""
    chosen = []
    for _ in range(k):
        base = np_topb_value(s, chosen, b)
        best, best_gain = None, -1.0
        for i in range(s.shape[0]):
            if i not in chosen:
                gain = np_topb_value(s, chosen + [i], b) - base
                if gain > best_gain:
                    best, best_gain = i, gain
        chosen.append(best)
    return chosen


def np_opt(s, k, b):
    """max F(U) over every U with |U| = k (F is monotone, so the optimum has k elements)."""
    return max(np_topb_value(s, u, b) for u in itertools.combinations(range(s.shape[0]), k))


def dyadic(rng, high, shape, denom=8):
    """Random multiples of 1/denom in [0, high): every sum and product below stays exact in f32,
    so ties are exact ties in both the kernel and the reference."""
    return (rng.integers(0, int(high * denom), size=shape) / denom).astype(np.float32)


def random_stochastic(rng, n):
    p = rng.uniform(0.1, 1.0, size=(n, n))
    return (p / p.sum(-1, keepdims=True)).astype(np.float32)


# ----------------------------------------------------------------------------- tiny model


def linear_loss(params, batch):
    """Masked mean cross-entropy of a linear softmax model."""
    x, y, m = batch
    logp = jax.nn.log_softmax(x @ params["w"] + params["b"])
    ce = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1)


def np_linear_loss(w, b, x, y, m):
    logp = np.log(np_softmax(x.astype(np.float64) @ w + b))
    total = sum(-logp[d, y[d]] for d in range(len(y)) if m[d])
    return total / max(m.sum(), 1)


def make_clients(seed, n=4, d=6, f=5, q=3, scale=0.5):
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.normal(scale=scale, size=(n, f, q)).astype(np.float32),
        "b": rng.normal(scale=scale, size=(n, q)).astype(np.float32),
    }
    x = rng.normal(size=(n, d, f)).astype(np.float32)
    y = rng.integers(0, q, size=(n, d)).astype(np.int32)
    counts = rng.integers(1, d + 1, size=n)
    m = (np.arange(d)[None, :] < counts[:, None]).astype(np.float32)  # padded, variable size
    return params, (x, y, m)


def np_flat(params, i):
    return np.concatenate([params["b"][i].ravel(), params["w"][i].ravel()]).astype(np.float64)


# ----------------------------------------------------------------------------- distances (AC8)


def test_flatten_and_max_pairwise_distance():
    params, _ = make_clients(4)
    flat = np.asarray(sim.flatten_clients(params))
    assert flat.shape == (4, 3 + 5 * 3) and flat.dtype == np.float32
    np.testing.assert_allclose(flat[2], np_flat(params, 2), rtol=1e-6)
    want = max(np.linalg.norm(flat[a] - flat[b]) for a in range(4) for b in range(4))
    assert float(sim.max_pairwise_distance(jnp.asarray(flat))) == pytest.approx(want, rel=1e-5)


def test_self_distance_positive_after_local_update():
    """d[n, n] = ||R_n - R_n^prev|| > 0 after one local SGD step, and S[n, n] is finite."""
    rec_prev, data = make_clients(5)
    grads = jax.vmap(jax.grad(linear_loss))(rec_prev, data)
    rec = jax.tree.map(lambda p, g: p - 0.1 * g, rec_prev, grads)
    flat_prev, flat_rec = sim.flatten_clients(rec_prev), sim.flatten_clients(rec)
    dist = np.asarray(sim.sr_distances(flat_prev, flat_rec, flat_prev))
    want = np.linalg.norm(np.asarray(flat_rec) - np.asarray(flat_prev), axis=1)
    np.testing.assert_allclose(np.diag(dist), want, rtol=1e-5)
    assert (np.diag(dist) > 0).all()
    l_cross = sim.set_diagonal(
        sim.cross_evaluate(linear_loss, rec_prev, data), jax.vmap(linear_loss)(rec, data)
    )
    sr, _ = sim.similarity_ratios(l_cross, jax.vmap(linear_loss)(rec_prev, data), dist, g2=1.0)
    assert np.isfinite(np.diag(np.asarray(sr))).all()
    # Without the update the self distance is 0; the eps floor keeps S finite.
    zero_self = sim.set_diagonal(jnp.asarray(dist), jnp.zeros(4))
    sr0, _ = sim.similarity_ratios(l_cross, jnp.diag(l_cross), zero_self)
    assert np.isfinite(np.asarray(sr0)).all()
    assert (np.diag(np.asarray(sr0)) > 0.99).all()  # a[n, n] = gamma G2 / eps dominates


# ----------------------------------------------------------------------------- ratios (Eq. 19)


def test_sr_hand_computed_three_clients():
    """gamma = 0.5, G1 = 0.2, G2 = 1. Worked by hand, a = max((g (l_T - l_i) + G1 + g G2) / d, 0):
    row 0: numerators (-0.3, 0.95, 0.45) / d (0.5, 2, 1) -> a = (0, 0.475, 0.45) -> (0, 19, 18)/37
    row 1: numerators (1.2, -0.55, 0.7) / d (1, 0.4, 2) -> a = (1.2, 0, 0.35) -> (24, 0, 7)/31
    row 2: numerators (-1.55, -2.05, 0.9) / d (1, 2, 0.3) -> a = (0, 0, 3) -> (0, 0, 1)
    """
    loss_own = jnp.asarray([1.0, 2.0, 0.5])
    loss_cross = jnp.asarray([[3.0, 0.5, 1.5], [1.0, 4.5, 2.0], [5.0, 6.0, 0.1]])
    dist = jnp.asarray([[0.5, 2.0, 1.0], [1.0, 0.4, 2.0], [1.0, 2.0, 0.3]])
    sr, deg = sim.similarity_ratios(loss_cross, loss_own, dist, gamma=0.5, g1=0.2, g2=1.0)
    want = [[0, 19 / 37, 18 / 37], [24 / 31, 0, 7 / 31], [0, 0, 1]]
    # float32 ratios in [0, 1] after a few ops: rtol above float32 rounding, atol for the 0s.
    np.testing.assert_allclose(sr, want, rtol=1e-5, atol=1e-6)
    assert not np.asarray(deg).any()
    # exclude_self drops a[n, n] before normalizing: rows 0 and 1 had a[n, n] = 0 already,
    # row 2 has nothing left, so it is degenerate (uniform over the allowed providers 0 and 1).
    sr_x, deg_x = sim.similarity_ratios(
        loss_cross, loss_own, dist, gamma=0.5, g1=0.2, g2=1.0, exclude_self=True
    )
    np.testing.assert_allclose(sr_x, [want[0], want[1], [0.5, 0.5, 0]], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(deg_x, [False, False, True])


def test_sr_degenerate_rows():
    """Row 2 made degenerate (own loss 5 instead of 0.1): it keeps sr_prev's row; on the first
    call (no sr_prev) it is uniform; with rule "zeros" it is 0. Other rows are untouched."""
    loss_own = jnp.asarray([1.0, 2.0, 0.5])
    loss_cross = jnp.asarray([[3.0, 0.5, 1.5], [1.0, 4.5, 2.0], [5.0, 6.0, 5.0]])
    dist = jnp.asarray([[0.5, 2.0, 1.0], [1.0, 0.4, 2.0], [1.0, 2.0, 0.3]])
    prev = jnp.asarray([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1]])
    kw = dict(gamma=0.5, g1=0.2, g2=1.0)
    sr, deg = sim.similarity_ratios(loss_cross, loss_own, dist, prev, **kw)
    np.testing.assert_array_equal(deg, [False, False, True])
    np.testing.assert_allclose(sr[2], prev[2])
    # float32 ratios in [0, 1] vs float64 fractions: rtol above float32 rounding, atol for 0s.
    np.testing.assert_allclose(sr[0], [0, 19 / 37, 18 / 37], rtol=1e-5, atol=1e-6)
    first, _ = sim.similarity_ratios(loss_cross, loss_own, dist, None, **kw)
    np.testing.assert_allclose(first[2], [1 / 3] * 3, rtol=1e-5, atol=1e-6)
    uni, _ = sim.similarity_ratios(loss_cross, loss_own, dist, prev, degenerate="uniform", **kw)
    np.testing.assert_allclose(uni[2], [1 / 3] * 3, rtol=1e-5, atol=1e-6)
    zero, _ = sim.similarity_ratios(loss_cross, loss_own, dist, prev, degenerate="zeros", **kw)
    np.testing.assert_array_equal(zero[2], 0.0)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(2, 6), st.floats(0.01, 3.0), st.floats(0.01, 2.0), SEEDS)
def test_sr_monotone_in_loss_and_distance(n, drop, grow, seed):
    """Lowering l_n(M_i) never lowers S[n, i]; growing d[n, i] never raises it."""
    rng = np.random.default_rng(seed)
    loss_cross = rng.uniform(0, 6, (n, n)).astype(np.float32)
    loss_own = rng.uniform(0, 2, n).astype(np.float32)
    dist = rng.uniform(0.1, 3, (n, n)).astype(np.float32)
    prev = random_stochastic(rng, n)
    r, i = rng.integers(0, n, 2)
    kw = dict(gamma=0.1, g1=0.0, g2=1.0)
    base = np.asarray(sim.similarity_ratios(loss_cross, loss_own, dist, prev, **kw)[0])
    lower = loss_cross.copy()
    lower[r, i] -= drop
    s_low = np.asarray(sim.similarity_ratios(lower, loss_own, dist, prev, **kw)[0])
    assert s_low[r, i] >= base[r, i] - 1e-6
    far = dist.copy()
    far[r, i] += grow
    s_far = np.asarray(sim.similarity_ratios(loss_cross, loss_own, far, prev, **kw)[0])
    assert s_far[r, i] <= base[r, i] + 1e-6


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 6), st.floats(1e-3, 1.0), st.floats(0.0, 4.0), SEEDS)
def test_sr_does_not_depend_on_gamma_when_g1_is_zero(n, gamma, g2, seed):
    rng = np.random.default_rng(seed)
    args = (
        rng.uniform(0, 6, (n, n)).astype(np.float32),
        rng.uniform(0, 2, n).astype(np.float32),
        rng.uniform(0.05, 3, (n, n)).astype(np.float32),
        random_stochastic(rng, n),
    )
    s1, d1 = sim.similarity_ratios(*args, gamma=gamma, g1=0.0, g2=g2)
    s10, d10 = sim.similarity_ratios(*args, gamma=10 * gamma, g1=0.0, g2=g2)
    np.testing.assert_array_equal(d1, d10)
    # float32 ratios in [0, 1]; numerators that nearly cancel round differently under gamma and
    # 10 gamma, so atol is a few float32 ulps of the row scale (1), far below any real change.
    np.testing.assert_allclose(s1, s10, rtol=1e-5, atol=1e-6)
    # With G1 > 0 gamma matters: the check above is able to fail.
    if n >= 2:
        t1, _ = sim.similarity_ratios(*args, gamma=gamma, g1=5.0, g2=g2)
        t10, _ = sim.similarity_ratios(*args, gamma=10 * gamma, g1=5.0, g2=g2)
        assert not np.allclose(t1, t10, rtol=1e-5, atol=1e-7)


def test_sr_jit_and_vmap_with_traced_constants():
    rng = np.random.default_rng(0)
    lc = rng.uniform(0, 6, (3, 5, 5)).astype(np.float32)
    lo = rng.uniform(0, 2, (3, 5)).astype(np.float32)
    d = rng.uniform(0.1, 3, (3, 5, 5)).astype(np.float32)
    prev = np.stack([random_stochastic(rng, 5) for _ in range(3)])

    def fn(lc, lo, d, prev, g2):
        return sim.similarity_ratios(lc, lo, d, prev, gamma=0.01, g2=g2)

    batched = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, 0, None)))(lc, lo, d, prev, jnp.float32(2.0))
    for s in range(3):
        one = sim.similarity_ratios(lc[s], lo[s], d[s], prev[s], gamma=0.01, g2=2.0)
        # float32 ratios in [0, 1], jit + vmap vs eager: atol for entries near 0.
        np.testing.assert_allclose(batched[0][s], one[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(batched[1][s], one[1])


# ----------------------------------------------------------------------------- FedFomo (AC6)


def test_fedfomo_affinity_update_and_downloads():
    rng = np.random.default_rng(9)
    n, m = 5, 2
    affinity = np.eye(n, dtype=np.float32)  # FedFomo's reference code starts from the identity
    ids = np.stack(
        [rng.choice([j for j in range(n) if j != r], m, replace=False) for r in range(n)]
    )
    raw = rng.normal(size=(n, m)).astype(np.float32)
    valid = np.ones((n, m), bool)
    valid[0, 1] = False
    got = np.asarray(fw.fedfomo_affinity_update(affinity, raw, ids, valid))
    want = affinity.astype(np.float64).copy()
    for r in range(n):
        for s in range(m):
            if valid[r, s]:
                want[r, ids[r, s]] += raw[r, s]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # epsilon = 0: the top-m of each affinity row, never the client itself.
    aff = rng.normal(size=(n, n)).astype(np.float32)
    np.fill_diagonal(aff, 100.0)
    greedy = np.asarray(fw.fedfomo_choose_downloads(jax.random.PRNGKey(0), aff, m, 0.0))
    for r in range(n):
        order = [j for j in np.argsort(-aff[r], kind="stable") if j != r][:m]
        assert greedy[r].tolist() == order
    # epsilon = 1: random, distinct, never self, and not always the greedy choice.
    seen_other = False
    for s in range(10):
        ids_r = np.asarray(fw.fedfomo_choose_downloads(jax.random.PRNGKey(s), aff, m, 1.0))
        for r in range(n):
            assert len(set(ids_r[r].tolist())) == m and r not in ids_r[r]
        seen_other |= not np.array_equal(ids_r, greedy)
    assert seen_other


# ----------------------------------------------------------------------------- greedy (AC9-AC11)


def kb_instance(draw_n, draw_k, draw_b):
    k = min(draw_k, draw_n)
    return draw_n, k, min(draw_b, k)


def test_greedy_beats_top_k_when_b_is_small():
    """B < K rewards diversity: consumers 0-2 value providers 0 and 1 alike, consumer 3 only
    provider 2. Greedy with K = 2, B = 1 takes {0, 2} (F = 2.5); the top-2 column sums would take
    {0, 1} (F = 1.5)."""
    s = jnp.asarray([[0.5, 0.5, 0, 0]] * 3 + [[0, 0, 1.0, 0]])
    chosen, x, val = sim.greedy_select(s, 2, 1)
    assert np.flatnonzero(np.asarray(chosen)).tolist() == [0, 2]
    assert float(val) == pytest.approx(2.5)
    assert float(sim.selection_value(s, jnp.asarray([1, 1, 0, 0], bool), 1)) == pytest.approx(1.5)
    np.testing.assert_array_equal(np.asarray(x).sum(1), [1, 1, 1, 1])
    top2 = sim.colsum_select(s, 2)[0]
    np.testing.assert_array_equal(top2, [True, True, False, False])


def test_greedy_vmaps_over_k_and_b():
    rng = np.random.default_rng(3)
    s = jnp.asarray(rng.uniform(size=(7, 7)).astype(np.float32))
    ks, bs = jnp.asarray([1, 3, 5, 7]), jnp.asarray([1, 2, 5, 3])
    chosen, x, vals = jax.jit(jax.vmap(lambda k, b: sim.greedy_select(s, k, b)))(ks, bs)
    for j in range(4):
        one = sim.greedy_select(s, int(ks[j]), int(bs[j]), fast_path=False)
        np.testing.assert_array_equal(chosen[j], one[0])
        np.testing.assert_array_equal(x[j], one[1])
        # float32 sums of <= 49 values in [0, 1], vmapped vs one at a time.
        assert float(vals[j]) == pytest.approx(float(one[2]), rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------------------- budget (AC12)


def np_candidates(c1, c2, c3, n):
    """Spec 2.3.3 by loops: every (K, B(K)) with K in [min(K_lo, K_hi), K_hi]."""
    c1, c2, c3 = np.float32(c1), np.float32(c2), np.float32(c3)
    b_of = {}
    for k in range(1, n + 1):
        fits = [b for b in range(1, k + 1) if np.float32(b) * c2 + np.float32(k) * c3 <= c1]
        b_of[k] = max(fits) if fits else 0
    k_hi = max([k for k in b_of if b_of[k] >= 1], default=0)
    k_lo = max([k for k in b_of if b_of[k] == k], default=0)
    k_lo = max(k_lo, 1)
    return [(k, b_of[k]) for k in range(min(k_lo, k_hi), k_hi + 1) if k >= 1]


def test_budget_candidates_closed_form_example():
    """C1 = 10, C2 = 1, C3 = 2, N = 6: K_lo = floor(10/3) = 3, K_hi = min(6, floor(9/2)) = 4,
    B(3) = min(3, floor(4/1)) = 3, B(4) = min(4, floor(2/1)) = 2."""
    ks, bs, valid = sim.budget_candidates(10.0, 1.0, 2.0, 6)
    pairs = [(int(k), int(b)) for k, b, v in zip(ks, bs, valid, strict=True) if v]
    assert pairs == [(3, 3), (4, 2)]
    # Free labeling (C2 = 0) and free uploads (C3 = 0) need no division.
    ks, bs, valid = sim.budget_candidates(5.0, 0.0, 2.0, 6)
    assert [(int(k), int(b)) for k, b, v in zip(ks, bs, valid, strict=True) if v] == [(2, 2)]
    ks, bs, valid = sim.budget_candidates(3.0, 1.0, 0.0, 4)
    assert [(int(k), int(b)) for k, b, v in zip(ks, bs, valid, strict=True) if v] == [
        (3, 3),
        (4, 3),
    ]


# float32 values without subnormals: XLA:CPU flushes f32 subnormals to zero, NumPy does not.
F32 = {"width": 32, "allow_subnormal": False}


# ----------------------------------------------------------------------------- upload (AC13)


def test_upload_to_cache():
    cache, _ = make_clients(10)
    rec, _ = make_clients(11)
    chosen = jnp.asarray([True, False, True, False])
    rounds = jnp.asarray([0, 0, 2, 1], jnp.int32)
    new, new_rounds = jax.jit(sim.upload_to_cache)(cache, rec, chosen, rounds, 5)
    for leaf in ("w", "b"):
        for i in range(4):
            src = rec if chosen[i] else cache
            np.testing.assert_array_equal(new[leaf][i], src[leaf][i])
    np.testing.assert_array_equal(new_rounds, [5, 0, 5, 1])
    same, none = sim.upload_to_cache(cache, rec, jnp.zeros(4, bool))
    assert none is None
    np.testing.assert_array_equal(same["w"], cache["w"])


# ------------------------------------------------------------------------ labeling (AC14, AC15)


def test_labeling_weights_renormalize_and_logits():
    sr = jnp.asarray([[0.2, 0.3, 0.5], [0.0, 0.0, 1.0]])
    x = jnp.asarray([[True, True, False], [True, True, False]])
    w, deg = sim.labeling_weights(sr, x, renormalize=True)
    np.testing.assert_allclose(w, [[0.4, 0.6, 0.0], [0.5, 0.5, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(deg, [False, True])
    logits = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype(np.float32)
    a = sim.soft_vote(jnp.asarray(logits), w, from_logits=True)
    b = sim.soft_vote(jnp.asarray(np_softmax(logits)), w)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_selected_slots_pads_short_rows():
    x = jnp.asarray([[False, True, False, True], [False, False, True, False]])
    w = jnp.asarray([[9.0, 0.3, 9.0, 0.7], [9.0, 9.0, 1.0, 9.0]])
    ids, w_sel, valid = sim.selected_slots(x, w, 2)
    np.testing.assert_array_equal(ids, [[1, 3], [2, 0]])
    np.testing.assert_allclose(w_sel, [[0.3, 0.7], [1.0, 0.0]])
    np.testing.assert_array_equal(valid, [[True, True], [True, False]])


def test_student_targets_and_labeling_accuracy():
    rng = np.random.default_rng(12)
    n, du, dl = 3, 7, 4
    y_pl = rng.integers(0, 5, (n, du)).astype(np.int32)
    y_l = rng.integers(0, 5, (n, dl)).astype(np.int32)
    mask_u = np.arange(du)[None, :] < np.array([[7], [3], [0]])
    mask_l = np.arange(dl)[None, :] < np.array([[4], [2], [1]])
    labels, mask = sim.student_targets(jnp.asarray(y_pl), mask_u, jnp.asarray(y_l), mask_l)
    labels, mask = np.asarray(labels), np.asarray(mask)
    assert labels.shape == (n, du + dl) and mask.shape == (n, du + dl)
    np.testing.assert_array_equal(mask.sum(1), mask_u.sum(1) + mask_l.sum(1))  # |D^p|
    np.testing.assert_array_equal(labels[:, du:], y_l)  # D_lab keeps its true labels
    np.testing.assert_array_equal(labels[:, :du], y_pl)
    y_true = np.where(rng.uniform(size=(n, du)) < 0.5, y_pl, (y_pl + 1) % 5)
    acc = np.asarray(sim.labeling_accuracy(jnp.asarray(y_pl), jnp.asarray(y_true), mask_u))
    for r in range(n):
        valid = mask_u[r]
        want = (y_pl[r][valid] == y_true[r][valid]).mean() if valid.any() else 0.0
        assert acc[r] == pytest.approx(want)


# ----------------------------------------------------------------------------- bad arguments


def test_similarity_bad_arguments_name_the_argument():
    lc, lo, d = jnp.ones((3, 3)), jnp.ones(3), jnp.ones((3, 3))
    cases = [
        (dict(degenerate="last"), r"degenerate='last' is not allowed: one of \['keep_previous'"),
        (dict(gamma=0.0), r"gamma=0.0 is not allowed: a number > 0"),
        (dict(g1=-1.0), r"g1=-1.0 is not allowed: a number >= 0"),
        (dict(g2=-0.5), r"g2=-0.5 is not allowed: a number >= 0"),
        (dict(eps=0.0), r"eps=0.0 is not allowed: a number > 0"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            sim.similarity_ratios(lc, lo, d, **kw)
    with pytest.raises(ValueError, match=r"dist.shape=\(3, 2\)"):
        sim.similarity_ratios(lc, lo, jnp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"sr_prev.shape=\(2, 2\)"):
        sim.similarity_ratios(lc, lo, d, jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="exclude_self=True"):
        sim.similarity_ratios(jnp.ones((3, 2)), lo, jnp.ones((3, 2)), exclude_self=True)
    with pytest.raises(ValueError, match=r"providers.shape=\(3, 4\)"):
        sim.pairwise_distances(jnp.ones((3, 4)), jnp.ones((3, 5)))


def test_selection_bad_arguments_name_the_argument():
    s = jnp.ones((4, 4))
    with pytest.raises(ValueError, match=r"k=0 is not allowed: an int in \[1, N\] = \[1, 4\]"):
        sim.greedy_select(s, 0, 1)
    with pytest.raises(ValueError, match=r"k=5 is not allowed"):
        sim.greedy_select(s, 5, 1)
    with pytest.raises(ValueError, match=r"b=3 is not allowed: an int with 1 <= b <= k \(k=2\)"):
        sim.greedy_select(s, 2, 3)
    with pytest.raises(ValueError, match=r"b=0 is not allowed"):
        sim.greedy_select(s, 2, 0)
    with pytest.raises(ValueError, match=r"sr.shape=\(4, 3\)"):
        sim.greedy_select(jnp.ones((4, 3)), 2, 1)
    with pytest.raises(ValueError, match=r"c3=-1.0 is not allowed: a number >= 0"):
        sim.budget_candidates(1.0, 0.5, -1.0, 4)
    with pytest.raises(ValueError, match=r"n=0 is not allowed: an int >= 1"):
        sim.budget_candidates(1.0, 0.5, 1.0, 0)
    with pytest.raises(ValueError, match=r"b=5 is not allowed: an int in \[1, M\] = \[1, 4\]"):
        sim.selected_slots(s > 0, s, 5)
    with pytest.raises(ValueError, match=r"m=4 is not allowed: an int in \[1, N - 1\]"):
        fw.fedfomo_choose_downloads(jax.random.PRNGKey(0), s, 4, 0.1)
    with pytest.raises(ValueError, match=r"epsilon=1.5 is not allowed: a number in \[0, 1\]"):
        fw.fedfomo_choose_downloads(jax.random.PRNGKey(0), s, 2, 1.5)


def test_wireless_bad_arguments_name_the_argument():
    chosen = jnp.ones(3, bool)
    with pytest.raises(ValueError, match=r"mode='lte' is not allowed: one of \['empirical'"):
        wl.round_upload_time(chosen, 2.0, mode="lte")
    with pytest.raises(ValueError, match=r"key=None is not allowed with mode='empirical'"):
        wl.round_upload_time(chosen, 2.0)
    with pytest.raises(ValueError, match=r"rate_mbps=None is not allowed with mode='shannon'"):
        wl.round_upload_time(chosen, 2.0, mode="shannon")
    with pytest.raises(ValueError, match=r"rate_mbps=0.0 is not allowed: rates > 0"):
        wl.round_upload_time(chosen, 2.0, mode="shannon", rate_mbps=0.0)
    with pytest.raises(ValueError, match=r"rate_range=\(5.0, 2.0\) is not allowed"):
        wl.sample_rates(jax.random.PRNGKey(0), (3,), (5.0, 2.0))
    with pytest.raises(ValueError, match=r"model_mb=-1.0 is not allowed"):
        wl.upload_time(-1.0, 2.0)
    with pytest.raises(ValueError, match=r"bandwidth_hz=0.0 is not allowed"):
        wl.shannon_rate(0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"distance_km=0.0 is not allowed"):
        wl.path_loss_gain(0.0)
    with pytest.raises(ValueError, match=r"cpu_hz=0 is not allowed"):
        wl.local_compute_time(1, 1, 1, 0)


# ------------------------------------------------------------------------ wireless (AC25, AC26)


def test_shannon_golden_numbers():
    """b = 1 MHz, N0 = 1e-12 W/Hz, g = 1e-5, p = 0.1 W: SNR g p / (N0 b) = 1, so
    r = 1e6 * log2(2) = 1e6 bit/s = 0.125 MB/s and one 1 MB model takes 8 s; K = 3 takes 24 s.
    With p = 0.3 W, SNR = 3, r = 2e6 bit/s and K = 3 takes 12 s."""
    args = (1e6, 1e-5, 0.1, 1e-12)
    # float32 through rounded constants, a product, a ratio and log2: rel 1e-5 (not 1e-6, a
    # few float32 ulps); none of these values is near 0.
    assert float(wl.shannon_rate(*args)) == pytest.approx(1e6, rel=1e-5)
    assert float(wl.shannon_rate_mbps(*args)) == pytest.approx(0.125, rel=1e-5)
    assert float(wl.design_upload_time(3, 1.0, *args)) == pytest.approx(24.0, rel=1e-5)
    assert float(wl.design_upload_time(3, 1.0, 1e6, 1e-5, 0.3, 1e-12)) == pytest.approx(
        12.0, rel=1e-5
    )
    # shannon mode of the round clock: K uploads at the same rate = Eq. 24's K m / r.
    chosen = jnp.asarray([True, False, True, True, False])
    total, per = wl.round_upload_time(
        chosen, 1.0, mode="shannon", rate_mbps=wl.shannon_rate_mbps(*args)
    )
    assert float(total) == pytest.approx(24.0, rel=1e-5)
    np.testing.assert_allclose(per, [8, 0, 8, 8, 0], rtol=1e-5)  # the 0s are exact (where)
    # Spec 3.6's example units: -174 dBm/Hz, and 128.1 dB of path loss at 1 km.
    # abs=0: these values (4e-21, 1.5e-13) are below approx's default abs of 1e-12, which
    # would let any value in [0, 1e-12] pass; float32 10 ** x is good to rel 1e-5 here.
    assert float(wl.dbm_to_watt(-174.0)) == pytest.approx(10**-20.4, rel=1e-5, abs=0)
    assert float(wl.path_loss_gain(1.0)) == pytest.approx(10**-12.81, rel=1e-5, abs=0)
    assert float(wl.path_loss_gain(0.1)) == pytest.approx(10 ** -((128.1 - 37.6) / 10), rel=1e-5)


def test_empirical_upload_times():
    """Each upload takes m / r with r in [2, 10] MB/s, fresh per upload; unchosen clients (and
    the Local baseline, which uploads nothing) add no time; the mean matches m ln(5) / 8."""
    m = 2.1
    chosen = jnp.asarray([True, False, True, True, False, True])
    total, per = wl.round_upload_time(chosen, m, key=jax.random.PRNGKey(0))
    per = np.asarray(per)
    assert float(total) == pytest.approx(per.sum(), rel=1e-5)  # float32 sums, another order
    assert (per[[1, 4]] == 0).all()
    assert ((per[[0, 2, 3, 5]] >= m / 10 - 1e-6) & (per[[0, 2, 3, 5]] <= m / 2 + 1e-6)).all()
    other, _ = wl.round_upload_time(chosen, m, key=jax.random.PRNGKey(1))
    assert float(other) != float(total)  # a fresh draw every round
    none, _ = wl.round_upload_time(jnp.zeros(6, bool), m, key=jax.random.PRNGKey(0))
    assert float(none) == 0.0
    many = np.asarray(wl.sample_rates(jax.random.PRNGKey(2), (200_000,)))
    assert many.min() >= 2.0 and many.max() <= 10.0
    assert np.mean(m / many) == pytest.approx(m * wl.expected_inverse_rate(), rel=0.01)
    # Spec 2.3.3's numbers: E[1/r] = ln 5 / 8 = 0.2012 s/MB, C3 = 0.4225 s for 2.1 MB.
    assert wl.expected_inverse_rate() == pytest.approx(np.log(5) / 8)
    assert m * wl.expected_inverse_rate() == pytest.approx(0.4225, abs=1e-4)
    assert 51.2 * wl.expected_inverse_rate() == pytest.approx(10.30, abs=0.01)
    assert wl.expected_inverse_rate((4.0, 4.0)) == pytest.approx(0.25)


def test_simulated_clock():
    """Phase 0 adds L rounds of training, N uploads and the SR inference; every round adds
    compute plus the chosen uploads, so the clock is strictly increasing."""
    n, m = 5, 2.18
    kw = dict(sec_per_train_sample=1e-3, sec_per_infer_sample=2e-4)
    n_train, n_lab, n_unl = np.array([1000, 800, 1000, 900, 1000]), 20, 380
    comp0 = wl.phase0_compute_time(n_train, n_lab, n, 10, **kw)
    # float32 products and a sum of O(10) s vs float64: rel a few float32 ulps; never near 0.
    assert float(comp0) == pytest.approx(10 * 1000 * 1e-3 + n * 20 * 2e-4, rel=1e-5)
    up0, per0 = wl.round_upload_time(jnp.ones(n, bool), m, key=jax.random.PRNGKey(0))
    assert int((np.asarray(per0) > 0).sum()) == n  # all N clients upload in Phase 0
    clock = wl.advance_clock(0.0, comp0, up0)
    times = [float(clock)]
    rng = np.random.default_rng(0)
    for r in range(1, 6):
        chosen = jnp.asarray(rng.permutation(n) < 2)
        t_up, _ = wl.round_upload_time(chosen, m, key=jax.random.fold_in(jax.random.PRNGKey(1), r))
        t_comp = wl.dofed_compute_time(n_train, n_lab, n_unl, n, 2, **kw)
        clock = jax.jit(wl.advance_clock)(clock, t_comp, t_up)
        # float32 clock of O(10-100) s; rel 1e-5 is far below one round's increment (> 1 s).
        assert float(clock) == pytest.approx(times[-1] + float(t_comp) + float(t_up), rel=1e-5)
        times.append(float(clock))
    assert all(b > a for a, b in itertools.pairwise(times))
    assert bool(wl.over_budget(times[-1], times[-1])) and not bool(
        wl.over_budget(times[-2], times[-1])
    )


def test_dofed_compute_time_matches_formula():
    kw = dict(sec_per_train_sample=1e-3, sec_per_infer_sample=2e-4, epochs_rec=2, epochs_tar=3)
    n_train = np.array([1000, 3000, 2000])
    n_lab = np.array([20, 60, 10])
    n_unl = np.array([380, 100, 190])
    got = float(wl.dofed_compute_time(n_train, n_lab, n_unl, 25, 10, **kw))
    per = [
        n_train[c] * 1e-3 * 2
        + (n_unl[c] + n_lab[c]) * 1e-3 * 3
        + 25 * n_lab[c] * 2e-4
        + 10 * n_unl[c] * 2e-4
        for c in range(3)
    ]
    # The slowest client sets the pace. float32 products and sums of O(10) s vs float64.
    assert got == pytest.approx(max(per), rel=1e-5)


@settings(max_examples=examples(30), deadline=None)
@given(
    st.integers(1, 10),
    st.integers(1, 10),
    st.floats(1.0, 200.0),
    st.floats(0.01, 5.0),
    st.floats(0.0, 2.0),
)
def test_budget_constants_equal_eqs_23_to_25(k, b, round_budget, dist_km, c_pse_giga):
    """B C2 + K C3 <= C1 (Eq. 26) exactly when t^l + t^u <= T / G (Eqs. 23-25)."""
    b = min(b, k)
    comp = dict(iterations=1, cycles_train=2e6, num_samples=1000, cycles_sr=5e8, cpu_hz=1e10)
    radio = dict(
        bandwidth_hz=1e7, gain=wl.path_loss_gain(dist_km), power_w=0.2,
        noise_psd=wl.dbm_to_watt(-174.0),
    )  # fmt: skip
    cycles_pse = c_pse_giga * 1e9
    fixed = wl.design_compute_time(cycles_pse=cycles_pse, b=0, **comp)
    label = cycles_pse / comp["cpu_hz"]
    per_up = wl.design_upload_time(1, 2.18, **radio)
    c1, c2, c3 = wl.budget_constants(round_budget, fixed, label, per_up)
    t_round = wl.design_compute_time(cycles_pse=cycles_pse, b=b, **comp) + wl.design_upload_time(
        k, 2.18, **radio
    )
    lhs = float(b * c2 + k * c3)
    assert lhs == pytest.approx(float(t_round) - float(fixed), rel=1e-4)
    if abs(float(t_round) - round_budget) > 1e-3 * round_budget:  # away from the boundary
        assert (lhs <= float(c1)) == (float(t_round) <= round_budget)


def test_paper_model_formulas():
    assert float(wl.local_compute_time(2, 3e6, 1000, 1e9)) == pytest.approx(6.0)  # Eq. 7
    assert float(wl.total_time(50, 0.5, 4.2)) == pytest.approx(235.0)  # Eq. 12
    assert float(wl.upload_time(2.1, 7.0)) == pytest.approx(0.3)  # Eq. 9
    assert float(wl.compute_time(400, 1e-3, 2)) == pytest.approx(0.8)
    # Spec 3.3: the CIFAR CNN has 545,098 parameters = 2.18 MB of f32.
    assert wl.model_size_mb(545_098) == pytest.approx(2.180392)
    tree = {"a": np.zeros((3, 4)), "b": {"c": np.zeros(5)}}
    assert wl.param_count(tree) == 17
    c1, c2, c3 = wl.budget_constants(10.0, 2.5, 0.5, 1.0)
    assert (float(c1), float(c2), float(c3)) == (7.5, 0.5, 1.0)


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
