"""The FedAvg family: FedAvg, FedAvg-SL, FedProx, FedAvg-PL, Local, and the leaf-mask variants.

One mechanism, several knobs (McMahan et al. 2017, Li et al. 2020):

    for each round:
        S = sample clients_per_round clients                       (prepare)
        for k in S in parallel:                                    (client_update, vmapped)
            w_k = merge(w_global, personal_k)                      # shared leaves from the server
            w_k = local SGD on CE(labeled) [+ mu/2 ||w - w_g||^2] [+ CE(confident pseudo-labels)]
        w_global += server_lr * (sum_k n_k w_k / sum_k n_k - w_global)   on shared leaves (finish)
        personal_k = w_k                                           on the others

* fedavg: labeled data only.            * fedavg_sl: every training label (oracle reference).
* fedprox: proximal term prox_mu.       * fedavg_pl: + own confident pseudo-labels.
* local: nothing shared (algorithm.shared=none); each client keeps its model.

On DoFed-SPP's SUBSET/NORMAL partitions (roles `target_labeled`, `target_unlabeled`) fedavg and
local are DoFed-SPP's baselines (its Sec. 6.1; docs/choices.md: DoFed-SPP, the baselines' details),
on the same footing as FedFomo and FedBE (`dofed_baselines.py`): they train on D_train + D_lab
(`baseline_train_data`), Local trains every client every round, the simulated clock advances by the
slowest participant's compute plus its uploads (Local uploads nothing), and `finish` reports each
client model's hard labels of its D_unl as `pl_index` / `pl_label`, which the engine scores into
`pl_acc`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms import dofed_baselines as dofed
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
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.aggregate import SHARE_PRESETS
from fedjax_semi.engine.clients import broadcast, gather, scatter
from fedjax_semi.engine.keys import DROPOUT, INIT, SAMPLE, client_key
from fedjax_semi.engine.train import (
    LocalObjective,
    evaluate_indices,
    evaluate_row,
    table_stats,
)
from fedjax_semi.errors import bad
from fedjax_semi.models.zoo import Model
from fedjax_semi.systems import wireless

PyTree = Any

WEIGHTINGS = ("num_samples", "uniform")


@dataclasses.dataclass
class FedAvgConfig(AlgorithmConfig):
    """The FedAvg family's knobs (and UM-pFSSL's and pFedMe's, which extend it)."""

    name: str = "fedavg"
    # Keep each client's optimizer state across rounds (personalized methods) or reset it.
    persist_optimizer: bool = False
    server_lr: float = 1.0
    weighting: str = "num_samples"  # num_samples | uniform
    # Which leaves the server averages: all | none | fedbn | fedper | lg (see engine.aggregate).
    shared: str = "all"
    prox_mu: float = 0.0  # FedProx proximal term (mu / 2) ||w - w_global||^2
    # Pseudo-labelling of the client's own unlabeled data (fedavg_pl, the FixMatch methods): keep
    # a pseudo-label when its top probability is >= pl_threshold. null = keep all (um_pfssl only).
    pl_threshold: float | None = 0.95
    pl_weight: float = 1.0
    unlabeled_batch_ratio: int = 1  # unlabeled batch = ratio * batch_size
    pl_warmup_rounds: int = 0  # rounds of labeled-only training before pseudo-labels are used

    # May pl_threshold be null (keep every pseudo-label)? UM-pFSSL's config says yes.
    pl_threshold_nullable: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weighting not in WEIGHTINGS:
            raise bad("algorithm.weighting", self.weighting, f"one of {list(WEIGHTINGS)}")
        if self.shared not in SHARE_PRESETS:
            raise bad("algorithm.shared", self.shared, f"one of {sorted(SHARE_PRESETS)}")
        if self.prox_mu < 0:
            raise bad("algorithm.prox_mu", self.prox_mu, "a number >= 0")
        if self.pl_threshold is None and not self.pl_threshold_nullable:
            raise bad("algorithm.pl_threshold", None, "a number in [0, 1] (null only for um_pfssl)")
        if self.pl_threshold is not None and not 0 <= self.pl_threshold <= 1:
            raise bad("algorithm.pl_threshold", self.pl_threshold, "a number in [0, 1], or null")
        if self.unlabeled_batch_ratio < 1:
            raise bad(
                "algorithm.unlabeled_batch_ratio", self.unlabeled_batch_ratio, "an integer >= 1"
            )


@struct.dataclass
class FedAvgInputs:
    """prepare -> client_update, one row per cohort client [S, ...]: its id, its training table,
    its personal leaves and optimizer state, and its unlabeled table (pseudo-labels only)."""

    id: jax.Array
    table: RoleTable
    personal: PyTree
    opt: PyTree
    utable: RoleTable | None = None


