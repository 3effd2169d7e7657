"""CoFED's consensus-voting kernels (Cao et al., "Cross-Silo Heterogeneous Model Federated
Multitask Learning", Sec. 4.3, Eqs. 15-19, Algorithm 1; Sec. 4.6 credibility weights): weighted
vote counts, the alpha threshold that fills the pseudo-label sets P_k, the per-client sets R_i
with conflicting indices removed, and the local <-> global class maps.

Everything here is pure jnp over fixed shapes, jit-compatible, with no Python loop over clients.
`C` is the client axis, `M` the public samples and `K` the global classes; `owns [C, K]` is the
ownership matrix (owns[i, k]: class k is in client i's label space Y_i) and `preds [C, M]` the
clients' hard predictions as global class ids (negative = padding, no vote).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.errors import check_choice
from fedjax_semi.kernels.checks import concrete

# "gt" is Eq. 18 and Algorithm 1 line 12 (alpha = 1 selects nothing); "ge" is our variant for
# the prose's reading of alpha = 1 as "consent of all participants".
THRESHOLD_OPS = ("gt", "ge")
# "drop_in_client" is Sec. 4.3's removal read per R_i; the other two are our variants.
CONFLICTS = ("drop_in_client", "drop_global", "max_ratio")


# ----------------------------------------------------------------------------- voting (Alg. 1)


def vote_counts(
    preds: jax.Array, owns: jax.Array, weights: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Algorithm 1's COUNT and TOTAL, weighted as in Sec. 4.6.

    preds [C, M] int, owns [C, K] bool, weights [C] (None: all 1, Algorithm 1 as written).
    count[m, k] = sum_i w_i [preds[i, m] == k]; total[k] = sum_i w_i owns[i, k] (m_k of Eq. 16
    when unweighted). Ids outside [0, K) (-1 = padding) cast no vote; the client still
    counts in total.
    Returns (count f32 [M, K], total f32 [K]).
    """
    preds, owns = jnp.asarray(preds), jnp.asarray(owns, bool)
    if preds.ndim != 2 or owns.ndim != 2 or preds.shape[0] != owns.shape[0]:
        raise ValueError(
            f"preds.shape={preds.shape} and owns.shape={owns.shape} are not allowed: "
            "need [C, M] and [C, K] with the same C"
        )
    (c, m), k = preds.shape, owns.shape[1]
    w = jnp.ones(c, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    chex.assert_shape(w, (c,))
    # A masked sum, not w @ owns: an accelerator's default matmul precision could round w.
    total = jnp.sum(jnp.where(owns, w[:, None], 0.0), axis=0)
    # Scatter-add, so no [C, M, K] one-hot; index K is out of range and dropped (padding).
    cls = jnp.where(preds >= 0, preds, k)
    count = (
        jnp.zeros((m, k), jnp.float32)
        .at[jnp.arange(m)[None, :], cls]
        .add(jnp.broadcast_to(w[:, None], (c, m)), mode="drop")
    )
    return count, total


def vote_ratio(count: jax.Array, total: jax.Array) -> jax.Array:
    """Eq. 18's left side in f32: count [M, K] / total [K], 0 where total == 0 (no NaN/inf).

    Correctly rounded, so equal fractions give equal ratios (6/12.75 == 2/4.25): XLA would
    rewrite x / broadcast(t) as x * broadcast(1/t), which rounds twice; the barrier keeps the
    divisor an opaque [M, K] array and the division elementwise.
    """
    count, total = jnp.asarray(count, jnp.float32), jnp.asarray(total, jnp.float32)
    chex.assert_rank(count, 2)
    chex.assert_shape(total, count.shape[1:])
    safe = jnp.where(total > 0, total, 1.0)
    den = jax.lax.optimization_barrier(jnp.broadcast_to(safe, count.shape))
    return jnp.where(total > 0, count / den, 0.0)


def threshold_votes(
    count: jax.Array, total: jax.Array, alpha: float | jax.Array, *, threshold_op: str = "gt"
) -> jax.Array:
    """Eq. 18: m joins P_k iff total[k] > 0 and count[m, k] / total[k] > alpha -> bool [M, K].

    The ratio is rounded to f32 and compared with alpha in f32, never count > alpha * total,
    so an exact tie (3/10 vs 0.3) rounds both sides alike and is not selected under "gt".
    Only voted classes are tested (count > 0: Algorithm 1 line 11 loops over keys(COUNT)),
    which matters for "ge" at alpha = 0. alpha may be traced.
    """
    check_choice("algorithm.threshold_op", threshold_op, THRESHOLD_OPS)
    ratio = vote_ratio(count, total)  # checks count [M, K] and total [K]
    alpha = jnp.asarray(alpha, jnp.float32)
    chex.assert_rank(alpha, 0)
    passed = ratio > alpha if threshold_op == "gt" else ratio >= alpha
    return passed & (count > 0) & (total > 0)[None, :]


def consensus_votes(
    preds: jax.Array,
    owns: jax.Array,
    alpha: float | jax.Array,
    weights: jax.Array | None = None,
    *,
    threshold_op: str = "gt",
    axis_name: str | None = None,
) -> jax.Array:
    """Algorithm 1: the pseudo-label sets as accept [M, K] bool (accept[m, k]: m in P_k).

    A sample may join several P_k (line 14's "continue" only moves to the next class).
    axis_name: the client axis is split over shards (shard_map, or vmap with that axis name);
    count and total are summed over it before the threshold, so every shard gets the
    unsharded result.
    """
    count, total = vote_counts(preds, owns, weights)
    if axis_name is not None:
        count, total = jax.lax.psum((count, total), axis_name)
    return threshold_votes(count, total, alpha, threshold_op=threshold_op)


# ----------------------------------------------------------------------------- R_i (Eq. 19)


def distribute(
    accept: jax.Array,
    owns: jax.Array,
    *,
    conflict: str = "drop_in_client",
    count: jax.Array | None = None,
    total: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Eq. 19's R_i with contradictory indices removed (Sec. 4.3, last paragraph).

    accept [M, K] bool, owns [C, K] bool. conflict:
      "drop_in_client": m is in R_i iff exactly one class of Y_i claims it; claims by classes
        outside Y_i are ignored;
      "drop_global": also drop every m that is in two or more P_k at all;
      "max_ratio": among the classes of Y_i that claim m keep the one with the largest
        count / total (Eq. 18's ratio, needs count [M, K] and total [K]); drop on a tie.
    Returns (keep [C, M] bool, label [C, M] int32: the global class of m in R_i, -1 elsewhere).
    """
    check_choice("algorithm.conflict", conflict, CONFLICTS)
    accept, owns = jnp.asarray(accept, bool), jnp.asarray(owns, bool)
    chex.assert_rank([accept, owns], 2)
    chex.assert_equal_shape([accept, owns], dims=1)
    if conflict == "max_ratio":
        if count is None or total is None:
            raise ValueError("conflict='max_ratio' needs count and total (from vote_counts)")
        ratio = jnp.where(accept, vote_ratio(count, total), -1.0)  # accepted ratios are > 0

        def one_client(own):  # [K] -> ([M], [M]); lax.map keeps memory at [M, K]
            r = jnp.where(own[None, :], ratio, -1.0)
            best = jnp.max(r, axis=-1)
            unique = jnp.sum(r == best[:, None], axis=-1) == 1
            return (best >= 0) & unique, jnp.argmax(r, axis=-1).astype(jnp.int32)

        keep, label = jax.lax.map(one_client, owns)
    else:
        a, o = accept.astype(jnp.int32), owns.astype(jnp.int32)
        keep = o @ a.T == 1  # [C, M]: number of classes of Y_i that claim m
        # Sum of the claiming class ids: the unique one wherever keep holds.
        label = o @ (a * jnp.arange(a.shape[1], dtype=jnp.int32)[None, :]).T
        if conflict == "drop_global":
            keep = keep & (jnp.sum(a, axis=-1) == 1)[None, :]
    return keep, jnp.where(keep, label, -1).astype(jnp.int32)


def pseudo_label_counts(accept: jax.Array, keep: jax.Array) -> dict[str, jax.Array]:
    """The three pseudo-label counts (Fig. 7 does not say which it plots), int32 scalars.

    sum_pk = sum_k |P_k|, union_pk = |union_k P_k|, sum_ri = sum_i |R_i|. Only sum_pk is
    monotone (non-increasing) in alpha.
    """
    accept, keep = jnp.asarray(accept, bool), jnp.asarray(keep, bool)
    chex.assert_rank([accept, keep], 2)
    chex.assert_axis_dimension(keep, 1, accept.shape[0])
    return {
        "sum_pk": jnp.sum(accept, dtype=jnp.int32),
        "union_pk": jnp.sum(jnp.any(accept, axis=-1), dtype=jnp.int32),
        "sum_ri": jnp.sum(keep, dtype=jnp.int32),
    }


# ----------------------------------------------------------------------------- class maps


def class_maps(owns: jax.Array, kmax: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Local <-> global class ids; local ids follow increasing global order within Y_i.

    owns [C, K] bool; kmax: width of l2g (static; None: K; must be >= every |Y_i|).
    Returns (l2g int32 [C, kmax]: global id of local j, -1 pad;
             g2l int32 [C, K]: local id of global k, -1 where k is not in Y_i).
    """
    owns = jnp.asarray(owns, bool)
    chex.assert_rank(owns, 2)
    k = owns.shape[-1]
    kmax = k if kmax is None else kmax
    concrete_owns = concrete(owns)  # traced owns: the width is the caller's responsibility
    widest = 0 if concrete_owns is None else int(concrete_owns.sum(-1).max(initial=0))
    if kmax < widest:
        raise ValueError(f"kmax={kmax!r} is not allowed: need >= max |Y_i| = {widest}")
    ids = jnp.arange(k, dtype=jnp.int32)
    order = jnp.argsort(jnp.where(owns, 0, k) + ids, axis=-1)  # owned classes first, ascending
    l2g = jnp.where(jnp.take_along_axis(owns, order, axis=-1), order, -1).astype(jnp.int32)
    l2g = jnp.pad(l2g, ((0, 0), (0, max(kmax - k, 0))), constant_values=-1)[:, :kmax]
    g2l = jnp.where(owns, jnp.cumsum(owns, axis=-1) - 1, -1).astype(jnp.int32)
    return l2g, g2l


def masked_argmax(logits: jax.Array, owns: jax.Array) -> jax.Array:
    """argmax over the owned classes only: logits [..., K], owns bool broadcastable to it.

    The same as a |Y_i|-way head's argmax mapped to global ids; ties go to the lowest owned
    class (even at -inf), and a row with no owned class gets -1 (no vote). -> int32 [...].
    """
    chex.assert_shape(logits, (..., None))  # [..., K]
    chex.assert_is_broadcastable(jnp.shape(owns), jnp.shape(logits))
    owns = jnp.broadcast_to(jnp.asarray(owns, bool), jnp.shape(logits))
    best = jnp.max(jnp.where(owns, logits, -jnp.inf), axis=-1, keepdims=True)
    idx = jnp.argmax(owns & (logits == best), axis=-1).astype(jnp.int32)
    return jnp.where(jnp.any(owns, axis=-1), idx, -1)
