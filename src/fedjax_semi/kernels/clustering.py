"""CFSL's clustering kernels (Sattler et al.'s CFL at each edge, as used by CFSL: Eqs. 4-6 and
Algorithm 1's `CFLSteps`, the stopping point Eq. 25): the cosine matrix of the updates, the
exact min-max bipartition (maximum-spanning-tree cut) and the complete-linkage option, the split
and stopping tests, and the cluster bookkeeping over fixed cluster slots.

Everything here is pure jnp over fixed shapes, jit/vmap-compatible, with no Python loop over
clients. `C` is the client axis, `P` the flattened parameter count and `K` the number of
cluster slots (K_max); `assign [C] int32` holds each client's cluster slot in [0, K).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.kernels.checks import as_float

_HI = jax.lax.Precision.HIGHEST  # accelerators' default matmul precision would round to ~bf16


# ----------------------------------------------------------------------------- Eq. 4


def cosine_matrix(delta: jax.Array, part: jax.Array) -> jax.Array:
    """Eq. 4: S[i, j] = <d_i, d_j> / (||d_i|| ||d_j||) -> f32 [C, C].

    delta [C, P] (flattened updates), part [C] bool. Rows and columns of non-participants and
    of zero-norm updates (cosine undefined) are 0; the diagonal is 1 for every other client.
    Entries are clipped to [-1, 1]. One [C, C] Gram matrix scaled by the inverse norms, so no
    normalized [C, P] copy of delta is made.
    """
    delta = as_float(delta)
    if delta.ndim != 2 or jnp.shape(part) != delta.shape[:1]:
        raise ValueError(
            f"delta.shape={delta.shape}, part.shape={jnp.shape(part)} are not allowed: "
            "need [C, P] and [C]"
        )
    norm = jnp.linalg.norm(delta, axis=-1)
    ok = jnp.asarray(part, bool) & (norm > 0)
    inv = jnp.where(ok, 1.0 / jnp.where(ok, norm, 1.0), 0.0)
    gram = jnp.matmul(delta, delta.T, precision=_HI)
    s = jnp.clip(gram * inv[:, None] * inv[None, :], -1.0, 1.0)
    eye = jnp.eye(delta.shape[0], dtype=bool)
    return jnp.where(eye, ok.astype(s.dtype), s)


# ----------------------------------------------------------------------------- Alg. 1 bipartition


def _check_square(s: jax.Array, member: jax.Array) -> None:
    c = s.shape[-1]
    if s.shape != (c, c) or jnp.shape(member) != (c,):
        raise ValueError(
            f"S.shape={s.shape}, member.shape={jnp.shape(member)} are not allowed: "
            "need [C, C] and [C] (vmap over a batch of clusters)"
        )


def bipartition_maxst(s: jax.Array, member: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Algorithm 1's bipartition, argmin over g = g1 + g2 of max_{i in g1, j in g2} S[i, j].

    S [C, C] symmetric (finite on members), member [C] bool -> (side [C] bool, alpha_cross []).
    Exact: build a maximum spanning tree of the members (Prim, a fori_loop of C - 1 steps) and
    cut its lightest edge (single linkage). Every bipartition cuts some tree edge, so its max
    cross similarity is at least the lightest one; by the cycle property no edge across that
    cut is heavier. side marks the subtree below the cut edge (never the first member) and is
    False on non-members, whose rows and columns of S are never read into the result. Ties go
    to the lowest index. With fewer than 2 members side is all False and alpha_cross = 1.0
    (inseparable, so the gamma test of Alg. 1 line 7, sqrt((1 - alpha) / 2), is 0).
    """
    _check_square(s, member)
    s = as_float(s)
    member = jnp.asarray(member, bool)
    c = s.shape[0]
    idx = jnp.arange(c)
    root = jnp.argmax(member)  # the first member
    ninf = jnp.asarray(-jnp.inf, s.dtype)

    # best[v]: heaviest edge from the tree to v, via near[v]; w[v]: v's tree-edge weight.
    in_tree = idx == root
    best = jnp.where(member & ~in_tree, s[root], ninf)
    near = jnp.full(c, root)
    w = jnp.full(c, jnp.inf, s.dtype)
    parent = idx  # non-members and the root point to themselves

    def body(_, carry):
        in_tree, best, near, w, parent = carry
        cand = member & ~in_tree
        v = jnp.argmax(jnp.where(cand, best, ninf))
        go = jnp.any(cand)
        in_tree = in_tree.at[v].set(in_tree[v] | go)
        w = w.at[v].set(jnp.where(go, best[v], w[v]))
        parent = parent.at[v].set(jnp.where(go, near[v], parent[v]))
        better = member & ~in_tree & (s[v] > best) & go
        return in_tree, jnp.where(better, s[v], best), jnp.where(better, v, near), w, parent

    _, _, _, w, parent = jax.lax.fori_loop(0, c - 1, body, (in_tree, best, near, w, parent))

    n = jnp.sum(member)
    cut = jnp.argmin(w)  # +inf on the root and non-members
    # Subtree of `cut`: pointer doubling over parent, ceil(log2 C) + 1 static steps.
    side, anc = idx == cut, parent
    for _ in range(max(c - 1, 1).bit_length() + 1):
        side, anc = side | side[anc], anc[anc]
    side = side & member & (n >= 2)
    alpha = jnp.where(n >= 2, w[cut], 1.0).astype(s.dtype)
    return side, alpha


