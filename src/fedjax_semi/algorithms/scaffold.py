"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", Algorithm 1 with option II control variates), written as one round:

    server: model x, control c; client i: control c_i (all zero at the start)
    each round:
        S = sample |S| of the N clients                                     (line 3)
        for i in S in parallel, from y_i = x:                               (lines 4-5)
            K steps  y_i <- y_i - η_l (g_i(y_i) - c_i + c)                  (lines 6-9)
            c_i+ = c_i - c + (x - y_i) / (K η_l)                            (line 12, option II)
            upload (Δy_i, Δc_i) = (y_i - x, c_i+ - c_i);  c_i <- c_i+       (lines 13-14)
        x <- x + η_g mean_S Δy_i;   c <- c + |S|/N mean_S Δc_i              (lines 16-17)

The corrected step runs in the shared local trainer (`engine.train.local_train`): the local loss
gets the term ⟨c - c_i, y - sg(y)⟩ (sg: stop-gradient), whose value is 0 and whose gradient is
c - c_i, so each optimizer step sees g_i(y) - c_i + c and the logged loss stays the data loss.
Only `algorithm.optimizer=sgd` is allowed (option II's (x - y_i) / (K η_l) is the mean corrected
gradient of K plain SGD steps; Adam's rescaling would break it). Weight decay adds wd·y to the
gradient after the correction, the same term on every client (it cancels in c - c_i); with
momentum the corrected gradients pass through the momentum buffer and option II estimates the
mean step per η_l instead (the paper's box has neither). K is the number of steps the client
actually took; a client without data keeps its c_i and uploads Δy = Δc = 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import Mapper, Method, RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.fedavg import WEIGHTINGS, GlobalEvaluation
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import Clients, broadcast, gather, scatter
from fedjax_semi.engine.keys import DROPOUT, INIT, SAMPLE, client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.errors import bad


@dataclasses.dataclass
class ScaffoldConfig(AlgorithmConfig):
    """SCAFFOLD's knobs: the shared local-training ones, η_g and the mean over the cohort."""

    name: str = "scaffold"
    server_lr: float = 1.0  # η_g, the global step size (Alg. 1 line 16)
    # How the server averages Δy_i: uniform (the paper's mean over S; clients without data
    # count neither way) | num_samples (FedAvg's n_i weights). c always takes |S|/N mean Δc_i.
    weighting: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.server_lr > 0:
            raise bad("algorithm.server_lr", self.server_lr, "a number > 0")
        if self.weighting not in WEIGHTINGS:
            raise bad("algorithm.weighting", self.weighting, f"one of {list(WEIGHTINGS)}")
        if self.optimizer != "sgd":
            raise bad(
                "algorithm.optimizer",
                self.optimizer,
                "'sgd' for algorithm scaffold (option II's control variates assume SGD steps)",
            )


@struct.dataclass
class ScaffoldState:
    """What SCAFFOLD carries from round to round. c and c_i have the shapes of x's params.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock (not advanced here).
    x: the server model's variables; c: the server control; c_i: every client's control [N, ...].
    """

    round: jax.Array
    x: PyTree
    c: PyTree
    c_i: PyTree
    sim_time: jax.Array


@struct.dataclass
class ScaffoldClient:
    """One row per cohort client [S, ...]: its id, its labeled table and its control c_i."""

    id: jax.Array
    table: RoleTable
    c_i: PyTree


@struct.dataclass
class ScaffoldUpload:
    """What a client sends back (line 13) and keeps (line 14), and local_train's stats."""

    dy: PyTree  # Δy_i = y_i - x, all of x's variables
    dc: PyTree  # Δc_i = c_i+ - c_i
    c_plus: PyTree  # c_i+
    weight: jax.Array  # float32 []: its weight in the mean of Δy
    stats: dict  # loss, steps (K), pl_rate


@dataclasses.dataclass(frozen=True)
class ControlledLoss:
    """The local loss plus ⟨correction, y - sg(y)⟩: value 0, gradient `correction` (c - c_i)."""

    base: Any  # an engine.train objective: (params, state, batch, rng, anchor, pl_on) -> ...
    correction: PyTree

    def __call__(
        self,
        params: PyTree,
        model_state: dict[str, Any],
        batch: dict,
        rng: jax.Array,
        anchor: PyTree,
        pl_on: jax.Array | bool,
    ) -> tuple[jax.Array, tuple[dict[str, Any], dict[str, jax.Array]]]:
        loss, aux = self.base(params, model_state, batch, rng, anchor, pl_on)
        pairs = zip(jax.tree.leaves(self.correction), jax.tree.leaves(params), strict=True)
        linear = sum(jnp.vdot(d, p - jax.lax.stop_gradient(p)) for d, p in pairs)
        return loss + linear, aux


@dataclasses.dataclass
class Scaffold(Method):
    cfg: ScaffoldConfig
    name: str = "scaffold"
    roles: tuple[str, ...] = ("labeled", "unlabeled", "test")
    oracle: bool = False
    has_global_model: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.evaluation = GlobalEvaluation(self.model, self.eval_batch)

    def init(self, key: jax.Array, fed: FederatedData) -> ScaffoldState:
        x = self.model.init(client_key(key, INIT, 0, 0))  # FedAvg's initial model
        c = jax.tree.map(jnp.zeros_like, x["params"])
        return ScaffoldState(
            round=jnp.zeros((), jnp.int32),
            x=x,
            c=c,
            c_i=broadcast(c, self.num_clients),
            sim_time=jnp.zeros((), jnp.float32),
        )

    def round(
        self,
        state: ScaffoldState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[ScaffoldState, dict]:
        """One round of Algorithm 1, top-down: sample S, gather the cohort's c_i, send x and c,
        map the clients, aggregate and update x and c, scatter the new c_i."""
        cohort = self.sample_cohort(key, state.round)  # line 3
        table = data.roles["labeled"].take(cohort)
        rows = ScaffoldClient(cohort, table, gather(state.c_i, cohort))
        shared = RoundShared(state.x, data.x, data.y, state.round, key)  # line 5: x (and c)
        up = clients.map(self.client_update, rows, shared, state.c)  # lines 4-14
        return clients.server(self.server_update)(state, cohort, up)  # lines 16-17

    def client_update(self, row: ScaffoldClient, shared: RoundShared, c: PyTree) -> ScaffoldUpload:
        """Lines 5-13 for one client: K corrected SGD steps from y_i = x, then option II."""
        x = shared.models
        correction = jax.tree.map(jnp.subtract, c, row.c_i)  # c - c_i
        y, _, stats = self.train_client(
            x,
            row.table,
            shared,
            row.id,
            SAMPLE,
            DROPOUT,
            objective=ControlledLoss(self.objective, correction),
        )
        k = stats["steps"]  # K, the steps taken
        scale = 1.0 / (jnp.maximum(k, 1).astype(jnp.float32) * self.cfg.lr)

        def option_ii(ci, c, xp, yp):  # line 12
            return jnp.where(k > 0, ci - c + (xp - yp) * scale, ci)

        c_plus = jax.tree.map(option_ii, row.c_i, c, x["params"], y["params"])
        count = row.table.count
        weight = count if self.cfg.weighting == "num_samples" else (count > 0)
        return ScaffoldUpload(
            dy=jax.tree.map(jnp.subtract, y, x),
            dc=jax.tree.map(jnp.subtract, c_plus, row.c_i),
            c_plus=c_plus,
            weight=weight.astype(jnp.float32),
            stats=stats,
        )

    def server_update(
        self, state: ScaffoldState, cohort: jax.Array, up: ScaffoldUpload
    ) -> tuple[ScaffoldState, dict]:
        """Lines 16-17, and line 14's c_i <- c_i+ for the cohort; the round's metrics."""
        eta_g, n = self.cfg.server_lr, self.num_clients
        dy = aggregate.weighted_mean(up.dy, up.weight)  # zero when no client had data
        x = jax.tree.map(lambda x, d: x + eta_g * d, state.x, dy)  # line 16
        c = jax.tree.map(lambda c, d: c + jnp.sum(d, 0) / n, state.c, up.dc)  # line 17
        new = state.replace(
            round=state.round + 1, x=x, c=c, c_i=scatter(state.c_i, cohort, up.c_plus)
        )
        metrics = cohort_metrics(cohort, up.stats, {"dy": up.dy, "c_plus": up.c_plus})
        return new, metrics

    def evaluate(self, state: ScaffoldState, fed: FederatedData, mapper: Mapper) -> dict:
        """The FedAvg family's evaluation of a global model, on x."""
        return self.evaluation(state.x, fed, mapper)


@register("scaffold", ScaffoldConfig)
def scaffold(cfg: ScaffoldConfig, **kw: Any) -> Scaffold:
    return Scaffold(cfg, **kw)
