"""CFSL's labeling kernels against plain NumPy references (spec cfsl.md section 2.7 and
section 7, acceptance checks 10-12)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import labeling as lb

C, N, Y, K = 6, 9, 5, 4
# float32 results that can be near zero (alpha, probabilities, coverage differences): a
# relative tolerance means nothing there, so compare with an absolute one a few float32 ulps
# of 1 wide.
ATOL = 1e-6


def softmax_np(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return (z / z.sum(-1, keepdims=True)).astype(np.float32)


def random_probs(rng, *shape, scale=3.0):
    return softmax_np(rng.normal(scale=scale, size=(*shape, Y)))


# ----------------------------------------------------------------------------- references


def threshold_ref(probs, phi, eligible):
    return probs.argmax(-1), (probs.max(-1) >= phi) & eligible


def utility_ref(correct, counts, active):
    u = np.zeros(correct.shape, np.float64)
    for m in range(correct.shape[0]):
        for i in range(correct.shape[1]):
            if not active[m]:
                u[m, i] = -np.inf
            elif counts[i] > 0:
                u[m, i] = correct[m, i] / counts[i]
    return u


def best_ref(u, t, active):
    """Lexicographic: max u, then max t, then lowest m, over the active slots (Python loop)."""
    out = []
    for i in range(u.shape[1]):
        best = None
        for m in range(u.shape[0]):
            if not active[m]:
                continue
            if best is None or (u[m, i], t[m, i]) > (u[best, i], t[best, i]):
                best = m  # strict > keeps the lowest m on a full tie
        out.append(best)
    return np.array(out)


def weights_ref(u, active, mode, temp=0.1):
    a = np.zeros((u.shape[1], u.shape[0]))
    idx = np.flatnonzero(active)
    for i in range(u.shape[1]):
        v = u[idx, i].astype(np.float64)
        if mode == "proportional":
            w = v / v.sum() if v.sum() > 0 else np.full(len(idx), 1 / len(idx))
        else:
            e = np.exp((v - v.max()) / temp)
            w = e / e.sum()
        a[i, idx] = w
    return a


# ----------------------------------------------------------------------------- check 10


def test_threshold_boundary_and_ties():
    # max prob exactly phi is accepted (>=), one float32 ulp above is not.
    probs = np.array([[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4]]], np.float32)
    eligible = np.ones((1, 2), bool)
    y, ok = lb.threshold(probs, 0.5, eligible)
    np.testing.assert_array_equal(ok, [[True, False]])
    np.testing.assert_array_equal(y, [[0, 1]])  # tie between classes 1 and 2: the lower
    _, ok = lb.threshold(probs, np.nextafter(np.float32(0.5), np.float32(1)), eligible)
    assert not np.asarray(ok).any()


def test_threshold_vmap_over_models_and_bad_args():
    rng = np.random.default_rng(1)
    probs = random_probs(rng, K, C, N)
    eligible = rng.random((C, N)) < 0.5
    y, ok = jax.vmap(lb.threshold, in_axes=(0, None, None))(probs, 0.6, eligible)
    for m in range(K):
        y_ref, ok_ref = threshold_ref(probs[m], np.float32(0.6), eligible)
        np.testing.assert_array_equal(y[m], y_ref)
        np.testing.assert_array_equal(ok[m], ok_ref)
    with pytest.raises(ConfigError, match="algorithm.phi"):
        lb.threshold(probs[0], float("nan"), eligible)
    with pytest.raises(ConfigError, match="eligible.shape"):
        lb.threshold(probs[0], 0.6, eligible[:, :-1])


# ----------------------------------------------------------------------------- check 11


def test_best_model_tie_rules_and_no_epsilon_sum():
    active = np.array([True, True, True, False])
    # worker 0: utility tie (0, 1) -> higher tiebreak (1); worker 1: full tie -> lowest (0);
    # worker 2: utility 1 beats 0 by one float32 ulp, whatever the tiebreak (no weighted sum);
    # worker 3: the inactive slot 3 has the largest utility and tiebreak, never chosen.
    half_up = np.nextafter(np.float32(0.5), np.float32(1))
    u = np.array(
        [[0.8, 0.6, 0.5, 0.1], [0.8, 0.6, half_up, 0.2], [0.3, 0.6, 0.5, 0.3], [0.9, 1, 1, 9]],
        np.float32,
    )
    t = np.array(
        [[0.1, 0.5, 1.0, 0.1], [0.9, 0.5, 0.0, 0.1], [1.0, 0.5, 1.0, 0.1], [1, 1, 1, 9]],
        np.float32,
    )
    np.testing.assert_array_equal(lb.best_model(u, t, active), [1, 0, 1, 2])
    # NaN ranks last; an all-NaN column still picks an active slot (the lowest)
    u_nan = np.full((K, 1), np.nan, np.float32)
    u_nan[3] = 5.0
    assert int(lb.best_model(u_nan, np.zeros((K, 1)), active)[0]) == 0
    with pytest.raises(ConfigError, match="active"):
        lb.best_model(u, t, np.zeros(K, bool))


def test_perfect_model_is_chosen_end_to_end():
    """Check 11: one model classifies worker i's labeled data perfectly, the others do not."""
    rng = np.random.default_rng(5)
    labels = rng.integers(0, Y, (C, N))
    labeled = rng.random((C, N)) < 0.5
    labeled[:, 0] = True
    perfect = rng.integers(0, K - 1, C)  # per worker; slot K - 1 is inactive
    probs = random_probs(rng, K, C, N)
    onehot = np.eye(Y, dtype=np.float32)[labels]
    for i in range(C):
        for m in range(K):
            if m == perfect[i] or m == K - 1:  # the inactive slot is perfect too
                probs[m, i] = 0.1 * probs[m, i] + 0.9 * onehot[i]
            else:  # wrong on the first labeled sample
                probs[m, i, 0] = np.eye(Y, dtype=np.float32)[(labels[i, 0] + 1) % Y]
    active = np.array([True, True, True, False])
    correct = jax.lax.map(lambda p: lb.correct_count(p, labels, labeled), probs)
    u = lb.accuracy_utility(correct, labeled.sum(-1), active)
    conf = jax.lax.map(lambda p: lb.mean_confidence(p, ~labeled), probs)
    np.testing.assert_array_equal(lb.best_model(u, conf, active), perfect)


