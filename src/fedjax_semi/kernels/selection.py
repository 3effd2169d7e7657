"""Selection kernels: sampling without replacement under exclusions, and the best-R merge of
incumbents and candidates used by UM-pFSSL's helper search (Algorithm 1 line 9, Algorithm 2
REPLACEHELPER, whose pairing of candidates and incumbents the paper leaves open)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def sample_excluding(key: jax.Array, excluded: jax.Array, k: int) -> jax.Array:
    """k distinct ids per row, uniform over the ids not excluded (masked Gumbel top-k).

    excluded bool [S, K] -> ids int32 [S, k]. Rows need at least k allowed ids.
    """
    chex.assert_rank(excluded, 2)
    g = jax.random.gumbel(key, excluded.shape)
    _, ids = jax.lax.top_k(jnp.where(excluded, -jnp.inf, g), k)
    return ids.astype(jnp.int32)


def lowest_mask(values: jax.Array, r: int) -> jax.Array:
    """values [S, M] -> bool [S, M]: the r lowest entries of each row (ties to the lower index)."""
    chex.assert_rank(values, 2)
    order = jnp.argsort(values, axis=-1, stable=True)
    ranks = jnp.argsort(order, axis=-1, stable=True)
    return ranks < r


def merge_best(
    inc_ids: jax.Array, inc_corr: jax.Array, cand_ids: jax.Array, cand_corr: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Keep the best R of R incumbents and R candidates (incumbents win ties).

    inc_* [S, R], cand_* [S, R] -> (ids [S, R], corr [S, R], pos [S, R]) where pos indexes
    concat(incumbents, candidates): pos >= R marks a candidate that got in.
    Equivalent to Alg. 2's greedy swap: sort candidates descending and incumbents ascending and
    swap while the candidate's Corr is strictly greater ("if its Corr is higher").
    """
    chex.assert_rank(inc_ids, 2)
    chex.assert_equal_shape([inc_ids, inc_corr, cand_ids, cand_corr])
    r = inc_ids.shape[-1]
    ids = jnp.concatenate([inc_ids, cand_ids], axis=-1)
    corr = jnp.concatenate([inc_corr, cand_corr], axis=-1)
    # top_k puts equal values at the lower index first: incumbents come first, so they win ties.
    best_corr, pos = jax.lax.top_k(corr, r)
    return jnp.take_along_axis(ids, pos, -1), best_corr, pos
