"""The algorithm interface and the registry.

A method is `init(key, fed) -> state` and a round, `round(state, data, key, clients, flags)
-> (state, metrics)`, pure and jittable: the server's code reads top-down like the paper's
algorithm box (select, broadcast, map the clients, aggregate, update), and `clients`
(`engine.clients.Clients`) maps the per-client work, chunked and sharded inside one compiled
round, or as a loop of per-client jitted calls in the reference backend. Every random draw
derives from the run's key, passed in as an argument (never held by the method). `flags` are
the round's static switches (`round_flags(t)`), compiled as static arguments.

Each method keeps its own typed state (a flax.struct dataclass with fields named like its
paper's symbols, at least `round` and `sim_time`, the two the engine reads).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_semi.algorithms.registry import (  # noqa: F401  (re-exported: the registry)
    ALGORITHM_CONFIGS,
    ALGORITHMS,
    algorithm_names,
    check_config_class,
    make_algorithm,
    register,
)
from fedjax_semi.config import AlgorithmConfig, SystemsConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients, select_cohort
from fedjax_semi.engine.keys import client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.state import State
from fedjax_semi.engine.train import LocalObjective, Schedule, local_train, make_optimizer
from fedjax_semi.models.zoo import Model
from fedjax_semi.systems import wireless
from fedjax_semi.systems.compute import Compute
from fedjax_semi.systems.uplink import Uplink

Mapper = Callable[..., PyTree]  # mapper(fn, xs, *shared) -> stacked outputs

# A key's shape for jax.eval_shape of a model's init: no value is drawn, and no array is made at
# import (an array would start XLA's backend before a caller could set XLA_FLAGS).
SHAPE_KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)


class Algorithm(Protocol):
    name: str
    roles: tuple[str, ...]
    oracle: bool  # reads the labels of unlabeled data (fully supervised references only)
    has_global_model: bool
    mechanism_metrics: tuple[str, ...]  # row keys summary.json keeps as "mechanism"

    def init(self, key: jax.Array, fed: FederatedData) -> State: ...

    def round(
        self, state: State, data: TrainView, key: jax.Array, clients: Clients, flags: tuple
    ) -> tuple[State, dict]: ...

    def round_flags(self, t: int) -> tuple: ...

    def evaluate(self, state: State, fed: FederatedData, mapper: Mapper) -> dict: ...


class Capabilities:
    """The optional parts of a round, declared by every method (the engine never probes for
    them). The defaults are a method without them; a method that has one overrides it.

    has_warmup: `warmup(state, data, mapper, key)` runs once before round 1.
    round_flags(t): hashable per-round switches of round t, compiled as static arguments.
    stop_reason(row): the method's own stop rule, read by the run loop (engine.loop.StopRules)
        on each round's row of one replica: why that replica ends now, or None to go on.
    loop_hooks(): extra run-loop hooks (engine.loop.Hook) the method's experiments need, run
        before the checkpointer.
    mechanism_metrics: row keys that show the method's mechanism acting (none by default).
    """

    has_warmup: ClassVar[bool] = False
    # Names of row keys that show the method's own mechanism acting (e.g. a clustering's
    # agreement with the true groups); summary.json keeps their final values in its "mechanism"
    # block and fedjax-semi-report prints them (docs/gates.md).
    mechanism_metrics: ClassVar[tuple[str, ...]] = ()
    # Labels the round reports for unlabeled rows (beside `pl_index` [S, N]) -> the row key of
    # their accuracy, scored on the host after the round against the hidden labels, which
    # training never reads (engine.loop.pseudo_label_accuracy).
    label_scores: ClassVar[dict[str, str]] = {"pl_label": "pl_acc"}

    def warmup(self, state: State, data: TrainView, mapper: Mapper, key: jax.Array) -> State:
        raise NotImplementedError(f"{type(self).__name__} declares no warm-up")

    def round_flags(self, t: int) -> tuple:
        return ()

    def stop_reason(self, row: dict) -> str | None:
        return None

    def loop_hooks(self) -> list:
        return []

    def sample_cohort(self, key: jax.Array, rnd: jax.Array) -> jax.Array:
        """Round `rnd`'s cohort: `select_cohort` with the method's sizes and
        `cfg.cohort_sampler`. int32 [S]."""
        n, s = self.num_clients, self.clients_per_round  # type: ignore[attr-defined]
        return select_cohort(key, rnd, n, s, self.cfg.cohort_sampler)  # type: ignore[attr-defined]


@struct.dataclass
class RoundShared:
    """What every client of a round reads (the `shared` of `clients.map`).

    models: the server's models the clients read: the global model, or the pool of uploads
        (leaves [N, ...]) clients download from.
    x [D, ...], y [D]: the inputs and labels the clients' role tables index.
    round: the round t (int32 []); key: the run's key (each client folds in its purpose).
    versions: int32 [N] the round each pooled model was uploaded in, where a method keeps it.
    """

    models: PyTree
    x: jax.Array
    y: jax.Array
    round: jax.Array
    key: jax.Array
    versions: jax.Array | None = None


@struct.dataclass
class ClientTable:
    """One row per client [S] of `clients.map`: its id and the table it trains on."""

    id: jax.Array
    table: RoleTable


@dataclasses.dataclass
class Method(Capabilities):
    """What every method is built from: the fields each factory receives, the local trainer's
    optimizer, schedule and objective from the shared knobs (`engine.train.local_train` runs
    them), and the model's size on the simulated clock (`systems`: its uplink and compute
    models). A method extends it, narrowing `cfg` to its own config class, and calls
    `super().__post_init__()` first."""

    cfg: AlgorithmConfig
    model: Model
    num_clients: int
    clients_per_round: int
    data_seed: int = 0  # host-side draws of the data (the server pools); most methods: unused
    eval_batch: int = 1000
    systems: SystemsConfig = dataclasses.field(default_factory=SystemsConfig)

    def __post_init__(self) -> None:
        c = self.cfg
        # The local trainer's parts from the shared knobs (a method may replace the objective).
        self.tx = make_optimizer(c.optimizer, c.lr, c.momentum, c.weight_decay)
        self.schedule = Schedule(c.batch_size, c.local_epochs, c.local_steps)
        self.objective = LocalObjective(self.model)  # cross-entropy on the labeled batch
        self.template = jax.eval_shape(self.model.init, SHAPE_KEY)  # shapes only
        self.model_mb = wireless.model_size_mb(wireless.param_count(self.template["params"]))
        self.uplink = Uplink.from_config(self.systems, self.model_mb)
        self.compute = Compute.from_config(self.systems)

    def with_hyperparameters(self, values: Mapping[str, jax.Array]) -> Method:
        """This method with `values` in place of its config's keys: inside a compiled round,
        traced scalars, so one program serves every value of a sweep (the vectorized launcher's
        run axis). The parts built from the config (optimizers, objectives) are built again from
        them; the config's own checks ran on the values already. Keys: `cfg.traceable`."""
        extra = sorted(set(values) - set(self.cfg.traceable))
        if extra:
            raise ValueError(
                f"algorithm.{extra[0]} cannot vary inside one compiled {self.cfg.name} program: "
                f"the traceable keys are {list(self.cfg.traceable)}"
            )
        cfg = copy.copy(self.cfg)
        for k, v in values.items():
            object.__setattr__(cfg, k, v)
        alg = copy.copy(self)
        alg.cfg = cfg
        alg.__post_init__()
        return alg

    def train_client(
        self,
        variables: PyTree,
        table: RoleTable,
        shared: RoundShared,
        client: jax.Array,
        sample: int,
        dropout: int,
        *,
        rnd: jax.Array | int | None = None,
        opt_state: PyTree | None = None,
        tx: optax.GradientTransformation | None = None,
        schedule: Schedule | None = None,
        objective: Any = None,
        **kw: Any,
    ) -> tuple[PyTree, PyTree, dict]:
        """`local_train` of one client from `variables` on `table` (rows of shared.x, shared.y):
        the method's objective, optimizer (a fresh state unless `opt_state`) and schedule, and
        the keys client_key(shared.key, purpose, rnd, client) of the `sample` (batches) and
        `dropout` purposes (rnd defaults to shared.round). `tx`, `schedule` and `objective` replace
        the method's (DoFed-SPP's student, HeteroAda's per-depth exits); other keywords go to
        `local_train`.
        -> (variables, optimizer state, stats)."""
        tx = self.tx if tx is None else tx
        opt = tx.init(variables["params"]) if opt_state is None else opt_state
        t = shared.round if rnd is None else rnd
        return local_train(
            self.objective if objective is None else objective,
            tx,
            variables,
            opt,
            shared.x,
            shared.y,
            table,
            self.schedule if schedule is None else schedule,
            client_key(shared.key, sample, t, client),
            client_key(shared.key, dropout, t, client),
            **kw,
        )


