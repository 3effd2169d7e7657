"""DoFed-SPP's array kernels (Ching et al., IEEE TSC 2023, Secs. 4.1-4.4): similarity ratios
(Theorem 1, Eq. 19), the greedy uploader selection (Algorithm 1) with the (K, B) choice from the
time budget (Ineq. 26), the upload bookkeeping, and the SR-weighted ensemble pseudo-labels
(Eq. 20). The FedFomo baseline reuses the similarity kernel with its own constants; its kernels
are in `kernels.fedfomo_weights`. Our answers to what the paper leaves open are in
docs/choices.md: DoFed-SPP.

Everything here is pure jnp over fixed shapes. `N` is the client axis, `P` the flattened
parameter count, `D` a per-client padded sample count and `Q` the number of classes. Row n of an
`[N, N]` matrix belongs to consumer n (the owner of the target data); column i to provider i.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.kernels.checks import as_float, check_choice, check_number, concrete

# Defaults for the image CNN; the paper gives no values (G1 literal would swamp the loss term).
GAMMA = 0.01  # the reciprocal models' learning rate
G1 = 0.0
G2 = 3.0
EPS = 1e-8
DEGENERATE_RULES = ("keep_previous", "uniform", "zeros")


# ----------------------------------------------------------------------------- distances


def flatten_clients(params: PyTree) -> jax.Array:
    """Stacked per-client pytree (leaves lead with [N]) -> f32 [N, P], leaves in tree order."""
    chex.assert_equal_shape_prefix(jax.tree.leaves(params), 1)
    flat = jax.vmap(lambda t: ravel_pytree(t)[0])(params)
    return flat.astype(jnp.float32)


def pairwise_distances(
    providers: jax.Array, refs: jax.Array, *, batch_size: int | None = None
) -> jax.Array:
    """d[n, i] = ||providers[i] - refs[n]||_2: providers [M, P], refs [N, P] -> [N, M].

    Direct differences in f32, one reference row per `lax.map` step (memory M * P per step;
    `batch_size` vmaps that many rows at once). No Gram trick: ||a||^2 + ||b||^2 - 2ab cancels
    catastrophically for the small distances of one local update (Eq. 19's self-distance).
    """
    if providers.ndim != 2 or refs.ndim != 2 or providers.shape[1] != refs.shape[1]:
        raise ValueError(
            f"providers.shape={providers.shape} and refs.shape={refs.shape} are not allowed: "
            "both must be [rows, P] with the same P"
        )
    providers = providers.astype(jnp.float32)

    def row(ref):
        return jnp.linalg.norm(providers - ref.astype(jnp.float32), axis=-1)

    return jax.lax.map(row, refs, batch_size=batch_size)


def cross_evaluate(
    fn: Any, providers: PyTree, data: PyTree, *, batch_size: int | None = None
) -> jax.Array:
    """out[n, i] = fn(providers[i], data[n]) -> [N, M], e.g. Eq. 19's losses l_n(M_i).

    providers: pytree with leaves [M, ...] (e.g. the cached models); data: pytree with leaves
    [N, ...] (e.g. each client's padded labeled target set and mask); fn returns a scalar.
    `lax.map` over providers (`batch_size` of them vmapped at once), vmap over consumers, so
    memory holds one provider's evaluation of all consumers at a time.
    """
    chex.assert_equal_shape_prefix(jax.tree.leaves(providers), 1)
    chex.assert_equal_shape_prefix(jax.tree.leaves(data), 1)
    per_provider = jax.lax.map(
        lambda p: jax.vmap(lambda d: fn(p, d))(data), providers, batch_size=batch_size
    )
    return jnp.swapaxes(per_provider, 0, 1)


def set_diagonal(matrix: jax.Array, diag: jax.Array) -> jax.Array:
    """matrix [..., N, N] with its diagonal replaced by diag [..., N] (a mask, so vmap-friendly)."""
    n = matrix.shape[-1]
    chex.assert_shape(matrix, (..., n, n))
    chex.assert_shape(diag, matrix.shape[:-1])
    eye = jnp.eye(matrix.shape[-1], dtype=bool)
    return jnp.where(eye, diag[..., :, None], matrix)


def sr_distances(
    cache: jax.Array, rec: jax.Array, rec_prev: jax.Array, *, batch_size: int | None = None
) -> jax.Array:
    """Eq. 19 distances d[n, i] = ||M_i - R_n^prev||: flat [N, P] each -> [N, N].

    M_i is the cached broadcast model cache[i] off the diagonal and the client's own current
    reciprocal model rec[n] on it, so d[n, n] is one round of local progress and positive
    (Eq. 19's round indices disagree with Alg. 2 l.32; docs/choices.md: DoFed-SPP, which models
    Eq. 19 compares).
    """
    chex.assert_rank(cache, 2)
    chex.assert_equal_shape([cache, rec, rec_prev])
    dist = pairwise_distances(cache, rec_prev, batch_size=batch_size)
    own = jnp.linalg.norm(rec.astype(jnp.float32) - rec_prev.astype(jnp.float32), axis=-1)
    return set_diagonal(dist, own)


def max_pairwise_distance(flat: jax.Array, *, batch_size: int | None = None) -> jax.Array:
    """max_{n, i} ||flat[n] - flat[i]||: G1 as Assumption 1 defines it, `algorithm.sr_g1=auto`
    (Assumption 1 read literally)."""
    return jnp.max(pairwise_distances(flat, flat, batch_size=batch_size))


# ----------------------------------------------------------------------------- ratios (Eq. 19)


def similarity_ratios(
    loss_cross: jax.Array,
    loss_own: jax.Array,
    dist: jax.Array,
    sr_prev: jax.Array | None = None,
    *,
    gamma: float | jax.Array = GAMMA,
    g1: float | jax.Array = G1,
    g2: float | jax.Array = G2,
    eps: float = EPS,
    exclude_self: bool = False,
    valid: jax.Array | None = None,
    degenerate: str = "keep_previous",
) -> tuple[jax.Array, jax.Array]:
    """Similarity ratios S (Theorem 1, Eq. 19) and the degenerate-row flags.

    loss_cross [N, M]: loss_cross[n, i] = l_n(M_i), provider i's model on n's labeled target data
      (for DoFed-SPP the diagonal holds the own current reciprocal model, so d[n, n] > 0).
    loss_own [N]: l_n(T_n), the target model's loss on the same data.
    dist [N, M]: ||M_i - R_n^prev|| (see `sr_distances`).
    sr_prev [N, M]: the previous SR matrix, used by `degenerate="keep_previous"`; None means
      this is the first computation, and degenerate rows become uniform.

        a[n, i] = max((gamma * (l_n(T_n) - l_n(M_i) + g2) + g1) / max(d[n, i], eps), 0)
        S[n, i] = a[n, i] / sum_j a[n, j]           (normalized over all providers, self too)

    gamma * (delta + g2) + g1 is the paper's gamma * delta + g1 + gamma * g2 written so that with
    g1 = 0 the sign of the numerator, and S, are exactly independent of gamma (G1 and G2
    are Assumptions 1-2's bounds, with no values given). exclude_self zeroes a[n, n] (one local
    update away, so it can dominate); valid [N, M] zeroes providers n cannot use (FedFomo's
    downloads). A row whose a are all 0 is degenerate (0 / 0 in Eq. 19's normalization):
    "keep_previous" keeps sr_prev's row (uniform if sr_prev is None), "uniform" spreads 1 over
    the allowed providers, "zeros" leaves the row 0 (FedFomo: keep the own model). Inputs must
    be finite.
    Returns (S [N, M] >= 0 with rows summing to 1 unless "zeros" applied, degenerate [N] bool).
    """
    check_choice("degenerate", degenerate, DEGENERATE_RULES)
    check_number("gamma", gamma, lambda v: v > 0, "a number > 0")
    check_number("g1", g1, lambda v: v >= 0, "a number >= 0")
    check_number("g2", g2, lambda v: v >= 0, "a number >= 0")
    check_number("eps", eps, lambda v: v > 0, "a number > 0")
    loss_cross, loss_own, dist = as_float(loss_cross), as_float(loss_own), as_float(dist)
    n, m = loss_cross.shape[-2:]
    if dist.shape != loss_cross.shape or loss_own.shape != loss_cross.shape[:-1]:
        raise ValueError(
            f"loss_cross.shape={loss_cross.shape}, loss_own.shape={loss_own.shape}, "
            f"dist.shape={dist.shape} are not allowed: need [..., N, M], [..., N], [..., N, M]"
        )
    if exclude_self and n != m:
        raise ValueError(f"exclude_self=True with loss_cross.shape={loss_cross.shape}: need N == M")
    if sr_prev is not None and jnp.shape(sr_prev) != loss_cross.shape:
        raise ValueError(
            f"sr_prev.shape={jnp.shape(sr_prev)} is not allowed: must equal {loss_cross.shape}"
        )
    if valid is not None:
        valid = jnp.asarray(valid, bool)
        chex.assert_shape(valid, loss_cross.shape)

    allowed = jnp.ones(loss_cross.shape, bool)
    if valid is not None:
        allowed = allowed & valid
    if exclude_self:
        allowed = allowed & ~jnp.eye(n, dtype=bool)

    gain = loss_own[..., :, None] - loss_cross
    a = jnp.maximum((gamma * (gain + g2) + g1) / jnp.maximum(dist, eps), 0.0)
    a = jnp.where(allowed, a, 0.0)
    total = jnp.sum(a, axis=-1, keepdims=True)
    is_degenerate = total[..., 0] <= 0.0
    sr = a / jnp.where(total > 0.0, total, 1.0)

    n_allowed = jnp.sum(allowed, axis=-1, keepdims=True)
    uniform = allowed / jnp.maximum(n_allowed, 1).astype(a.dtype)
    if degenerate == "zeros":
        fallback = jnp.zeros_like(a)
    elif degenerate == "keep_previous" and sr_prev is not None:
        fallback = as_float(sr_prev).astype(a.dtype)
    else:  # "uniform", or "keep_previous" on the first computation
        fallback = uniform
    sr = jnp.where(is_degenerate[..., None], fallback, sr)
    return sr, is_degenerate


# ----------------------------------------------------------------------------- selection (Alg. 1)


def _check_k_b(k: Any, b: Any, n: int) -> None:
    kc, bc = concrete(k), concrete(b)
    if kc is not None and not 1 <= int(kc) <= n:
        raise ValueError(f"k={k!r} is not allowed: an int in [1, N] = [1, {n}]")
    if bc is not None and not 1 <= int(bc) <= (int(kc) if kc is not None else n):
        raise ValueError(f"b={b!r} is not allowed: an int with 1 <= b <= k (k={k!r})")


def topb_mask(sr: jax.Array, chosen: jax.Array, b: int | jax.Array) -> jax.Array:
    """x[n, i]: i is among the top-b SRs of row n within the chosen set (ties to the lower i).

    sr [N, N], chosen [N] bool -> bool [N, N] with min(b, |chosen|) ones per row.
    """
    n = sr.shape[-1]
    chex.assert_shape([sr, chosen], [(n, n), (n,)])
    masked = jnp.where(chosen[None, :], sr, -jnp.inf)
    rank = jnp.argsort(jnp.argsort(-masked, axis=-1, stable=True), axis=-1, stable=True)
    return (rank < b) & chosen[None, :]


def selection_value(sr: jax.Array, chosen: jax.Array, b: int | jax.Array) -> jax.Array:
    """F(U) = sum_n topB_sum({S[n, i] : i in U}) (Definition 4 / Eqs. 27-31): scalar."""
    return jnp.sum(jnp.where(topb_mask(sr, chosen, b), sr, 0.0))


def colsum_select(sr: jax.Array, k: int | jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The K = B fast path: top-k providers by column sum (ties to the lower index).

    While |U| < B every greedy gain is a column sum, so greedy with K = B is exactly this, and
    it is optimal. sr [N, N] -> (chosen [N] bool, x [N, N] bool = chosen in every row, value).
    """
    n = sr.shape[-1]
    chex.assert_shape(sr, (n, n))
    _check_k_b(k, k, n)
    colsum = jnp.sum(sr, axis=0)
    rank = jnp.argsort(jnp.argsort(-colsum, stable=True), stable=True)
    chosen = rank < k
    x = jnp.broadcast_to(chosen[None, :], sr.shape)
    return chosen, x, jnp.sum(jnp.where(x, sr, 0.0))


def greedy_select(
    sr: jax.Array, k: int | jax.Array, b: int | jax.Array, *, fast_path: bool = True
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Algorithm 1 (the greedy (1 - 1/e) approximation of Definition 4) in closed vectorized form.

    sr [N, N] >= 0 (row = consumer); k uploaders, b labeling models per client (1 <= b <= k <=
    N; traced values are clipped into that range). K steps of: add the unchosen provider with
    the largest gain(i) = sum_n max(0, S[n, i] - tau_n), tau_n the b-th largest S[n, .] in U
    (0 while |U| < b); ties go to the lowest index. A static fori_loop over N steps with a step
    mask, so k and b may be traced and the kernel vmaps over candidate (k, b) pairs.
    fast_path: when k and b are the same Python int, use `colsum_select` (identical result).
    Returns (chosen [N] bool with k ones, x [N, N] bool = top-b of each row within chosen,
    value = F(chosen)).
    """
    n = sr.shape[-1]
    if sr.shape != (n, n):
        raise ValueError(f"sr.shape={sr.shape} is not allowed: must be [N, N]")
    _check_k_b(k, b, n)
    if fast_path and isinstance(k, int) and isinstance(b, int) and k == b:
        return colsum_select(sr, k)
    sr = as_float(sr)
    k = jnp.clip(jnp.asarray(k, jnp.int32), 1, n)
    b = jnp.clip(jnp.asarray(b, jnp.int32), 1, k)
    rows = jnp.arange(n)
    # Row n's current top-b values within U; +inf pads slots beyond b so min() is the b-th value.
    buf0 = jnp.broadcast_to(jnp.where(rows[None, :] < b, 0.0, jnp.inf), (n, n)).astype(sr.dtype)

    def body(step, carry):
        chosen, buf = carry
        tau = jnp.min(buf, axis=1)
        gain = jnp.sum(jnp.maximum(sr - tau[:, None], 0.0), axis=0)
        gain = jnp.where(chosen, -1.0, gain)  # gains are >= 0, so a chosen one never wins
        i = jnp.argmax(gain)
        slot = jnp.argmin(buf, axis=1)
        new_buf = buf.at[rows, slot].set(jnp.maximum(buf[rows, slot], sr[:, i]))
        active = step < k
        return jnp.where(active, chosen.at[i].set(True), chosen), jnp.where(active, new_buf, buf)

    chosen, _ = jax.lax.fori_loop(0, n, body, (jnp.zeros(n, bool), buf0))
    x = topb_mask(sr, chosen, b)
    return chosen, x, jnp.sum(jnp.where(x, sr, 0.0))


class Selection(NamedTuple):
    """Phase 1's decision: who uploads, who labels with what, and the budget bookkeeping."""

    chosen: jax.Array  # [N] bool, K ones
    x: jax.Array  # [N, N] bool, x[n, i]: n labels with i's model
    value: jax.Array  # F(chosen), scalar
    k: jax.Array  # int32 scalar
    b: jax.Array  # int32 scalar
    budget_violated: jax.Array  # bool scalar: no (K, B) fits the budget, K = B = 1 used


def budget_candidates(
    c1: float | jax.Array, c2: float | jax.Array, c3: float | jax.Array, n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The (K, B) pairs of Ineq. 26 (Sec. 4.4), B * c2 + K * c3 <= c1, 1 <= B <= K <= n.

    Row K - 1 holds K and B(K) = the largest feasible B <= K; valid marks K in [min(K_lo, K_hi),
    K_hi], K_lo the largest K with B = K feasible (at least 1), K_hi the largest K with B >= 1.
    Feasibility is tested as written (no division), so c2 = 0 or c3 = 0 need no special case
    and every valid pair satisfies the inequality in floating point.
    Returns (k int32 [n], b int32 [n] (0 where no B fits), valid bool [n]).
    """
    check_number("c2", c2, lambda v: v >= 0, "a number >= 0 (seconds per labeling model)")
    check_number("c3", c3, lambda v: v >= 0, "a number >= 0 (seconds per uploaded model)")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is not allowed: an int >= 1 (the number of clients)")
    return _budget_candidates(as_float(c1), as_float(c2), as_float(c3), n)


@functools.partial(jax.jit, static_argnames="n")
def _budget_candidates(
    c1: jax.Array, c2: jax.Array, c3: jax.Array, n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    ks = jnp.arange(1, n + 1)
    bs = jnp.arange(1, n + 1)
    fits = (bs[None, :] * c2 + ks[:, None] * c3 <= c1) & (bs[None, :] <= ks[:, None])
    b_of_k = jnp.max(jnp.where(fits, bs[None, :], 0), axis=1)
    k_hi = jnp.sum(b_of_k >= 1)  # {K : B(K) >= 1} is a prefix of 1..n since c3 >= 0
    k_lo = jnp.maximum(jnp.sum(b_of_k == ks), 1)  # so is {K : B = K fits}
    valid = (b_of_k >= 1) & (ks >= jnp.minimum(k_lo, k_hi)) & (ks <= k_hi)
    return ks.astype(jnp.int32), b_of_k.astype(jnp.int32), valid


def select_with_budget(
    sr: jax.Array, c1: float | jax.Array, c2: float | jax.Array, c3: float | jax.Array
) -> Selection:
    """Budget mode (Algorithm 2 lines 13-15): run Algorithm 1 for every candidate (K, B) of
    `budget_candidates` (vmapped) and keep the largest F; ties go to the smaller K (fewer
    uploads). c1, c2, c3 as in Eq. 26 (wireless.budget_constants). With no feasible pair
    (c1 < c2 + c3) K = B = 1 and budget_violated is True.
    """
    n = sr.shape[-1]
    ks, bs, valid = budget_candidates(c1, c2, c3, n)
    chosen, x, vals = jax.vmap(lambda k, b: greedy_select(sr, k, b))(ks, jnp.maximum(bs, 1))
    feasible = jnp.any(valid)
    best = jnp.where(feasible, jnp.argmax(jnp.where(valid, vals, -jnp.inf)), 0)  # 0: K = B = 1
    return Selection(
        chosen=chosen[best],
        x=x[best],
        value=vals[best],
        k=ks[best],
        b=jnp.maximum(bs[best], 1),
        budget_violated=~feasible,
    )


def upload_to_cache(
    cache: PyTree,
    rec: PyTree,
    chosen: jax.Array,
    cache_round: jax.Array | None = None,
    round_index: int | jax.Array = 0,
) -> tuple[PyTree, jax.Array | None]:
    """Phase 1's upload (Sec. 5): cache[i] <- rec[i] for the chosen i, every other unchanged.

    Leaves of cache and rec lead with [N]; chosen [N] bool. cache_round [N] int (optional) is
    set to round_index where chosen. Returns (cache, cache_round).
    """
    chex.assert_rank(chosen, 1)
    chex.assert_tree_shape_prefix((cache, rec), chosen.shape)
    if cache_round is not None:
        chex.assert_equal_shape([chosen, cache_round])

    def put(c, r):
        mask = chosen.reshape(chosen.shape + (1,) * (c.ndim - 1))
        return jnp.where(mask, r, c)

    new_cache = jax.tree.map(put, cache, rec)
    if cache_round is not None:
        cache_round = jnp.where(chosen, jnp.asarray(round_index, cache_round.dtype), cache_round)
    return new_cache, cache_round


# ----------------------------------------------------------------------------- labeling (Eq. 20)


def labeling_weights(
    sr: jax.Array, x: jax.Array, *, renormalize: bool = False
) -> tuple[jax.Array, jax.Array]:
    """W[n, i] = S[n, i] * x[n, i], DoFed-SPP's personalized aggregation weights (Eq. 20).

    sr [N, M], x [N, M] bool. Not renormalized by default (the argmax does not care); with
    renormalize=True rows sum to 1 (soft labels for diagnostics). A row with sum W = 0 gets
    uniform weights over its selected models (0 / 0 otherwise).
    Returns (W [N, M], degenerate [N] bool).
    """
    x, sr = jnp.asarray(x, bool), as_float(sr)
    chex.assert_rank(x, 2)
    chex.assert_equal_shape([x, sr])
    w = jnp.where(x, sr, 0.0)
    total = jnp.sum(w, axis=-1, keepdims=True)
    is_degenerate = total[..., 0] <= 0.0
    uniform = x / jnp.maximum(jnp.sum(x, axis=-1, keepdims=True), 1).astype(w.dtype)
    if renormalize:
        w = w / jnp.where(total > 0.0, total, 1.0)
    return jnp.where(is_degenerate[..., None], uniform, w), is_degenerate


def selected_slots(
    x: jax.Array, weights: jax.Array, b: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Gather the <= b providers each client labels with into fixed slots (static b).

    x [N, M] bool, weights [N, M] -> (ids int32 [N, b] ascending, w [N, b], valid [N, b]).
    Unused slots (rows with fewer than b ones) point at provider 0 with weight 0, valid False.
    """
    chex.assert_rank(x, 2)
    chex.assert_equal_shape([x, weights])
    m = x.shape[-1]
    if not 1 <= b <= m:
        raise ValueError(f"b={b!r} is not allowed: an int in [1, M] = [1, {m}]")
    # Selected ids first, in ascending order: sort on (not selected, id).
    key = jnp.where(x, 0, m) + jnp.arange(m)
    order = jnp.argsort(key, axis=-1)[..., :b]
    valid = jnp.take_along_axis(jnp.asarray(x, bool), order, axis=-1)
    ids = jnp.where(valid, order, 0).astype(jnp.int32)
    w = jnp.where(valid, jnp.take_along_axis(as_float(weights), order, axis=-1), 0.0)
    return ids, w, valid


def soft_vote(probs: jax.Array, weights: jax.Array, *, from_logits: bool = False) -> jax.Array:
    """q_n(x) = sum_s W[n, s] * p_s(x) (Eq. 20): probs [N, S, D, Q], weights [N, S] -> [N, D, Q].

    probs[n, s] are the class probabilities of client n's s-th model on n's unlabeled data
    (S = B gathered slots, or S = N with zero weights for unused providers). from_logits applies
    a softmax first.
    """
    p, weights = as_float(probs), as_float(weights)
    chex.assert_rank(p, 4)
    chex.assert_shape(weights, p.shape[:2])
    if from_logits:
        p = jax.nn.softmax(p, axis=-1)
    return jnp.einsum("ns,nsdq->ndq", weights.astype(p.dtype), p)


def pseudo_labels(
    probs: jax.Array, weights: jax.Array, *, from_logits: bool = False
) -> tuple[jax.Array, jax.Array]:
    """Hard pseudo-labels y[n, d] = argmax_q q_n(x_d) (Eq. 20): -> (int32 [N, D], q [N, D, Q]).

    Hard, as Eq. 20's OneHot; ties go to the lowest class.
    Padded samples get a label too; mask them downstream.
    """
    q = soft_vote(probs, weights, from_logits=from_logits)
    return jnp.argmax(q, axis=-1).astype(jnp.int32), q


def student_targets(
    y_pl: jax.Array, mask_u: jax.Array, y_l: jax.Array, mask_l: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Labels and mask of D^p = pseudo-labeled D_unl + truly labeled D_lab (Algorithm 2 l. 24-28).

    y_pl, mask_u [N, Du]; y_l, mask_l [N, Dl] -> (labels int32 [N, Du + Dl], mask [N, Du + Dl]),
    in the order of concat(x_u, x_l). Rebuilt from scratch every round.
    """
    chex.assert_rank([y_pl, y_l], 2)
    chex.assert_equal_shape([y_pl, mask_u])
    chex.assert_equal_shape([y_l, mask_l])
    chex.assert_equal_shape([y_pl, y_l], dims=0)
    labels = jnp.concatenate([y_pl.astype(jnp.int32), y_l.astype(jnp.int32)], axis=-1)
    mask = jnp.concatenate([jnp.asarray(mask_u, bool), jnp.asarray(mask_l, bool)], axis=-1)
    return labels, mask


def labeling_accuracy(y_pl: jax.Array, y_true: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-client accuracy of the pseudo-labels on the valid D_unl entries: [N, D] -> [N].

    y_true is the hidden, evaluation-only label; a client with no valid entry scores 0.
    """
    mask = jnp.asarray(mask, bool)
    chex.assert_rank(mask, 2)
    chex.assert_equal_shape([y_pl, y_true, mask])
    hits = jnp.sum((y_pl == y_true) & mask, axis=-1)
    return hits / jnp.maximum(jnp.sum(mask, axis=-1), 1)
