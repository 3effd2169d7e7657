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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms.base import FLState, Mapper, register
from fedjax_semi.config import AlgorithmConfig, bad
from fedjax_semi.data.federated import FederatedData, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import (
    DROPOUT,
    INIT,
    SAMPLE,
    broadcast,
    client_key,
    gather,
    scatter,
    select_cohort,
)
from fedjax_semi.engine.train import (
    LocalObjective,
    Schedule,
    evaluate_indices,
    evaluate_row,
    local_train,
    make_optimizer,
)
from fedjax_semi.models.zoo import Model


def _client_finite(stacked) -> jax.Array:
    """bool [S]: every leaf of each client's tree is finite."""
    per_leaf = [
        jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(stacked)
    ]
    return jnp.all(jnp.stack(per_leaf), axis=0)


def cohort_metrics(cohort: jax.Array, out: dict, models) -> dict:
    """The per-round metrics every algorithm reports: the cohort, each client's loss and
    finiteness (for the NaN guard), the step-weighted mean training loss and mean step count."""
    steps = out["steps"].astype(jnp.float32)
    return {
        "cohort": cohort,
        "client_loss": out["loss"],
        "client_finite": _client_finite(models) & jnp.isfinite(out["loss"]),
        "train_loss": jnp.sum(out["loss"] * steps) / jnp.maximum(jnp.sum(steps), 1.0),
        "local_steps": jnp.mean(steps),
    }


@dataclasses.dataclass
class FedAvgFamily:
    cfg: AlgorithmConfig
    model: Model
    num_clients: int
    clients_per_round: int
    seed: int
    eval_batch: int = 1000
    name: str = "fedavg"
    primary: str = "labeled"  # the role local epochs run over
    oracle: bool = False
    pseudo_labels: bool = False
    fixmatch: bool = False  # FixMatch augmentations in the pseudo-label loss
    roles: tuple[str, ...] = ("labeled", "unlabeled", "test")

    def __post_init__(self) -> None:
        c = self.cfg
        self.seed_key = jax.random.PRNGKey(self.seed)
        self.tx = make_optimizer(c.optimizer, c.lr, c.momentum, c.weight_decay)
        self.schedule = Schedule(c.batch_size, c.local_epochs, c.local_steps)
        self.objective = LocalObjective(
            self.model,
            prox_mu=c.prox_mu,
            pl_weight=c.pl_weight if self.pseudo_labels else 0.0,
            pl_threshold=c.pl_threshold,
            fixmatch=self.fixmatch,
        )
        template = jax.eval_shape(self.model.init, self.seed_key)
        self.mask = aggregate.share_mask(template, c.shared)
        self.personal = not aggregate.all_shared(self.mask)
        # The server holds a whole usable model only when every leaf is shared (FedBN, FedPer,
        # LG-FedAvg have none: their accuracy is each client's own model on its own test split).
        self.has_global_model = aggregate.all_shared(self.mask)
        self.communicates = any(jax.tree.leaves(self.mask))
        # The single global model is evaluated without vmap, where XLA's conv is faster.
        self.global_eval_model = self.model.with_conv("xla")
        self.unlabeled_batch = c.unlabeled_batch_ratio * c.batch_size if self.pseudo_labels else 0

    # ------------------------------------------------------------------ state

    def init(self, fed: FederatedData) -> FLState:
        gv = self.model.init(client_key(self.seed_key, INIT, 0, 0))
        n = self.num_clients
        client_vars = broadcast(gv, n) if self.personal else {}
        client_opt = broadcast(self.tx.init(gv["params"]), n) if self.cfg.persist_optimizer else {}
        return FLState(
            round=jnp.zeros((), jnp.int32),
            global_vars=gv,
            client_vars=client_vars,
            client_opt=client_opt,
            sim_time=jnp.zeros((), jnp.float32),
            # Whole-model transfers (UM-pFSSL's unit, spec 2.9): each sampled client downloads
            # the global model once and uploads once per round.
            extra={"comm": {"downloads": jnp.int32(0), "uploads": jnp.int32(0)}},
        )

    # ------------------------------------------------------------------ one round

    def prepare(self, state: FLState, data: TrainView):
        cohort = select_cohort(self.seed_key, state.round, self.num_clients, self.clients_per_round)
        inputs = {
            "id": cohort,
            "table": data.roles[self.primary].take(cohort),
            "personal": gather(state.client_vars, cohort),
            "opt": gather(state.client_opt, cohort),
        }
        if self.pseudo_labels:
            inputs["utable"] = data.roles["unlabeled"].take(cohort)
        shared = {"global": state.global_vars, "x": data.x, "y": data.y, "round": state.round}
        return cohort, inputs, shared

    def client_update(self, inp, shared):
        c, rnd, cid = self.cfg, shared["round"], inp["id"]
        variables = shared["global"]
        if self.personal:
            variables = aggregate.merge(variables, inp["personal"], self.mask)
        opt = inp["opt"] if c.persist_optimizer else self.tx.init(variables["params"])
        new_vars, new_opt, stats = local_train(
            self.objective,
            self.tx,
            variables,
            opt,
            shared["x"],
            shared["y"],
            inp["table"],
            self.schedule,
            client_key(self.seed_key, SAMPLE, rnd, cid),
            client_key(self.seed_key, DROPOUT, rnd, cid),
            anchor=shared["global"]["params"],
            utable=inp.get("utable"),
            unlabeled_batch=self.unlabeled_batch,
            pl_on=rnd >= c.pl_warmup_rounds,
        )
        count = inp["table"].count
        weight = count if c.weighting == "num_samples" else (count > 0)
        return {
            "vars": new_vars,
            "opt": new_opt if c.persist_optimizer else {},
            "weight": weight.astype(jnp.float32),
            **stats,
        }

    def finish(self, state: FLState, cohort, out):
        c = self.cfg
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
        return new_state, metrics

    # ------------------------------------------------------------------ evaluation

    def client_model(self, global_vars, personal):
        return aggregate.merge(global_vars, personal, self.mask) if self.personal else global_vars

    def eval_client(self, inp, global_vars, x, labels):
        variables = self.client_model(global_vars, inp["personal"])
        return evaluate_row(self.model, variables, x, labels, inp["table"])

    def evaluate(self, state: FLState, fed: FederatedData, mapper: Mapper) -> dict:
        """Global accuracy on the server test set, and each client's accuracy on its own test
        split with its own model (the global model where nothing is personal)."""
        out = {}
        test = fed.roles["test"]
        if self.has_global_model:
            g = evaluate_indices(
                self.global_eval_model,
                state.global_vars,
                fed.x,
                fed.eval_y,
                fed.server["test_global"],
                self.eval_batch,
            )
            out["global_acc"], out["global_loss"] = g["accuracy"], g["loss"]
        if not self.personal and fed.test_in_global:
            # Every client holds the global model: reuse its per-example results.
            full = jnp.zeros(fed.x.shape[0], bool).at[fed.server["test_global"]].set(g["correct"])
            r = {"correct": jnp.sum(full[test.idx] & test.mask, axis=1), "count": test.count}
        else:
            xs = {"table": test, "personal": state.client_vars}
            r = mapper(self.eval_client, xs, state.global_vars, fed.x, fed.eval_y)
        has = r["count"] > 0
        acc = r["correct"] / jnp.maximum(r["count"], 1)
        out["personal_acc"] = jnp.sum(jnp.where(has, acc, 0.0)) / jnp.maximum(jnp.sum(has), 1)
        out["client_acc"] = acc
        out["accuracy"] = out["global_acc"] if self.has_global_model else out["personal_acc"]
        return out


