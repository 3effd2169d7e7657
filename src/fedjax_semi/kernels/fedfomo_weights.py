"""FedFomo's array kernels (Zhang et al., "Personalized Federated Learning with First Order Model
Optimization", ICLR 2021), as DoFed-SPP's baseline: the first-order weights of the downloaded
models, the server's affinity matrix and the epsilon-greedy choice of the downloads.

The weights are DoFed-SPP's Eq. 19 kernel (`similarity.similarity_ratios`) with G1 = G2 = 0 and
gamma = 1. DoFed-SPP's paper leaves how it ran FedFomo to an appendix that is not public; the
validation data (D_lab), M and epsilon are our choices (docs/choices.md: DoFed-SPP, the
baselines' details). Row n of an `[N, M]` matrix belongs to client n, column m to its m-th
downloaded model.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.kernels.checks import as_float, check_number
from fedjax_semi.kernels.selection import sample_excluding
from fedjax_semi.kernels.similarity import EPS, similarity_ratios


def fedfomo_weights(
    loss_cross: jax.Array,
    loss_own: jax.Array,
    dist: jax.Array,
    valid: jax.Array | None = None,
    *,
    eps: float = EPS,
) -> tuple[jax.Array, jax.Array]:
    """FedFomo's first-order weights: the Eq. 19 kernel with g1 = g2 = 0, gamma = 1.

    loss_own [N] = l_n(theta_n^prev), loss_cross [N, M] = l_n(theta_m), dist [N, M] =
    ||theta_m - theta_n^prev||, valid [N, M] = the models n downloaded.
    w[n, m] = max(l_n(prev) - l_n(theta_m), 0) / ||.||, normalized over the valid m; a row whose
    weights are all 0 stays 0, which means "keep theta_n^prev". Returns (w [N, M], degenerate [N]).
    """
    chex.assert_rank(jnp.asarray(loss_cross), 2)  # the shapes are checked by similarity_ratios
    return similarity_ratios(
        loss_cross,
        loss_own,
        dist,
        gamma=1.0,
        g1=0.0,
        g2=0.0,
        eps=eps,
        valid=valid,
        degenerate="zeros",
    )


def fedfomo_raw_weights(
    loss_cross: jax.Array, loss_own: jax.Array, dist: jax.Array, *, eps: float = EPS
) -> jax.Array:
    """Unclipped FedFomo weights (l_n(prev) - l_n(theta_m)) / max(||.||, eps): [N, M].

    loss_cross [N, M], loss_own [N], dist [N, M], as `fedfomo_weights`."""
    loss_cross, loss_own, dist = as_float(loss_cross), as_float(loss_own), as_float(dist)
    chex.assert_rank(loss_cross, 2)
    chex.assert_equal_shape([loss_cross, dist])
    chex.assert_shape(loss_own, loss_cross.shape[:1])
    return (loss_own[..., :, None] - loss_cross) / jnp.maximum(dist, eps)


def fedfomo_affinity_update(
    affinity: jax.Array, raw_weights: jax.Array, ids: jax.Array, valid: jax.Array | None = None
) -> jax.Array:
    """FedFomo's server affinity P[n, ids[n, s]] += w[n, s].

    affinity [N, N]; raw_weights [N, M] are the unclipped weights of the M downloaded models
    ids [N, M] (int). Following the FedFomo reference code the raw weights are added, so a
    harmful model lowers the affinity. Slots with valid False add nothing.
    """
    w, ids = as_float(raw_weights), jnp.asarray(ids)
    n = affinity.shape[0]
    chex.assert_shape([affinity, w], [(n, n), (n, None)])
    chex.assert_equal_shape([w, ids] + ([] if valid is None else [jnp.asarray(valid)]))
    if valid is not None:
        w = jnp.where(valid, w, 0.0)
    rows = jnp.arange(affinity.shape[0])[:, None]
    return as_float(affinity).astype(w.dtype).at[rows, ids].add(w)


def fedfomo_choose_downloads(
    key: jax.Array, affinity: jax.Array, m: int, epsilon: float | jax.Array
) -> jax.Array:
    """Which M peer models each client downloads: ids int32 [N, m] (FedFomo's epsilon-greedy).

    epsilon-greedy per client: with probability epsilon m peers uniformly at random, otherwise
    the top m of the client's affinity row (ties to the lower id). A client never downloads its
    own model.
    """
    n = affinity.shape[0]
    chex.assert_shape(affinity, (n, n))
    if not 1 <= m <= n - 1:
        raise ValueError(f"m={m!r} is not allowed: an int in [1, N - 1] = [1, {n - 1}]")
    check_number("epsilon", epsilon, lambda v: (v >= 0) & (v <= 1), "a number in [0, 1]")
    k_coin, k_rand = jax.random.split(key)
    self_mask = jnp.eye(n, dtype=bool)
    _, top = jax.lax.top_k(jnp.where(self_mask, -jnp.inf, as_float(affinity)), m)
    rand = sample_excluding(k_rand, self_mask, m)
    explore = jax.random.uniform(k_coin, (n, 1)) < epsilon
    return jnp.where(explore, rand, top).astype(jnp.int32)