@struct.dataclass
class FedAvgPlan:
    """prepare -> finish: the cohort int32 [S], and on DoFed-SPP's tasks what its clock and
    labels need (else None)."""

    cohort: jax.Array
    target: dofed.TargetPlan | None = None


@dataclasses.dataclass
class FedAvgFamily(Method):
    cfg: FedAvgConfig
    name: str = "fedavg"
    primary: str = "labeled"  # the role local epochs run over
    oracle: bool = False
    pseudo_labels: bool = False
    fixmatch: bool = False  # FixMatch augmentations in the pseudo-label loss
    roles: tuple[str, ...] = ("labeled", "unlabeled", "test")

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.objective = LocalObjective(
            self.model,
            prox_mu=c.prox_mu,
            pl_weight=c.pl_weight if self.pseudo_labels else 0.0,
            pl_threshold=c.pl_threshold,
            fixmatch=self.fixmatch,
        )
        self.mask = aggregate.share_mask(self.template, c.shared)
        self.personal = not aggregate.all_shared(self.mask)
        # The server holds a whole usable model only when every leaf is shared (FedBN, FedPer,
        # LG-FedAvg have none: their accuracy is each client's own model on its own test split).
        self.has_global_model = aggregate.all_shared(self.mask)
        self.communicates = any(jax.tree.leaves(self.mask))
        self.global_evaluation = GlobalEvaluation(self.model, self.eval_batch)
        self.unlabeled_batch = c.unlabeled_batch_ratio * c.batch_size if self.pseudo_labels else 0

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> FLState:
        clock = {}
        if dofed.is_target_task(fed.roles):
            dofed.check_epochs(self.cfg, self.name)
            clock = self.uplink.init_state(key, self.num_clients)
        gv = self.model.init(client_key(key, INIT, 0, 0))
        n = self.num_clients
        client_vars = broadcast(gv, n) if self.personal else {}
        client_opt = broadcast(self.tx.init(gv["params"]), n) if self.cfg.persist_optimizer else {}
        return FLState(
            round=jnp.zeros((), jnp.int32),
            global_vars=gv,
            client_vars=client_vars,
            client_opt=client_opt,
            sim_time=jnp.zeros((), jnp.float32),
            # Whole-model transfers (UM-pFSSL's unit: Cost_1 of its Sec. 6.2, "Communication
            # cost"): each sampled client downloads the global model once and uploads once per
            # round.
            extra={"comm": {"downloads": jnp.int32(0), "uploads": jnp.int32(0)}, **clock},
        )

    # ------------------------------------------------------------------ one round

    def prepare(self, state: FLState, data: TrainView, key: jax.Array):
        target = dofed.is_target_task(data.roles)
        if target and not self.communicates:  # DoFed-SPP's Local: every client, every round
            cohort = jnp.arange(self.num_clients)
        else:
            cohort = self.sample_cohort(key, state.round)
        if target:
            table = dofed.training_table(data.roles, self.cfg.baseline_train_data)
        else:
            table = data.roles[self.primary]
        inputs = FedAvgInputs(
            id=cohort,
            table=table.take(cohort),
            personal=gather(state.client_vars, cohort),
            opt=gather(state.client_opt, cohort),
            utable=data.roles["unlabeled"].take(cohort) if self.pseudo_labels else None,
        )
        shared = RoundShared(state.global_vars, data.x, data.y, state.round, key)
        if target:  # what the clock and the labels need in `finish`
            unl = data.roles[dofed.data_roles(data.roles).unl]
            target = dofed.TargetPlan(cohort, table.count[cohort], unl, data.x)
            return FedAvgPlan(cohort, target), inputs, shared
        return FedAvgPlan(cohort), inputs, shared

    def client_update(self, inp: FedAvgInputs, shared: RoundShared) -> dict:
        c, rnd, cid = self.cfg, shared.round, inp.id
        variables = shared.models
        if self.personal:
            variables = aggregate.merge(variables, inp.personal, self.mask)
        new_vars, new_opt, stats = self.train_client(
            variables,
            inp.table,
            shared,
            cid,
            SAMPLE,
            DROPOUT,
            opt_state=inp.opt if c.persist_optimizer else None,
            anchor=shared.models["params"],
            utable=inp.utable,
            unlabeled_batch=self.unlabeled_batch,
            pl_on=rnd >= c.pl_warmup_rounds,
        )
        count = inp.table.count
        weight = count if c.weighting == "num_samples" else (count > 0)
        return {
            "vars": new_vars,
            "opt": new_opt if c.persist_optimizer else {},
            "weight": weight.astype(jnp.float32),
            **stats,
        }

    def finish(self, state: FLState, plan: FedAvgPlan, out, key: jax.Array):
        c = self.cfg
        cohort = plan.cohort
        new_global = aggregate.server_update(
            state.global_vars, out["vars"], out["weight"], self.mask, c.server_lr
        )
        client_vars = scatter(state.client_vars, cohort, out["vars"]) if self.personal else {}
        client_opt = scatter(state.client_opt, cohort, out["opt"]) if c.persist_optimizer else {}
        steps = out["steps"].astype(jnp.float32)
        metrics = cohort_metrics(cohort, out, out["vars"])
        if self.pseudo_labels:
            metrics["pl_rate"] = jnp.sum(out["pl_rate"] * steps) / jnp.maximum(jnp.sum(steps), 1.0)
        moved = cohort.shape[0] if self.communicates else 0
        comm = {k: v + moved for k, v in state.extra["comm"].items()}
        metrics["comm_cost"] = comm["downloads"] + comm["uploads"]
        new_state = state.replace(
            round=state.round + 1,
            global_vars=new_global,
            client_vars=client_vars,
            client_opt=client_opt,
            extra={**state.extra, "comm": comm},
        )
        if plan.target is not None:
            return self.target_task_round(state, new_state, plan.target, metrics, key)
        return new_state, metrics

    def target_task_round(
        self,
        old: FLState,
        state: FLState,
        plan: dofed.TargetPlan,
        metrics: dict,
        key: jax.Array,
    ):
        """DoFed-SPP's clock (its Sec. 6.1) and labels (its Sec. 6.2) for this round: the slowest
        participant's E t_train(|D_train| + |D_lab|) plus m / r_i per upload, and every client's
        model's hard predictions on its D_unl [N, Du]."""
        c, t = self.cfg, state.round
        chosen = jnp.zeros((self.num_clients,), bool).at[plan.cohort].set(self.communicates)
        t_up, per_upload = self.uplink.upload_time(key, chosen, t, old.extra)
        t_comp = self.compute.slowest(plan.n_train, c.local_epochs)
        if self.personal:
            models = jax.vmap(lambda p: self.client_model(state.global_vars, p))(state.client_vars)
        else:
            models = state.global_vars
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
        return state.replace(sim_time=wireless.advance_clock(old.sim_time, t_comp, t_up)), metrics

    # ------------------------------------------------------------------ evaluation

    def client_model(self, global_vars, personal):
        return aggregate.merge(global_vars, personal, self.mask) if self.personal else global_vars

    def eval_client(self, inp, global_vars, x, labels):
        variables = self.client_model(global_vars, inp["personal"])
        return evaluate_row(self.model, variables, x, labels, inp["table"])

    def evaluate(self, state: FLState, fed: FederatedData, mapper: Mapper) -> dict:
        """Global accuracy on the server test set, and each client's accuracy on its own test
        split with its own model (the global model where nothing is personal). The sanity
        columns describe the model(s) behind `accuracy`, and with a global model the personal
        evaluation's too (`personal_` columns)."""
        if not self.personal:
            out = self.global_evaluation(state.global_vars, fed, mapper)
        else:
            out = {}
            if self.has_global_model:  # pFedMe: a global model beside the personal ones
                out.update(self.global_evaluation.server(state.global_vars, fed)[0])
            xs = {"table": fed.roles["test"], "personal": state.client_vars}
            r = mapper(self.eval_client, xs, state.global_vars, fed.x, fed.eval_y)
            out["client_acc"], out["personal_acc"] = client_accuracy(r)
            out.update(sanity(r, prefix="personal_" if self.has_global_model else ""))
            out["accuracy"] = out["global_acc"] if self.has_global_model else out["personal_acc"]
        # Each client's model on its D_unl, a secondary metric beside its held-out test split.
        if dofed.is_target_task(fed.roles):
            unl = fed.roles[dofed.data_roles(fed.roles).unl]
            xs = {"table": unl, "personal": state.client_vars}
            r = mapper(self.eval_client, xs, state.global_vars, fed.x, fed.eval_y)
            out["cls_acc_on_unl"] = client_accuracy(r)[1]
        return out


