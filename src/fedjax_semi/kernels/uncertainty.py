"""UM-pFSSL's array kernels (Shi, Chen, Zhang, "Uncertainty Minimization for Personalized
Federated Semi-Supervised Learning", Sec. 4): MC-dropout predictive distribution and entropy
(Eqs. 9, 10), the data-relation metric Corr(k|j) (Eqs. 12-14), helper-weighted personalized
aggregation (Algorithm 1 lines 14-15), and pseudo-labels from the least uncertain helper
(Eq. 11). Our answers to what the paper leaves open are in docs/choices.md: UM-pFSSL.

Everything here is pure jnp over fixed shapes; callers vmap over (client, helper) pairs.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.models.zoo import Model

EPS_H = 1e-6  # floor of H in Eq. 13's reciprocal term (unbounded as H -> 0)


# ------------------------------------------------------------------------- MC dropout (Eqs. 9, 10)


def mc_logits(
    model: Model,
    variables: PyTree,
    x: jax.Array,
    keys: jax.Array,
    bn_mode: str = "running",
    mask: jax.Array | None = None,
) -> jax.Array:
    """Logits of T dropout samples: x [N, ...], keys [T] -> [T, N, NC].

    bn_mode "running": BatchNorm runs on its running statistics; only dropout is random, so a
    prediction does not depend on the rest of its batch (the paper does not say). "batch":
    BatchNorm normalizes with the statistics of x's rows where mask [N] is true (all rows
    without a mask), as in training; the running statistics are not updated. Models without
    BatchNorm give the same logits either way. Models that expose a deterministic `prefix` and a
    stochastic `suffix` (ResNet-9) run the prefix once and vmap only the suffix over the keys,
    which is the same function (tested).
    """
    if bn_mode not in ("running", "batch"):
        raise ValueError(
            f"algorithm.mc_bn_mode={bn_mode!r} is not allowed: one of ['running', 'batch']"
        )
    chex.assert_shape(x, (None, ...))  # [N, ...]
    if mask is not None:
        chex.assert_shape(mask, x.shape[:1])
    module, batch = model.module, bn_mode == "batch"
    if batch and mask is None:
        mask = jnp.ones(x.shape[0], bool)
    if hasattr(module, "prefix") and hasattr(module, "suffix"):
        h = model.preprocess(x)
        if batch:
            (skip, a), _ = module.apply(
                variables, h, True, mask, method="prefix", mutable=["batch_stats"]
            )
        else:
            skip, a = module.apply(variables, h, False, method="prefix")

        def suffix(k):
            if batch:
                out, _ = module.apply(
                    variables, skip, a, True, False, mask, method="suffix",
                    rngs={"dropout": k}, mutable=["batch_stats"],
                )  # fmt: skip
            else:
                out = module.apply(
                    variables, skip, a, False, True, method="suffix", rngs={"dropout": k}
                )
            return out.astype(jnp.float32)

        return jax.vmap(suffix)(keys)
    if batch:
        return jax.vmap(lambda k: model.apply(variables, x, train=True, rng=k, mask=mask)[0])(keys)
    return jax.vmap(lambda k: model.apply(variables, x, mc=True, rng=k)[0])(keys)


def predictive_entropy(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Bayesian model average and its entropy (Eqs. 9, 10).

    logits [T, N, NC] -> (p_bar [N, NC], h [N]) with h = -sum_c p_bar log p_bar in [0, log NC].
    This is the total predictive entropy, not BALD's mutual information.
    """
    chex.assert_rank(logits, 3)
    t, nc = logits.shape[0], logits.shape[-1]
    log_p = jax.nn.logsumexp(jax.nn.log_softmax(logits.astype(jnp.float32), -1), axis=0)
    log_p = log_p - jnp.log(t)
    p_bar = jnp.exp(log_p)
    h = -jnp.sum(p_bar * log_p, axis=-1)
    return p_bar, jnp.clip(h, 0.0, jnp.log(nc))


