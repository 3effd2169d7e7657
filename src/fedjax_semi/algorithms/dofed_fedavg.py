"""FedAvg and Local as DoFed-SPP's baselines (its Sec. 6.1), on DoFed-SPP's SUBSET/NORMAL tasks
(roles `target_labeled`, `target_unlabeled`), on the same footing as FedFomo and FedBE
(`dofed_baselines.py`; our choices: docs/choices.md, DoFed-SPP, the baselines' details):

    each round t:
        S_t = clients_per_round clients at random (FedAvg); every client (Local)
        for k in S_t in parallel: ClientUpdate(k, w_t) on D_train + D_lab (baseline_train_data)
        w_{t+1} = FedAvg's weighted mean (Local: each client keeps its own model)
        clock += slowest participant's E t_train(|D_train| + |D_lab|) + sum_k m / r_k
                 (Sec. 6.1; Local uploads nothing)
        every client's model labels its D_unl: pl_index / pl_label (Sec. 6.2's labeling accuracy)

The partition's roles pick this variant when the method is built (`registry.make_algorithm`):
`fedavg` and `local` on any other partition are the plain FedAvg family (`fedavg.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms import dofed_baselines as dofed
from fedjax_semi.algorithms.base import Mapper, RoundShared, client_accuracy
from fedjax_semi.algorithms.fedavg import (
    LOCAL_REQUIRES,
    FedAvgConfig,
    FedAvgFamily,
    FedAvgState,
    FedAvgUpload,
    check_required,
)
from fedjax_semi.algorithms.registry import register_variant
from fedjax_semi.data.federated import FederatedData, TrainView
from fedjax_semi.engine.clients import Clients
from fedjax_semi.systems import wireless
from fedjax_semi.systems.uplink import UplinkState


@struct.dataclass
class TargetTaskState(FedAvgState):
    """FedAvg's state (round, w, w_k, opt_k, comm, sim_time; sim_time is DoFed-SPP's clock) and
    clock: the uplink's state from `Uplink.init_state` (the fixed rates in shannon mode)."""

    clock: UplinkState


@dataclasses.dataclass
class TargetTaskFedAvg(FedAvgFamily):
    """FedAvg (or Local, algorithm.shared=none) on DoFed-SPP's tasks."""

    def __post_init__(self) -> None:
        super().__post_init__()
        dofed.check_epochs(self.cfg, self.name)  # the compute time counts epochs

    def init(self, key: jax.Array, fed: FederatedData) -> TargetTaskState:
        state = super().init(key, fed)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        return TargetTaskState(**fields, clock=self.uplink.init_state(key, self.num_clients))

    def round(
        self,
        state: TargetTaskState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[TargetTaskState, dict]:
        """FedAvg's round on D_train + D_lab (Local: every client trains every round), then the
        clock and the labels of D_unl."""
        if self.communicates:
            cohort = self.sample_cohort(key, state.round)  # S_t
        else:  # Local: every client, every round
            cohort = jnp.arange(self.num_clients)
        table = dofed.training_table(data.roles, self.cfg.baseline_train_data)
        rows = self.client_rows(state, data, table, cohort)
        shared = RoundShared(state.w, data.x, data.y, state.round, key)  # w_t to S_t
        up = clients.map(self.client_update, rows, shared)
        unl = data.roles[dofed.data_roles(data.roles).unl]
        plan = dofed.TargetPlan(cohort, table.count[cohort], unl, data.x)
        return clients.server(self.target_server_update)(state, plan, up, key)

    def target_server_update(
        self, state: TargetTaskState, plan: dofed.TargetPlan, up: FedAvgUpload, key: jax.Array
    ) -> tuple[TargetTaskState, dict]:
        """FedAvg's server update, then DoFed-SPP's clock (Sec. 6.1) and labels (Sec. 6.2):
        the slowest participant's E t_train(|D_train| + |D_lab|) plus m / r_k per upload, and
        every client's model's hard predictions on its D_unl [N, Du]."""
        new, metrics = self.server_update(state, plan.cohort, up)
        chosen = jnp.zeros((self.num_clients,), bool).at[plan.cohort].set(self.communicates)
        t_up, per_upload = self.uplink.upload_time(key, chosen, new.round, state.clock)
        t_comp = self.compute.slowest(plan.n_train, self.cfg.local_epochs)
        if self.personal:
            models = jax.vmap(self.client_model, in_axes=(None, 0))(new.w, new.w_k)
        else:
            models = new.w
        labels = dofed.predict_labels(
            self.model, models, plan.x, plan.unl, per_client=self.personal
        )
        metrics = dict(
            metrics,
            upload_time=t_up,
            upload_times=per_upload,
            compute_time=t_comp,
            pl_index=plan.unl.idx,
            pl_label=labels,
        )
        sim_time = wireless.advance_clock(state.sim_time, t_comp, t_up)
        return new.replace(sim_time=sim_time), metrics

    def evaluate(self, state: TargetTaskState, fed: FederatedData, mapper: Mapper) -> dict:
        """FedAvg's evaluation, and each client's model on its D_unl (`cls_acc_on_unl`), a
        secondary metric beside its held-out test split."""
        out = super().evaluate(state, fed, mapper)
        unl = fed.roles[dofed.data_roles(fed.roles).unl]
        xs = {"table": unl, "personal": state.w_k}
        r = mapper(self.eval_client, xs, state.w, fed.x, fed.eval_y)
        out["cls_acc_on_unl"] = client_accuracy(r)[1]
        return out


@register_variant("fedavg", dofed.is_target_task)
def fedavg_on_target_task(cfg: FedAvgConfig, **kw: Any) -> TargetTaskFedAvg:
    return TargetTaskFedAvg(cfg, name="fedavg", **kw)


@register_variant("local", dofed.is_target_task)
def local_on_target_task(cfg: FedAvgConfig, **kw: Any) -> TargetTaskFedAvg:
    check_required(cfg, "local", **LOCAL_REQUIRES)
    return TargetTaskFedAvg(cfg, name="local", **kw)
