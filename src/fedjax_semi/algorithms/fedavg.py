"""The FedAvg family: FedAvg, FedAvg-SL, FedProx, FedAvg-PL, Local, and the leaf-mask variants.

One mechanism, several knobs (McMahan et al. 2017, Algorithm 1; Li et al. 2020 for FedProx):

    server: w (the global model); client k: its personal leaves of w_k (where any leaf is personal)
    each round t:
        S_t = a random set of clients_per_round clients
        for k in S_t in parallel, from w_t (shared leaves) and its own personal leaves:
            w_k <- ClientUpdate(k, w_t): local SGD on CE(labeled) [+ mu/2 ||w - w_t||^2]
                                          [+ CE(confident pseudo-labels)]
        w_{t+1} = w_t + server_lr (sum_k n_k w_k / sum_k n_k - w_t)   on the shared leaves
        personal leaves of w_k: kept by client k

* fedavg: labeled data only.            * fedavg_sl: every training label (oracle reference).
* fedprox: proximal term prox_mu.       * fedavg_pl: + own confident pseudo-labels.
* local: nothing shared (algorithm.shared=none); each client keeps its model.
* fixavg, fixprox, fixbn, fedper, lg_fedavg: FixMatch local training (UM-pFSSL's baselines);
  fedprox_sl, fedbn_sl: FedProx and FedBN on every training label.

A subclass changes the client step or the server step (pFedMe, UM-pFSSL) or what a round
trains on and reports (a task variant chosen by the partition's roles, `registry.register_variant`);
the round below is the common skeleton.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import (
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
from fedjax_semi.engine.clients import Clients, broadcast, gather, scatter
from fedjax_semi.engine.keys import DROPOUT, INIT, SAMPLE, client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import (
    LocalObjective,
    evaluate_indices,
    evaluate_row,
    table_stats,
)
from fedjax_semi.errors import bad
from fedjax_semi.models.zoo import Model

WEIGHTINGS = ("num_samples", "uniform")


@dataclasses.dataclass
class FedAvgConfig(AlgorithmConfig):
    """The FedAvg family's knobs (and UM-pFSSL's and pFedMe's, which extend it)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "server_lr",
        "pl_threshold",
    )

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
class Comm:
    """Whole-model transfers so far (UM-pFSSL's unit, Cost_1 of its Sec. 6.2): each sampled
    client downloads the global model once and uploads once per round. int32 [] each."""

    downloads: jax.Array
    uploads: jax.Array


@struct.dataclass
class FedAvgState:
    """The FedAvg family's state (McMahan et al. 2017, Algorithm 1).

    round: int32 [], the round t.  sim_time: float32 [], the simulated clock.
    w: the server's model variables (its shared leaves are the global model).
    w_k: [N, ...] each client's variables where some leaves are personal, else {}.
    opt_k: [N, ...] each client's optimizer state when persist_optimizer, else {}.
    comm: the transfers so far.
    """

    round: jax.Array
    w: PyTree
    w_k: PyTree
    opt_k: PyTree
    # sim_time before comm: the leaves keep the order of the older state, as does XLA's
    # compilation of the programs that take the state (one float32 ulp moved otherwise).
    sim_time: jax.Array
    comm: Comm


@struct.dataclass
class FedAvgClient:
    """The round's rows, one per cohort client [S, ...]: its id, its training table, its personal
    leaves (w_k, {} where nothing is personal) and optimizer state, and its unlabeled table
    (pseudo-labels only)."""

    id: jax.Array
    table: RoleTable
    w_k: PyTree
    opt: PyTree
    utable: RoleTable | None = None