@dataclasses.dataclass(eq=False)
class GlobalEvaluation:
    """The evaluation of one global model that every client holds (the FedAvg family's without
    personal leaves; SCAFFOLD's, FedOpt's): its accuracy, loss and sanity columns on the server
    test set (with XLA's conv: one model, no vmap), and each client's accuracy on its own test
    split (`client_acc`, `personal_acc`, `personal_` sanity columns), read from that same pass
    when the clients' test rows lie inside the server test set. accuracy = global_acc."""

    model: Model
    eval_batch: int

    def __post_init__(self) -> None:
        self.server_model = self.model.with_conv("xla")

    def row(self, table: RoleTable, variables: PyTree, x: jax.Array, labels: jax.Array) -> dict:
        return evaluate_row(self.model, variables, x, labels, table)

    def server(self, variables: PyTree, fed: FederatedData) -> tuple[dict, dict]:
        """(global_acc, global_loss and the sanity columns; `evaluate_indices`' result) of the
        model on the server test set."""
        ids = fed.server["test_global"]
        g = evaluate_indices(self.server_model, variables, fed.x, fed.eval_y, ids, self.eval_batch)
        return {"global_acc": g["accuracy"], "global_loss": g["loss"], **sanity(g["stats"])}, g

    def __call__(self, variables: PyTree, fed: FederatedData, mapper: Mapper) -> dict:
        out, g = self.server(variables, fed)
        test, ids = fed.roles["test"], fed.server["test_global"]
        if fed.test_in_global:
            # Every client holds the global model: reuse its per-example results.
            full = jnp.zeros(fed.x.shape[0], bool).at[ids].set(g["correct"])
            r = {"correct": jnp.sum(full[test.idx] & test.mask, axis=1), "count": test.count}
            r.update(table_stats(g["each"], ids, test, fed.eval_y, fed.num_classes))
        else:
            r = mapper(self.row, test, variables, fed.x, fed.eval_y)
        out["client_acc"], out["personal_acc"] = client_accuracy(r)
        out.update(sanity(r, prefix="personal_"))
        out["accuracy"] = out["global_acc"]
        return out