def cross_max(s: jax.Array, member: jax.Array, side: jax.Array) -> jax.Array:
    """max S[i, j] over members i in side, j not in side -> [] (-inf if one part is empty).

    S [C, C], member [C] bool, side [C] bool."""
    member, side = jnp.asarray(member, bool), jnp.asarray(side, bool)
    c = member.shape[-1]
    chex.assert_shape([s, member, side], [(c, c), (c,), (c,)])
    a, b = member & side, member & ~side
    return jnp.max(jnp.where(a[:, None] & b[None, :], as_float(s), -jnp.inf))


def bipartition_complete_linkage(s: jax.Array, member: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Option `bipartition: complete`: complete-linkage agglomeration of the members on the
    distance -S down to 2 clusters (as the CFL reference code), not the exact min-max split.

    S [C, C] symmetric, member [C] bool -> (side [C] bool, alpha_cross [] = cross_max of the
    result). C - 1 masked merge steps on a [C, C] cluster-similarity matrix (linkage = min over
    pairs of S); each merges the most similar pair (ties: lowest flat index) into its lower
    slot. side is the cluster without the first member. O(C^3) per call. Fewer than 2 members:
    side all False, alpha_cross = 1.0 (as `bipartition_maxst`).
    """
    _check_square(s, member)
    s = as_float(s)
    member = jnp.asarray(member, bool)
    c = s.shape[0]
    idx = jnp.arange(c)
    n = jnp.sum(member)
    ninf = jnp.asarray(-jnp.inf, s.dtype)

    def body(step, carry):
        link, alive, label = carry
        pair = alive[:, None] & alive[None, :] & (idx[:, None] < idx[None, :])
        flat = jnp.argmax(jnp.where(pair, link, ninf))
        a, b = flat // c, flat % c  # a < b: b merges into a
        go = step < n - 2
        row = jnp.minimum(link[a], link[b])
        new = link.at[a, :].set(row).at[:, a].set(row)
        link = jnp.where(go, new, link)
        alive = alive.at[b].set(alive[b] & ~go)
        label = jnp.where(go & (label == b), a, label)
        return link, alive, label

    _, _, label = jax.lax.fori_loop(0, c - 1, body, (s, member, idx))
    first = jnp.argmax(member)
    side = member & (label != label[first]) & (n >= 2)
    alpha = jnp.where(n >= 2, cross_max(s, member, side), 1.0).astype(s.dtype)
    return side, alpha


# ----------------------------------------------------------------------------- per-cluster stats


def cluster_mean(
    values: jax.Array, assign: jax.Array, k_max: int, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Weighted mean per cluster slot, sum_{i in k} w_i v_i / sum_{i in k} w_i (the inside of
    Eq. 5 with weights D_i / D normalized within the cluster).

    values [C, P], assign [C] int in [0, k_max), weights [C] >= 0 (0 = not participating) ->
    (mean f32 [K, P], total weight [K]). A slot with total weight 0 gets a zero mean.
    """
    values, weights, assign = as_float(values), as_float(weights), jnp.asarray(assign)
    chex.assert_rank(values, 2)
    chex.assert_shape([assign, weights], values.shape[:1])
    total = jax.ops.segment_sum(weights, assign, k_max)
    summed = jax.ops.segment_sum(weights[:, None] * values, assign, k_max)
    return summed / jnp.where(total > 0, total, 1.0)[:, None], total


def cluster_max(values: jax.Array, part: jax.Array, assign: jax.Array, k_max: int) -> jax.Array:
    """max over participating members of values (e.g. ||d_i||, Eq. 6 and 25) -> [K]; 0 for a
    slot with no participant (norms are >= 0). values [C], part [C] bool, assign [C]."""
    values, part, assign = as_float(values), jnp.asarray(part, bool), jnp.asarray(assign)
    chex.assert_rank(values, 1)
    chex.assert_equal_shape([values, part, assign])
    v = jnp.where(part, values, -jnp.inf)
    m = jax.ops.segment_max(v, assign, k_max)
    return jnp.where(jnp.isfinite(m), m, 0.0)


def cluster_size(member: jax.Array, assign: jax.Array, k_max: int) -> jax.Array:
    """Number of flagged clients per slot: member [C] bool, assign [C] -> int32 [K]."""
    member, assign = jnp.asarray(member, jnp.int32), jnp.asarray(assign)
    chex.assert_rank(member, 1)
    chex.assert_equal_shape([member, assign])
    return jax.ops.segment_sum(member, assign, k_max)


# ----------------------------------------------------------------------------- Eqs. 5, 6, 25


def should_split(
    mean_norm: jax.Array,
    max_norm: jax.Array,
    eps1: float | jax.Array,
    eps2: float | jax.Array,
    *,
    active: jax.Array,
    stopped: jax.Array,
    size: jax.Array,
    round_index: int | jax.Array,
    last_split: jax.Array,
    min_size: int = 3,
    warmup: int = 20,
) -> jax.Array:
    """The split test per slot -> bool [K].

    mean_norm [K] = ||weighted mean update|| (Eq. 5: < eps1, the cluster is near a stationary
    point), max_norm [K] = max member update norm (Eq. 6: > eps2, some member is not). Guards:
    the slot is active and not stopped, has >= min_size members (size [K]), round_index >=
    warmup and round_index - last_split[K] >= warmup (the slot's creation or last split).
    active [K] and stopped [K] bool; eps1, eps2 and round_index are scalars.
    """
    r = jnp.asarray(round_index, jnp.int32)
    mean_norm, max_norm = as_float(mean_norm), as_float(max_norm)
    active, stopped = jnp.asarray(active, bool), jnp.asarray(stopped, bool)
    size, last_split = jnp.asarray(size), jnp.asarray(last_split)
    chex.assert_rank([mean_norm, r, eps1, eps2], [1, 0, 0, 0])
    chex.assert_equal_shape([mean_norm, max_norm, active, stopped, size, last_split])
    eqs = (mean_norm < eps1) & (max_norm > eps2)  # Eqs. 5 and 6
    guards = active & ~stopped & (size >= min_size)
    return eqs & guards & (r >= warmup) & (r - last_split >= warmup)


def reached_stopping_point(
    max_norm: jax.Array,
    eps2: float | jax.Array,
    *,
    active: jax.Array,
    full: jax.Array,
    round_index: int | jax.Array,
    warmup: int = 20,
) -> jax.Array:
    """Eq. 25, max_{i in g} ||d_i|| < eps2, per slot -> bool [K]; only for active slots whose
    members all trained this round (full [K]) and from round `warmup` on. The caller keeps the
    flag sticky (stopped |= this). max_norm [K], active [K] bool; eps2, round_index scalars."""
    r = jnp.asarray(round_index, jnp.int32)
    max_norm, active, full = as_float(max_norm), jnp.asarray(active, bool), jnp.asarray(full, bool)
    chex.assert_rank([max_norm, r, eps2], [1, 0, 0])
    chex.assert_equal_shape([max_norm, active, full])
    ok = active & full & (r >= warmup)
    return ok & (max_norm < eps2)  # Eq. 25


def gamma_hat(delta: jax.Array, mean: jax.Array, assign: jax.Array, part: jax.Array) -> jax.Array:
    """Observable surrogate of Alg. 1's gamma_i, ||mean[g(i)] - d_i|| / ||mean[g(i)]||, with the
    (child) cluster's mean update standing in for the unobservable grad F_psi(i).

    delta [C, P], mean [K, P] (`cluster_mean` over the post-split assign [C]), part [C] bool
    -> f32 [C]: 0 for non-participants, +inf where the cluster mean is 0.
    """
    delta, mean, assign = as_float(delta), as_float(mean), jnp.asarray(assign)
    part = jnp.asarray(part, bool)
    chex.assert_rank([delta, mean], 2)
    chex.assert_equal_shape([delta, mean], dims=1)
    chex.assert_shape([assign, part], delta.shape[:1])
    m = mean[assign]
    num = jnp.linalg.norm(m - delta, axis=-1)
    den = jnp.linalg.norm(m, axis=-1)
    g = jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), jnp.inf)
    return jnp.where(part, g, 0.0)


