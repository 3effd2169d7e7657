"""Ada-FedSemi's resource model (Xu et al., "Enhancing Federated Learning with Server-Side
Unlabeled Data by Adaptive Client and Data Selection", Sec. 2.4, Eqs. 8-11; the metrics of
Sec. 5.2) as pure functions: a client's round time, the straggler's round time plus the server's
pseudo-label training, the round's traffic, the weighted cost Phi_k, the budgets, and the
optimal fixed (P, C) of Tables 4-6.

Units: time in seconds and traffic in bytes in and out of the round functions; the weighted cost
Phi_k = alpha t_k + (1 - alpha) b_k (Eq. 10) takes t_k in minutes and b_k in GB (10^9 bytes),
the units in which the paper's Tables 4-6 follow from its Tables 1-3. Per-client arrays lead
with `[M]` (all clients, with a bool selection mask) and scalars broadcast. Everything is jnp
float32 and jit-compatible; checks run on concrete arguments only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.errors import bad
from fedjax_semi.kernels.checks import concrete

SEC_PER_MIN = 60.0
BYTES_PER_GB = 1e9
# Eq. 9 counts one model W per participant; the paper's traffic metric is "broadcasting and
# uploading models" (Sec. 5.2), and Tables 1-3 fit two transfers per participant and round.
DIRECTIONS = 2
VGG9_BYTES = 13.4e6  # Table 9: the full VGG9 is 13.4 MB
# t_p, the server's time per pseudo-labeled sample (Eq. 8), is only a symbol in the paper; this
# value is ours, fitted to the round-time increments of Table 1 (about 6 s for 40k samples).
T_P_SEC = 1.5e-4


def _check(name: str, value: Any, ok, allowed: str) -> None:
    v = concrete(value)
    if v is not None and not bool(ok(v).all()):
        raise bad(name, value, allowed)


def _check_alpha(alpha: Any) -> None:
    _check("cost.alpha", alpha, lambda v: (v >= 0) & (v <= 1), "a number in [0, 1]")


# ----------------------------------------------------------------------------- one round


def transfer_time(size_bytes: Any, rate_bytes_per_s: Any) -> jax.Array:
    """Seconds to move one model: size / rate, elementwise float32 (a broadcast or an upload)."""
    _check("rate_bytes_per_s", rate_bytes_per_s, lambda v: v > 0, "a rate > 0 (bytes/s)")
    return jnp.asarray(size_bytes, jnp.float32) / jnp.asarray(rate_bytes_per_s, jnp.float32)


def client_time(broadcast_s: Any, compute_s: Any, upload_s: Any) -> jax.Array:
    """t_{k,m} of Eq. 8: model broadcast + local updating + upload, float32 [M] (broadcast)."""
    parts = [jnp.asarray(x, jnp.float32) for x in (broadcast_s, compute_s, upload_s)]
    return parts[0] + parts[1] + parts[2]


def straggler_time(t_client: Any, mask: Any) -> jax.Array:
    """max_{m in V_k} t_{k,m}: t_client float [M], mask bool [M] -> float32 [].

    Clients train in parallel, so the slowest selected one decides; unselected clients are
    ignored whatever their time (even inf or NaN); no client selected gives 0.
    """
    t, mask = jnp.asarray(t_client, jnp.float32), jnp.asarray(mask, bool)
    t, mask = jnp.broadcast_arrays(t, mask)
    return jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, t, -jnp.inf)), 0.0)


def round_time(t_client: Any, mask: Any, num_pseudo: Any, t_p: Any = T_P_SEC) -> jax.Array:
    """Eq. 8: t_k = max_{m in V_k} t_{k,m} + t_p |D_{k,U}| seconds -> float32 [].

    num_pseudo int []: |D_{k,U}|, the pseudo-labeled samples the server trains on this round
    (generating the pseudo-labels is not charged, as in the paper).
    """
    _check("cost.t_p", t_p, lambda v: v >= 0, "a time >= 0 (seconds per sample)")
    _check("num_pseudo", num_pseudo, lambda v: v >= 0, "a count >= 0")
    server = jnp.asarray(t_p, jnp.float32) * jnp.asarray(num_pseudo, jnp.float32)
    return straggler_time(t_client, mask) + server


def round_traffic(
    mask: Any, model_bytes: Any = VGG9_BYTES, directions: int = DIRECTIONS
) -> jax.Array:
    """Eq. 9 with both directions: b_k = sum_{m in V_k} directions * W_m bytes -> float32 [].

    mask bool [M]; model_bytes: W, a scalar or per client [M] (the sub-model each client
    exchanged). Homogeneous models: ceil(P_k M) * directions * W.
    """
    if directions not in (1, 2):
        raise bad("cost.traffic_directions", directions, "1 (Eq. 9 as printed) or 2")
    mask = jnp.asarray(mask, bool)
    w = jnp.broadcast_to(jnp.asarray(model_bytes, jnp.float32), mask.shape)
    return directions * jnp.sum(jnp.where(mask, w, 0.0))


def weighted_cost(time_s: Any, traffic_bytes: Any, alpha: Any) -> jax.Array:
    """Eq. 10: Phi = alpha t[min] + (1 - alpha) b[GB], from seconds and bytes -> float32."""
    return weighted_cost_min_gb(
        jnp.asarray(time_s, jnp.float32) / SEC_PER_MIN,
        jnp.asarray(traffic_bytes, jnp.float32) / BYTES_PER_GB,
        alpha,
    )


def weighted_cost_min_gb(time_min: Any, traffic_gb: Any, alpha: Any) -> jax.Array:
    """Eq. 10 on values already in minutes and GB: alpha t + (1 - alpha) b -> float32."""
    _check_alpha(alpha)
    a = jnp.asarray(alpha, jnp.float32)
    return a * jnp.asarray(time_min, jnp.float32) + (1.0 - a) * jnp.asarray(traffic_gb, jnp.float32)


@struct.dataclass
class RoundCost:
    """One round's t_k (seconds), b_k (bytes) and Phi_k (min and GB), float32 [] each."""

    time_s: jax.Array
    traffic_bytes: jax.Array
    cost: jax.Array


