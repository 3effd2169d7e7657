"""Ada-FedSemi's bandit, learning-rate schedule and reward against NumPy references and the
spec's acceptance checks (ada_fedsemi.md section 8, checks 1 (counts), 10-14)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import ada_schedule as sc
from fedjax_semi.kernels import bandit as bd

# ----------------------------------------------------------------------------- references


def softmax_reference(q, psi):
    z = psi * np.asarray(q, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def updates_reference(num_arms, arms, rewards, beta, q0=0.0):
    """Eq. 17 one pull at a time; beta None: the sample average 1/n."""
    q, n = np.full(num_arms, q0, np.float64), np.zeros(num_arms, np.int64)
    for a, r in zip(arms, rewards, strict=True):
        n[a] += 1
        step = 1.0 / n[a] if beta is None else beta
        q[a] += step * (r - q[a])
    return q, n


# ----------------------------------------------------------------------------- arms and counts


def test_arm_grids_and_integer_participant_counts():
    assert bd.P_ARMS == (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert bd.C_ARMS == (0.82, 0.84, 0.86, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98, 1.0)
    assert len(bd.C_ARMS_LINSPACE) == 10
    assert bd.C_ARMS_LINSPACE[0] == 0.8 and bd.C_ARMS_LINSPACE[-1] == 1.0
    # Check 1: 0.3 -> 6 and 0.7 -> 14, where float ceil(0.30000000000000004 * 20) gives 7.
    assert np.ceil(0.1 * 3 * 20) == 7
    want = [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    np.testing.assert_array_equal(bd.participants(jnp.arange(10), 20), want)
    traced = jax.jit(lambda a: bd.participants(a, 20))
    assert [int(traced(a)) for a in (2, 6)] == [6, 14]
    np.testing.assert_array_equal(
        bd.participants(jnp.arange(10), 7), [1, 2, 3, 3, 4, 5, 5, 6, 7, 7]
    )
    assert float(bd.arm_value(bd.C_ARMS, 9)) == 1.0
    np.testing.assert_allclose(bd.arm_value(bd.P_ARMS, jnp.arange(10)), bd.P_ARMS)


# ----------------------------------------------------------------------------- Eq. 18


class TestAgainstNumPy(chex.TestCase):
    """Eqs. 17-18 jitted and op by op (chex variants) against the NumPy references above."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_boltzmann_probs_match_numpy_softmax(self):
        probs = self.variant(bd.boltzmann_probs)
        rng = np.random.default_rng(0)
        q = rng.normal(size=(3, 10)).astype(np.float32)
        for psi in (0.0, 0.3, 1.0, 5.0):
            p = np.asarray(probs(q, psi))
            want = np.stack([softmax_reference(row, psi) for row in q])
            np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(probs(q[0], 0.0), np.full(10, 0.1), rtol=1e-6)
        # Large psi * r_hat: no overflow, the argmax takes (almost) everything.
        big = np.asarray(probs(jnp.asarray([0.0, 100.0, 99.0]), 50.0))
        assert np.all(np.isfinite(big)) and big[1] == pytest.approx(1.0)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0.1, 0.5, None)
    def test_updates_match_numpy_reference(self, beta):
        rng = np.random.default_rng(2)
        arms = rng.integers(0, 6, size=40)
        rewards = rng.normal(size=40).astype(np.float32)

        @self.variant
        def run(arms, rewards):
            def step(s, x):
                return bd.update_arm(s, x[0], x[1], beta), None

            return jax.lax.scan(step, bd.bandit_init(6, 0.5), (arms, rewards))[0]

        state = run(jnp.asarray(arms, jnp.int32), jnp.asarray(rewards))
        q, n = updates_reference(6, arms, rewards, beta, q0=0.5)
        np.testing.assert_allclose(state.estimates, q, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(state.counts, n)


def test_selection_frequencies_match_probs_chi_square():
    """Check 12: psi = 0 pulls uniformly; psi = 1 follows Eq. 18 (chi-square, 10^4 pulls)."""
    q = jnp.asarray(np.random.default_rng(1).normal(size=10), jnp.float32)
    draw = jax.jit(
        jax.vmap(
            lambda k, psi: bd.select_arm(k, bd.BanditState(q, jnp.zeros(10, jnp.int32)), psi),
            in_axes=(0, None),
        )
    )
    keys = jax.random.split(jax.random.PRNGKey(0), 10_000)
    for psi in (0.0, 1.0):
        arms = np.asarray(draw(keys, psi))
        assert arms.dtype == np.int32 and arms.min() >= 0 and arms.max() <= 9
        expected = 10_000 * softmax_reference(q, psi)
        chi2 = np.sum((np.bincount(arms, minlength=10) - expected) ** 2 / expected)
        assert chi2 < 27.88, (psi, chi2)  # 9 degrees of freedom, p = 0.001


def test_select_arm_is_deterministic_in_the_key():
    state = bd.bandit_init(10)
    k = jax.random.PRNGKey(5)
    assert int(bd.select_arm(k, state, 1.0)) == int(bd.select_arm(k, state, 1.0))
    assert bd.select_arm(k, state, 1.0).shape == () and bd.select_arm(k, state, 1.0).dtype == (
        jnp.int32
    )
    many = {int(bd.select_arm(jax.random.PRNGKey(i), state, 1.0)) for i in range(30)}
    assert len(many) > 1


# ----------------------------------------------------------------------------- Eq. 17


def test_update_changes_only_the_pulled_arm_by_beta_times_error():
    """Check 12: only the pulled arm moves, by exactly beta (r - r_hat)."""
    q = jnp.asarray([0.5, -1.0, 2.0, 0.25], jnp.float32)
    state = bd.BanditState(q, jnp.asarray([3, 0, 1, 2], jnp.int32))
    new = bd.update_arm(state, 2, 1.0, 0.25)
    np.testing.assert_array_equal(new.estimates, [0.5, -1.0, 2.0 + 0.25 * (1.0 - 2.0), 0.25])
    np.testing.assert_array_equal(new.counts, [3, 0, 2, 2])
    avg = bd.update_arm(state, 0, 1.5, None)  # 4th pull: 0.5 + (1.5 - 0.5) / 4
    np.testing.assert_array_equal(avg.estimates, [0.75, -1.0, 2.0, 0.25])
    first = bd.update_arm(state, 1, 3.0, None)  # the first pull takes the reward
    assert float(first.estimates[1]) == 3.0
    update = jax.jit(bd.update_arm, static_argnums=3)
    for outside in (-1, 4):  # no wrap-around, no clipping: nothing changes
        for beta in (0.5, None):
            same = update(state, outside, 9.0, beta)
            np.testing.assert_array_equal(same.estimates, state.estimates)
            np.testing.assert_array_equal(same.counts, state.counts)


def test_bad_settings_raise_config_error():
    state = bd.bandit_init(3)
    with pytest.raises(ConfigError, match="bandit.beta"):
        bd.update_arm(state, 0, 1.0, 0.0)
    with pytest.raises(ConfigError, match="bandit.beta"):
        bd.update_arm(state, 0, 1.0, 1.5)
    with pytest.raises(ConfigError, match="bandit.psi"):
        bd.boltzmann_probs(state.estimates, -1.0)
    with pytest.raises(ConfigError, match="bandit.num_arms"):
        bd.bandit_init(0)
    with pytest.raises(ConfigError, match="arm"):
        bd.participants(10, 20)


# ----------------------------------------------------------------------------- simulations

MEANS = 0.1 * np.arange(10, dtype=np.float32)  # check 13: mu_a = 0.1 a, sigma = 0.1
STEPS, FLIP = 12_000, 10_000  # check 14: the means reverse after 10,000 pulls


@functools.cache
def _simulator(beta: float | None, steps: int):
    """jit(vmap over runs) of `steps` pulls of one agent on Gaussian arms whose means reverse
    at pull `flip` (flip >= steps: stationary). Returns (arms int32 [S, steps], rewards)."""
    means = jnp.asarray(MEANS)

    def one(key, psi, q0, flip):
        def step(state, x):
            t, k = x
            k_arm, k_noise = jax.random.split(k)
            arm = bd.select_arm(k_arm, state, psi)
            mu = jnp.where(t < flip, means, means[::-1])
            r = mu[arm] + 0.1 * jax.random.normal(k_noise)
            return bd.update_arm(state, arm, r, beta), (arm, r)

        init = bd.bandit_init(10, 0.0)
        init = init.replace(estimates=jnp.full_like(init.estimates, q0))
        xs = (jnp.arange(steps), jax.random.split(key, steps))
        return jax.lax.scan(step, init, xs)[1]

    return jax.jit(jax.vmap(one))


@pytest.fixture(scope="module")
def runs():
    """Recency-weighted (beta = 0.1) and sample-average agents, 4 seeds each, psi = 5, the
    means reversed at pull 10,000; plus 4 stationary psi = 50 runs with optimistic estimates."""
    s = 4
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * s)
    psi = jnp.asarray([5.0] * s + [50.0] * s)
    q0 = jnp.asarray([0.0] * s + [1.0] * s)
    flip = jnp.asarray([FLIP] * s + [STEPS] * s, jnp.int32)
    recency = _simulator(0.1, STEPS)(keys, psi, q0, flip)
    average = _simulator(None, STEPS)(keys[:s], psi[:s], q0[:s], flip[:s])
    as_np = lambda pair: tuple(np.asarray(x) for x in pair)
    return {"recency": as_np(recency), "average": as_np(average)}