def clients_finite(stacked: PyTree) -> jax.Array:
    """bool [S]: every leaf of each client's tree is finite."""
    per_leaf = [
        jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1) for a in jax.tree.leaves(stacked)
    ]
    return jnp.all(jnp.stack(per_leaf), axis=0)


def cohort_metrics(cohort: jax.Array, out: dict, models: PyTree) -> dict:
    """The per-round metrics every algorithm reports: the cohort, each client's loss and
    finiteness (for the NaN guard), the step-weighted mean training loss and mean step count."""
    steps = out["steps"].astype(jnp.float32)
    return {
        "cohort": cohort,
        "client_loss": out["loss"],
        "client_finite": clients_finite(models) & jnp.isfinite(out["loss"]),
        "train_loss": jnp.sum(out["loss"] * steps) / jnp.maximum(jnp.sum(steps), 1.0),
        "local_steps": jnp.mean(steps),
    }


def client_accuracy(result: dict) -> tuple[jax.Array, jax.Array]:
    """Per-client accuracy [C] from summed `correct` / `count` [C], and its mean over the
    clients that hold any example (clients with none count neither way)."""
    has = result["count"] > 0
    acc = result["correct"] / jnp.maximum(result["count"], 1)
    return acc, jnp.sum(jnp.where(has, acc, 0.0)) / jnp.maximum(jnp.sum(has), 1)