def _check(cfg: FedAvgConfig, name: str, **required) -> None:
    for key, (ok, allowed) in required.items():
        value = getattr(cfg, key)
        if not ok(value):
            raise bad(f"algorithm.{key}", value, f"{allowed} for algorithm {name}")


@register("fedavg", FedAvgConfig)
def fedavg(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg", **kw)


@register("fedavg_sl", FedAvgConfig)
def fedavg_sl(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg_sl", primary="train", oracle=True, **kw)


@register("fedprox", FedAvgConfig)
def fedprox(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
    _check(cfg, "fedprox", prox_mu=(lambda v: v > 0, "a number > 0"))
    return FedAvgFamily(cfg, name="fedprox", **kw)


@register("fedavg_pl", FedAvgConfig)
def fedavg_pl(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
    _check(cfg, "fedavg_pl", pl_weight=(lambda v: v > 0, "a number > 0"))
    return FedAvgFamily(cfg, name="fedavg_pl", pseudo_labels=True, **kw)


def _fixmatch(name: str, shared: str, prox: bool):
    """FixMatch local training on D^s / D^u with FedAvg, FedProx or a shared-leaf mask."""

    def factory(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
        req = {
            "shared": (lambda v: v == shared, f"{shared!r}"),
            "pl_weight": (lambda v: v > 0, "a number > 0"),
        }
        if prox:
            req["prox_mu"] = (lambda v: v > 0, "a number > 0")
        _check(cfg, name, **req)
        return FedAvgFamily(cfg, name=name, pseudo_labels=True, fixmatch=True, **kw)

    register(name, FedAvgConfig)(factory)


# The semi-supervised baselines of UM-pFSSL's Tables 1-2 (its Sec. 6.1): one mechanism, knobs.
_fixmatch("fixavg", "all", prox=False)
_fixmatch("fixprox", "all", prox=True)
_fixmatch("fixbn", "fedbn", prox=False)
_fixmatch("fedper", "fedper", prox=False)
_fixmatch("lg_fedavg", "lg", prox=False)


def _supervised(name: str, shared: str, prox: bool):
    """FedAvg on every training label with a proximal term or a shared-leaf mask."""

    def factory(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
        req = {"shared": (lambda v: v == shared, f"{shared!r}")}
        if prox:
            req["prox_mu"] = (lambda v: v > 0, "a number > 0")
        _check(cfg, name, **req)
        return FedAvgFamily(cfg, name=name, primary="train", oracle=True, **kw)

    register(name, FedAvgConfig)(factory)


_supervised("fedprox_sl", "all", prox=True)
_supervised("fedbn_sl", "fedbn", prox=False)


@register("local", FedAvgConfig)
def local(cfg: FedAvgConfig, **kw) -> FedAvgFamily:
    _check(cfg, "local", shared=(lambda v: v == "none", "'none' (nothing is communicated)"))
    return FedAvgFamily(cfg, name="local", **kw)
