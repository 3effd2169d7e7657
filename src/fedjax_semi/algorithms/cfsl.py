"""CFSL: clustered federated semi-supervised learning in a hierarchical wireless network
(Hamood et al.: Algorithms 1-3, Eqs. 4-21 and 25), and its baselines HFSL and labeled-only CFL.

    init: one cluster per edge server, every cluster from one random model (Sec. III-B)
    each round r:
      label     D^u labeled by round r - 1's models (Alg. 3 labels before training): SP once a
                cluster has split (ST: stopped clusters), by the best model (BM) or the
                ensemble (EM); accept max p >= phi (Eqs. 17-18)
      select    h2 <- path loss x block fading; latency l_i = T_cmp(D_i,new) + T_com
                (Eqs. 7-10, 21); C_r <- every member of a non-stopped cluster, k per stopped
                one (greedy / RR)
      workers   d_i = local SGD from theta_cid(i) on D_i^l + accepted pseudo-labels (Eqs. 1-3, 19)
      aggregate per cluster ||weighted mean d||, max ||d_i||; stopped |= Eq. 25 (sticky)
                split where Eq. 5 and Eq. 6 hold: min-max bipartition of the cosines (Eq. 4, Alg. 1)
                theta_k += weighted mean d over the post-split cluster k (edge aggregation)
                the never-split root clusters are averaged at the cloud (the HFL trunk)
                the cloud averages cross-edge specialized models whose mean updates agree
                T_r = max_j (T_cld + max_i l_i), E_r = sum (Eqs. 12-16)

Clusters live in K = max_clusters fixed slots (`Clusters`: cid [C], active [K]), so a split is
array work inside the compiled round. Every worker is mapped each round; one not selected has an
empty training pool, so its update is zero and, under chunk=1, its steps are skipped. HFSL is the
same round with clustering off and every worker selected: one global model (all root clusters
hold the trunk), labeling timed by the same tests (Eq. 5 for SP, Eq. 25 for ST). The array steps
of the server (pools, thresholds, trunk, cloud merge) are in `cfsl_steps.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms.base import (
    Mapper,
    Method,
    RoundShared,
    client_accuracy,
    cohort_metrics,
    register,
    sanity,
)
from fedjax_semi.algorithms.cfsl_config import CFSLConfig
from fedjax_semi.algorithms.cfsl_state import (
    CFSLState,
    Clusters,
    ClusterTable,
    Devices,
    PseudoLabels,
    RoundPlan,
    WorkerRow,
    WorkerUpdate,
    edge_of,
)
from fedjax_semi.algorithms.cfsl_steps import (
    cloud_merge,
    flatten_clients,
    gamma_ok,
    pool_table,
    relabel,
    thresholds,
    trunk,
    unflatten_like,
)
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients
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
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import evaluate_indices, evaluate_row
from fedjax_semi.errors import bad
from fedjax_semi.kernels import clustering as cl
from fedjax_semi.kernels import labeling
from fedjax_semi.kernels.scheduling import select_workers
from fedjax_semi.systems import hwn, wireless


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

    def init(self, key: jax.Array, fed: FederatedData) -> CFSLState:
        """One cluster per edge (slot j is edge j's root), all from one random model."""
        n, k = self.num_clients, self.k_max
        edges = edge_of(fed.server, n)
        num_edges = int(jnp.max(edges)) + 1
        if num_edges > k:
            raise bad("algorithm.max_clusters", k, f">= the {num_edges} edge servers")
        theta0 = self.model.init(client_key(key, INIT, 0, 0))
        slots = jnp.arange(k)
        unl = fed.roles["unlabeled"]
        clusters = Clusters(
            cid=edges,
            active=slots < num_edges,
            edge=jnp.where(slots < num_edges, slots, 0).astype(jnp.int32),
            root=slots < num_edges,
            stopped=jnp.zeros((k,), bool),
            last_split=jnp.zeros((k,), jnp.int32),
        )
        labels = PseudoLabels(
            y=jnp.zeros(unl.idx.shape, jnp.int32),
            accepted=jnp.zeros(unl.idx.shape, bool),
            on=jnp.zeros((), bool),
        )
        devices = hwn.draw_devices(round_key(key, CFSL_DEVICES, 0), n, self.hwn)
        return CFSLState(
            round=jnp.zeros((), jnp.int32),
            theta=jax.tree.map(lambda a: jnp.broadcast_to(a, (k, *a.shape)), theta0),
            theta_global=theta0,
            clusters=clusters,
            labels=labels,
            devices=Devices(**devices),
            last_selected=jnp.full((n,), -1, jnp.int32),
            norm_hist=jnp.zeros((self.cfg.calibration_rounds,), jnp.float32),
            energy=jnp.zeros((), jnp.float32),
            sim_time=jnp.zeros((), jnp.float32),
        )

    # ------------------------------------------------------------------ one round

    def round(
        self,
        state: CFSLState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[CFSLState, dict]:
        """Round r, top-down: label with round r - 1's models (Alg. 3), select C_r on this
        round's channel, send each worker its cluster's model, train, then aggregate at the
        edges, split, average at the cloud and put the round's cost on the clock."""
        labels = clients.server(self.pseudo_label)(state, data)  # Eqs. 17-18
        plan = clients.server(self.select)(state, data, labels, key)  # Eqs. 7-10, 20-21
        shared = RoundShared(state.theta, data.x, data.y, state.round, key)  # theta_cid(i)
        up = clients.map(self.local_update, plan.workers, shared)  # Eqs. 1-3, 19
        edges = edge_of(data.server, self.num_clients)
        return clients.server(self.aggregate)(state, edges, plan, up)  # Algs. 1-2, Eqs. 4-16

    def pseudo_label(self, state: CFSLState, data: TrainView) -> PseudoLabels:
        """Round r's D_psdo (Alg. 3, before training, with the models of the end of round
        r - 1): relabel the label set's workers every relabel_every rounds, else keep the last
        labels. The label set: all workers once SP has started, the members of stopped
        clusters under ST, nobody for labeled-only CFL."""
        c, cs, n = self.cfg, state.clusters, self.num_clients
        r = state.round + 1
        if self.prediction_time == "split":
            label_set = jnp.broadcast_to(state.labels.on, (n,))
        elif self.prediction_time == "stopping":
            label_set = cs.stopped[cs.cid]
        else:
            label_set = jnp.zeros((n,), bool)
        due = jnp.any(label_set) & ((r - 1) % c.relabel_every == 0)
        last = (state.labels.y, state.labels.accepted)
        args = (self.model, c, self.prediction_model, state.theta, cs.active, last, data, label_set)
        y, accepted = jax.lax.cond(due, lambda: relabel(*args), lambda: last)
        return state.labels.replace(y=y, accepted=accepted)

    def select(
        self, state: CFSLState, data: TrainView, labels: PseudoLabels, key: jax.Array
    ) -> RoundPlan:
        """C_r, the workers that train (every member of a non-stopped cluster; in a stopped one
        k by latency on this round's channel (GS) or in turn (RR), Sec. V's scenarios), and each
        worker's pool D_i,new."""
        c, cs, n = self.cfg, state.clusters, self.num_clients
        r = state.round + 1
        lab, unl = data.roles["labeled"], data.roles["unlabeled"]
        n_train = lab.count + jnp.sum(labels.accepted, axis=1).astype(jnp.int32)  # Eq. 20
        h2 = hwn.channel_gain(state.devices.dist_m, round_key(key, CFSL_FADING, r), self.hwn)
        own = hwn.bandwidth_shares(jnp.ones((n,), bool), n, self.hwn)  # latency for ranking
        rank_costs = self._costs(n_train, h2, state.devices, own)
        sel = select_workers(
            self.selection,
            cs.cid,
            cs.stopped,
            rank_costs["latency"],
            rank_costs["energy"],
            state.last_selected,
            round_key(key, CFSL_SELECT, r),
            c.k_per_cluster,
        )
        costs = self._costs(n_train, h2, state.devices, hwn.bandwidth_shares(sel, n, self.hwn))
        table, pool_y = pool_table(lab, unl, data.y, labels.y, labels.accepted)
        table = RoleTable(table.idx, jnp.where(sel, table.count, 0))
        workers = WorkerRow(jnp.arange(n), cs.cid, table, pool_y)
        return RoundPlan(sel, n_train, costs, labels, workers)

    def _costs(self, n_train, h2, devices: Devices, beta) -> dict:
        return hwn.worker_costs(
            n_train.astype(jnp.float32),
            self.cfg.local_epochs,
            h2,
            devices.as_dict(),
            self.model_bits,
            beta,
            self.hwn,
        )

    def local_update(self, row: WorkerRow, shared: RoundShared) -> WorkerUpdate:
        """Worker i: local SGD from theta_cid(i) on D_i,new (Eqs. 1-3, 19); uploads d_i."""
        start = jax.tree.map(lambda a: a[row.cluster], shared.models)  # theta_cid(i)
        new, _, stats = self.train_client(
            start, row.table, shared, row.id, SAMPLE, DROPOUT, extras={"y": row.labels}
        )
        return WorkerUpdate(jax.tree.map(jnp.subtract, new, start), stats)

    def aggregate(
        self, state: CFSLState, edges: jax.Array, plan: RoundPlan, up: WorkerUpdate
    ) -> tuple[CFSLState, dict]:
        """After the uploads (edges int32 [C]: each worker's edge server): the tests and
        splits (Alg. 1), the edge aggregation in the post-split clusters, the cloud's trunk and
        merge (Alg. 2), SP's start, the round's cost (Eqs. 12-16); the round's metrics."""
        c, k = self.cfg, self.k_max
        r = state.round + 1
        sel = plan.sel
        flat = flatten_clients(up.delta)  # [C, P]
        norm = jnp.linalg.norm(flat, axis=1)
        w = jnp.where(sel, plan.n_train if c.agg_weight == "n_train" else 1, 0).astype(jnp.float32)
        norm_hist, eps1, eps2 = thresholds(c, state.norm_hist, r, norm, sel)
        clusters, parent, want, granted = self._split(state.clusters, flat, norm, sel, w, eps1,
                                                      eps2, r)  # fmt: skip

        # Edge aggregation inside the post-split clusters (a child starts from its parent's
        # model), then the cloud's trunk and merge.
        theta = jax.tree.map(lambda a: a[parent], state.theta)
        active, root = clusters.active, clusters.root
        mean, total = cl.cluster_mean(flat, clusters.cid, k, w)
        flat_vars = flatten_clients(theta) + mean  # an empty cluster's mean is 0
        flat_vars = trunk(flat_vars, total, root & active)
        if c.cloud_merge:
            flat_vars = cloud_merge(flat_vars, mean, total, active & ~root, clusters.edge,
                                    c.cloud_tau)  # fmt: skip
        theta = unflatten_like(flat_vars, theta)

        # Labeling from the next round on: SP after the first split (HFSL: once Eq. 5 holds).
        split_now = jnp.any(granted) if c.clustering else jnp.any(want)
        labeling_on = state.labels.on | split_now

        # Cost of the round (Eqs. 12-16) on the simulated clock.
        per_edge = jax.ops.segment_sum(active.astype(jnp.int32), clusters.edge, self.num_clients)
        cost = hwn.round_cost(
            sel, edges, self.num_clients, plan.costs, per_edge, self.model_bits, self.hwn
        )
        weight = jax.ops.segment_sum(plan.n_train.astype(jnp.float32), clusters.cid, k) * active
        global_flat = jnp.sum(flat_vars * weight[:, None], 0) / jnp.maximum(jnp.sum(weight), 1)
        theta_global = jax.tree.map(lambda a: a[0], unflatten_like(global_flat[None], theta))
        energy = state.energy + cost["round_energy"]

        new = state.replace(
            round=r,
            theta=theta,
            theta_global=theta_global,
            clusters=clusters,
            labels=plan.labels.replace(on=labeling_on),
            last_selected=jnp.where(sel, r, state.last_selected),
            norm_hist=norm_hist,
            energy=energy,
            sim_time=state.sim_time + cost["round_time"],
        )
        ids = jnp.arange(self.num_clients, dtype=jnp.int32)
        metrics = cohort_metrics(ids, up.stats, up.delta)
        metrics.update(
            selected=jnp.sum(sel),
            num_clusters=jnp.sum(active),
            num_stopped=jnp.sum(clusters.stopped & active),
            splits=jnp.sum(granted),
            eps1=eps1,
            eps2=eps2,
            mean_update_norm=jnp.sum(norm * sel) / jnp.maximum(jnp.sum(sel), 1),
            labeling_on=labeling_on,
            pseudo_labeled=jnp.sum(plan.labels.accepted),
            round_time=cost["round_time"],
            round_energy=cost["round_energy"],
            worker_energy=cost["worker_energy"],
            avg_energy=energy / r,
        )
        return new, metrics

    def _split(self, cs: Clusters, flat, norm, sel, w, eps1, eps2, r):
        """Alg. 1 on the slots: Eq. 25's stop (sticky), the splits where Eqs. 5 and 6 hold
        (min-max bipartition of the cosines, Eq. 4), child B in a free slot. flat f32 [C, P]
        updates, norm f32 [C], w f32 [C] aggregation weights -> (the post-split `Clusters`,
        parent int32 [K] each slot's model source, want bool [K] Eqs. 5-6 held, granted bool [K]
        split)."""
        c, k = self.cfg, self.k_max
        cid, active = cs.cid, cs.active
        mean, _ = cl.cluster_mean(flat, cid, k, w)
        mean_norm = jnp.linalg.norm(mean, axis=1)
        max_norm = cl.cluster_max(norm, sel, cid, k)
        size = cl.cluster_size(jnp.ones_like(sel), cid, k)
        full = cl.cluster_size(sel, cid, k) == size
        warm = c.split_warmup
        stopped = cs.stopped | cl.reached_stopping_point(
            max_norm, eps2, active=active, full=full, round_index=r, warmup=warm
        )
        want = cl.should_split(
            mean_norm, max_norm, eps1, eps2, active=active, stopped=stopped, size=size,
            round_index=r, last_split=cs.last_split, min_size=c.min_split_size, warmup=warm,
        )  # fmt: skip
        member = (cid[None, :] == jnp.arange(k)[:, None]) & sel[None, :]  # [K, C]
        sim = cl.cosine_matrix(flat, sel)  # Eq. 4
        bip = cl.bipartition_maxst if c.bipartition == "maxst" else cl.bipartition_complete_linkage
        side, alpha = jax.vmap(bip, in_axes=(None, 0))(sim, member)  # [K, C], [K]
        if c.gamma_gate:
            want = want & gamma_ok(flat, cid, side, sel, w, alpha, k)
        granted, new_id = cl.allocate_children(want & c.clustering, max_norm, active)
        child = jnp.where(granted, new_id, k)  # k: dropped
        parent = jnp.arange(k).at[child].set(jnp.arange(k), mode="drop")
        born = jnp.zeros((k,), bool).at[child].set(True, mode="drop")
        changed = born | granted
        after = Clusters(
            cid=cl.apply_splits(cid, side, granted, new_id),
            active=active | born,
            edge=cs.edge[parent],
            root=cs.root & ~changed,
            stopped=stopped & ~changed,
            last_split=jnp.where(changed, r, cs.last_split),
        )
        return after, parent, want, granted

    # ------------------------------------------------------------------ evaluation

    def eval_client(self, row: ClusterTable, theta: PyTree, x: jax.Array, y: jax.Array) -> dict:
        variables = jax.tree.map(lambda a: a[row.cluster], theta)
        return evaluate_row(self.model, variables, x, y, row.table)

    def evaluate(self, state: CFSLState, fed: FederatedData, mapper: Mapper) -> dict:
        """Each worker's test accuracy with its cluster's model (min / mean / max over workers),
        the global model's on the pooled test set, and the labeling accuracy of the accepted
        pseudo-labels against the hidden labels (evaluation only) with their coverage."""
        cs, pl = state.clusters, state.labels
        rows = ClusterTable(cs.cid, fed.roles["test"])
        r = mapper(self.eval_client, rows, state.theta, fed.x, fed.eval_y)
        acc, mean = client_accuracy(r)
        has = r["count"] > 0
        g = evaluate_indices(
            self.model, state.theta_global, fed.x, fed.eval_y, fed.server["test_global"],
            self.eval_batch,
        )  # fmt: skip
        unl = fed.roles["unlabeled"]
        acc_l, _, n_ok = labeling.labeling_accuracy(
            pl.y, pl.accepted & unl.mask, fed.eval_y[unl.idx]
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
            **cl.cluster_recovery(cs.cid, cs.active, cs.stopped, fed.eval_group),
        }


@register("cfsl", CFSLConfig)
def cfsl(cfg: CFSLConfig, **kw: Any) -> CFSL:
    return CFSL(cfg, **kw)


@register("hfsl", CFSLConfig)
def hfsl(cfg: CFSLConfig, **kw: Any) -> CFSL:
    """HFSL (the paper's baseline): one global model by two-level FedAvg with SSL; clustering
    off and every worker selected, labeling timed by Eq. 5 (SP) or Eq. 25 (ST) at the roots."""
    if cfg.clustering:
        raise bad("algorithm.clustering", True, "false for algorithm hfsl")
    if cfg.axes()[2] != "all":
        raise bad("algorithm.selection", cfg.selection, "'all' for algorithm hfsl")
    return CFSL(cfg, name="hfsl", **kw)