def test_best_model_vmap_over_edges():
    rng = np.random.default_rng(6)
    u = rng.choice([0.0, 1.0], (3, K, C)).astype(np.float32)
    t = rng.random((3, K, C)).astype(np.float32)
    active = np.array([[True, True, False, True], [False, True, True, False], [True] * 4])
    got = jax.vmap(lb.best_model)(u, t, active)
    for e in range(3):
        np.testing.assert_array_equal(got[e], best_ref(u[e], t[e], active[e]))


# ----------------------------------------------------------------------------- check 12


def test_ensemble_weights_take_accuracy_utility_and_bad_args():
    u = lb.accuracy_utility(np.array([[1, 0], [2, 0], [0, 0]]), np.array([2, 0]), [1, 1, 0])
    np.testing.assert_allclose(
        lb.ensemble_weights(u, [1, 1, 0]), [[1 / 3, 2 / 3, 0], [0.5, 0.5, 0]]
    )
    with pytest.raises(ConfigError, match="ensemble_weighting"):
        lb.ensemble_weights(u, [1, 1, 0], mode="mean")
    with pytest.raises(ConfigError, match="ensemble_temperature"):
        lb.ensemble_weights(u, [1, 1, 0], mode="softmax", temperature=0.0)
    with pytest.raises(ConfigError, match="utility"):
        lb.ensemble_weights(-np.ones((3, 2)), [1, 1, 0])


def ensemble_scan(alpha, probs):
    """p_ens = sum_m alpha[:, m] p_m as the caller builds it: a lax.scan over the K models."""

    def body(acc, xs):
        return lb.accumulate_ensemble(*xs, acc), None

    acc0 = jnp.zeros(probs.shape[1:], jnp.float32)
    return jax.lax.scan(body, acc0, (alpha.T, probs))[0]


def test_accumulate_ensemble_vmap_over_chunks():
    rng = np.random.default_rng(9)
    probs = random_probs(rng, 2, C, N)  # two client chunks
    alpha = rng.random((2, C)).astype(np.float32)
    acc = rng.random((2, C, N, Y)).astype(np.float32)
    got = jax.vmap(lb.accumulate_ensemble)(alpha, probs, acc)
    np.testing.assert_allclose(got, acc + alpha[:, :, None, None] * probs, rtol=1e-6, atol=ATOL)


# ----------------------------------------------------------------------------- section 5.3


