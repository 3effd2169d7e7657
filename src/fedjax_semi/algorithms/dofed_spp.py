"""DoFed-SPP: dual-objective personalized federated learning with similarity-ratio pseudo-labels
(Ching et al., IEEE TSC 2023; the paper's Algorithm 2).

Every client n holds a fully labeled training set D_train, a labeled target set D_lab and an
unlabeled target set D_unl; it keeps a reciprocal model R_n (trained on D_train, shared) and a
target model T_n (the student, personal). There is no parameter averaging: models meet only as a
prediction ensemble.

    Phase 0  R = R0 (one init); L rounds of local training on D_train;        (warmup)
             every client uploads: cache = R; S = SR(cache, R, R0, T0); R_prev = R0
    for t = 1..rounds (every client, every round):                           (round)
      1  (K, B) fixed or from Ineq. 26; U, x = greedy(S, K, B)                 (select_and_upload)
         cache[U] = R[U]; clock += sum_{i in U} m / r_i
      2  y_pl[n] = argmax sum_i x[n, i] S[n, i] softmax(f(cache_i, D_unl[n]))  (client_update)
      3  T_n = local SGD from T_n on D_unl with y_pl + D_lab with true labels
      4  R_prev, R_n = R_n, local SGD from R_n on D_train
         S = SR(cache, R, R_prev, T_pre) with Eq. 19 (before the update of R)   (refresh_similarity)
         clock += compute

Phases 1 and 4's server halves are array code over all N clients at the base station (the SR
matrix, the greedy selection, the cache, the clock); `client_update` is one client's Phases 2-4,
mapped over the client axis by the engine. The SR kernel runs at the base station because row n
needs the whole cache; every piece of it is a vmapped kernel of `kernels.similarity`.

Data roles: the SUBSET / NORMAL partitions give `labeled` (D_train), `target_labeled` (D_lab),
`target_unlabeled` (D_unl) and `test`. On a generic semi-supervised partition (`labeled`,
`unlabeled`, `test`) the target is the client's own distribution: D_train = D_lab = labeled and
D_unl = unlabeled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.dofed_task import (
    DoFedClient,
    DoFedComm,
    DoFedPlan,
    DoFedSPPConfig,
    DoFedUpload,
    DoFedWarmupClient,
    TargetTaskMethod,
    check_selection_k,
    client_evaluator,
    data_roles,
    evaluate_clients,
    low_rank,
)
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients, broadcast, gather
from fedjax_semi.engine.keys import (
    INIT,
    REC_DROPOUT,
    REC_SAMPLE,
    TAR_DROPOUT,
    TAR_SAMPLE,
    WARM_DROPOUT,
    WARM_SAMPLE,
    client_key,
)
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import Schedule, evaluate_row, make_optimizer
from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import similarity as sim
from fedjax_semi.systems import wireless
from fedjax_semi.systems.uplink import UplinkState

Counts = tuple[jax.Array, jax.Array, jax.Array]  # valid sizes [N] of D_train, D_lab, D_unl


@struct.dataclass
class DoFedSPPState:
    """What DoFed-SPP carries from round to round (Algorithm 2's symbols). Models are
    [N]-stacked variables.

    round: int32 [] rounds done (Phase 0 is round 0); sim_time: float32 [] the simulated clock.
    R: the reciprocal models R_n; R_prev: R_n^prev, R one update earlier (Eq. 19's distances).
    T: the target (student) models T_n, the ones evaluated.
    cache: the base station's copies of the last uploaded R_i; cache_round: int32 [N] the round
        each was uploaded in (-1: never).
    S: float32 [N, N] the similarity ratios S[n, i] of Eq. 19 (row n: consumer n).
    comm: the upload counts; clock: the uplink's fixed rates (shannon mode).
    No server model (the base station only relays uploads); the optimizers restart every round.
    """

    round: jax.Array
    R: PyTree
    R_prev: PyTree
    T: PyTree
    cache: PyTree
    cache_round: jax.Array
    S: jax.Array
    comm: DoFedComm
    clock: UplinkState
    sim_time: jax.Array


@dataclasses.dataclass
class DoFedSPP(TargetTaskMethod):
    cfg: DoFedSPPConfig
    name: str = "dofed_spp"
    has_global_model: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        # The reciprocal models train with Method's tx and schedule (lr, local_epochs) and its
        # cross-entropy objective; the student's pseudo-labels come to it as extras.
        self.evaluator = client_evaluator(self.model, per_client=True)
        self.tx_tar = make_optimizer(c.optimizer, c.lr_tar, c.momentum, c.weight_decay)
        self.schedule_tar = Schedule(c.batch_size, c.local_epochs_tar, 0)
        self.gamma = c.lr if c.sr_gamma is None else c.sr_gamma
        self.budget_mode = c.selection_mode == "budget"
        # Labeling slots per client: B in fixed mode; all N (zero weights) when B varies.
        self.slots = self.num_clients if self.budget_mode else c.selection_b

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> DoFedSPPState:
        """R0 and T0 (Algorithm 2 line 3; one shared init each by default: docs/choices.md,
        DoFed-SPP, "Other choices"); S uniform until Phase 0."""
        need = {*data_roles(fed.roles), "test"}
        missing = sorted(need - set(fed.roles))
        if missing:
            raise ConfigError(
                f"algorithm.name='dofed_spp' needs the data roles {missing}, which this partition "
                "does not build: use partition=subset or partition=normal (or a semi-supervised "
                "partition with labeled, unlabeled and test roles)"
            )
        n = self.num_clients

        def init_models(kind: int):
            if self.cfg.init_mode == "shared":
                return broadcast(self.model.init(client_key(key, INIT, kind, 0)), n)
            keys = jax.vmap(lambda i: client_key(key, INIT, kind, i))(jnp.arange(n))
            return jax.vmap(self.model.init)(keys)

        rec0, tar0 = init_models(0), init_models(1)
        return DoFedSPPState(
            round=jnp.zeros((), jnp.int32),
            R=rec0,
            R_prev=rec0,
            T=tar0,
            cache=rec0,  # nothing uploaded yet (cache_round -1)
            cache_round=jnp.full((n,), -1, jnp.int32),
            S=jnp.full((n, n), 1.0 / n, jnp.float32),
            comm=DoFedComm(uploads=jnp.int32(0), warmup_uploads=jnp.int32(0)),
            clock=self.uplink.init_state(key, n),  # shannon mode's fixed rates
            sim_time=jnp.zeros((), jnp.float32),
        )

    # ------------------------------------------------------------------ Phase 0

    has_warmup: ClassVar[bool] = True

    def warmup(
        self, state: DoFedSPPState, data: TrainView, mapper: Clients, key: jax.Array
    ) -> DoFedSPPState:
        """Algorithm 2 lines 1-12: L rounds of reciprocal training, all N upload, first SRs."""
        n, roles = self.num_clients, data_roles(data.roles)
        rows = DoFedWarmupClient(jnp.arange(n), state.R, data.roles[roles.train])
        shared = RoundShared(state.R, data.x, data.y, jnp.int32(0), key)
        rec = mapper(self.warmup_client, rows, shared)
        everyone = jnp.ones((n,), bool)
        cache, cache_round = sim.upload_to_cache(state.cache, rec, everyone, state.cache_round, 0)
        # Scored: the fresh uploads; target: the untrained T0; distance reference: R0.
        S, _ = self.similarity(
            cache, self.broadcast(cache), rec, state.R, state.T,
            data.x, data.y, data.roles[roles.lab], None,
        )  # fmt: skip
        t_up, _ = self.uplink.upload_time(key, everyone, 0, state.clock)
        t_comp = wireless.phase0_compute_time(
            data.roles[roles.train].count,
            data.roles[roles.lab].count,
            n,
            self.cfg.warmup_rounds,
            sec_per_train_sample=self.compute.sec_per_train_sample,
            sec_per_infer_sample=self.compute.sec_per_infer_sample,
            epochs_rec=self.cfg.local_epochs,
        )
        return state.replace(
            R=rec,
            R_prev=state.R,
            cache=cache,
            cache_round=cache_round,
            S=S,
            comm=state.comm.replace(warmup_uploads=jnp.int32(n)),
            sim_time=wireless.advance_clock(state.sim_time, t_comp, t_up),
        )

    def warmup_client(self, row: DoFedWarmupClient, shared: RoundShared) -> PyTree:
        """L rounds of local reciprocal training of one client: R0 -> R^L (no communication).

        row: id [], rec (one model), train (RoleTable row [Dtr]); shared: x, y (visible labels),
        key.
        """

        def one_round(variables, r):
            variables, _, stats = self.train_client(
                variables, row.train, shared, row.id, WARM_SAMPLE, WARM_DROPOUT, rnd=r
            )
            return variables, stats["loss"]

        rec, _ = jax.lax.scan(one_round, row.rec, jnp.arange(self.cfg.warmup_rounds))
        return rec

    # ------------------------------------------------------------------ one round

    def round(
        self,
        state: DoFedSPPState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[DoFedSPPState, dict]:
        """One round of Algorithm 2 (lines 13-34), every client taking part: Phase 1 at the base
        station, Phases 2-4 on the clients, Phase 4's SRs and the clock at the base station."""
        t, n = state.round + 1, self.num_clients
        train, lab, unl = (data.roles[r] for r in data_roles(data.roles))
        counts = (train.count, lab.count, unl.count)
        # Phase 1 (lines 13-19): uploaders and labeling models from last round's S; the upload.
        plan = clients.server(self.select_and_upload)(state, counts, t)
        rows = DoFedClient(jnp.arange(n), state.R, state.T, plan.ids, plan.w, train, lab, unl)
        shared = RoundShared(plan.shown, data.x, data.y, t, key)  # the broadcast cache
        up = clients.map(self.client_update, rows, shared)  # Phases 2-4 (lines 20-33)
        # Phase 4 (line 32): the new S, R_prev <- R, the clock.
        return clients.server(self.refresh_similarity)(
            state, plan, up, counts, lab, data.x, data.y, key
        )

    # ------------------------------------------------------------------ Phase 1 (base station)

    def budget_constants(self, counts: Counts, clock: UplinkState) -> Counts:
        """Eq. 26's (C1, C2, C3) for the slowest client (Sec. 4.4 assumes identical devices;
        docs/choices.md: DoFed-SPP, Ineq. 26 with unequal clients): counts are the valid sizes [N]
        of D_train, D_lab, D_unl. C1 = T/G minus the compute that does not grow with B, C2 = seconds
        per labeling model, C3 = expected seconds per upload."""
        c = self.cfg
        n_train, n_lab, n_unl = counts
        fixed = wireless.dofed_compute_time(
            n_train, n_lab, n_unl, self.num_clients, 0,
            sec_per_train_sample=self.compute.sec_per_train_sample,
            sec_per_infer_sample=self.compute.sec_per_infer_sample,
            epochs_rec=c.local_epochs, epochs_tar=c.local_epochs_tar,
        )  # fmt: skip
        per_label_model = jnp.max(wireless.compute_time(n_unl, self.compute.sec_per_infer_sample))
        return wireless.budget_constants(
            c.selection_time_per_round_s,
            fixed,
            per_label_model,
            self.uplink.mean_upload_time(clock),
        )

    def select(
        self, S: jax.Array, counts: Counts, clock: UplinkState
    ) -> tuple[sim.Selection, tuple]:
        """Algorithm 1 on S [N, N] with the configured (K, B), or with the pair of Ineq. 26 of
        largest F (Algorithm 2 lines 13-15). Returns the selection and (C1, C2, C3) or ()."""
        c = self.cfg
        if self.budget_mode:
            consts = self.budget_constants(counts, clock)
            return sim.select_with_budget(S, *consts), consts
        chosen, x, value = sim.greedy_select(S, c.selection_k, c.selection_b)
        k, b = jnp.int32(c.selection_k), jnp.int32(c.selection_b)
        return sim.Selection(chosen, x, value, k, b, jnp.bool_(False)), ()

    def select_and_upload(self, state: DoFedSPPState, counts: Counts, t: jax.Array) -> DoFedPlan:
        """Phase 1 at the base station: select, upload into the cache, give each client the ids
        and weights of the models it labels with, and the copies to broadcast."""
        sel, consts = self.select(state.S, counts, state.clock)
        cache, cache_round = sim.upload_to_cache(
            state.cache, state.R, sel.chosen, state.cache_round, t
        )
        weights, label_degenerate = sim.labeling_weights(
            state.S, sel.x, renormalize=self.cfg.label_renormalize
        )
        ids, w, _ = sim.selected_slots(sel.x, weights, self.slots)
        return DoFedPlan(
            sel=sel,
            budget=consts,
            cache=cache,
            shown=self.broadcast(cache),
            cache_round=cache_round,
            ids=ids,
            w=w,
            label_degenerate=label_degenerate,
        )

    def broadcast(self, cache: PyTree) -> PyTree:
        """The copies the BS broadcasts: the uploads, or their low-rank version (Sec. 4.5,
        Algorithm 2 lines 7 and 19; our reading of its "PCA": `low_rank`)."""
        return low_rank(cache, self.cfg.pca_rank) if self.cfg.pca_rank > 0 else cache

    # ------------------------------------------------------------------ Phases 2-4 (one client)

    def client_update(self, row: DoFedClient, shared: RoundShared) -> DoFedUpload:
        """Phases 2, 3 and the reciprocal half of 4 for one client.

        row: id [], rec and tar (one model each), ids [B] int32 and w [B] (labeling models and
        weights), train / lab / unl (RoleTable rows [Dtr], [Dl], [Du]); shared: cache ([N]
        broadcast models), x, y (visible labels only), round t.
        """
        cid, x, y = row.id, shared.x, shared.y
        train, lab, unl = row.train, row.lab, row.unl
        unl_mask = jnp.arange(unl.idx.shape[0]) < unl.count
        lab_mask = jnp.arange(lab.idx.shape[0]) < lab.count

        # Phase 2 (Eq. 20): hard labels from the SR-weighted soft vote of the downloaded models.
        models = gather(shared.models, row.ids)  # [B] models
        logits = jax.vmap(lambda v: self.model.apply(v, x[unl.idx])[0])(models)  # [B, Du, Q]
        y_pl, _ = sim.pseudo_labels(logits[None], row.w[None], from_logits=True)
        y_pl = y_pl[0]  # [Du]

        # Phase 3 (Eqs. 21-22): the student continues from T_n on D^p = D_unl + D_lab, rebuilt
        # every round; valid entries are packed first, as local_train's table expects.
        labels, mask = sim.student_targets(
            y_pl[None], unl_mask[None], y[lab.idx][None], lab_mask[None]
        )
        order = jnp.argsort(~mask[0], stable=True)
        idx = jnp.concatenate([unl.idx, lab.idx])[order]
        tar, _, st_tar = self.train_client(
            row.tar,
            RoleTable(idx, unl.count + lab.count),
            shared,
            cid,
            TAR_SAMPLE,
            TAR_DROPOUT,
            tx=self.tx_tar,
            schedule=self.schedule_tar,
            extras={"y": labels[0][order]},  # replaces the batch labels: pseudo + true
        )

        # Phase 4 (line 33): one round of local reciprocal training on D_train.
        rec, _, st_rec = self.train_client(row.rec, train, shared, cid, REC_SAMPLE, REC_DROPOUT)
        return DoFedUpload(
            tar=tar,
            rec=rec,
            loss=st_tar["loss"],
            steps=st_tar["steps"],
            rec_loss=st_rec["loss"],
            # Scored against the hidden labels on the host (simulate.py), never here.
            pl_index=unl.idx,
            pl_label=jnp.where(unl_mask, y_pl, -1),
        )

    # ------------------------------------------------------------------ Phase 4 (base station)

    def mean_loss(
        self, variables: PyTree, x: jax.Array, y: jax.Array, table: RoleTable
    ) -> jax.Array:
        """l_n(theta): mean CE of one model on one client's labeled target row (0 if empty)."""
        r = evaluate_row(self.model, variables, x, y, table)
        return r["loss"] / jnp.maximum(r["count"], 1)

    def similarity(
        self,
        cache: PyTree,
        shown: PyTree,
        rec: PyTree,
        rec_prev: PyTree,
        target: PyTree,
        x: jax.Array,
        y: jax.Array,
        lab: RoleTable,
        sr_prev: jax.Array | None,
    ) -> tuple[jax.Array, jax.Array]:
        """Eq. 19 for every (consumer n, provider i): S [N, N] and the degenerate rows [N].

        Models are [N]-stacked. Losses: the broadcast copies `shown` off the diagonal, the own
        current R_n on it, target T_n, all on D_lab (lab [N, Dl]); distances: the uploads
        `cache` (un-reduced when PCA is on, so distances are exact) and R_n to the own R_n^prev,
        over every parameter (Theorem 1, Eq. 19; its round indices disagree with Alg. 2 l.32:
        docs/choices.md: DoFed-SPP, which models Eq. 19 compares). sr_prev None: the first
        computation (rows of all 0, 0 / 0 in Eq. 19, become uniform)."""
        c = self.cfg

        def loss(v, table):
            return self.mean_loss(v, x, y, table)

        cross = sim.cross_evaluate(loss, shown, lab)  # [N, N]
        cross = sim.set_diagonal(cross, jax.vmap(loss)(rec, lab))
        own = jax.vmap(loss)(target, lab)  # [N]
        flat = [sim.flatten_clients(v["params"]) for v in (cache, rec, rec_prev)]
        dist = sim.sr_distances(*flat)
        g1 = sim.max_pairwise_distance(flat[1]) if c.sr_g1 == "auto" else c.sr_g1
        return sim.similarity_ratios(
            cross,
            own,
            dist,
            sr_prev,
            gamma=self.gamma,
            g1=g1,
            g2=c.sr_g2,
            eps=c.sr_eps,
            exclude_self=c.sr_exclude_self,
            degenerate=c.sr_degenerate,
        )

    def refresh_similarity(
        self,
        state: DoFedSPPState,
        plan: DoFedPlan,
        up: DoFedUpload,
        counts: Counts,
        lab: RoleTable,
        x: jax.Array,
        y: jax.Array,
        key: jax.Array,
    ) -> tuple[DoFedSPPState, dict]:
        """Phase 4 at the BS: the new S, R_prev <- R, the clock, the round's metrics."""
        c, n = self.cfg, self.num_clients
        t, sel = state.round + 1, plan.sel
        # Line 32: SRs of the fresh cache, against R_prev, before R moves on.
        target = state.T if c.sr_target_version == "pre_update" else up.tar
        S, degenerate = self.similarity(
            plan.cache, plan.shown, state.R, state.R_prev, target, x, y, lab, state.S
        )
        t_up, per_upload = self.uplink.upload_time(key, sel.chosen, t, state.clock)
        t_comp = wireless.dofed_compute_time(
            *counts, n, sel.b,
            sec_per_train_sample=self.compute.sec_per_train_sample,
            sec_per_infer_sample=self.compute.sec_per_infer_sample,
            epochs_rec=c.local_epochs, epochs_tar=c.local_epochs_tar,
        )  # fmt: skip
        uploads = jnp.sum(sel.chosen).astype(jnp.int32)
        comm = state.comm.replace(uploads=state.comm.uploads + uploads)
        stats = {"loss": up.loss, "steps": up.steps}
        metrics = cohort_metrics(jnp.arange(n), stats, {"tar": up.tar, "rec": up.rec})
        metrics["client_finite"] &= jnp.isfinite(up.rec_loss)
        p = jnp.clip(S, 1e-12, 1.0)
        metrics.update(
            K=sel.k,
            B=sel.b,
            F=sel.value,
            budget_violated=sel.budget_violated,
            chosen=sel.chosen,
            uploads=uploads,
            comm_uploads=comm.uploads,
            comm_warmup_uploads=comm.warmup_uploads,
            upload_time=t_up,
            upload_times=per_upload,
            compute_time=t_comp,
            rec_loss=jnp.mean(up.rec_loss),
            n_degenerate_rows=jnp.sum(degenerate).astype(jnp.int32),
            n_label_degenerate=jnp.sum(plan.label_degenerate).astype(jnp.int32),
            sr_self=jnp.mean(jnp.diagonal(S)),
            sr_entropy=jnp.mean(-jnp.sum(jnp.where(S > 0, S * jnp.log(p), 0.0), axis=1)),
            # How much of each client's SR mass the uploaded set covered (with K = B Alg. 1
            # has no incentive for diversity).
            sr_mass_uploaded=jnp.mean(jnp.sum(jnp.where(sel.chosen, state.S, 0.0), axis=1)),
            sr_mass_uploaded_min=jnp.min(jnp.sum(jnp.where(sel.chosen, state.S, 0.0), axis=1)),
            cache_age=jnp.mean((t - plan.cache_round).astype(jnp.float32)),
            pl_index=up.pl_index,
            pl_label=up.pl_label,
        )
        if self.budget_mode:
            metrics.update(zip(("budget_c1", "budget_c2", "budget_c3"), plan.budget, strict=True))
        new = state.replace(
            round=t,
            R=up.rec,
            R_prev=state.R,
            T=up.tar,
            cache=plan.cache,
            cache_round=plan.cache_round,
            S=S,
            comm=comm,
            sim_time=wireless.advance_clock(state.sim_time, t_comp, t_up),
        )
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, state: DoFedSPPState, fed: FederatedData, mapper: Clients) -> dict:
        """Classification accuracy (Sec. 6.1): each target model T_n on its own test split, and
        T_n on its D_unl as a secondary metric (the paper defines no test set; docs/choices.md:
        DoFed-SPP, the test data)."""
        return evaluate_clients(self.evaluator, state.T, fed, mapper, per_client=True)


@register("dofed_spp", DoFedSPPConfig)
def dofed_spp(cfg: DoFedSPPConfig, **kw: Any) -> DoFedSPP:
    check_selection_k(cfg, kw["num_clients"])
    return DoFedSPP(cfg, **kw)
