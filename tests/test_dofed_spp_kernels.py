"""DoFed-SPP kernels against plain NumPy references (spec dofed_spp.md sections 1.5, 2.2-2.4, 2.8;
acceptance checks AC1-AC6, AC8-AC15); the clock (AC25, AC26) is in test_wireless.py, the
jitted and op-by-op variants in test_dofed_spp_numpy.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from dofed_references import (
    SEEDS,
    linear_loss,
    make_clients,
    np_flat,
    np_softmax,
    random_stochastic,
)
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.kernels import similarity as sim

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
