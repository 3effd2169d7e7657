"""FedFomo: personalized FL by first-order model optimization (Zhang et al., ICLR 2021), as the
baseline of DoFed-SPP (its Sec. 6.1; our details: docs/choices.md: DoFed-SPP, the baselines'
details).

Every client keeps one personalized model theta_n; the server stores each client's latest
upload and an affinity matrix P [N, N]. Because a client uploads the model it keeps, the store
is theta itself plus a mask of who has uploaded.

    for t = 1..rounds:                                                          (round)
      S = clients_per_round clients, uniformly
      eps_t = max(eps - (t - 1) * decay, 0)                                     (choose_downloads)
      ids[n] = M peers: top-M of P[n] or, with probability eps_t, M at random
      for n in S in parallel:                                                   (client_update)
        l_m = l_n(theta_m) on D_lab for the downloaded m; l_0 = l_n(theta_n)
        w_m = max(l_0 - l_m, 0) / ||theta_m - theta_n||, normalized            (Eq. 19 kernel,
        theta_n <- theta_n + sum_m w_m (theta_m - theta_n)  (all w = 0: keep)   G1 = G2 = 0,
        theta_n <- local SGD on D_train + D_lab                                 gamma = 1)
      upload theta_n, n in S; P[n, ids[n]] += raw w; clock += compute + uploads  (server_update)

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
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

from fedjax_semi.algorithms import dofed_baselines as common
from fedjax_semi.algorithms.base import RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.dofed_task import TargetTaskMethod, data_roles
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients, broadcast, gather, scatter
from fedjax_semi.engine.keys import DOWNLOAD, INIT, client_key, round_key
from fedjax_semi.engine.keys import FEDFOMO_DROPOUT as DROPOUT
from fedjax_semi.engine.keys import FEDFOMO_SAMPLE as SAMPLE
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import evaluate_row
from fedjax_semi.errors import bad
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.kernels import similarity as sim
from fedjax_semi.systems import wireless
from fedjax_semi.systems.uplink import UplinkState

AFFINITY = ("raw", "normalized")


@dataclasses.dataclass
class FedFomoConfig(AlgorithmConfig):
    """FedFomo (Zhang et al. 2021) as DoFed-SPP's baseline; its local training reuses lr,
    local_epochs, batch_size, optimizer and momentum; the clock is `systems`'. M and epsilon are
    our choices (the paper's appendix with them is not public; epsilon from FedFomo's code)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = ("lr", "sr_eps")

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
class FedFomoState:
    """What FedFomo carries from round to round.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock.
    theta: every client's personalized model theta_n, [N]-stacked variables; a client uploads
        the model it keeps, so theta is also the server's store of uploads.
    uploaded: bool [N] who has uploaded (only stored models can be downloaded).
    P: float32 [N, N] the affinity matrix (row n: how much n gained from each peer).
    comm: the models moved; clock: the uplink's fixed rates (shannon mode).
    The optimizer state restarts every round.
    """

    round: jax.Array
    theta: PyTree
    uploaded: jax.Array
    P: jax.Array
    comm: common.Traffic
    clock: UplinkState
    sim_time: jax.Array


@struct.dataclass
class FomoDownloads:
    """The server's choice of downloads for a round's participants.

    ids: int32 [S, M] the models each participant downloads; valid: bool [S, M] stored ones;
    epsilon: float32 [] this round's exploration rate.
    """

    ids: jax.Array
    valid: jax.Array
    epsilon: jax.Array


@struct.dataclass
class FomoClient:
    """One row per cohort client [S, ...]: its id and model theta_n, the ids [M] of the models
    it downloads and which of them are stored [M], its training table and its labeled target
    table D_lab."""

    id: jax.Array
    own: PyTree
    ids: jax.Array
    valid: jax.Array
    train: RoleTable
    lab: RoleTable


@struct.dataclass
class FomoUpload:
    """What one participant returns, stacked [S, ...] by the mapping.

    theta: its new model (its upload); raw [M]: the unclipped weights (for the affinity);
    w [M]: the clipped, normalized ones; degenerate: bool [] every weight was 0; val_loss:
    l_n(theta_n) on D_lab before the update; loss, steps: local training's mean loss and steps.
    """

    theta: PyTree
    raw: jax.Array
    w: jax.Array
    degenerate: jax.Array
    val_loss: jax.Array
    loss: jax.Array
    steps: jax.Array


