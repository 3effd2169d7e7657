"""CFSL: clustered federated semi-supervised learning in a hierarchical wireless network
(Hamood et al.: Algorithms 1-3, Eqs. 4-21 and 25), and its baselines HFSL and labeled-only CFL.

    init: one cluster per edge server, every cluster from one random model (Sec. III-B)
    each round r:
      prepare   labels from round r - 1's models; h2 <- path loss x block fading; latency
                l_i = T_cmp(D_i,new) + T_com (Eqs. 7-10, 21)
                C_r <- every member of a non-stopped cluster, k per stopped one (greedy / RR)
      clients   d_i = local SGD from theta_cid(i) on D_i^l + accepted pseudo-labels (Eqs. 1-3, 19)
      finish    per cluster ||weighted mean d||, max ||d_i||; stopped |= Eq. 25 (sticky)
                split where Eq. 5 and Eq. 6 hold: min-max bipartition of the cosines (Eq. 4, Alg. 1)
                theta_k += weighted mean d over the post-split cluster k (edge aggregation)
                the never-split root clusters are averaged at the cloud (the HFL trunk)
                the cloud averages cross-edge specialized models whose mean updates agree
                SP: labeling from the next round once a cluster has split (ST: stopped clusters),
                by the best model (BM) or the ensemble (EM); accept max p >= phi (Eqs. 17-18)
                T_r = max_j (T_cld + max_i l_i), E_r = sum (Eqs. 12-16)

Clusters live in K = max_clusters fixed slots (`cid [C]`, `active [K]`), so a split is array
work inside the compiled round. Every client is mapped each round; a worker not selected has an
empty training pool, so its update is zero and, under chunk=1, its steps are skipped. HFSL is the
same round with clustering off and every worker selected: one global model (all root clusters
hold the trunk), labeling timed by the same tests (Eq. 5 for SP, Eq. 25 for ST).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import (
    FLState,
    Mapper,
    Method,
    RoundShared,
    client_accuracy,
    cohort_metrics,
    register,
    sanity,
)
from fedjax_semi.algorithms.cfsl_config import CFSLConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.keys import (
    CFSL_DEVICES,
    CFSL_FADING,
    CFSL_SELECT,
    DROPOUT,
    INIT,
    SAMPLE,
    client_key,
    round_key,
)
from fedjax_semi.engine.train import evaluate_indices, evaluate_row
from fedjax_semi.errors import bad
from fedjax_semi.kernels import clustering as cl
from fedjax_semi.kernels import labeling
from fedjax_semi.kernels.scheduling import select_workers
from fedjax_semi.systems import hwn, wireless

PyTree = Any


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


@struct.dataclass
class CFSLInputs:
    """prepare -> client_update, one row per worker [C]: its id, its cluster slot, its training
    pool for this round (empty if not selected) and the pool's labels."""

    id: jax.Array
    cluster: jax.Array
    table: RoleTable
    labels: jax.Array


@struct.dataclass
class CFSLPlan:
    """prepare -> finish: the selection sel bool [C], the pool sizes n_train [C] (Eq. 20) and
    the workers' latency and energy terms at this round's channel (`hwn.worker_costs`), and the
    pseudo-labels pseudo_y [C, U] with their acceptance [C, U] the round trains on."""

    sel: jax.Array
    n_train: jax.Array
    costs: dict
    pseudo_y: jax.Array
    accepted: jax.Array


