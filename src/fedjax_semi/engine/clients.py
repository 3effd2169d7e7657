"""The client axis: per-client randomness, chunked mapping, gather/scatter of a cohort.

Three ways to map a per-client function over a leading client axis, which must agree numerically:
  * `map_clients(fn, xs, chunk=k)` inside jit: `lax.map(..., batch_size=k)`, a vmap over chunks of
    k clients run one after another (small k bounds memory and suits the CPU);
  * `map_clients(fn, xs, chunk="all")`: one vmap over every client (GPU);
  * `LoopMapper`: the reference backend, a Python loop of per-client jitted calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any

# Purposes of per-client random streams. A client's key never depends on its position in a chunk.
INIT, SELECT, SAMPLE, DROPOUT, AUGMENT, PSEUDO = range(6)
# UM-pFSSL's helper protocol.
WARMUP, FILL, CANDIDATE, MC_REPLACE, MC_CANDIDATE, MC_REFRESH, MC_STATS = range(6, 13)


def client_key(seed_key: jax.Array, purpose: int, rnd: jax.Array, client: jax.Array) -> jax.Array:
    """Key for (seed, purpose, round, client id)."""
    k = jax.random.fold_in(seed_key, purpose)
    k = jax.random.fold_in(k, rnd)
    return jax.random.fold_in(k, client)


def round_key(seed_key: jax.Array, purpose: int, rnd: jax.Array) -> jax.Array:
    """Key for (seed, purpose, round) with no client: server-side draws such as selection."""
    return jax.random.fold_in(jax.random.fold_in(seed_key, purpose), rnd)


def map_clients(fn: Callable, xs: PyTree, *shared: Any, chunk: int | str = "all") -> PyTree:
    """fn(x_i, *shared) for every i of the leading axis of xs, inside a jit."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if chunk == "all" or chunk >= n:
        return jax.vmap(fn, in_axes=(0,) + (None,) * len(shared))(xs, *shared)
    if chunk == 1:
        # A plain loop: no batch-of-one vmap, so every op keeps its unbatched form.
        return jax.lax.map(lambda x: fn(x, *shared), xs)
    return jax.lax.map(lambda x: fn(x, *shared), xs, batch_size=int(chunk))


class LoopMapper:
    """Reference backend: a Python loop over clients, each a call of one jitted function."""

    def __init__(self) -> None:
        self._jitted: dict[Callable, Callable] = {}

    def __call__(self, fn: Callable, xs: PyTree, *shared: Any) -> PyTree:
        jfn = self._jitted.setdefault(fn, jax.jit(fn))
        n = jax.tree.leaves(xs)[0].shape[0]
        outs = [jfn(jax.tree.map(lambda a, i=i: a[i], xs), *shared) for i in range(n)]
        return jax.tree.map(lambda *a: jnp.stack(a), *outs)


def gather(tree: PyTree, ids: jax.Array) -> PyTree:
    """Rows `ids` of every leaf of a client-stacked tree: [C, ...] -> [S, ...]."""
    return jax.tree.map(lambda a: a[ids], tree)


def scatter(tree: PyTree, ids: jax.Array, rows: PyTree) -> PyTree:
    """Write the cohort's rows back: tree[ids] = rows."""
    return jax.tree.map(lambda a, r: a.at[ids].set(r), tree, rows)


def broadcast(tree: PyTree, n: int) -> PyTree:
    """Stack n copies of a tree on a new leading axis."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), tree)


def select_cohort(seed_key: jax.Array, rnd: jax.Array, num_clients: int, size: int) -> jax.Array:
    """Uniform sample of `size` client ids without replacement, sorted: int32 [S]."""
    key = round_key(seed_key, SELECT, rnd)
    ids = jax.random.choice(key, num_clients, (size,), replace=False)
    return jnp.sort(ids).astype(jnp.int32)