def gamma_check(
    gamma: jax.Array, part: jax.Array, assign: jax.Array, alpha: jax.Array, k_max: int
) -> jax.Array:
    """Alg. 1 lines 7-8 per parent slot: max_{i in g} gamma_i < sqrt((1 - alpha_cross) / 2).

    gamma [C] (`gamma_hat`), part [C] bool, assign [C] (the pre-split slots), alpha [K]
    -> bool [K] (K = k_max).
    """
    gamma, alpha = as_float(gamma), as_float(alpha)
    part, assign = jnp.asarray(part, bool), jnp.asarray(assign)
    chex.assert_rank(gamma, 1)
    chex.assert_shape([part, assign, alpha], [gamma.shape, gamma.shape, (k_max,)])
    bound = jnp.sqrt(jnp.maximum(1.0 - as_float(alpha), 0.0) / 2.0)
    return cluster_max(gamma, part, assign, k_max) < bound


# ----------------------------------------------------------------------------- bookkeeping


def split_cluster(
    assign: jax.Array, k: int | jax.Array, side: jax.Array, new_id: int | jax.Array
) -> jax.Array:
    """One split: members of slot k with side True move to slot new_id -> assign [C].

    assign [C], side [C] bool; k and new_id scalars."""
    assign, side = jnp.asarray(assign), jnp.asarray(side, bool)
    chex.assert_rank([assign, k, new_id], [1, 0, 0])
    chex.assert_equal_shape([assign, side])
    move = (assign == k) & side
    return jnp.where(move, jnp.asarray(new_id, assign.dtype), assign)