def round_cost(
    t_client: Any,
    mask: Any,
    num_pseudo: Any,
    alpha: Any,
    model_bytes: Any = VGG9_BYTES,
    t_p: Any = T_P_SEC,
    directions: int = DIRECTIONS,
) -> RoundCost:
    """Eqs. 8-10 for one round: t_client [M], mask bool [M], num_pseudo [] -> RoundCost."""
    t = round_time(t_client, mask, num_pseudo, t_p)
    b = round_traffic(mask, model_bytes, directions)
    return RoundCost(time_s=t, traffic_bytes=b, cost=weighted_cost(t, b, alpha))


def waiting_terms(t_client: Any, mask: Any) -> tuple[jax.Array, jax.Array]:
    """One round's share of Eq. 34: (sum_{m in V_k} (t_{k,max} - t_{k,m}) / t_{k,max}, |V_k|)
    over t_client float [M] and mask bool [M] -> (float32 [], float32 []). A run's waiting
    ratio is the sum of the first over its rounds divided by the sum of the second (x 100%)."""
    t, mask = jnp.asarray(t_client, jnp.float32), jnp.asarray(mask, bool)
    t_max = straggler_time(t, mask)
    wait = jnp.where(mask, (t_max - t) / jnp.where(t_max > 0, t_max, 1.0), 0.0)
    return jnp.sum(wait), jnp.sum(mask).astype(jnp.float32)


def waiting_ratio(wait_sum: Any, count: Any) -> jax.Array:
    """Eq. 34 in percent from the summed `waiting_terms` of the rounds so far (0 before any)."""
    count = jnp.asarray(count, jnp.float32)
    return 100.0 * jnp.asarray(wait_sum, jnp.float32) / jnp.maximum(count, 1.0)


# ----------------------------------------------------------------------------- a whole run


def over_budget(
    cum_time_s: Any, cum_traffic_bytes: Any, time_budget_s: Any, traffic_budget_bytes: Any
) -> jax.Array:
    """Eq. 11's budget constraints as a stop rule: sum t_k >= T or sum b_k >= B -> bool.

    An infinite budget never stops the run.
    """
    t_over = jnp.asarray(cum_time_s, jnp.float32) >= jnp.asarray(time_budget_s, jnp.float32)
    b_over = jnp.asarray(cum_traffic_bytes, jnp.float32) >= jnp.asarray(
        traffic_budget_bytes, jnp.float32
    )
    return t_over | b_over


def run_cost(
    reached: Any,
    time_min: Any,
    traffic_gb: Any,
    alpha: Any,
    time_budget_min: Any,
    traffic_budget_gb: Any = jnp.inf,
) -> jax.Array:
    """The weighted-cost metric (Sec. 5.2, Eq. 10) of a run, in min and GB -> float32.

    reached bool: the run hit the target accuracy; then its time and traffic until then are
    charged. Otherwise our rule charges the budgets, alpha T + (1 - alpha) B (an infinite
    traffic budget with alpha < 1 gives inf; alpha = 1 charges T alone).
    """
    spent = weighted_cost_min_gb(time_min, traffic_gb, alpha)
    a = jnp.asarray(alpha, jnp.float32)
    b_term = jnp.where(a < 1, (1.0 - a) * jnp.asarray(traffic_budget_gb, jnp.float32), 0.0)
    budget = a * jnp.asarray(time_budget_min, jnp.float32) + b_term
    return jnp.where(jnp.asarray(reached, bool), spent, budget)


def best_cell(time_min: Any, traffic_gb: Any, alpha: Any) -> jax.Array:
    """Tables 4-6: the fixed (P, C) cell with the least Eq. 10 cost until the target.

    time_min, traffic_gb float [K] over the cells of a grid (Tables 1-3 (b), (c)), NaN where
    the target was not reached; alpha []. Returns int32 [], the first minimising cell (-1 when
    no cell reached the target).
    """
    t, b = jnp.asarray(time_min, jnp.float32), jnp.asarray(traffic_gb, jnp.float32)
    cost = weighted_cost_min_gb(t, b, alpha)
    ok = ~(jnp.isnan(t) | jnp.isnan(b))
    best = jnp.argmin(jnp.where(ok, cost, jnp.inf)).astype(jnp.int32)
    return jnp.where(jnp.any(ok), best, -1)
