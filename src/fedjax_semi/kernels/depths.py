"""HeteroAda-FedSemi's kernels (Xu et al., "Enhancing Federated Learning with Server-Side
Unlabeled Data by Adaptive Client and Data Selection", Sec. 4.2, Eqs. 23-25, Algorithm 3): each
client's estimated full-model time from what it reported last round, the 1-D k-means of those
times into depths (sub-models H^1 .. H^L), the Semi-HFL baseline's static split into equal
groups, and the layer-wise aggregation of the sub-models.

Pure jnp, jit-compatible, fixed shapes: `[M]` is every client (a bool mask marks the selected
ones), `[L]` the parts / depths. Randomness only from explicit keys.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.errors import bad

KMEANS_MAX_ITER = 100  # Alg. 3's loop runs "while the assignment is changing"; our cap


# ----------------------------------------------------------------------------- Eqs. 23-25


def capability(load: Any, size: Any, t_cp: Any, t_cm: Any) -> tuple[jax.Array, jax.Array]:
    """Eqs. 24-25: compute speed psi_hat = Pi_{k-1,m} / t^cp_{k-1,m} and bandwidth
    gamma_hat = Omega_{k-1,m} / t^cm_{k-1,m}, from the training load Pi and the bytes Omega of
    the sub-model each client trained last round and its reported times. t_cp, t_cm [M]; load,
    size [M], or [] when every client trained the same sub-model -> float32 [M] each."""
    load, size, t_cp, t_cm = (jnp.asarray(v, jnp.float32) for v in (load, size, t_cp, t_cm))
    chex.assert_rank([load, size, t_cp], [{0, 1}, {0, 1}, 1])
    chex.assert_shape([t_cm, *(v for v in (load, size) if v.ndim)], t_cp.shape)
    return load / t_cp, size / t_cm


def full_model_time(load_full: Any, size_full: Any, psi_hat: Any, gamma_hat: Any) -> jax.Array:
    """Eq. 23: t_hat = Pi / psi_hat + Omega / gamma_hat, the time a client would need to train
    and exchange the full model (load Pi, bytes Omega): psi_hat, gamma_hat [M], load_full and
    size_full [] (or [M]) -> float32 [M]."""
    load, size, psi, gamma = (
        jnp.asarray(v, jnp.float32) for v in (load_full, size_full, psi_hat, gamma_hat)
    )
    chex.assert_rank([load, size, psi], [{0, 1}, {0, 1}, 1])
    chex.assert_shape([gamma, *(v for v in (load, size) if v.ndim)], psi.shape)
    return load / psi + size / gamma


# ----------------------------------------------------------------------------- Algorithm 3


def kmeans_1d(
    t: jax.Array, mask: jax.Array, init: jax.Array, max_iter: int = KMEANS_MAX_ITER
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Alg. 3 lines 7-10: Lloyd's iterations on the times t [M] of the clients in mask [M]
    from the centroids init [L], until no client changes cluster (at most max_iter times).

    Each client goes to the nearest centroid (ties: the lower index); each centroid becomes
    the mean of its members, an empty cluster keeping its centroid. Returns (cluster int32 [M]:
    each client's nearest final centroid, unselected ones too; centroids float32 [L];
    iterations int32 [])."""
    t, mask = jnp.asarray(t, jnp.float32), jnp.asarray(mask, bool)
    chex.assert_rank([t, init], 1)
    chex.assert_equal_shape([t, mask])
    num = init.shape[0]

    def nearest(c):
        return jnp.argmin(jnp.abs(t[:, None] - c[None, :]), axis=1).astype(jnp.int32)

    def means(a, c):
        member = (a[:, None] == jnp.arange(num)[None, :]) & mask[:, None]  # [M, L]
        count = jnp.sum(member, axis=0)
        total = jnp.sum(jnp.where(member, t[:, None], 0.0), axis=0)
        return jnp.where(count > 0, total / jnp.maximum(count, 1), c)

    def body(carry):
        it, a, c, _ = carry
        a_new = nearest(c)
        changed = jnp.any((a_new != a) & mask)
        return it + 1, a_new, means(a_new, c), changed

    start = (jnp.int32(0), jnp.full(t.shape, -1, jnp.int32), jnp.asarray(init, jnp.float32), True)
    it, _, c, _ = jax.lax.while_loop(lambda s: s[3] & (s[0] < max_iter), body, start)
    # At a fixed point this is the last assignment; after max_iter it keeps the clusters
    # contiguous intervals of t all the same.
    return nearest(c), c, it


