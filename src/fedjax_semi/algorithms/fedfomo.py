"""FedFomo: personalized FL by first-order model optimization (Zhang et al., ICLR 2021), as the
baseline of DoFed-SPP (its Sec. 6.1; our details: docs/choices.md: DoFed-SPP, the baselines'
details).

Every client keeps one personalized model theta_n; the server stores each client's latest
upload and an affinity matrix P [N, N]. Because a client uploads the model it keeps, the store
is `client_vars` itself plus a mask of who has uploaded.

    for t = 1..rounds:
      S = clients_per_round clients, uniformly                                 (prepare)
      eps_t = max(eps - (t - 1) * decay, 0)
      ids[n] = M peers: top-M of P[n] or, with probability eps_t, M at random
      for n in S in parallel:                                                   (client_update)
        l_m = l_n(theta_m) on D_lab for the downloaded m; l_0 = l_n(theta_n)
        w_m = max(l_0 - l_m, 0) / ||theta_m - theta_n||, normalized            (Eq. 19 kernel,
        theta_n <- theta_n + sum_m w_m (theta_m - theta_n)  (all w = 0: keep)   G1 = G2 = 0,
        theta_n <- local SGD on D_train + D_lab                                 gamma = 1)
      upload theta_n, n in S; P[n, ids[n]] += raw w; clock += compute + uploads  (finish)

The weights, the affinity update and the epsilon-greedy downloads are the kernels of
`kernels.fedfomo_weights` (the weights are `kernels.similarity`'s Eq. 19 kernel). Validation data is
the labeled target set D_lab, so the personalization aims at the client's target distribution; D_unl
is never trained on. A client is scored with its personalized model, on its target test split
(classification) and on D_unl (labeling, as DoFed-SPP's Sec. 6.2 says of its baselines). A peer that
has never uploaded cannot be downloaded (its slot is invalid), so round 1 is local training for
everyone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

from fedjax_semi.algorithms import dofed_baselines as common
from fedjax_semi.algorithms.base import (
    FLState,
    Mapper,
    RoundShared,
    cohort_metrics,
    register,
)
from fedjax_semi.algorithms.dofed_task import TargetTaskMethod, data_roles
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import broadcast, gather, scatter
from fedjax_semi.engine.keys import DOWNLOAD, INIT, client_key, round_key
from fedjax_semi.engine.keys import FEDFOMO_DROPOUT as DROPOUT
from fedjax_semi.engine.keys import FEDFOMO_SAMPLE as SAMPLE
from fedjax_semi.engine.train import (
    evaluate_row,
)
from fedjax_semi.errors import bad
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.kernels import similarity as sim
from fedjax_semi.systems import wireless

PyTree = Any

AFFINITY = ("raw", "normalized")


@dataclasses.dataclass
class FedFomoConfig(AlgorithmConfig):
    """FedFomo (Zhang et al. 2021) as DoFed-SPP's baseline; its local training reuses lr,
    local_epochs, batch_size, optimizer and momentum; the clock is `systems`'. M and epsilon are
    our choices (the paper's appendix with them is not public; epsilon from FedFomo's code)."""

    name: str = "fedfomo"
    fedfomo_m: int = 10  # M peer models each participating client downloads
    fedfomo_epsilon: float = 0.3  # epsilon-greedy exploration of the downloads in round 1
    fedfomo_epsilon_decay: float = 0.05  # epsilon_t = max(epsilon - (t - 1) * decay, 0)
    fedfomo_affinity: str = "raw"  # P[n, m] += raw (unclipped) | normalized (clipped) weights
    sr_eps: float = 1e-8  # floor of the loss-per-distance weights' distances

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self
        if c.local_epochs < 1:
            raise bad("algorithm.local_epochs", c.local_epochs, "an integer >= 1 for fedfomo")
        m = c.fedfomo_m
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise bad("algorithm.fedfomo_m", m, "an integer >= 1")
        if not 0 <= c.fedfomo_epsilon <= 1:
            raise bad("algorithm.fedfomo_epsilon", c.fedfomo_epsilon, "a probability in [0, 1]")
        if not c.fedfomo_epsilon_decay >= 0:
            raise bad("algorithm.fedfomo_epsilon_decay", c.fedfomo_epsilon_decay, "a number >= 0")
        if c.fedfomo_affinity not in AFFINITY:
            raise bad("algorithm.fedfomo_affinity", c.fedfomo_affinity, f"one of {list(AFFINITY)}")
        if not c.sr_eps > 0:
            raise bad("algorithm.sr_eps", c.sr_eps, "a number > 0 (FedFomo's distance floor)")


def fomo_update(own: PyTree, models: PyTree, w: jax.Array) -> PyTree:
    """theta + sum_m w_m (theta_m - theta): own (one model), models (leaves [M, ...]), w [M].

    Every leaf moves (batch statistics too, as FedFomo's state_dict update). With all w = 0
    the result is `own` bit for bit (a degenerate row keeps its model).
    """

    def leaf(a, b):
        delta = b - a[None]
        return a + jnp.tensordot(w.astype(delta.dtype), delta, axes=1)

    return jax.tree.map(leaf, own, models)


def epsilon_at(t: jax.Array, epsilon: float, decay: float) -> jax.Array:
    """Exploration rate of round t (1-based): max(epsilon - (t - 1) * decay, 0) (FedFomo code)."""
    return jnp.maximum(epsilon - (t - 1).astype(jnp.float32) * decay, 0.0)


@struct.dataclass
class FomoInputs:
    """prepare -> client_update, one row per cohort client [S, ...]: its id and model, the ids
    [M] of the models it downloads and which of them are stored [M], its training table and
    its labeled target table D_lab."""

    id: jax.Array
    own: PyTree
    ids: jax.Array
    valid: jax.Array
    train: RoleTable
    lab: RoleTable


@struct.dataclass
class FomoPlan:
    """prepare -> finish: the clock's and labels' inputs, and each participant's downloads.

    ids: int32 [S, M] the models each participant downloads; valid: bool [S, M] stored ones;
    epsilon: float32 [] this round's exploration rate; n_lab: int32 [S] labeled rows scored.
    """

    target: common.TargetPlan
    ids: jax.Array
    valid: jax.Array
    epsilon: jax.Array
    n_lab: jax.Array


@dataclasses.dataclass
class FedFomo(TargetTaskMethod):
    cfg: FedFomoConfig
    name: str = "fedfomo"
    has_global_model: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.evaluator = common.client_evaluator(self.model, per_client=True)

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> FLState:
        """theta_n = one shared init; nobody has uploaded; P = 0."""
        common.check_roles(self.name, fed)
        n = self.num_clients
        theta0 = self.model.init(client_key(key, INIT, 0, 0))
        extra = {
            "uploaded": jnp.zeros((n,), bool),
            "affinity": jnp.zeros((n, n), jnp.float32),
            "comm": {"uploads": jnp.int32(0), "downloads": jnp.int32(0)},
            **self.uplink.init_state(key, n),
        }
        return FLState(
            round=jnp.zeros((), jnp.int32),
            global_vars={},  # no server model: the server only stores and relays uploads
            client_vars=broadcast(theta0, n),  # the personalized models = the store
            client_opt={},  # optimizer state restarts every round
            sim_time=jnp.zeros((), jnp.float32),
            extra=extra,
        )

    # ------------------------------------------------------------------ server: who, what

    def prepare(
        self, state: FLState, data: TrainView, key: jax.Array
    ) -> tuple[FomoPlan, dict, dict]:
        """Sample the participants, pick each one's M downloads by the affinity rule."""
        c, ex, t = self.cfg, state.extra, state.round + 1
        cohort = self.sample_cohort(key, state.round)
        eps = epsilon_at(t, c.fedfomo_epsilon, c.fedfomo_epsilon_decay)
        # Drawn for all N (the kernel masks row n's own id), then the participants' rows.
        ids = fw.fedfomo_choose_downloads(
            round_key(key, DOWNLOAD, t), ex["affinity"], c.fedfomo_m, eps
        )[cohort]  # [S, M]
        valid = ex["uploaded"][ids]  # only stored (uploaded) models can be downloaded
        roles = data_roles(data.roles)
        train = common.training_table(data.roles, c.baseline_train_data)
        lab = data.roles[roles.lab]
        inputs = FomoInputs(
            id=cohort,
            own=gather(state.client_vars, cohort),
            ids=ids,
            valid=valid,
            train=train.take(cohort),
            lab=lab.take(cohort),
        )
        shared = RoundShared(state.client_vars, data.x, data.y, t, key)
        plan = FomoPlan(
            target=common.TargetPlan(cohort, train.count[cohort], data.roles[roles.unl], data.x),
            ids=ids,
            valid=valid,
            epsilon=eps,
            n_lab=lab.count[cohort],
        )
        return plan, inputs, shared

    # ------------------------------------------------------------------ one participant

    def mean_loss(self, variables: PyTree, x: jax.Array, y: jax.Array, table: RoleTable):
        """l_n(theta): mean CE of one model on one client's D_lab row (0 if empty)."""
        r = evaluate_row(self.model, variables, x, y, table)
        return r["loss"] / jnp.maximum(r["count"], 1)

    def client_update(self, inp: FomoInputs, shared: RoundShared) -> dict:
        """First-order weights on D_lab, the personalized update, local training.

        inp: id [], own (one model), ids [M] int32, valid [M] bool, train [Dtr + Dl] and
        lab [Dl] (RoleTable rows); shared: store ([N] models), x, y (visible labels), round t.
        Returns the new model, the raw weights [M] (for the affinity), the normalized ones [M],
        whether every weight was 0, the losses and steps.
        """
        cid, x, y = inp.id, shared.x, shared.y
        own = inp.own
        models = gather(shared.models, inp.ids)  # [M] downloaded models

        loss_own = self.mean_loss(own, x, y, inp.lab)  # l_n(theta_n^prev)
        loss_m = jax.vmap(lambda v: self.mean_loss(v, x, y, inp.lab))(models)  # [M]
        flat_own = ravel_pytree(own["params"])[0].astype(jnp.float32)
        dist = sim.pairwise_distances(sim.flatten_clients(models["params"]), flat_own[None])
        args = (loss_m[None], loss_own[None], dist)  # one consumer row: [1, M], [1], [1, M]
        w, degenerate = fw.fedfomo_weights(*args, inp.valid[None], eps=self.cfg.sr_eps)
        raw = fw.fedfomo_raw_weights(*args, eps=self.cfg.sr_eps)

        mixed = fomo_update(own, models, w[0])
        new, _, stats = self.train_client(mixed, inp.train, shared, cid, SAMPLE, DROPOUT)
        return {
            "vars": new,
            "raw": raw[0],
            "w": w[0],
            "degenerate": degenerate[0],
            "val_loss": loss_own,
            "loss": stats["loss"],
            "steps": stats["steps"],
        }

    # ------------------------------------------------------------------ server: store, P, clock

    def finish(
        self, state: FLState, plan: FomoPlan, out: dict, key: jax.Array
    ) -> tuple[FLState, dict]:
        c, ex, n = self.cfg, state.extra, self.num_clients
        t, cohort = state.round + 1, plan.target.cohort
        client_vars = scatter(state.client_vars, cohort, out["vars"])  # upload = keep
        uploaded = ex["uploaded"].at[cohort].set(True)
        # P[n, ids[n]] += w over the participants' rows (others add nothing).
        w = out["raw"] if c.fedfomo_affinity == "raw" else out["w"]
        m = c.fedfomo_m
        rows_w = jnp.zeros((n, m), jnp.float32).at[cohort].set(w)
        rows_ids = jnp.zeros((n, m), jnp.int32).at[cohort].set(plan.ids)
        rows_valid = jnp.zeros((n, m), bool).at[cohort].set(plan.valid)
        affinity = fw.fedfomo_affinity_update(ex["affinity"], rows_w, rows_ids, rows_valid)

        chosen = jnp.zeros((n,), bool).at[cohort].set(True)
        t_up, per_upload = self.uplink.upload_time(key, chosen, t, ex)
        # Each participant scores its own model and M downloads on D_lab, then trains.
        t_comp = self.compute.slowest(plan.target.n_train, c.local_epochs, (m + 1) * plan.n_lab)
        downloads = jnp.sum(plan.valid).astype(jnp.int32)
        uploads = jnp.int32(cohort.shape[0])
        comm = {
            "uploads": ex["comm"]["uploads"] + uploads,
            "downloads": ex["comm"]["downloads"] + downloads,
        }
        # Labeling (DoFed-SPP Sec. 6.2): every client's personalized model predicts its D_unl.
        pl = common.predict_labels(
            self.model, client_vars, plan.target.x, plan.target.unl, per_client=True
        )
        metrics = cohort_metrics(cohort, out, out["vars"])
        metrics.update(
            epsilon=plan.epsilon,
            downloads=downloads,
            uploads=uploads,
            comm_uploads=comm["uploads"],
            comm_downloads=comm["downloads"],
            n_degenerate_rows=jnp.sum(out["degenerate"]).astype(jnp.int32),
            weight_max=jnp.mean(jnp.max(out["w"], axis=1)),
            # The participants' rows [S, M]: whom they downloaded, and the weights.
            download_ids=plan.ids,
            download_valid=plan.valid,
            fomo_weights=out["w"],
            fomo_raw_weights=out["raw"],
            val_loss=jnp.mean(out["val_loss"]),
            upload_time=t_up,
            upload_times=per_upload,
            compute_time=t_comp,
            pl_index=plan.target.unl.idx,
            pl_label=pl,
        )
        extra = dict(ex, uploaded=uploaded, affinity=affinity, comm=comm)
        new_state = state.replace(
            round=t,
            client_vars=client_vars,
            sim_time=wireless.advance_clock(state.sim_time, t_comp, t_up),
            extra=extra,
        )
        return new_state, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, state: FLState, fed: FederatedData, mapper: Mapper) -> dict:
        """Each personalized model on its client's target test split and D_unl (DoFed-SPP
        Sec. 6.1; docs/choices.md: DoFed-SPP, the test data)."""
        return common.evaluate_clients(self.evaluator, state, fed, mapper, per_client=True)


@register("fedfomo", FedFomoConfig)
def fedfomo(cfg: FedFomoConfig, **kw) -> FedFomo:
    """FedFomo; M must leave a peer to download: 1 <= fedfomo_m <= num_clients - 1."""
    n, m = kw["num_clients"], cfg.fedfomo_m
    if not m <= n - 1:
        raise bad("algorithm.fedfomo_m", m, f"an integer in [1, num_clients - 1 = {n - 1}]")
    return FedFomo(cfg, **kw)