@dataclasses.dataclass
class CFSL(Method):
    cfg: CFSLConfig
    name: str = "cfsl"
    oracle: bool = False
    has_global_model: bool = True
    roles: tuple[str, ...] = ("labeled", "unlabeled", "test")
    # Clustering acts when the clusters found are the latent groups (Sec. III-B) and clusters
    # stop (Eq. 6), which is what saves energy in Sec. V.
    mechanism_metrics: ClassVar[tuple[str, ...]] = ("cluster_ari", "stopped_cluster_share")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.prediction_model, self.prediction_time, self.selection = self.cfg.axes()
        self.k_max = self.cfg.max_clusters
        self.hwn = hwn.HwnSystem.from_config(self.systems)
        self.model_bits = 32.0 * wireless.param_count(self.template["params"])  # sigma

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> FLState:
        n, k = self.num_clients, self.k_max
        edge_of = fed.server.get("edge_of", jnp.zeros((n,), jnp.int32)).astype(jnp.int32)
        num_edges = int(jnp.max(edge_of)) + 1
        if num_edges > k:
            raise bad("algorithm.max_clusters", k, f">= the {num_edges} edge servers")
        gv = self.model.init(client_key(key, INIT, 0, 0))
        slots = jnp.arange(k)
        unl = fed.roles["unlabeled"]
        extra = {
            "cl_vars": jax.tree.map(lambda a: jnp.broadcast_to(a, (k, *a.shape)), gv),
            "cid": edge_of,  # one cluster per edge: slot j is edge j's root
            "active": slots < num_edges,
            "cl_edge": jnp.where(slots < num_edges, slots, 0).astype(jnp.int32),
            "root": slots < num_edges,
            "stopped": jnp.zeros((k,), bool),
            "last_split": jnp.zeros((k,), jnp.int32),
            "labeling_on": jnp.zeros((), bool),
            "rr_last": jnp.full((n,), -1, jnp.int32),
            "pseudo_y": jnp.zeros(unl.idx.shape, jnp.int32),
            "accepted": jnp.zeros(unl.idx.shape, bool),
            "edge_of": edge_of,
            "devices": hwn.draw_devices(round_key(key, CFSL_DEVICES, 0), n, self.hwn),
            "norm_hist": jnp.zeros((self.cfg.calibration_rounds,), jnp.float32),
            "energy": jnp.zeros((), jnp.float32),
        }
        return FLState(
            round=jnp.zeros((), jnp.int32),
            global_vars=gv,
            client_vars={},
            client_opt={},
            sim_time=jnp.zeros((), jnp.float32),
            extra=extra,
        )

    # ------------------------------------------------------------------ one round

    def prepare(self, state: FLState, data: TrainView, key: jax.Array):
        c, ex, n = self.cfg, state.extra, self.num_clients
        r = state.round + 1
        lab, unl = data.roles["labeled"], data.roles["unlabeled"]
        # Labeling with the models of the end of round r - 1 (Alg. 3 labels before training).
        if self.prediction_time == "split":
            label_set = jnp.broadcast_to(ex["labeling_on"], (n,))
        elif self.prediction_time == "stopping":
            label_set = ex["stopped"][ex["cid"]]
        else:
            label_set = jnp.zeros((n,), bool)
        relabel = jnp.any(label_set) & ((r - 1) % c.relabel_every == 0)
        pseudo_y, accepted = jax.lax.cond(
            relabel,
            lambda: self._relabel(ex, data, label_set),
            lambda: (ex["pseudo_y"], ex["accepted"]),
        )
        n_train = lab.count + jnp.sum(accepted, axis=1).astype(jnp.int32)  # Eq. 20
        h2 = hwn.channel_gain(ex["devices"]["dist_m"], round_key(key, CFSL_FADING, r), self.hwn)
        own = hwn.bandwidth_shares(jnp.ones((n,), bool), n, self.hwn)  # latency for ranking
        rank_costs = self._costs(n_train, h2, ex, own)
        sel = select_workers(
            self.selection,
            ex["cid"],
            ex["stopped"],
            rank_costs["latency"],
            rank_costs["energy"],
            ex["rr_last"],
            round_key(key, CFSL_SELECT, r),
            c.k_per_cluster,
        )
        costs = self._costs(n_train, h2, ex, hwn.bandwidth_shares(sel, n, self.hwn))
        table, labels = pool_table(lab, unl, data.y, pseudo_y, accepted)
        table = RoleTable(table.idx, jnp.where(sel, table.count, 0))
        inputs = CFSLInputs(jnp.arange(n), ex["cid"], table, labels)
        shared = RoundShared(ex["cl_vars"], data.x, data.y, state.round, key)
        return CFSLPlan(sel, n_train, costs, pseudo_y, accepted), inputs, shared

    def _costs(self, n_train, h2, ex, beta) -> dict:
        return hwn.worker_costs(
            n_train.astype(jnp.float32),
            self.cfg.local_epochs,
            h2,
            ex["devices"],
            self.model_bits,
            beta,
            self.hwn,
        )

    def client_update(self, inp: CFSLInputs, shared: RoundShared) -> dict:
        start = jax.tree.map(lambda a: a[inp.cluster], shared.models)  # theta_cid(i)
        new, _, stats = self.train_client(
            start, inp.table, shared, inp.id, SAMPLE, DROPOUT, extras={"y": inp.labels}
        )
        return {"delta": jax.tree.map(jnp.subtract, new, start), **stats}

    def finish(self, state: FLState, plan: CFSLPlan, out, key: jax.Array):
        c, ex, k = self.cfg, state.extra, self.k_max
        r = state.round + 1
        sel, cid, active = plan.sel, ex["cid"], ex["active"]
        flat = flatten_clients(out["delta"])  # [C, P]
        norm = jnp.linalg.norm(flat, axis=1)
        w = jnp.where(sel, plan.n_train if c.agg_weight == "n_train" else 1, 0).astype(jnp.float32)

        # Split thresholds, per-cluster statistics and the tests (Eqs. 5, 6, 25).
        norm_hist, eps1, eps2 = self._thresholds(ex["norm_hist"], r, norm, sel)
        mean, _ = cl.cluster_mean(flat, cid, k, w)
        mean_norm = jnp.linalg.norm(mean, axis=1)
        max_norm = cl.cluster_max(norm, sel, cid, k)
        size = cl.cluster_size(jnp.ones_like(sel), cid, k)
        full = cl.cluster_size(sel, cid, k) == size
        warm = c.split_warmup
        stopped = ex["stopped"] | cl.reached_stopping_point(
            max_norm, eps2, active=active, full=full, round_index=r, warmup=warm
        )
        want = cl.should_split(
            mean_norm, max_norm, eps1, eps2, active=active, stopped=stopped, size=size,
            round_index=r, last_split=ex["last_split"], min_size=c.min_split_size, warmup=warm,
        )  # fmt: skip
        member = (cid[None, :] == jnp.arange(k)[:, None]) & sel[None, :]  # [K, C]
        sim = cl.cosine_matrix(flat, sel)  # Eq. 4
        bip = cl.bipartition_maxst if c.bipartition == "maxst" else cl.bipartition_complete_linkage
        side, alpha = jax.vmap(bip, in_axes=(None, 0))(sim, member)  # [K, C], [K]
        if c.gamma_gate:
            want = want & self._gamma_ok(flat, cid, side, sel, w, alpha)
        granted, new_id = cl.allocate_children(want & c.clustering, max_norm, active)

        # Bookkeeping: child B takes a free slot, starting from its parent's model.
        new_cid = cl.apply_splits(cid, side, granted, new_id)
        child = jnp.where(granted, new_id, k)  # k: dropped
        parent = jnp.arange(k).at[child].set(jnp.arange(k), mode="drop")
        born = jnp.zeros((k,), bool).at[child].set(True, mode="drop")
        changed = born | granted
        cl_vars = jax.tree.map(lambda a: a[parent], ex["cl_vars"])
        active = active | born
        cl_edge = ex["cl_edge"][parent]
        root = ex["root"] & ~changed
        last_split = jnp.where(changed, r, ex["last_split"])
        stopped = stopped & ~changed

        # Edge aggregation inside the post-split clusters, then the cloud's trunk and merge.
        mean, total = cl.cluster_mean(flat, new_cid, k, w)
        flat_vars = flatten_clients(cl_vars) + mean  # an empty cluster's mean is 0
        flat_vars = self._trunk(flat_vars, total, root & active)
        if c.cloud_merge:
            flat_vars = self._cloud_merge(flat_vars, mean, total, active & ~root, cl_edge)
        cl_vars = unflatten_like(flat_vars, cl_vars)

        # Labeling from the next round on: SP after the first split (HFSL: once Eq. 5 holds).
        split_now = jnp.any(granted) if c.clustering else jnp.any(want)
        labeling_on = ex["labeling_on"] | split_now

        # Cost of the round (Eqs. 12-16) on the simulated clock.
        per_edge = jax.ops.segment_sum(active.astype(jnp.int32), cl_edge, self.num_clients)
        cost = hwn.round_cost(
            sel, ex["edge_of"], self.num_clients, plan.costs, per_edge, self.model_bits, self.hwn
        )
        weight = jax.ops.segment_sum(plan.n_train.astype(jnp.float32), new_cid, k) * active
        global_flat = jnp.sum(flat_vars * weight[:, None], 0) / jnp.maximum(jnp.sum(weight), 1)
        global_vars = jax.tree.map(lambda a: a[0], unflatten_like(global_flat[None], cl_vars))

        new_extra = dict(
            ex,
            cl_vars=cl_vars, cid=new_cid, active=active, cl_edge=cl_edge, root=root,
            stopped=stopped, last_split=last_split, labeling_on=labeling_on,
            rr_last=jnp.where(sel, r, ex["rr_last"]), pseudo_y=plan.pseudo_y,
            accepted=plan.accepted,
            norm_hist=norm_hist, energy=ex["energy"] + cost["round_energy"],
        )  # fmt: skip
        ids = jnp.arange(self.num_clients, dtype=jnp.int32)
        metrics = cohort_metrics(ids, out, out["delta"])
        metrics.update(
            selected=jnp.sum(sel),
            num_clusters=jnp.sum(active),
            num_stopped=jnp.sum(stopped & active),
            splits=jnp.sum(granted),
            eps1=eps1,
            eps2=eps2,
            mean_update_norm=jnp.sum(norm * sel) / jnp.maximum(jnp.sum(sel), 1),
            labeling_on=labeling_on,
            pseudo_labeled=jnp.sum(plan.accepted),
            round_time=cost["round_time"],
            round_energy=cost["round_energy"],
            worker_energy=cost["worker_energy"],
            avg_energy=new_extra["energy"] / r,
        )
        new_state = state.replace(
            round=r,
            global_vars=global_vars,
            sim_time=state.sim_time + cost["round_time"],
            extra=new_extra,
        )
        return new_state, metrics

    # ------------------------------------------------------------------ finish's parts

    def _thresholds(self, hist, r, norm, sel):
        """(hist, eps1, eps2): the given eps (absolute), or kappa times the median of the first
        rounds' median update norms (relative), recorded into hist [calibration_rounds]."""
        c = self.cfg
        if c.eps_mode == "absolute":
            return hist, jnp.float32(c.eps1), jnp.float32(c.eps2)
        med = jnp.nanmedian(jnp.where(sel, norm, jnp.nan))
        slot = r - 1
        hist = jnp.where(jnp.arange(hist.shape[0]) == slot, jnp.nan_to_num(med), hist)
        m = jnp.median(hist)  # read only from round split_warmup > calibration_rounds on
        return hist, c.kappa1 * m, c.kappa2 * m

    def _gamma_ok(self, flat, cid, side, sel, w, alpha):
        """Alg. 1 lines 7-8 per slot on gamma-hat, with each worker's would-be child cluster."""
        k = self.k_max
        child = cid + k * side[cid, jnp.arange(cid.shape[0])]  # [C] in [0, 2K)
        mean, _ = cl.cluster_mean(flat, child, 2 * k, w)
        gamma = cl.gamma_hat(flat, mean, child, sel)
        return cl.gamma_check(gamma, sel, cid, alpha, k)

    def _trunk(self, flat_vars, total, roots):
        """The HFL trunk: the clusters never split (each edge's root) take their weighted
        average, the cloud's average of the edge models (two-level FedAvg, Sec. III-B)."""
        tw = jnp.where(roots, total, 0.0)
        trunk = jnp.sum(flat_vars * tw[:, None], 0) / jnp.maximum(jnp.sum(tw), 1e-12)
        return jnp.where((roots & (jnp.sum(tw) > 0))[:, None], trunk[None], flat_vars)

    def _cloud_merge(self, flat_vars, mean, total, eligible, cl_edge):
        """The cloud's cross-edge step (Sec. III-C, end): specialized models on different edges
        whose round mean updates have cosine >= tau are averaged (connected components)."""
        k = self.k_max
        ok = eligible & (total > 0)
        s = cl.cosine_matrix(mean, ok)
        adj = (s >= self.cfg.cloud_tau) & ok[:, None] & ok[None, :]
        adj = adj & (cl_edge[:, None] != cl_edge[None, :])
        comp = jax.lax.fori_loop(
            0, k, lambda _, cp: jnp.minimum(cp, jnp.min(jnp.where(adj, cp[None], k), 1)),
            jnp.arange(k),
        )  # fmt: skip
        tw = jnp.where(ok, total, 0.0)
        summed = jax.ops.segment_sum(flat_vars * tw[:, None], comp, k)
        wsum = jax.ops.segment_sum(tw, comp, k)
        avg = summed[comp] / jnp.maximum(wsum[comp], 1e-12)[:, None]
        return jnp.where(ok[:, None], avg, flat_vars)

    def _model_outputs(self, variables, x, table: RoleTable) -> jax.Array:
        """Softmax of one model on every worker's table rows -> [C, n_max, Y]."""

        def one(idx):
            logits, _ = self.model.apply(variables, x[idx])
            return jax.nn.softmax(logits.astype(jnp.float32), -1)

        return jax.lax.map(one, table.idx, batch_size=min(table.idx.shape[0], 25))

    def _relabel(self, ex: dict, data: TrainView, label_set: jax.Array):
        """Pseudo-labels of the label set's unlabeled data (Eqs. 17-18) from the best specialized
        model (BM, P2) or the weighted ensemble (EM, P3) of all active clusters; utility = each
        model's accuracy on the worker's labeled data (BM: ties to its mean confidence on D^u).
        Each active model reads D^u once (a scan over the slots holding [C, U, Y])."""
        c, k = self.cfg, self.k_max
        cl_vars, active = ex["cl_vars"], ex["active"]
        lab, unl = data.roles["labeled"], data.roles["unlabeled"]
        slot = lambda m: jax.tree.map(lambda a: a[m], cl_vars)
        n = lab.idx.shape[0]

        def correct(m):  # D^l is small: this pass is cheap
            run = lambda: labeling.correct_count(
                self._model_outputs(slot(m), data.x, lab), data.y[lab.idx], lab.mask
            ).astype(jnp.float32)
            return jax.lax.cond(active[m], run, lambda: jnp.zeros((n,), jnp.float32))

        util = labeling.accuracy_utility(jax.lax.map(correct, jnp.arange(k)), lab.count, active)
        zeros = jnp.zeros((*unl.idx.shape, self.model.num_classes), jnp.float32)
        if self.prediction_model == "best":

            def visit(best, m):
                def run(best):
                    p = self._model_outputs(slot(m), data.x, unl)
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
                    alpha[:, m], self._model_outputs(slot(m), data.x, unl), acc
                )
                return jax.lax.cond(jnp.any(alpha[:, m] > 0), run, lambda a: a, acc), None

            probs, _ = jax.lax.scan(add, zeros, jnp.arange(k))
        pseudo_y, ok = labeling.threshold(probs, c.phi, unl.mask & label_set[:, None])
        if c.pseudo_mode == "accumulate":
            keep = ex["accepted"]
            return jnp.where(keep, ex["pseudo_y"], pseudo_y), keep | ok
        return pseudo_y, ok

    # ------------------------------------------------------------------ evaluation

    def eval_client(self, inp: dict, cl_vars: PyTree, x: jax.Array, labels: jax.Array) -> dict:
        variables = jax.tree.map(lambda a: a[inp["cluster"]], cl_vars)
        return evaluate_row(self.model, variables, x, labels, inp["table"])

    def evaluate(self, state: FLState, fed: FederatedData, mapper: Mapper) -> dict:
        """Each worker's test accuracy with its cluster's model (min / mean / max over workers),
        the global model's on the pooled test set, and the labeling accuracy of the accepted
        pseudo-labels against the hidden labels (evaluation only) with their coverage."""
        ex = state.extra
        xs = {"table": fed.roles["test"], "cluster": ex["cid"]}
        r = mapper(self.eval_client, xs, ex["cl_vars"], fed.x, fed.eval_y)
        acc, mean = client_accuracy(r)
        has = r["count"] > 0
        g = evaluate_indices(
            self.model, state.global_vars, fed.x, fed.eval_y, fed.server["test_global"],
            self.eval_batch,
        )  # fmt: skip
        unl = fed.roles["unlabeled"]
        acc_l, _, n_ok = labeling.labeling_accuracy(
            ex["pseudo_y"], ex["accepted"] & unl.mask, fed.eval_y[unl.idx]
        )
        return {
            "accuracy": mean,
            "personal_acc": mean,
            "client_acc": acc,
            "min_acc": jnp.min(jnp.where(has, acc, jnp.inf)),
            "max_acc": jnp.max(jnp.where(has, acc, -jnp.inf)),
            "global_acc": g["accuracy"],
            "global_loss": g["loss"],
            "labeling_acc": jnp.where(n_ok > 0, acc_l, jnp.nan),  # none accepted: no value
            "coverage": n_ok / jnp.maximum(jnp.sum(unl.count), 1),
            **sanity(r),  # the cluster models behind `accuracy`
            # The mechanism: clusters that are the latent groups, and clusters that stop.
            **cl.cluster_recovery(ex["cid"], ex["active"], ex["stopped"], fed.eval_group),
        }


@register("cfsl", CFSLConfig)
def cfsl(cfg: CFSLConfig, **kw) -> CFSL:
    return CFSL(cfg, **kw)


@register("hfsl", CFSLConfig)
def hfsl(cfg: CFSLConfig, **kw) -> CFSL:
    """HFSL (the paper's baseline): one global model by two-level FedAvg with SSL; clustering
    off and every worker selected, labeling timed by Eq. 5 (SP) or Eq. 25 (ST) at the roots."""
    if cfg.clustering:
        raise bad("algorithm.clustering", True, "false for algorithm hfsl")
    if cfg.axes()[2] != "all":
        raise bad("algorithm.selection", cfg.selection, "'all' for algorithm hfsl")
    return CFSL(cfg, name="hfsl", **kw)
