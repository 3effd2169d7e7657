"""FedOpt: FedAvg's clients, an adaptive server optimizer (Reddi et al. 2021, "Adaptive
Federated Optimization", Algorithm 2), written as one round:

    each round t:
        S = sample |S| clients                                          (line 3)
        for i in S in parallel, from x_t: local SGD -> x_i; Δ_i = x_i - x_t   (lines 4-7)
        Δ_t = mean_S Δ_i                                                (line 8)
        x_{t+1} = ServerOpt(x_t, -Δ_t, η, β1, β2, τ)                    (lines 9-11)

`algorithm.server_optimizer`: sgd (x + η Δ; η = 1 is FedAvg) | adam (FedAdam) | yogi (FedYogi)
| adagrad (FedAdagrad), the paper's moment rules without bias correction, from m = 0, v = τ²
(`engine.aggregate.scale_by_fedopt`). The optimizer steps the params; other collections
(BatchNorm statistics) take the plain mean, x + Δ. `fedadam`, `fedyogi`, `fedadagrad` are
FedOpt with that optimizer; `fedopt` takes any.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fedjax_semi.algorithms.base import (
    ClientTable,
    Mapper,
    Method,
    RoundShared,
    cohort_metrics,
    register,
)
from fedjax_semi.algorithms.fedavg import WEIGHTINGS, GlobalEvaluation
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.aggregate import SERVER_OPTIMIZERS
from fedjax_semi.engine.clients import Clients
from fedjax_semi.engine.keys import DROPOUT, INIT, SAMPLE, client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.errors import bad

# The names that fix the server optimizer (`fedopt` takes any of SERVER_OPTIMIZERS).
RULES = {"fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad"}


@dataclasses.dataclass
class FedOptConfig(AlgorithmConfig):
    """FedOpt's knobs: the shared local-training ones and the server optimizer's."""

    name: str = "fedopt"
    server_optimizer: str = "adam"  # sgd | adam | yogi | adagrad
    server_lr: float = 0.01  # η
    server_beta1: float = 0.9  # β1 (the paper fixes 0.9)
    server_beta2: float = 0.99  # β2 (the paper fixes 0.99; adam and yogi)
    server_tau: float = 1e-3  # τ, the adaptivity (optax's eps); v starts at τ²
    # How the server averages the uploads: uniform (the paper's mean over S; clients without
    # data count neither way) | num_samples (FedAvg's n_i weights).
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        rule = RULES.get(self.name)
        if self.server_optimizer not in SERVER_OPTIMIZERS:
            allowed = f"one of {list(SERVER_OPTIMIZERS)}"
            raise bad("algorithm.server_optimizer", self.server_optimizer, allowed)
        if rule is not None and self.server_optimizer != rule:
            allowed = f"{rule!r} for algorithm {self.name} (algorithm=fedopt takes any)"
            raise bad("algorithm.server_optimizer", self.server_optimizer, allowed)
        if not self.server_lr > 0:
            raise bad("algorithm.server_lr", self.server_lr, "a number > 0")
        for key in ("server_beta1", "server_beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise bad(f"algorithm.{key}", getattr(self, key), "a number in [0, 1)")
        if not self.server_tau > 0:
            raise bad("algorithm.server_tau", self.server_tau, "a number > 0")
        if self.weighting not in WEIGHTINGS:
            raise bad("algorithm.weighting", self.weighting, f"one of {list(WEIGHTINGS)}")


@struct.dataclass
class FedOptState:
    """round: int32 [] rounds done; x: the server model's variables; opt: the server
    optimizer's state (of x's params); sim_time: float32 [] (not advanced here)."""

    round: jax.Array
    x: PyTree
    opt: PyTree
    sim_time: jax.Array


@struct.dataclass
class FedOptUpload:
    """A client's trained model x_i, its weight in the mean, and local_train's stats."""

    x: PyTree
    weight: jax.Array
    stats: dict


@dataclasses.dataclass
class FedOpt(Method):
    cfg: FedOptConfig
    name: str = "fedopt"
    roles: tuple[str, ...] = ("labeled", "unlabeled", "test")
    oracle: bool = False
    has_global_model: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.server_tx: optax.GradientTransformation = aggregate.server_optimizer(
            c.server_optimizer, c.server_lr, c.server_beta1, c.server_beta2, c.server_tau
        )
        self.evaluation = GlobalEvaluation(self.model, self.eval_batch)

    def init(self, key: jax.Array, fed: FederatedData) -> FedOptState:
        x = self.model.init(client_key(key, INIT, 0, 0))  # FedAvg's initial model
        return FedOptState(
            round=jnp.zeros((), jnp.int32),
            x=x,
            opt=self.server_tx.init(x["params"]),
            sim_time=jnp.zeros((), jnp.float32),
        )

    def round(
        self,
        state: FedOptState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[FedOptState, dict]:
        cohort = self.sample_cohort(key, state.round)  # line 3
        rows = ClientTable(cohort, data.roles["labeled"].take(cohort))
        shared = RoundShared(state.x, data.x, data.y, state.round, key)
        up = clients.map(self.client_update, rows, shared)  # lines 4-7
        return clients.server(self.server_update)(state, cohort, up)  # lines 8-11

    def client_update(self, row: ClientTable, shared: RoundShared) -> FedOptUpload:
        x_i, _, stats = self.train_client(shared.models, row.table, shared, row.id, SAMPLE, DROPOUT)
        count = row.table.count
        weight = count if self.cfg.weighting == "num_samples" else (count > 0)
        return FedOptUpload(x=x_i, weight=weight.astype(jnp.float32), stats=stats)

    def server_update(
        self, state: FedOptState, cohort: jax.Array, up: FedOptUpload
    ) -> tuple[FedOptState, dict]:
        delta = aggregate.mean_delta(state.x, up.x, up.weight)  # Δ_t (line 8)
        step, opt = self.server_tx.update(  # lines 9-11, on the pseudo-gradient -Δ_t
            jax.tree.map(jnp.negative, delta["params"]), state.opt, state.x["params"]
        )
        x = jax.tree.map(jnp.add, state.x, delta)  # the other collections: x + Δ
        x["params"] = optax.apply_updates(state.x["params"], step)
        # A round in which no client had data leaves x and the moments as they were.
        any_data = jnp.sum(up.weight) > 0
        x, opt = jax.tree.map(
            lambda new, old: jnp.where(any_data, new, old), (x, opt), (state.x, state.opt)
        )
        new = state.replace(round=state.round + 1, x=x, opt=opt)
        return new, cohort_metrics(cohort, up.stats, up.x)

    def evaluate(self, state: FedOptState, fed: FederatedData, mapper: Mapper) -> dict:
        return self.evaluation(state.x, fed, mapper)


def _fedopt(name: str) -> None:
    """FedOpt registered as `name` (its server optimizer: RULES, checked by the config)."""

    def factory(cfg: FedOptConfig, **kw) -> FedOpt:
        return FedOpt(cfg, name=name, **kw)

    register(name, FedOptConfig)(factory)


for _name in ("fedopt", *RULES):
    _fedopt(_name)
