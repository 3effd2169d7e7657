"""CFSL's worker selection (Hamood et al., Sec. V-C; Algorithm 3 lines 5-11): within each cluster
that has reached the stopping point (Eq. 25) only k workers train per round, chosen greedily
(lowest latency), round-robin (least recently selected) or at random; clusters that have not
stopped keep all their workers.

Everything here is pure jnp over fixed shapes, jit/vmap-compatible, with no Python loop over
clients: a worker's rank inside its cluster comes from one stable lexicographic sort. `C` is the
client axis and `K` the number of cluster slots; `assign [C] int` holds each client's slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.errors import bad
from fedjax_semi.kernels.checks import concrete

SCHEMES = ("greedy", "round_robin", "random", "all")


def _segment_rank_keys(
    keys: Sequence[jax.Array], segment: jax.Array, num_segments: int
) -> jax.Array:
    """Rank [C] int32 of each client inside its segment, ordered by `keys` (primary first),
    ties by the lower client index."""
    segment = jnp.asarray(segment, jnp.int32)
    c = segment.shape[0]
    idx = jnp.arange(c, dtype=jnp.int32)
    # lexsort sorts by its LAST key first: segment, then keys in order, then index.
    order = jnp.lexsort((idx, *reversed(tuple(keys)), segment))
    pos = jnp.arange(c, dtype=jnp.int32)
    seg_sorted = segment[order]
    # First sorted position of each segment (segments are contiguous after the sort).
    start = jax.ops.segment_min(pos, seg_sorted, num_segments=num_segments)
    return jnp.zeros(c, jnp.int32).at[order].set(pos - start[seg_sorted])


def segment_rank(score: Any, segment: Any, num_segments: int) -> jax.Array:
    """Rank [C] int32 of each client inside its segment by ascending score, ties by the lower
    client index: the segment's best client has rank 0.

    score [C] float, segment [C] int in [0, num_segments) (num_segments static).
    """
    score = jnp.asarray(score)
    if score.ndim != 1 or jnp.shape(segment) != score.shape:
        raise ValueError(
            f"score.shape={score.shape}, segment.shape={jnp.shape(segment)} are not allowed: "
            "need [C] and [C]"
        )
    return _segment_rank_keys((score,), segment, num_segments)


def select_workers(
    scheme: str,
    assign: Any,
    stopped: Any,
    latency: Any,
    energy: Any,
    last_selected: Any,
    key: jax.Array,
    k: Any,
    member: Any = None,
) -> jax.Array:
    """Sec. 2.9's selection -> sel [C] bool.

    scheme (static): greedy = the k lowest-latency members (ties: lower energy, then index);
    round_robin = the k smallest `last_selected` (the round each was last picked; ties: index),
    cyclic for a static cluster once the caller sets last_selected = r for the picked ones;
    random = k members uniformly at random from `key`; all = everyone.
    assign [C] int cluster slot, stopped [K] bool, latency [C], energy [C], last_selected [C]
    int, k an int or a [K] int array (per-cluster k, e.g. ceil(k_frac |g|)), member [C] bool
    (default all True): non-members (padding, absent clients) are never selected and take no
    slot. A stopped cluster selects min(k, |g|) members; a non-stopped one selects all.
    """
    if scheme not in SCHEMES:
        raise bad("algorithm.selection", scheme, f"one of {list(SCHEMES)}")
    kv = concrete(k)
    if kv is not None and not bool((kv >= 0).all()):
        raise bad("algorithm.k_per_cluster", k, "an int >= 0")
    assign = jnp.asarray(assign, jnp.int32)
    stopped = jnp.asarray(stopped, bool)
    chex.assert_rank([assign, stopped], 1)
    c, num_k = assign.shape[0], stopped.shape[0]
    member = jnp.ones(c, bool) if member is None else jnp.asarray(member, bool)
    k = jnp.asarray(k, jnp.int32)
    chex.assert_shape(member, (c,))
    chex.assert_rank(k, {0, 1})
    if k.ndim:
        chex.assert_shape(k, (num_k,))
    if scheme == "all":
        return member
    if scheme == "greedy":
        keys = (jnp.asarray(latency), jnp.asarray(energy))
    elif scheme == "round_robin":
        keys = (jnp.asarray(last_selected),)
    else:
        keys = (jax.random.uniform(key, (c,)),)
    chex.assert_shape(keys, (c,))
    # Non-members go to an extra segment K so they never use up a cluster's k slots.
    slot = jnp.where(member, jnp.clip(assign, 0, num_k - 1), num_k)
    rank = _segment_rank_keys(keys, slot, num_k + 1)
    k_of = jnp.broadcast_to(k, (num_k,))[slot.clip(0, num_k - 1)]
    in_stopped = stopped[slot.clip(0, num_k - 1)]
    return member & (~in_stopped | (rank < k_of))
