"""CFSL's server-side array steps (Hamood et al.), beside `cfsl.py`: models as flat rows, the
training pools D_i,new (Eq. 20), the split thresholds (Eqs. 5, 6, 25), Alg. 1's gamma check,
the cloud's two averages (the HFL trunk of the never-split clusters, the cross-edge merge) and
the labeling by the cluster models (Alg. 3, Eqs. 17-18). Pure functions of arrays [C, ...]
(workers) and [K, ...] (cluster slots)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_semi.data.federated import RoleTable, TrainView
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.kernels import clustering as cl
from fedjax_semi.kernels import labeling
from fedjax_semi.models.zoo import Model


def flatten_clients(tree: PyTree) -> jax.Array:
    """[C, ...] leaves -> f32 [C, P], the clients' flattened models or updates."""
    leaves = jax.tree.leaves(tree)
    c = leaves[0].shape[0]
    return jnp.concatenate([a.reshape(c, -1).astype(jnp.float32) for a in leaves], axis=1)


def unflatten_like(flat: jax.Array, like: PyTree) -> PyTree:
    """f32 [M, P] -> a tree of `like`'s structure and trailing shapes with leaves [M, ...] (the
    inverse of flatten_clients)."""
    leaves, treedef = jax.tree.flatten(like)
    out, start = [], 0
    for a in leaves:
        n = a[0].size
        out.append(flat[:, start : start + n].reshape(flat.shape[0], *a.shape[1:]).astype(a.dtype))
        start += n
    return jax.tree.unflatten(treedef, out)


def pool_table(
    lab: RoleTable, unl: RoleTable, y: jax.Array, pseudo_y: jax.Array, accepted: jax.Array
) -> tuple[RoleTable, jax.Array]:
    """Each worker's training pool D_i,new = D_i^l + D_psdo,i (Eq. 20): rows of labeled then
    accepted unlabeled examples, valid entries first -> (table [C, L + U], labels [C, L + U]:
    the visible label of a labeled row, the pseudo-label of an accepted one)."""
    idx = jnp.concatenate([lab.idx, unl.idx], axis=1)
    labels = jnp.concatenate([y[lab.idx], pseudo_y], axis=1)
    keep = jnp.concatenate([lab.mask, accepted], axis=1)
    order = jnp.argsort(~keep, axis=1, stable=True)
    take = lambda a: jnp.take_along_axis(a, order, axis=1)
    return RoleTable(take(idx), jnp.sum(keep, axis=1).astype(jnp.int32)), take(labels)