def mc_predict(
    model: Model,
    variables: PyTree,
    x: jax.Array,
    key: jax.Array,
    num_samples: int,
    bn_mode: str = "running",
    mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """MC-dropout predictive distribution: x [N, ...] -> (p_bar [N, NC], entropy [N]).

    num_samples = 0 is the deterministic network (dropout off, BatchNorm on its running
    statistics whatever bn_mode), as one sample. bn_mode, mask: as in `mc_logits`.
    """
    chex.assert_shape(x, (None, ...))  # [N, ...]
    if mask is not None:
        chex.assert_shape(mask, x.shape[:1])
    if num_samples == 0:
        logits = model.apply(variables, x)[0].astype(jnp.float32)
        return predictive_entropy(logits[None])
    keys = jax.random.split(key, num_samples)
    return predictive_entropy(mc_logits(model, variables, x, keys, bn_mode, mask))


def mc_predict_rows(
    model: Model,
    variables: PyTree,
    data_x: jax.Array,
    idx: jax.Array,
    count: jax.Array,
    key: jax.Array,
    num_samples: int,
    block: int = 128,
    bn_mode: str = "running",
) -> tuple[jax.Array, jax.Array]:
    """mc_predict over one client's padded index row idx [N] (count valid), block by block.

    Blocks past the client's data are skipped when the client is mapped on its own (under
    vmap both branches of the cond run) and give p_bar 0 and entropy 0; the padded rows of the
    last, partly filled block are computed like any row (callers mask them by count). Block b
    uses key fold_in(key, b), so results depend on the block size but not on the padding.
    bn_mode "batch": BatchNorm's batch is the block's valid rows (of at most `block`).
    """
    chex.assert_rank([idx, count], [1, 0])
    n = idx.shape[0]
    block = min(block, n)
    nb = -(-n // block)
    padded = jnp.pad(idx, (0, nb * block - n)).reshape(nb, block)
    num_classes = jax.eval_shape(lambda: model.apply(variables, data_x[:1]))[0].shape[-1]

    def one(args):
        b, ids = args

        def compute(_):
            mask = None
            if bn_mode == "batch":
                mask = b * block + jnp.arange(block) < count
            return mc_predict(
                model, variables, data_x[ids], jax.random.fold_in(key, b), num_samples,
                bn_mode, mask,
            )  # fmt: skip

        def skip(_):
            return jnp.zeros((block, num_classes)), jnp.zeros((block,))

        return jax.lax.cond(b * block < count, compute, skip, None)

    p_bar, ent = jax.lax.map(one, (jnp.arange(nb), padded))
    return p_bar.reshape(-1, num_classes)[:n], ent.reshape(-1)[:n]


# ------------------------------------------------------------------------------- Corr (Eqs. 12-14)


def relation_metric(
    ent_u: jax.Array,
    mask_u: jax.Array,
    p_bar_s: jax.Array,
    y_s: jax.Array,
    mask_s: jax.Array,
    mu: jax.Array,
    num_classes: int,
    form: str = "inverse",
    reduction: str = "mean",
    eps: float = EPS_H,
) -> dict:
    """Corr(k|j) of helper j for client k (Eqs. 12-14), from j's MC statistics on k's data.

    ent_u [Nu], mask_u [Nu]: j's entropy on k's unlabeled data.
    p_bar_s [Ns, NC], y_s [Ns], mask_s [Ns]: j's MC mean on k's labeled data.
    mu: k's labeled ratio. form: "inverse" ((1 - mu) / H + mu Acc, the paper's Eq. 13
    literally) or "complement" ((1 - mu)(1 - H) + mu Acc, bounded like the Acc term, for ablation).
    reduction: "mean" (H in [0, 1], as the paper reasons about H) or "sum" (Eq. 12 literally,
    H in [0, Nu]). eps: floor of H in the reciprocal. A term over an empty set is 0 (the paper
    does not say).
    Returns corr, h_bar and acc.
    """
    chex.assert_rank([ent_u, p_bar_s, y_s, mu], [1, 2, 1, 0])
    chex.assert_equal_shape([ent_u, mask_u])
    chex.assert_equal_shape([p_bar_s, y_s, mask_s], dims=0)
    n_u, n_s = jnp.sum(mask_u), jnp.sum(mask_s)
    h_bar = jnp.sum(jnp.where(mask_u, ent_u, 0.0)) / jnp.log(num_classes)
    if reduction == "mean":
        h_bar = h_bar / jnp.maximum(n_u, 1)
    elif reduction != "sum":
        raise ValueError(
            f"algorithm.entropy_reduction={reduction!r} is not allowed: one of ['mean', 'sum']"
        )
    correct = (jnp.argmax(p_bar_s, -1) == y_s) & mask_s
    acc = jnp.sum(correct) / jnp.maximum(n_s, 1)
    if form == "inverse":
        unl_term = (1.0 - mu) / jnp.maximum(h_bar, eps)
    elif form == "complement":
        unl_term = (1.0 - mu) * (1.0 - h_bar)
    else:
        raise ValueError(
            f"algorithm.corr_form={form!r} is not allowed: one of ['inverse', 'complement']"
        )
    corr = jnp.where(n_u > 0, unl_term, 0.0) + jnp.where(n_s > 0, mu * acc, 0.0)
    return {"corr": corr, "h_bar": h_bar, "acc": acc}


def pair_stats(
    model: Model,
    variables: PyTree,
    data_x: jax.Array,
    labels: jax.Array,
    unl_idx: jax.Array,
    unl_count: jax.Array,
    lab_idx: jax.Array,
    lab_count: jax.Array,
    mu: jax.Array,
    key: jax.Array,
    num_samples: int,
    form: str = "inverse",
    reduction: str = "mean",
    eps: float = EPS_H,
    acc_mode: str = "mc_mean",
    bn_mode: str = "running",
) -> dict:
    """Helper model `variables` on one client's data: the Eq. 12-14 statistics of one pair.

    unl_idx [Nu], lab_idx [Ns]: the client's index rows; counts are the valid lengths.
    acc_mode: Acc(k|j) from the argmax of the MC mean ("mc_mean") or of the network with
    dropout off ("deterministic"); the first reuses Eq. 9's passes. bn_mode: BatchNorm in the
    MC passes, "running" or "batch" statistics (see `mc_logits`).
    Returns corr, h_bar, acc, p_bar_u [Nu, NC] (zero on padding) and ent_u [Nu] (+inf on
    padding, so a padded row never wins an argmin).
    """
    chex.assert_rank([unl_idx, unl_count, lab_idx, lab_count, mu], [1, 0, 1, 0, 0])
    mask_u = jnp.arange(unl_idx.shape[0]) < unl_count
    mask_s = jnp.arange(lab_idx.shape[0]) < lab_count
    ku, ks = jax.random.split(key)
    p_u, ent_u = mc_predict_rows(
        model, variables, data_x, unl_idx, unl_count, ku, num_samples, bn_mode=bn_mode
    )
    if acc_mode not in ("mc_mean", "deterministic"):
        raise ValueError(
            f"algorithm.acc_mode={acc_mode!r} is not allowed: one of ['mc_mean', 'deterministic']"
        )
    t_s = num_samples if acc_mode == "mc_mean" else 0
    p_s, _ = mc_predict_rows(model, variables, data_x, lab_idx, lab_count, ks, t_s, bn_mode=bn_mode)
    stats = relation_metric(
        ent_u, mask_u, p_s, labels[lab_idx], mask_s, mu, p_u.shape[-1], form, reduction, eps
    )
    stats["p_bar_u"] = jnp.where(mask_u[:, None], p_u, 0.0)
    stats["ent_u"] = jnp.where(mask_u, ent_u, jnp.inf)
    return stats


# ------------------------------------------------------------------- aggregation (Alg. 1 l. 14-15)


def aggregation_weights(corr: jax.Array, valid: jax.Array) -> jax.Array:
    """Helper weights omega [S, M] from Corr [S, M] and validity [S, M] (Algorithm 1 line 15).

    Proportional to Corr over valid slots; uniform over valid slots when they all have ~0 Corr
    (0 / 0 otherwise; the paper does not say).
    """
    chex.assert_rank(corr, 2)
    chex.assert_equal_shape([corr, valid])
    w = jnp.where(valid, corr, 0.0)
    total = jnp.sum(w, axis=-1, keepdims=True)
    uniform = valid / jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
    return jnp.where(total > 1e-12, w / jnp.maximum(total, 1e-12), uniform)


def personalized_average(weights: jax.Array, helpers: PyTree) -> PyTree:
    """sum_m omega[s, m] * helpers[s, m] for every leaf: [S, M], [S, M, ...] -> [S, ...].

    Applies to every variable, BatchNorm running statistics included (Alg. 1
    l.15 averages "the models"; with aggregate_bn_stats=false the caller keeps its own).
    """
    chex.assert_rank(weights, 2)
    chex.assert_tree_shape_prefix(helpers, weights.shape)
    return jax.tree.map(lambda a: jnp.einsum("sm,sm...->s...", weights.astype(a.dtype), a), helpers)


# -------------------------------------------------------------------------- pseudo-labels (Eq. 11)


def helper_pseudo_labels(
    p_bar: jax.Array, ent: jax.Array, valid: jax.Array, hard: bool = False
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pseudo-labels from the least uncertain valid helper per sample (Eq. 11).

    p_bar [S, M, Nu, NC], ent [S, M, Nu], valid [S, M] -> (y_hat [S, Nu, NC], chosen slot
    [S, Nu], confidence [S, Nu]). Ties go to the lowest slot (self is slot 0). Soft labels by
    default (Eq. 11's "min" read as a choice of helper, not an elementwise minimum); `hard`
    gives one-hot labels. confidence is the chosen helper's top MC-mean probability either way.
    """
    chex.assert_rank([p_bar, ent, valid], [4, 3, 2])
    chex.assert_shape([ent, valid], [p_bar.shape[:3], p_bar.shape[:2]])
    masked = jnp.where(valid[:, :, None], ent, jnp.inf)
    chosen = jnp.argmin(masked, axis=1)  # [S, Nu]; argmin returns the first minimum
    y_hat = jnp.take_along_axis(p_bar, chosen[:, None, :, None], axis=1)[:, 0]
    confidence = jnp.max(y_hat, -1)
    if hard:
        y_hat = jax.nn.one_hot(jnp.argmax(y_hat, -1), p_bar.shape[-1], dtype=y_hat.dtype)
    return y_hat, chosen, confidence