def cluster_depths(
    cluster: jax.Array, centroids: jax.Array, mask: jax.Array, min_rel_gap: float | None = None
) -> jax.Array:
    """Alg. 3 line 11 and Sec. 4.2: U^1 .. U^L by decreasing centroid (the slowest clients
    train H^1, the fastest the full model H^L) -> each client's depth int32 [M] (0: not in
    mask). An empty cluster counts as the slowest, so the fastest clients always train H^L.
    min_rel_gap (None: off, the paper): a cluster whose centroid is within that fraction of
    the next faster one's takes its depth (near-identical clients train the same sub-model).
    cluster int [M], centroids [L], mask bool [M]."""
    chex.assert_rank([cluster, centroids], 1)
    chex.assert_equal_shape([cluster, mask])
    num = centroids.shape[0]
    member = (cluster[:, None] == jnp.arange(num)[None, :]) & mask[:, None]
    empty = ~jnp.any(member, axis=0)
    key = jnp.where(empty, jnp.inf, centroids)
    order = jnp.argsort(-key, stable=True)  # slowest first: position p -> depth p + 1
    depth_of = jnp.zeros((num,), jnp.int32).at[order].set(jnp.arange(1, num + 1, dtype=jnp.int32))
    if min_rel_gap is not None:
        c_sorted, d_sorted = centroids[order], jnp.arange(1, num + 1, dtype=jnp.int32)
        for p in range(num - 2, -1, -1):  # from the fastest down; L is tiny and static
            close = (c_sorted[p] - c_sorted[p + 1]) < min_rel_gap * c_sorted[p + 1]
            d_sorted = d_sorted.at[p].set(jnp.where(close, d_sorted[p + 1], d_sorted[p]))
        depth_of = jnp.zeros((num,), jnp.int32).at[order].set(d_sorted)
    return jnp.where(mask, depth_of[cluster], 0)


def within_sse(
    t: jax.Array, mask: jax.Array, cluster: jax.Array, centroids: jax.Array
) -> jax.Array:
    """Within-cluster sum of squared distances over the clients in mask -> float32 [].

    t [M], mask bool [M], cluster int [M], centroids [L]."""
    chex.assert_rank([t, centroids], 1)
    chex.assert_equal_shape([t, mask, cluster])
    return jnp.sum(jnp.where(mask, jnp.square(t - centroids[cluster]), 0.0))