@dataclasses.dataclass
class FedFomo(TargetTaskMethod):
    cfg: FedFomoConfig
    name: str = "fedfomo"
    has_global_model: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.evaluator = common.client_evaluator(self.model, per_client=True)

    def init(self, key: jax.Array, fed: FederatedData) -> FedFomoState:
        """theta_n = one shared init; nobody has uploaded; P = 0."""
        common.check_roles(self.name, fed)
        n = self.num_clients
        theta0 = self.model.init(client_key(key, INIT, 0, 0))
        return FedFomoState(
            round=jnp.zeros((), jnp.int32),
            theta=broadcast(theta0, n),
            uploaded=jnp.zeros((n,), bool),
            P=jnp.zeros((n, n), jnp.float32),
            comm=common.Traffic.zero(),
            clock=self.uplink.init_state(key, n),
            sim_time=jnp.zeros((), jnp.float32),
        )

    def round(
        self,
        state: FedFomoState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[FedFomoState, dict]:
        """One round: sample S, choose each participant's M downloads, map the participants
        (weights, update, local training), then store the uploads and update P and the clock."""
        t = state.round + 1
        cohort = self.sample_cohort(key, state.round)
        dl = clients.server(self.choose_downloads)(state, cohort, t, key)
        roles = data_roles(data.roles)
        train = common.training_table(data.roles, self.cfg.baseline_train_data)
        lab = data.roles[roles.lab]
        own = gather(state.theta, cohort)
        rows = FomoClient(cohort, own, dl.ids, dl.valid, train.take(cohort), lab.take(cohort))
        shared = RoundShared(state.theta, data.x, data.y, t, key)  # the store to download from
        up = clients.map(self.client_update, rows, shared)
        target = common.TargetPlan(cohort, train.count[cohort], data.roles[roles.unl], data.x)
        return clients.server(self.server_update)(state, target, dl, lab.count[cohort], up, key)

    def choose_downloads(
        self, state: FedFomoState, cohort: jax.Array, t: jax.Array, key: jax.Array
    ) -> FomoDownloads:
        """Each participant's M downloads by the epsilon_t-greedy affinity rule."""
        c = self.cfg
        eps = epsilon_at(t, c.fedfomo_epsilon, c.fedfomo_epsilon_decay)
        # Drawn for all N (the kernel masks row n's own id), then the participants' rows.
        ids = fw.fedfomo_choose_downloads(round_key(key, DOWNLOAD, t), state.P, c.fedfomo_m, eps)
        ids = ids[cohort]  # [S, M]
        return FomoDownloads(ids=ids, valid=state.uploaded[ids], epsilon=eps)

    # ------------------------------------------------------------------ one participant

    def mean_loss(
        self, variables: PyTree, x: jax.Array, y: jax.Array, table: RoleTable
    ) -> jax.Array:
        """l_n(theta): mean CE of one model on one client's D_lab row (0 if empty)."""
        r = evaluate_row(self.model, variables, x, y, table)
        return r["loss"] / jnp.maximum(r["count"], 1)

    def client_update(self, row: FomoClient, shared: RoundShared) -> FomoUpload:
        """First-order weights on D_lab, the personalized update, local training.

        row: id [], own (one model), ids [M] int32, valid [M] bool, train [Dtr + Dl] and
        lab [Dl] (RoleTable rows); shared: store ([N] models), x, y (visible labels), round t.
        """
        x, y, own = shared.x, shared.y, row.own
        models = gather(shared.models, row.ids)  # [M] downloaded models

        loss_own = self.mean_loss(own, x, y, row.lab)  # l_n(theta_n^prev)
        loss_m = jax.vmap(lambda v: self.mean_loss(v, x, y, row.lab))(models)  # [M]
        flat_own = ravel_pytree(own["params"])[0].astype(jnp.float32)
        dist = sim.pairwise_distances(sim.flatten_clients(models["params"]), flat_own[None])
        args = (loss_m[None], loss_own[None], dist)  # one consumer row: [1, M], [1], [1, M]
        w, degenerate = fw.fedfomo_weights(*args, row.valid[None], eps=self.cfg.sr_eps)
        raw = fw.fedfomo_raw_weights(*args, eps=self.cfg.sr_eps)

        mixed = fomo_update(own, models, w[0])
        new, _, stats = self.train_client(mixed, row.train, shared, row.id, SAMPLE, DROPOUT)
        return FomoUpload(
            theta=new,
            raw=raw[0],
            w=w[0],
            degenerate=degenerate[0],
            val_loss=loss_own,
            loss=stats["loss"],
            steps=stats["steps"],
        )

    # ------------------------------------------------------------------ server: store, P, clock

    def server_update(
        self,
        state: FedFomoState,
        target: common.TargetPlan,
        dl: FomoDownloads,
        n_lab: jax.Array,
        up: FomoUpload,
        key: jax.Array,
    ) -> tuple[FedFomoState, dict]:
        """Store the uploads, P[n, ids[n]] += w, the clock and the labels; n_lab: int32 [S]
        the labeled rows each participant scored."""
        c, n = self.cfg, self.num_clients
        t, cohort = state.round + 1, target.cohort
        theta = scatter(state.theta, cohort, up.theta)  # upload = keep
        uploaded = state.uploaded.at[cohort].set(True)
        # P[n, ids[n]] += w over the participants' rows (others add nothing).
        w = up.raw if c.fedfomo_affinity == "raw" else up.w
        m = c.fedfomo_m
        rows_w = jnp.zeros((n, m), jnp.float32).at[cohort].set(w)
        rows_ids = jnp.zeros((n, m), jnp.int32).at[cohort].set(dl.ids)
        rows_valid = jnp.zeros((n, m), bool).at[cohort].set(dl.valid)
        P = fw.fedfomo_affinity_update(state.P, rows_w, rows_ids, rows_valid)

        chosen = jnp.zeros((n,), bool).at[cohort].set(True)
        t_up, per_upload = self.uplink.upload_time(key, chosen, t, state.clock)
        # Each participant scores its own model and M downloads on D_lab, then trains.
        t_comp = self.compute.slowest(target.n_train, c.local_epochs, (m + 1) * n_lab)
        downloads = jnp.sum(dl.valid).astype(jnp.int32)
        uploads = jnp.int32(cohort.shape[0])
        comm = common.Traffic(
            uploads=state.comm.uploads + uploads, downloads=state.comm.downloads + downloads
        )
        # Labeling (DoFed-SPP Sec. 6.2): every client's personalized model predicts its D_unl.
        pl = common.predict_labels(self.model, theta, target.x, target.unl, per_client=True)
        metrics = cohort_metrics(cohort, {"loss": up.loss, "steps": up.steps}, up.theta)
        metrics.update(
            epsilon=dl.epsilon,
            downloads=downloads,
            uploads=uploads,
            comm_uploads=comm.uploads,
            comm_downloads=comm.downloads,
            n_degenerate_rows=jnp.sum(up.degenerate).astype(jnp.int32),
            weight_max=jnp.mean(jnp.max(up.w, axis=1)),
            # The participants' rows [S, M]: whom they downloaded, and the weights.
            download_ids=dl.ids,
            download_valid=dl.valid,
            fomo_weights=up.w,
            fomo_raw_weights=up.raw,
            val_loss=jnp.mean(up.val_loss),
            upload_time=t_up,
            upload_times=per_upload,
            compute_time=t_comp,
            pl_index=target.unl.idx,
            pl_label=pl,
        )
        new = state.replace(
            round=t,
            theta=theta,
            uploaded=uploaded,
            P=P,
            comm=comm,
            sim_time=wireless.advance_clock(state.sim_time, t_comp, t_up),
        )
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, state: FedFomoState, fed: FederatedData, mapper: Clients) -> dict:
        """Each personalized model on its client's target test split and D_unl (DoFed-SPP
        Sec. 6.1; docs/choices.md: DoFed-SPP, the test data)."""
        return common.evaluate_clients(self.evaluator, state.theta, fed, mapper, per_client=True)


@register("fedfomo", FedFomoConfig)
def fedfomo(cfg: FedFomoConfig, **kw: Any) -> FedFomo:
    """FedFomo; M must leave a peer to download: 1 <= fedfomo_m <= num_clients - 1."""
    n, m = kw["num_clients"], cfg.fedfomo_m
    if not m <= n - 1:
        raise bad("algorithm.fedfomo_m", m, f"an integer in [1, num_clients - 1 = {n - 1}]")
    return FedFomo(cfg, **kw)