def allocate_children(
    want: jax.Array, priority: jax.Array, active: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Child slots for the splits of one round, within K_max: want, priority (e.g. max_norm),
    active, all [K] -> (granted bool [K], new_id int32 [K], -1 where not granted).

    Child B of slot k goes to a free (inactive) slot, lowest free slots first, granted in
    order of decreasing priority (ties: lower k); splits beyond the free slots are deferred.
    """
    want, active, priority = jnp.asarray(want, bool), jnp.asarray(active, bool), as_float(priority)
    chex.assert_rank(want, 1)
    chex.assert_equal_shape([want, priority, active])
    k = want.shape[0]
    order = jnp.argsort(jnp.where(want, -priority, jnp.inf), stable=True)
    rank = jnp.zeros(k, jnp.int32).at[order].set(jnp.arange(k, dtype=jnp.int32))
    free = jnp.argsort(active, stable=True)  # inactive slots first, ascending
    granted = want & (rank < jnp.sum(~active))
    return granted, jnp.where(granted, free[rank], -1).astype(jnp.int32)


def apply_splits(
    assign: jax.Array, side: jax.Array, granted: jax.Array, new_id: jax.Array
) -> jax.Array:
    """All granted splits at once: client i of slot k moves to new_id[k] iff granted[k] and
    side[k, i]. assign [C], side [K, C] bool (vmapped bipartitions), granted [K], new_id [K]
    -> assign [C]."""
    assign, side, granted = jnp.asarray(assign), jnp.asarray(side, bool), jnp.asarray(granted, bool)
    new_id = jnp.asarray(new_id)
    chex.assert_rank(assign, 1)
    c, k = assign.shape[0], granted.shape[0]
    chex.assert_shape([side, granted, new_id], [(k, c), (k,), (k,)])
    move = granted[assign] & side[assign, jnp.arange(c)]
    return jnp.where(move, new_id[assign].astype(assign.dtype), assign)


# --------------------------------------------------------------------- cluster recovery


def _pairs(n: jax.Array) -> jax.Array:
    return n * (n - 1.0) / 2.0


def adjusted_rand_index(
    found: jax.Array, truth: jax.Array, num_found: int, num_truth: int, mask: jax.Array
) -> jax.Array:
    """Hubert & Arabie's adjusted Rand index of two labelings -> f32 [].

    found [C] int in [0, num_found) (e.g. each client's cluster slot), truth [C] int in
    [0, num_truth) (the groups a partition built), mask [C] bool (the clients that count).
    1 for identical partitions up to renaming, about 0 for independent ones. The index is
    undefined when both labelings are a single cluster (or fewer than two clients count);
    it is 1 then if they agree, as sklearn's `adjusted_rand_score` returns.
    """
    m, found, truth = jnp.asarray(mask, jnp.float32), jnp.asarray(found), jnp.asarray(truth)
    chex.assert_rank(m, 1)
    chex.assert_equal_shape([found, truth, m])
    a = jax.nn.one_hot(found, num_found, dtype=jnp.float32) * m[:, None]  # [C, Kf]
    b = jax.nn.one_hot(truth, num_truth, dtype=jnp.float32) * m[:, None]  # [C, Kt]
    table = jnp.matmul(a.T, b, precision=_HI)  # [Kf, Kt] contingency counts
    n = jnp.sum(m)
    index = jnp.sum(_pairs(table))
    rows, cols = jnp.sum(_pairs(jnp.sum(table, 1))), jnp.sum(_pairs(jnp.sum(table, 0)))
    expected = rows * cols / jnp.maximum(_pairs(n), 1.0)
    top = 0.5 * (rows + cols)
    denom = top - expected
    return jnp.where(denom == 0, 1.0, (index - expected) / jnp.where(denom == 0, 1.0, denom))


def cluster_recovery(
    assign: jax.Array, active: jax.Array, stopped: jax.Array, group: jax.Array | None
) -> dict:
    """CFSL's mechanism metrics: `stopped_cluster_share`, the share of live slots (active [K])
    that stopped (stopped [K]), and, where the partition built latent groups (group [C] int,
    evaluation only), `cluster_ari`: the adjusted Rand index of the clients' slots (assign [C])
    against them."""
    chex.assert_rank([assign, active], 1)
    chex.assert_equal_shape([active, stopped])
    if group is not None:
        chex.assert_equal_shape([assign, group])
    out = {"stopped_cluster_share": jnp.sum(stopped & active) / jnp.sum(active)}
    if group is not None:
        c, k = assign.shape[0], active.shape[0]
        out["cluster_ari"] = adjusted_rand_index(assign, group, k, c, jnp.ones((c,), bool))
    return out