def _check(cfg: AlgorithmConfig, name: str, **required) -> None:
    for key, (ok, allowed) in required.items():
        value = getattr(cfg, key)
        if not ok(value):
            raise bad(f"algorithm.{key}", value, f"{allowed} for algorithm {name}")


@register("fedavg")
def fedavg(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg", **kw)


@register("fedavg_sl")
def fedavg_sl(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
    return FedAvgFamily(cfg, name="fedavg_sl", primary="train", oracle=True, **kw)


@register("fedprox")
def fedprox(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
    _check(cfg, "fedprox", prox_mu=(lambda v: v > 0, "a number > 0"))
    return FedAvgFamily(cfg, name="fedprox", **kw)


@register("fedavg_pl")
def fedavg_pl(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
    _check(cfg, "fedavg_pl", pl_weight=(lambda v: v > 0, "a number > 0"))
    return FedAvgFamily(cfg, name="fedavg_pl", pseudo_labels=True, **kw)


def _fixmatch(name: str, shared: str, prox: bool):
    """FixMatch local training on D^s / D^u with FedAvg, FedProx or a shared-leaf mask."""

    def factory(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
        req = {
            "shared": (lambda v: v == shared, f"{shared!r}"),
            "pl_weight": (lambda v: v > 0, "a number > 0"),
        }
        if prox:
            req["prox_mu"] = (lambda v: v > 0, "a number > 0")
        _check(cfg, name, **req)
        return FedAvgFamily(cfg, name=name, pseudo_labels=True, fixmatch=True, **kw)

    register(name)(factory)


# The semi-supervised baselines of UM-pFSSL's Table 1 (spec section 4): one mechanism, knobs.
_fixmatch("fixavg", "all", prox=False)
_fixmatch("fixprox", "all", prox=True)
_fixmatch("fixbn", "fedbn", prox=False)
_fixmatch("fedper", "fedper", prox=False)
_fixmatch("lg_fedavg", "lg", prox=False)


def _supervised(name: str, shared: str, prox: bool):
    """FedAvg on every training label with a proximal term or a shared-leaf mask."""

    def factory(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
        req = {"shared": (lambda v: v == shared, f"{shared!r}")}
        if prox:
            req["prox_mu"] = (lambda v: v > 0, "a number > 0")
        _check(cfg, name, **req)
        return FedAvgFamily(cfg, name=name, primary="train", oracle=True, **kw)

    register(name)(factory)


_supervised("fedprox_sl", "all", prox=True)
_supervised("fedbn_sl", "fedbn", prox=False)


@register("local")
def local(cfg: AlgorithmConfig, **kw) -> FedAvgFamily:
    _check(cfg, "local", shared=(lambda v: v == "none", "'none' (nothing is communicated)"))
    return FedAvgFamily(cfg, name="local", **kw)