def test_keep_better_streamed_equals_best_model_then_gather():
    """BM streamed over the slots (keep_better in a scan) picks best_model's slot, ties
    included, and keeps that model's probabilities."""
    rng = np.random.default_rng(3)
    k, c, n, y = 6, 9, 4, 3
    util = rng.integers(0, 3, (k, c)).astype(np.float32) / 2  # many exact ties
    conf = rng.integers(0, 2, (k, c)).astype(np.float32)  # ties on the tiebreak too
    active = np.array([True, False, True, True, False, True])
    probs = rng.dirichlet(np.ones(y), (k, c, n)).astype(np.float32)
    u = lb.accuracy_utility(util * 4, np.full(c, 4), active)
    conf, probs, act = jnp.asarray(conf), jnp.asarray(probs), jnp.asarray(active)

    def visit(best, m):
        new = lb.keep_better(best, u[m], conf[m], probs[m])
        return jax.tree.map(lambda a, b: jnp.where(act[m], a, b), new, best), None

    start = (jnp.full(c, -jnp.inf), jnp.full(c, -jnp.inf), jnp.zeros((c, n, y)))
    (_, _, got), _ = jax.jit(lambda s: jax.lax.scan(visit, s, jnp.arange(k)))(start)
    choice = np.asarray(lb.best_model(u, conf, active))
    np.testing.assert_array_equal(got, np.asarray(probs)[choice, np.arange(c)])