def assign_depths(
    key: jax.Array,
    t_hat: jax.Array,
    sel: jax.Array,
    num_parts: int,
    restarts: int = 1,
    max_iter: int = KMEANS_MAX_ITER,
    min_rel_gap: float | None = None,
) -> jax.Array:
    """Algorithm 3: the depth d_m in 1..L of every selected client from its estimated time
    t_hat [M] (sel bool [M]; unselected clients get 0) -> int32 [M].

    n > L selected: k-means from the times of L selected clients drawn at random (`restarts`
    draws, keeping the lowest within-cluster SSE; 1 is the paper's single draw). n <= L: each
    client its own cluster, depths L - n + 1 .. L from the slowest to the fastest."""
    if not (isinstance(restarts, int) and restarts >= 1):
        raise bad("algorithm.kmeans_restarts", restarts, "an integer >= 1")
    if min_rel_gap is not None and not min_rel_gap >= 0:
        raise bad("algorithm.min_rel_gap", min_rel_gap, "a fraction >= 0, or null (off)")
    t = jnp.asarray(t_hat, jnp.float32)
    sel = jnp.asarray(sel, bool)
    chex.assert_rank(t, 1)
    chex.assert_equal_shape([t, sel])
    n = jnp.sum(sel)

    def one(k):
        u = jnp.where(sel, jax.random.uniform(k, t.shape), 2.0)
        init = -jnp.sort(-t[jnp.argsort(u)[:num_parts]])  # L random selected clients, slowest 1st
        cluster, c, _ = kmeans_1d(t, sel, init, max_iter)
        return cluster, c, within_sse(t, sel, cluster, c)

    clusters, cents, sse = jax.vmap(one)(jax.random.split(key, restarts))
    best = jnp.argmin(sse)
    by_kmeans = cluster_depths(clusters[best], cents[best], sel, min_rel_gap)
    # n <= L (Alg. 3 lines 5-6): U^{L-n+1} .. U^L, one client each, slowest first.
    singletons = jnp.where(sel, num_parts - n + 1 + slowest_first(t, sel), 0).astype(jnp.int32)
    return jnp.where(n > num_parts, by_kmeans, singletons)


def slowest_first(t: jax.Array, sel: jax.Array) -> jax.Array:
    """Each selected client's rank by decreasing time t [M] (0: the slowest; ties: the lower
    index first; sel bool [M]), the unselected ranked after them -> int32 [M]."""
    order = jnp.argsort(jnp.where(sel, -t, jnp.inf), stable=True)
    return jnp.zeros(t.shape, jnp.int32).at[order].set(jnp.arange(t.shape[0], dtype=jnp.int32))


def quantile_depths(t: jax.Array, sel: jax.Array, num_parts: int) -> jax.Array:
    """Semi-HFL's static heuristic (the baseline of Xu et al.'s Sec. 5.8, after Semi-HFL's
    depth by device capability): the selected clients split into num_parts groups of equal
    size by their time t [M], the slowest group training H^1 and the fastest H^L (n not a
    multiple of L: the faster groups take one more; n < L: depths L - n + 1 .. L, so the
    fastest client always trains the full model, as in Alg. 3) -> depth int32 [M], 0 where
    not sel."""
    t, sel = jnp.asarray(t, jnp.float32), jnp.asarray(sel, bool)
    chex.assert_rank(t, 1)
    chex.assert_equal_shape([t, sel])
    n = jnp.maximum(jnp.sum(sel), 1)
    fastest_first = n - 1 - slowest_first(t, sel)  # 0: the fastest selected client
    depth = num_parts - (fastest_first * num_parts) // n
    return jnp.where(sel, depth, 0).astype(jnp.int32)


# ----------------------------------------------------------------------------- aggregation


def layerwise_mean(
    stacked: PyTree, weights: jax.Array, depth: jax.Array, parts: PyTree, old: PyTree
) -> PyTree:
    """Layer-wise aggregation (Sec. 4.2): part b of the new model is the N_m-weighted mean of
    part b over the clients that trained it (d_m >= b), or its old value when none did.

    stacked: the clients' parameters, leaves [M, ...]; weights float [M] (N_m, 0 for clients
    not selected); depth int [M]; parts: a tree like `old` of each leaf's part b (int); old:
    the global parameters. With every d_m = L it is the weighted mean over all clients."""
    chex.assert_rank(weights, 1)
    chex.assert_equal_shape([weights, depth])
    chex.assert_tree_shape_prefix(stacked, weights.shape)

    def leaf(a, b, g):
        w = jnp.where(depth >= b, weights, 0.0)
        total = jnp.sum(w)
        w = w / jnp.maximum(total, 1e-12)  # as engine.aggregate.weighted_mean
        mean = jnp.tensordot(w.astype(a.dtype), a, axes=1)
        return jnp.where(total > 0, mean, g).astype(g.dtype)

    return jax.tree.map(leaf, stacked, parts, old)