def test_stationary_pulls_follow_softmax_of_the_means(runs):
    """Check 13 over the 10,000 pulls before the change: the last half's pull distribution is
    within total variation 0.05 of softmax(psi mu), its mean reward beats uniform's 0.45."""
    arms, rewards = runs["recency"]
    want = softmax_reference(MEANS, 5.0)
    for a, r in zip(arms[:4, FLIP // 2 : FLIP], rewards[:4, FLIP // 2 : FLIP], strict=True):
        tv = 0.5 * np.abs(np.bincount(a, minlength=10) / len(a) - want).sum()
        assert tv < 0.05, tv
        assert r.mean() > MEANS.mean() + 0.15, r.mean()


def test_large_psi_concentrates_on_the_best_arm(runs):
    """Check 13, psi = 50: the best arm gets > 95% of the last-half pulls. Needs optimistic
    estimates (q0 = 1 > every mean): from q0 = 0 an arm whose estimate never left 0 is never
    tried again once another arm's estimate is ~0.1 above it, so the agent can lock in."""
    arms = runs["recency"][0][4:, STEPS // 2 :]
    assert np.all((arms == 9).mean(axis=1) > 0.95), (arms == 9).mean(axis=1)


def _modal_arm_after_change(arms, window=500, within=2000):
    post = arms[FLIP : FLIP + within]
    return np.bincount(post[within - window :], minlength=10).argmax()


def test_recency_weighting_follows_a_change_and_sample_average_lags(runs):
    """Check 14: after the means reverse, the modal arm of the last 500 of 2,000 pulls is the
    new best arm (0) for Eq. 17's constant step; the sample average (negative control) stays
    on the old best arm (9)."""
    for a in runs["recency"][0][:4]:
        assert np.bincount(a[FLIP - 500 : FLIP], minlength=10).argmax() == 9
        assert _modal_arm_after_change(a) == 0
    for a in runs["average"][0]:
        assert np.bincount(a[FLIP - 500 : FLIP], minlength=10).argmax() == 9
        assert _modal_arm_after_change(a) != 0


def test_vmap_over_seeds_equals_one_seed_at_a_time():
    sim = _simulator(0.1, 64)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    psi, q0, flip = jnp.full(3, 2.0), jnp.zeros(3), jnp.full(3, 32, jnp.int32)
    arms, rewards = sim(keys, psi, q0, flip)
    for i in range(3):
        a1, r1 = sim(keys[i : i + 1], psi[:1], q0[:1], flip[:1])
        np.testing.assert_array_equal(a1[0], arms[i])
        np.testing.assert_array_equal(r1[0], rewards[i])
    again = sim(keys, psi, q0, flip)
    np.testing.assert_array_equal(again[0], arms)  # same keys, same pulls


# ----------------------------------------------------------------------------- Eq. 13


def test_cosine_restart_lr_values():
    """Check 10: 0.05 at round 1, (0.05 + 0.0001) / 2 at offset 50, ~eta_min just before a
    restart, 0.05 again at round 101; everything within [eta_min, eta_max]."""
    lr = lambda k: float(sc.cosine_restart_lr(k))
    assert lr(1) == pytest.approx(0.05, rel=1e-6)
    assert lr(51) == pytest.approx((0.05 + 0.0001) / 2, rel=1e-6)
    before = 1e-4 + 0.5 * (0.05 - 1e-4) * (1 + np.cos(np.pi * 99 / 100))
    assert lr(100) == pytest.approx(before, rel=1e-5) and lr(100) < 1.2e-4
    assert lr(101) == pytest.approx(0.05, rel=1e-6) and lr(201) == pytest.approx(0.05, rel=1e-6)
    rounds = np.arange(1, 301)
    all_lr = np.asarray(jax.jit(sc.cosine_restart_lr)(jnp.asarray(rounds)))
    want = 1e-4 + 0.5 * (0.05 - 1e-4) * (1 + np.cos(np.pi * ((rounds - 1) % 100) / 100))
    np.testing.assert_allclose(all_lr, want, rtol=1e-5)
    assert all_lr.min() >= 1e-4 and all_lr.max() <= 0.05 + 1e-9
    # Eq. 13 as printed (k, not k - 1): restarts at rounds 100, 200.
    printed = lambda k: float(sc.cosine_restart_lr(k, zero_based=False))
    assert printed(100) == pytest.approx(0.05, rel=1e-6) and printed(1) < 0.05
    with pytest.raises(ConfigError, match="round"):
        sc.cosine_restart_lr(0)
    with pytest.raises(ConfigError, match="restart_interval"):
        sc.cosine_restart_lr(1, period=0)


# ----------------------------------------------------------------------------- Eqs. 14-16


def test_reward_values_and_monotonicity():
    """Check 11: r(0, Phi) = 0, du / Phi for gains, du * Phi for losses; increasing in du;
    decreasing in Phi on both sides."""
    assert float(sc.reward(0.0, 0.7)) == 0.0
    assert float(sc.reward(2.0, 0.5)) == 4.0
    assert float(sc.reward(-2.0, 0.5)) == -1.0
    assert float(sc.reward(-2.0, 3.0)) == -6.0
    du = np.linspace(-5, 5, 41, dtype=np.float32)
    phi = np.asarray([0.1, 0.5, 1.0, 2.5], np.float32)
    r = np.asarray(jax.jit(sc.reward)(du[:, None], phi[None, :]))
    want = np.where(du[:, None] >= 0, du[:, None] / phi, du[:, None] * phi)
    np.testing.assert_allclose(r, want, rtol=1e-6)
    assert np.all(np.diff(r, axis=0) > 0)  # increasing in du for every Phi
    nonzero = du != 0
    assert np.all(np.diff(r[nonzero], axis=1) < 0)  # a larger cost: less reward, more penalty
    with pytest.raises(ConfigError, match="cost"):
        sc.reward(1.0, 0.0)


def test_accuracy_changes_credit_p_and_c():
    """Eqs. 14-15: du_P = u_P - last u_C (aggregation), du_C = u_C - u_P (server training)."""
    du_p, du_c = sc.accuracy_changes(61.5, 63.0, 60.0)
    assert float(du_p) == 1.5 and float(du_c) == 1.5
    du_p, du_c = jax.jit(sc.accuracy_changes)(jnp.asarray([50.0]), jnp.asarray([48.0]), 52.0)
    np.testing.assert_array_equal(du_p, [-2.0])
    np.testing.assert_array_equal(du_c, [-2.0])