class TestAgainstReferences(chex.TestCase):
    """The kernels jitted and op by op (chex variants) against the references above."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_threshold_matches_reference_and_phi_grid(self):
        threshold = self.variant(lb.threshold)  # phi traced: one compile for the whole grid
        rng = np.random.default_rng(0)
        probs = random_probs(rng, C, N)
        eligible = rng.random((C, N)) < 0.7
        cover = []
        for phi in np.linspace(0.0, 1.0, 21):
            y, ok = threshold(probs, phi, eligible)
            y_ref, ok_ref = threshold_ref(probs, np.float32(phi), eligible)
            assert y.dtype == jnp.int32 and ok.dtype == jnp.bool_
            np.testing.assert_array_equal(y, y_ref)  # label = argmax, accepted or not
            np.testing.assert_array_equal(ok, ok_ref)
            assert not np.asarray(ok)[~eligible].any()  # labeled / padding never accepted
            cover.append(np.asarray(ok).sum() / eligible.sum())
        assert np.all(np.diff(cover) <= 0)  # coverage non-increasing in phi
        assert cover[0] == 1.0 and 0.0 < cover[10] < 1.0  # the grid does vary
        _, ok0 = threshold(probs, 0.0, eligible)
        np.testing.assert_array_equal(ok0, eligible)  # phi = 0: every eligible sample
        for phi in (1.0 + 1e-6, 1.5):
            assert not np.asarray(threshold(probs, phi, eligible)[1]).any()  # phi > 1: none

    @chex.variants(with_jit=True, without_jit=True)
    def test_pass1_statistics_match_reference(self):
        rng = np.random.default_rng(2)
        probs = random_probs(rng, C, N)
        labels = rng.integers(0, Y, (C, N))
        labels[:, :3] = probs[:, :3].argmax(-1)  # some hits guaranteed
        mask = rng.random((C, N)) < 0.6
        mask[-1] = False  # a worker with no masked sample
        hits = (probs.argmax(-1) == labels) & mask
        np.testing.assert_array_equal(
            self.variant(lb.correct_count)(probs, labels, mask), hits.sum(-1)
        )
        conf = np.where(mask, probs.max(-1), 0).sum(-1) / np.maximum(mask.sum(-1), 1)
        got = self.variant(lb.mean_confidence)(probs, mask)
        np.testing.assert_allclose(got, conf, rtol=1e-6, atol=ATOL)
        assert float(got[-1]) == 0.0

    @chex.variants(with_jit=True, without_jit=True)
    def test_accuracy_utility_matches_reference(self):
        utility = self.variant(lb.accuracy_utility)
        rng = np.random.default_rng(3)
        counts = rng.integers(0, 7, C)
        counts[0] = 0  # a worker with no labeled sample
        correct = rng.integers(0, 7, (K, C)) % (counts + 1)
        active = np.array([True, False, True, True])
        u = utility(correct, counts, active)
        ref = utility_ref(correct, counts, active)
        assert u.dtype == jnp.float32
        np.testing.assert_array_equal(np.isneginf(u), np.isneginf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(np.asarray(u)[fin], ref[fin], rtol=1e-6, atol=ATOL)
        np.testing.assert_array_equal(np.asarray(u)[active, 0], 0.0)
        # equal accuracies from different counts are bitwise equal (so they tie in best_model)
        u2 = utility(np.array([[1, 2]]), np.array([3, 6]), np.array([True]))
        assert float(u2[0, 0]) == float(u2[0, 1])

    @chex.variants(with_jit=True, without_jit=True)
    def test_best_model_matches_lexicographic_reference(self):
        rng = np.random.default_rng(4)
        best = self.variant(lb.best_model)
        for trial in range(20):
            # values from small sets, so ties on utility and on the tiebreak are frequent
            u = rng.choice([0.0, 0.5, 1.0], (K, C)).astype(np.float32)
            t = rng.choice([0.2, 0.7], (K, C)).astype(np.float32)
            active = rng.random(K) < 0.7
            active[trial % K] = True
            u_in = np.where(active[:, None], u, 10.0)  # inactive entries large: must be ignored
            got = np.asarray(best(u_in, t, active))
            np.testing.assert_array_equal(got, best_ref(u, t, active))
            assert got.dtype == np.int32 and active[got].all()
            z = np.asarray(jax.nn.one_hot(got, K))
            assert np.all(z.sum(-1) == 1) and not z[:, ~active].any()  # one-hot, active only

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("proportional", "softmax")
    def test_ensemble_weights_match_reference(self, mode):
        rng = np.random.default_rng(7)
        active = np.array([True, False, True, True])
        u = rng.random((K, C)).astype(np.float32)
        u[:, 0] = 0.0  # all-zero utility: proportional falls back to uniform
        u[1] = 100.0  # inactive slot with a large entry before masking
        alpha = self.variant(lb.ensemble_weights, static_argnames="mode")(u, active, mode=mode)
        ref = weights_ref(u, active, mode)
        assert alpha.shape == (C, K) and alpha.dtype == jnp.float32
        np.testing.assert_allclose(alpha, ref, rtol=1e-5, atol=ATOL)
        assert np.all(np.asarray(alpha) >= 0)
        np.testing.assert_array_equal(np.asarray(alpha)[:, ~active], 0.0)
        np.testing.assert_allclose(np.asarray(alpha).sum(-1), 1.0, atol=ATOL)
        np.testing.assert_allclose(alpha[0, active], 1 / 3, atol=ATOL)  # uniform over active

    @chex.variants(with_jit=True, without_jit=True)
    def test_ensemble_scan_sums_to_one_and_matches_reference(self):
        scan = self.variant(ensemble_scan)
        rng = np.random.default_rng(8)
        active = np.array([True, True, False, True])
        probs = random_probs(rng, K, C, N)
        probs[2] = np.nan  # an inactive slot's garbage output must not leak (alpha = 0 there)
        for mode in ("proportional", "softmax"):
            alpha = lb.ensemble_weights(rng.random((K, C)), active, mode=mode)
            ens = scan(alpha, probs)
            ref = np.einsum("cm,mcny->cny", np.asarray(alpha)[:, active], probs[active])
            np.testing.assert_allclose(ens, ref, rtol=1e-5, atol=ATOL)
            np.testing.assert_allclose(np.asarray(ens).sum(-1), 1.0, atol=1e-5)
            y, ok = lb.threshold(ens, 0.5, np.ones((C, N), bool))  # EM: threshold the ensemble
            np.testing.assert_array_equal(ok, ref.max(-1) >= 0.5)
        # one-hot alpha (BM through the same path): exactly that model's probabilities
        pick = rng.choice(np.flatnonzero(active), C)
        ens = scan(jax.nn.one_hot(pick, K), probs)
        np.testing.assert_array_equal(ens, probs[pick, np.arange(C)])

    @chex.variants(with_jit=True, without_jit=True)
    def test_labeling_accuracy_matches_reference(self):
        labeling_accuracy = self.variant(lb.labeling_accuracy)
        rng = np.random.default_rng(10)
        true_y = rng.integers(0, Y, (C, N))
        pseudo_y = np.where(rng.random((C, N)) < 0.6, true_y, (true_y + 1) % Y)
        accepted = rng.random((C, N)) < 0.5
        acc, correct, n = labeling_accuracy(pseudo_y, accepted, true_y)
        ref_correct = int(((pseudo_y == true_y) & accepted).sum())
        assert int(correct) == ref_correct and int(n) == int(accepted.sum())
        assert float(acc) == pytest.approx(ref_correct / accepted.sum(), rel=1e-6)
        assert 0 < ref_correct < accepted.sum()  # neither 0 nor 1: the pooling is exercised
        zero = labeling_accuracy(pseudo_y, np.zeros((C, N), bool), true_y)
        assert [float(v) for v in zero] == [0.0, 0.0, 0.0]
