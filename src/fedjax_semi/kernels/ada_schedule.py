"""Ada-FedSemi's per-round scalars (Xu et al., "Enhancing Federated Learning with Server-Side
Unlabeled Data by Adaptive Client and Data Selection"): the restarting cosine learning rate
(Sec. 3.2, Eq. 13), the accuracy changes credited to the P and C decisions (Eqs. 14-15) and
the cost-aware bandit reward (Eq. 16).

Pure jnp, jit-compatible, elementwise (any shape broadcasts; one round is shape []).
The functions are unit-free; Ada-FedSemi feeds them accuracies in percentage points and Phi_k
in minutes and GB, the units in which the paper's Tables 4-6 follow from its Tables 1-3.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_semi.errors import bad
from fedjax_semi.kernels.checks import concrete

ETA_MAX = 0.05  # Sec. 5.1: eta_max, eta_min and the restart period K~ (rounds)
ETA_MIN = 1e-4
RESTART_PERIOD = 100


def cosine_restart_lr(
    rnd: int | jax.Array,
    eta_max: float = ETA_MAX,
    eta_min: float = ETA_MIN,
    period: int = RESTART_PERIOD,
    *,
    zero_based: bool = True,
) -> jax.Array:
    """Eq. 13: eta_k = eta_min + (eta_max - eta_min) (1 + cos(pi (k mod K~) / K~)) / 2.

    rnd: the round k, starting at 1, int [...] -> float32 [...]. zero_based (default) uses
    k - 1 in Eq. 13, so round 1 runs at eta_max and rounds 1, K~ + 1, 2 K~ + 1, ... restart;
    False is Eq. 13 as printed (round 1 already slightly below eta_max, restarts at K~, 2 K~).
    Every value lies in [eta_min, eta_max].
    """
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise bad("lr.restart_interval", period, "an int >= 1 (rounds)")
    lo, hi = concrete(eta_min), concrete(eta_max)
    if lo is not None and hi is not None and not bool(((lo >= 0) & (lo <= hi)).all()):
        raise bad("lr.eta_min", eta_min, f"a number in [0, eta_max={eta_max}]")
    v = concrete(rnd)
    if v is not None and not bool((v >= (1 if zero_based else 0)).all()):
        raise bad("round", rnd, "an int >= 1 (rounds count from 1)")
    k = jnp.asarray(rnd, jnp.int32) - (1 if zero_based else 0)
    phase = jnp.mod(k, period).astype(jnp.float32) / period  # integer mod: exact restarts
    return eta_min + 0.5 * (eta_max - eta_min) * (1.0 + jnp.cos(jnp.pi * phase))


def accuracy_changes(
    u_p: float | jax.Array, u_c: float | jax.Array, u_prev_c: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Eqs. 14-15: (du_P, du_C) = (u_{k,P} - u_{k-1,C}, u_{k,C} - u_{k,P}), float32.

    u_p: validation accuracy of the aggregated model w_{k+1/2}; u_c: of w_{k+1}, after the
    server's pseudo-label training; u_prev_c: last round's u_{k-1,C} (round 1: the initial
    model's accuracy, or 0 as Algorithm 1 writes it; the caller chooses).
    """
    u_p, u_c = jnp.asarray(u_p, jnp.float32), jnp.asarray(u_c, jnp.float32)
    return u_p - jnp.asarray(u_prev_c, jnp.float32), u_c - u_p


def reward(delta_u: float | jax.Array, cost: float | jax.Array) -> jax.Array:
    """Eq. 16: r = du / Phi if du >= 0, else du * Phi -> float32, shape of du and Phi broadcast.

    A gain is divided by the round's weighted cost Phi_k (Eq. 10), a loss multiplied by it, so
    expensive losses are penalised more. r is increasing in du; Phi must be > 0.
    """
    v = concrete(cost)
    if v is not None and not bool((v > 0).all()):
        raise bad("cost", cost, "a weighted cost Phi > 0")
    du, phi = jnp.asarray(delta_u, jnp.float32), jnp.asarray(cost, jnp.float32)
    return jnp.where(du >= 0, du / phi, du * phi)