def sanity(result: dict, prefix: str = "") -> dict:
    """The columns of an evaluation row that show a broken model (docs/gates.md), from the
    `engine.train.logit_stats` sums of the evaluated model(s): per client [C, ...] (each
    client's model on its own rows) or of one model on one set (no client axis).

    pred_top_share: the share of a model's predictions in its most-predicted class, averaged
        over the clients holding rows (pred_top_share_max: the largest); label_top_share: the
        same for the true labels, so a skewed test split can be told from a collapse;
    pred_entropy: mean predictive entropy (nats) over all rows; max_logit: mean max |logit|;
    num_classes: K, so a report knows chance (1/K). NaN where no row was evaluated.
    """
    count = jnp.reshape(result["count"], (-1,))
    k = result["pred_hist"].shape[-1]
    has = count > 0
    n = jnp.maximum(count, 1).astype(jnp.float32)
    clients = jnp.sum(has)
    rows = jnp.sum(count).astype(jnp.float32)

    def share(hist):  # [C]: each client's largest class count over its rows
        return jnp.max(jnp.reshape(hist, (-1, k)), -1) / n

    def over_clients(v):
        return jnp.where(clients > 0, jnp.sum(jnp.where(has, v, 0.0)) / clients, jnp.nan)

    top = share(result["pred_hist"])
    out = {
        "pred_top_share": over_clients(top),
        "pred_top_share_max": jnp.where(clients > 0, jnp.max(jnp.where(has, top, 0.0)), jnp.nan),
        "label_top_share": over_clients(share(result["label_hist"])),
        "pred_entropy": jnp.where(rows > 0, jnp.sum(result["entropy"]) / rows, jnp.nan),
        "max_logit": jnp.where(rows > 0, jnp.sum(result["max_logit"]) / rows, jnp.nan),
    }
    out = {prefix + key: v for key, v in out.items()}
    out["num_classes"] = jnp.asarray(k, jnp.int32)
    return out


def concat_clients(results: Sequence[dict]) -> dict:
    """Per-client results of several model groups (a tuple of dicts [Cg, ...]) as one [C, ...]
    dict, in group order (enough for `sanity`, which does not depend on the order)."""
    return jax.tree.map(lambda *a: jnp.concatenate(a), *results)