def thresholds(
    cfg: Any, hist: jax.Array, r: jax.Array, norm: jax.Array, sel: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(hist, eps1, eps2) of Eqs. 5, 6 and 25: cfg's eps (eps_mode=absolute), or kappa times the
    median of the first rounds' median update norms (relative), round r's recorded into hist
    f32 [calibration_rounds]. norm f32 [C] ||d_i||, sel bool [C] the workers that trained."""
    if cfg.eps_mode == "absolute":
        return hist, jnp.float32(cfg.eps1), jnp.float32(cfg.eps2)
    med = jnp.nanmedian(jnp.where(sel, norm, jnp.nan))
    slot = r - 1
    hist = jnp.where(jnp.arange(hist.shape[0]) == slot, jnp.nan_to_num(med), hist)
    m = jnp.median(hist)  # read only from round split_warmup > calibration_rounds on
    return hist, cfg.kappa1 * m, cfg.kappa2 * m


def gamma_ok(
    flat: jax.Array,
    cid: jax.Array,
    side: jax.Array,
    sel: jax.Array,
    w: jax.Array,
    alpha: jax.Array,
    k: int,
) -> jax.Array:
    """Alg. 1 lines 7-8 per slot on gamma-hat -> bool [K], with each worker's would-be child
    cluster. flat f32 [C, P] updates, side bool [K, C] the bipartitions, alpha f32 [K]."""
    child = cid + k * side[cid, jnp.arange(cid.shape[0])]  # [C] in [0, 2K)
    mean, _ = cl.cluster_mean(flat, child, 2 * k, w)
    gamma = cl.gamma_hat(flat, mean, child, sel)
    return cl.gamma_check(gamma, sel, cid, alpha, k)


def trunk(flat_vars: jax.Array, total: jax.Array, roots: jax.Array) -> jax.Array:
    """The HFL trunk: the clusters never split (each edge's root) take their weighted average,
    the cloud's average of the edge models (two-level FedAvg, Sec. III-B). flat_vars f32 [K, P],
    total f32 [K] each cluster's aggregation weight, roots bool [K]."""
    tw = jnp.where(roots, total, 0.0)
    avg = jnp.sum(flat_vars * tw[:, None], 0) / jnp.maximum(jnp.sum(tw), 1e-12)
    return jnp.where((roots & (jnp.sum(tw) > 0))[:, None], avg[None], flat_vars)


def cloud_merge(
    flat_vars: jax.Array,
    mean: jax.Array,
    total: jax.Array,
    eligible: jax.Array,
    edge: jax.Array,
    tau: float,
) -> jax.Array:
    """The cloud's cross-edge step (Sec. III-C, end): specialized models on different edges
    whose round mean updates (mean f32 [K, P]) have cosine >= tau are averaged (connected
    components). eligible bool [K], edge int32 [K] each slot's edge server."""
    k = flat_vars.shape[0]
    ok = eligible & (total > 0)
    s = cl.cosine_matrix(mean, ok)
    adj = (s >= tau) & ok[:, None] & ok[None, :]
    adj = adj & (edge[:, None] != edge[None, :])
    comp = jax.lax.fori_loop(
        0, k, lambda _, cp: jnp.minimum(cp, jnp.min(jnp.where(adj, cp[None], k), 1)),
        jnp.arange(k),
    )  # fmt: skip
    tw = jnp.where(ok, total, 0.0)
    summed = jax.ops.segment_sum(flat_vars * tw[:, None], comp, k)
    wsum = jax.ops.segment_sum(tw, comp, k)
    avg = summed[comp] / jnp.maximum(wsum[comp], 1e-12)[:, None]
    return jnp.where(ok[:, None], avg, flat_vars)


# ----------------------------------------------------------------------------- labeling


def model_outputs(model: Model, variables: PyTree, x: jax.Array, table: RoleTable) -> jax.Array:
    """Softmax of one model on every worker's table rows -> f32 [C, n_max, Y]."""

    def one(idx):
        logits, _ = model.apply(variables, x[idx])
        return jax.nn.softmax(logits.astype(jnp.float32), -1)

    return jax.lax.map(one, table.idx, batch_size=min(table.idx.shape[0], 25))


def relabel(
    model: Model,
    cfg: Any,
    prediction_model: str,
    theta: PyTree,
    active: jax.Array,
    last: tuple[jax.Array, jax.Array],
    data: TrainView,
    label_set: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Pseudo-labels of the label set's (bool [C]) unlabeled data (Eqs. 17-18) from the best
    specialized model (BM, P2) or the weighted ensemble (EM, P3) of the active (bool [K]) cluster
    models theta (leaves [K, ...]); utility = each model's accuracy on the worker's labeled data
    (BM: ties to its mean confidence on D^u). Each active model reads D^u once (a scan over the
    slots holding [C, U, Y]). last: the previous (y, accepted) [C, U], which
    pseudo_mode=accumulate keeps. -> (y int32 [C, U], accepted bool [C, U])."""
    c, k = cfg, active.shape[0]
    lab, unl = data.roles["labeled"], data.roles["unlabeled"]
    slot = lambda m: jax.tree.map(lambda a: a[m], theta)
    n = lab.idx.shape[0]

    def correct(m):  # D^l is small: this pass is cheap
        run = lambda: labeling.correct_count(
            model_outputs(model, slot(m), data.x, lab), data.y[lab.idx], lab.mask
        ).astype(jnp.float32)
        return jax.lax.cond(active[m], run, lambda: jnp.zeros((n,), jnp.float32))

    util = labeling.accuracy_utility(jax.lax.map(correct, jnp.arange(k)), lab.count, active)
    zeros = jnp.zeros((*unl.idx.shape, model.num_classes), jnp.float32)
    if prediction_model == "best":

        def visit(best, m):
            def run(best):
                p = model_outputs(model, slot(m), data.x, unl)
                conf = labeling.mean_confidence(p, unl.mask)
                return labeling.keep_better(best, util[m], conf, p)

            # Only a model at some worker's top utility can win: the rest skip D^u.
            contender = active[m] & jnp.any(util[m] >= top)
            return jax.lax.cond(contender, run, lambda b: b, best), None

        top = jnp.max(util, axis=0)  # [C]; inactive slots are -inf
        ninf = jnp.full((n,), -jnp.inf, jnp.float32)
        (_, _, probs), _ = jax.lax.scan(visit, (ninf, ninf, zeros), jnp.arange(k))
    else:
        alpha = labeling.ensemble_weights(
            util, active, c.ensemble_weighting, c.ensemble_temperature
        )  # [C, K]

        def add(acc, m):
            run = lambda acc: labeling.accumulate_ensemble(
                alpha[:, m], model_outputs(model, slot(m), data.x, unl), acc
            )
            return jax.lax.cond(jnp.any(alpha[:, m] > 0), run, lambda a: a, acc), None

        probs, _ = jax.lax.scan(add, zeros, jnp.arange(k))
    pseudo_y, ok = labeling.threshold(probs, c.phi, unl.mask & label_set[:, None])
    if c.pseudo_mode == "accumulate":
        last_y, keep = last
        return jnp.where(keep, last_y, pseudo_y), keep | ok
    return pseudo_y, ok
