"""Ada-FedSemi's decision agents (Xu et al., "Enhancing Federated Learning with Server-Side
Unlabeled Data by Adaptive Client and Data Selection", Sec. 3.3, Algorithm 2, Eqs. 17-18): a
multi-armed bandit with Boltzmann (softmax) exploration and recency-weighted reward estimates,
and the two arm sets it runs over, the participating fraction P and the confidence threshold C.

Pure functions over a `BanditState`; every function is jit-compatible and vmaps over seeds (a
batch of states and keys). `A` is the arm axis. Randomness comes only from the explicit key of
`select_arm`. The paper runs two independent agents, one over S_P and one over S_C (not a joint
100-arm agent); each is one `BanditState`.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.errors import bad
from fedjax_semi.kernels.checks import concrete

# Sec. 3.3: "the decision spaces of P and C are [0, 1] and [0.8, 1] ... evenly partitioned into
# 10 discrete values". S_P = {0.1, ..., 1.0}; S_C takes the 10 right end-points of [0.8, 1]
# (0.82, ..., 1.00), so it includes C = 1.0 ("no pseudo-labels", FedAvg); C_ARMS_LINSPACE is
# the other reading, linspace(0.8, 1.0, 10). The values are rounded decimals, not i * 0.1.
NUM_P_ARMS = 10
P_ARMS: tuple[float, ...] = tuple(round(i / NUM_P_ARMS, 10) for i in range(1, NUM_P_ARMS + 1))
C_ARMS: tuple[float, ...] = tuple(round(0.80 + 0.02 * i, 10) for i in range(1, 11))
C_ARMS_LINSPACE: tuple[float, ...] = tuple(round(0.80 + 0.2 * i / 9, 10) for i in range(10))


@struct.dataclass
class BanditState:
    """One agent's estimates (Eq. 17's r_hat_a) and pull counts.

    estimates: float32 [A], the estimated reward of each arm.
    counts: int32 [A], how often each arm was updated (the sample-average step 1/n uses it).
    A batch of agents (one per seed) stacks both on a leading axis: [S, A].
    """

    estimates: jax.Array
    counts: jax.Array

    @property
    def num_arms(self) -> int:
        return self.estimates.shape[-1]


def _check_psi(psi: Any) -> None:
    v = concrete(psi)
    if v is not None and not (v.size > 0 and bool(((v >= 0) & (v < float("inf"))).all())):
        raise bad("bandit.psi", psi, "a finite number >= 0 (Eq. 18's inverse temperature)")


def _check_step_size(step_size: Any) -> None:
    if step_size is None:
        return
    v = concrete(step_size)
    if v is not None and not bool(((v > 0) & (v <= 1)).all()):
        raise bad("bandit.beta", step_size, "a number in (0, 1] (Eq. 17's step), or None")


def bandit_init(num_arms: int, q0: float = 0.0) -> BanditState:
    """A fresh agent: every estimate q0 (0: the first draw is uniform), every count 0.

    Returns estimates float32 [num_arms], counts int32 [num_arms].
    """
    if not isinstance(num_arms, int) or isinstance(num_arms, bool) or num_arms < 1:
        raise bad("bandit.num_arms", num_arms, "an int >= 1")
    return BanditState(
        estimates=jnp.full((num_arms,), q0, jnp.float32),
        counts=jnp.zeros((num_arms,), jnp.int32),
    )


def boltzmann_logits(estimates: jax.Array, psi: float | jax.Array) -> jax.Array:
    """Eq. 18's exponents psi * r_hat_a: estimates [..., A] -> float32 [..., A].

    psi is an inverse temperature: 0 gives uniform choice, psi -> inf greedy. Estimates must be
    finite (0 * inf is NaN).
    """
    _check_psi(psi)
    estimates = jnp.asarray(estimates, jnp.float32)
    chex.assert_shape(estimates, (..., None))  # [..., A]: at least one axis
    return jnp.asarray(psi, jnp.float32) * estimates


def boltzmann_probs(estimates: jax.Array, psi: float | jax.Array) -> jax.Array:
    """Eq. 18: p_a = exp(psi r_hat_a) / sum_a' exp(psi r_hat_a'), estimates [..., A] -> [..., A].

    Computed as a max-shifted softmax, so large psi * r_hat does not overflow.
    """
    return jax.nn.softmax(boltzmann_logits(estimates, psi), axis=-1)


def select_arm(key: jax.Array, state: BanditState, psi: float | jax.Array) -> jax.Array:
    """Algorithm 2 line 3: draw an arm from Eq. 18's distribution -> int32 [].

    One categorical draw on the logits psi * r_hat (log-sum-exp stable), with the caller's key.
    One agent (estimates [A]); vmap over a batch of agents and keys.
    """
    chex.assert_rank(state.estimates, 1)
    return jax.random.categorical(key, boltzmann_logits(state.estimates, psi)).astype(jnp.int32)


def update_arm(
    state: BanditState,
    arm: int | jax.Array,
    reward: float | jax.Array,
    step_size: float | jax.Array | None = 0.1,
) -> BanditState:
    """Eq. 17: r_hat_a += beta (r - r_hat_a) for the pulled arm a only; other arms keep theirs.

    arm int32 [], reward float32 [], step_size: Eq. 17's beta in (0, 1] (a constant step, the
    recency-weighted estimate for non-stationary rewards); None: the sample average, step
    1/n with n the arm's count after this pull (the stationary estimator the paper argues
    against; our negative control). The arm's count always grows by one. An arm outside
    [0, A) changes nothing.
    """
    _check_step_size(step_size)
    arm = jnp.asarray(arm, jnp.int32)
    chex.assert_rank([state.estimates, arm, reward], [1, 0, 0])
    chex.assert_equal_shape([state.estimates, state.counts])
    a = state.num_arms
    # Out-of-range arms (negative ones too, which .at[] would wrap) go to index A: dropped.
    arm = jnp.where((arm >= 0) & (arm < a), arm, a)
    counts = state.counts.at[arm].add(1, mode="drop")
    q = state.estimates[jnp.minimum(arm, a - 1)]
    if step_size is None:
        beta = 1.0 / jnp.maximum(counts[jnp.minimum(arm, a - 1)], 1).astype(jnp.float32)
    else:
        beta = jnp.asarray(step_size, jnp.float32)
    new_q = q + beta * (jnp.asarray(reward, jnp.float32) - q)
    return BanditState(estimates=state.estimates.at[arm].set(new_q, mode="drop"), counts=counts)


# ----------------------------------------------------------------------------- arm -> value


def participants(arm: int | jax.Array, num_clients: int, num_arms: int = NUM_P_ARMS) -> jax.Array:
    """n_k = ceil(P_k M) (Eq. 9's participant count) for P = (arm + 1) / num_arms, in integers.

    (arm + 1) M / num_arms rounded up as ((arm + 1) M + num_arms - 1) // num_arms, so float
    round-off cannot add a client: ceil(0.30000000000000004 * 20) would be 7, not 6.
    arm int [...] in [0, num_arms) -> int32 [...]; M = 20 gives 2, 4, ..., 20.
    """
    if not isinstance(num_clients, int) or num_clients < 1:
        raise bad("num_clients", num_clients, "an int >= 1")
    v = concrete(arm)
    if v is not None and not bool(((v >= 0) & (v < num_arms)).all()):
        raise bad("arm", arm, f"an int in [0, {num_arms})")
    i = jnp.asarray(arm, jnp.int32) + 1
    return (i * num_clients + num_arms - 1) // num_arms


def arm_value(arms: tuple[float, ...], arm: int | jax.Array) -> jax.Array:
    """The arm's value in the grid `arms` (P_ARMS, C_ARMS, ...) as float32 [...] (traceable)."""
    return jnp.asarray(arms, jnp.float32)[jnp.asarray(arm, jnp.int32)]