@struct.dataclass
class FedAvgUpload:
    """What ClientUpdate returns [S, ...]: the trained variables w_k, the optimizer state it keeps
    ({} unless persist_optimizer), its weight n_k in the server mean (float32), and local_train's
    stats: loss (float32), steps (int32), pl_rate (float32).

    The fields are in the order of the older per-client dict's sorted keys: the mapped program's
    outputs follow it, and XLA's compilation of the round with them (another order moved a
    float32 ulp)."""

    loss: jax.Array
    opt: PyTree
    pl_rate: jax.Array
    steps: jax.Array
    w_k: PyTree
    weight: jax.Array

    @property
    def stats(self) -> dict:
        return {"loss": self.loss, "steps": self.steps, "pl_rate": self.pl_rate}


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

    def init(self, key: jax.Array, fed: FederatedData) -> FedAvgState:
        """w_0 (Algorithm 1: "initialize w_0"); every client's personal leaves start from it."""
        w = self.model.init(client_key(key, INIT, 0, 0))
        n = self.num_clients
        return FedAvgState(
            round=jnp.zeros((), jnp.int32),
            w=w,
            w_k=broadcast(w, n) if self.personal else {},
            opt_k=broadcast(self.tx.init(w["params"]), n) if self.cfg.persist_optimizer else {},
            comm=Comm(downloads=jnp.int32(0), uploads=jnp.int32(0)),
            sim_time=jnp.zeros((), jnp.float32),
        )

    # ------------------------------------------------------------------ one round

    def round(
        self,
        state: FedAvgState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[FedAvgState, dict]:
        """One round of Algorithm 1: sample S_t, send w_t (and each client its personal leaves),
        ClientUpdate(k, w_t) for k in S_t in parallel, then the server's weighted mean."""
        cohort = self.sample_cohort(key, state.round)  # S_t
        rows = self.client_rows(state, data, data.roles[self.primary], cohort)
        shared = RoundShared(state.w, data.x, data.y, state.round, key)  # w_t to S_t
        up = clients.map(self.client_update, rows, shared)
        return clients.server(self.server_update)(state, cohort, up)

    def client_rows(
        self, state: FedAvgState, data: TrainView, table: RoleTable, cohort: jax.Array
    ) -> FedAvgClient:
        """The cohort's rows [S, ...] of `table` and of the clients' own state."""
        return FedAvgClient(
            id=cohort,
            table=table.take(cohort),
            w_k=gather(state.w_k, cohort),
            opt=gather(state.opt_k, cohort),
            utable=data.roles["unlabeled"].take(cohort) if self.pseudo_labels else None,
        )

    def client_update(self, row: FedAvgClient, shared: RoundShared) -> FedAvgUpload:
        """ClientUpdate(k, w): E epochs of local SGD from w_t's shared leaves and the client's
        personal ones (FedProx's term anchors at w_t)."""
        c = self.cfg
        w = shared.models
        if self.personal:
            w = aggregate.merge(w, row.w_k, self.mask)
        w_k, opt, stats = self.train_client(
            w,
            row.table,
            shared,
            row.id,
            SAMPLE,
            DROPOUT,
            opt_state=row.opt if c.persist_optimizer else None,
            anchor=shared.models["params"],
            utable=row.utable,
            unlabeled_batch=self.unlabeled_batch,
            pl_on=shared.round >= c.pl_warmup_rounds,
        )
        count = row.table.count
        weight = count if c.weighting == "num_samples" else (count > 0)
        return FedAvgUpload(
            loss=stats["loss"],
            opt=opt if c.persist_optimizer else {},
            pl_rate=stats["pl_rate"],
            steps=stats["steps"],
            w_k=w_k,
            weight=weight.astype(jnp.float32),
        )

    def server_update(
        self, state: FedAvgState, cohort: jax.Array, up: FedAvgUpload
    ) -> tuple[FedAvgState, dict]:
        """w_{t+1} = w_t + server_lr (sum_k n_k w_k / sum_k n_k - w_t) on the shared leaves; the
        cohort keeps its personal leaves and optimizer states; the round's metrics."""
        c = self.cfg
        w = aggregate.server_update(state.w, up.w_k, up.weight, self.mask, c.server_lr)
        w_k = scatter(state.w_k, cohort, up.w_k) if self.personal else {}
        opt_k = scatter(state.opt_k, cohort, up.opt) if c.persist_optimizer else {}
        metrics = cohort_metrics(cohort, up.stats, up.w_k)
        if self.pseudo_labels:
            steps = up.steps.astype(jnp.float32)
            pl = jnp.sum(up.pl_rate * steps)
            metrics["pl_rate"] = pl / jnp.maximum(jnp.sum(steps), 1.0)
        moved = cohort.shape[0] if self.communicates else 0  # one download, one upload each
        comm = Comm(downloads=state.comm.downloads + moved, uploads=state.comm.uploads + moved)
        metrics["comm_cost"] = comm.downloads + comm.uploads
        new = state.replace(round=state.round + 1, w=w, w_k=w_k, opt_k=opt_k, comm=comm)
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def client_model(self, w: PyTree, personal: PyTree) -> PyTree:
        """Client k's model: w's shared leaves and its own personal ones."""
        return aggregate.merge(w, personal, self.mask) if self.personal else w

    def eval_client(self, inp: dict, w: PyTree, x: jax.Array, labels: jax.Array) -> dict:
        """One client's model on its table row inp["table"]; inp["personal"]: its leaves."""
        variables = self.client_model(w, inp["personal"])
        return evaluate_row(self.model, variables, x, labels, inp["table"])

    def evaluate(self, state: FedAvgState, fed: FederatedData, mapper: Mapper) -> dict:
        """Global accuracy on the server test set, and each client's accuracy on its own test
        split with its own model (the global model where nothing is personal). The sanity
        columns describe the model(s) behind `accuracy`, and with a global model the personal
        evaluation's too (`personal_` columns). Reads state.w and state.w_k only."""
        if not self.personal:
            return self.global_evaluation(state.w, fed, mapper)
        out = {}
        if self.has_global_model:  # pFedMe: a global model beside the personal ones
            out.update(self.global_evaluation.server(state.w, fed)[0])
        xs = {"table": fed.roles["test"], "personal": state.w_k}
        r = mapper(self.eval_client, xs, state.w, fed.x, fed.eval_y)
        out["client_acc"], out["personal_acc"] = client_accuracy(r)
        out.update(sanity(r, prefix="personal_" if self.has_global_model else ""))
        out["accuracy"] = out["global_acc"] if self.has_global_model else out["personal_acc"]
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


Requirement = tuple[Callable[[Any], bool], str]  # (ok(value), what is allowed)


def check_required(cfg: FedAvgConfig, name: str, **required: Requirement) -> None:
    """Each knob `key` of `cfg` passes its ok(value), else a ConfigError naming what `name`
    allows."""
    for key, (ok, allowed) in required.items():
        value = getattr(cfg, key)
        if not ok(value):
            raise bad(f"algorithm.{key}", value, f"{allowed} for algorithm {name}")


_check = check_required  # the older name, kept for the subclasses' modules


def _positive(v: float) -> bool:
    return v > 0


POSITIVE: Requirement = (_positive, "a number > 0")
# Local: nothing is shared, so nothing is communicated (its task variants check it too).
LOCAL_REQUIRES: dict[str, Requirement] = {
    "shared": (lambda v: v == "none", "'none' (nothing is communicated)")
}


def shared_is(preset: str) -> Requirement:
    return (lambda v: v == preset, f"{preset!r}")


@register("fedavg", FedAvgConfig)
def fedavg(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg", **kw)


@register("fedavg_sl", FedAvgConfig)
def fedavg_sl(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg_sl", primary="train", oracle=True, **kw)


@register("fedprox", FedAvgConfig)
def fedprox(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    check_required(cfg, "fedprox", prox_mu=POSITIVE)
    return FedAvgFamily(cfg, name="fedprox", **kw)


@register("fedavg_pl", FedAvgConfig)
def fedavg_pl(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    check_required(cfg, "fedavg_pl", pl_weight=POSITIVE)
    return FedAvgFamily(cfg, name="fedavg_pl", pseudo_labels=True, **kw)


@register("local", FedAvgConfig)
def local(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    check_required(cfg, "local", **LOCAL_REQUIRES)
    return FedAvgFamily(cfg, name="local", **kw)


# The semi-supervised baselines of UM-pFSSL's Tables 1-2 (its Sec. 6.1): FixMatch local training
# on D^s / D^u with FedAvg, FedProx or a shared-leaf mask.


def _fixmatch(cfg: FedAvgConfig, name: str, shared: str, prox: bool, **kw) -> FedAvgFamily:
    required = {"shared": shared_is(shared), "pl_weight": POSITIVE}
    if prox:
        required["prox_mu"] = POSITIVE
    check_required(cfg, name, **required)
    return FedAvgFamily(cfg, name=name, pseudo_labels=True, fixmatch=True, **kw)


@register("fixavg", FedAvgConfig)
def fixavg(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _fixmatch(cfg, "fixavg", "all", prox=False, **kw)


@register("fixprox", FedAvgConfig)
def fixprox(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _fixmatch(cfg, "fixprox", "all", prox=True, **kw)


@register("fixbn", FedAvgConfig)
def fixbn(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _fixmatch(cfg, "fixbn", "fedbn", prox=False, **kw)


@register("fedper", FedAvgConfig)
def fedper(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _fixmatch(cfg, "fedper", "fedper", prox=False, **kw)


@register("lg_fedavg", FedAvgConfig)
def lg_fedavg(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _fixmatch(cfg, "lg_fedavg", "lg", prox=False, **kw)


# FedAvg on every training label with a proximal term or a shared-leaf mask (fully supervised
# references).


def _supervised(cfg: FedAvgConfig, name: str, shared: str, prox: bool, **kw) -> FedAvgFamily:
    required = {"shared": shared_is(shared)}
    if prox:
        required["prox_mu"] = POSITIVE
    check_required(cfg, name, **required)
    return FedAvgFamily(cfg, name=name, primary="train", oracle=True, **kw)


@register("fedprox_sl", FedAvgConfig)
def fedprox_sl(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _supervised(cfg, "fedprox_sl", "all", prox=True, **kw)


@register("fedbn_sl", FedAvgConfig)
def fedbn_sl(cfg: FedAvgConfig, **kw: Any) -> FedAvgFamily:
    return _supervised(cfg, "fedbn_sl", "fedbn", prox=False, **kw)
