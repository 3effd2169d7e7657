"""FedBE: a Bayesian model ensemble distilled into the global model (Chen & Chao, ICLR 2021), as the
baseline of DoFed-SPP (its Sec. 6.1; our details: docs/choices.md: DoFed-SPP, the baselines'
details).

    for t = 1..rounds:                                                         (round)
      S = clients_per_round clients, uniformly
      for k in S in parallel: theta_k = local SGD from w on D_train + D_lab   (client_update)
      mu, sigma^2 = weighted mean and variance of the theta_k (|D_k| weights)  (server_update)
      theta_s = mu + var_scale * sigma * z_s, z_s ~ N(0, I), s = 1..S_m
      E = {mu} + {theta_s} + {theta_k}                                         (the ensemble)
      p(x) = mean_{e in E} softmax(f(theta_e, x)) on the server pool           (pseudo-labels)
      w = SWA of SGD from mu on KL(p || f(w, .)) over the pool                 (distillation)
      clock += slowest participant's compute + S uploads (free server: DoFed-SPP Sec. 3.1)

Every client uses the global model w (classification, and labeling as DoFed-SPP's Sec. 6.2 says
of its baselines).

The server pool (`fedbe_pool`): DoFed-SPP's problem (DoLP) has no server data. Our default is 5,000
inputs of the train split with no labels used (`train_split`: every input no client tests on and no
server set holds, i.e. the official train split under SUBSET / NORMAL, clients' data included;
overlap with client data is allowed). Drawing it class-balanced would need the hidden labels, so the
draw is uniform: balanced in expectation on the balanced datasets of the paper. The other choices
are `clients_unlabeled` (the union of every client's unlabeled target set, pooled at the server) and
`server` (the partition's own server set, `server_unlabeled` or `public`).

Batch statistics, if the model has any, are not part of the Gaussian: samples carry mu's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_semi.algorithms import dofed_baselines as common
from fedjax_semi.algorithms.base import ClientTable, RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.dofed_task import TargetTaskMethod, data_roles
from fedjax_semi.algorithms.fedbe_ensemble import (
    DistillObjective,
    distill_targets,
    ensemble_average,
    gaussian_fit,
    gaussian_sample,
)
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import Clients
from fedjax_semi.engine.keys import (
    DISTILL_DROPOUT,
    DISTILL_SAMPLE,
    GAUSSIAN,
    INIT,
    POOL_STREAM,
    client_key,
    round_key,
)
from fedjax_semi.engine.keys import FEDBE_DROPOUT as DROPOUT
from fedjax_semi.engine.keys import FEDBE_SAMPLE as SAMPLE
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import (
    Schedule,
    evaluate_indices,
    local_train,
    make_optimizer,
)
from fedjax_semi.errors import ConfigError, bad
from fedjax_semi.models.zoo import Model
from fedjax_semi.systems import wireless
from fedjax_semi.systems.uplink import UplinkState

POOLS = ("train_split", "clients_unlabeled", "server")
TARGETS = ("soft", "hard")
SERVER_SETS = ("server_unlabeled", "public")  # the partition's unlabeled server sets


@dataclasses.dataclass
class FedBEConfig(AlgorithmConfig):
    """FedBE (Chen & Chao 2021) as DoFed-SPP's baseline; its local training reuses lr,
    local_epochs, batch_size, optimizer and momentum; the clock is `systems`'. Defaults marked
    [FedBE] are the original paper's or code's."""

    name: str = "fedbe"
    fedbe_samples: int = 10  # S_m models drawn from the Gaussian over client weights [FedBE]
    fedbe_var_scale: float = 1.0  # samples mu + var_scale * sigma * z, z ~ N(0, I)
    fedbe_ensemble_clients: bool = True  # ensemble = {mu} + samples (+ the cohort's models)
    fedbe_pool: str = "train_split"  # server pool: train_split | clients_unlabeled | server
    fedbe_pool_size: int = 5000  # random subset of the pool, labels never read (0 = all)
    fedbe_target: str = "soft"  # distillation target: soft (mean softmax) | hard (its argmax)
    fedbe_distill_epochs: int = 20  # server epochs over the pool per round [FedBE code]
    fedbe_distill_lr: float = 1e-3
    fedbe_distill_momentum: float = 0.9
    fedbe_distill_batch_size: int = 128
    fedbe_swa: bool = True  # SWA: the global model is the mean of the epoch-end models
    fedbe_swa_start: int = 10  # first epoch (0-based) whose end model enters the SWA mean

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self
        if c.local_epochs < 1:
            raise bad("algorithm.local_epochs", c.local_epochs, "an integer >= 1 for fedbe")
        if c.fedbe_pool not in POOLS:
            raise bad("algorithm.fedbe_pool", c.fedbe_pool, f"one of {list(POOLS)}")
        if c.fedbe_target not in TARGETS:
            raise bad("algorithm.fedbe_target", c.fedbe_target, f"one of {list(TARGETS)}")
        for key, low in (
            ("fedbe_samples", 0),
            ("fedbe_pool_size", 0),
            ("fedbe_distill_epochs", 1),
            ("fedbe_distill_batch_size", 1),
        ):
            v = getattr(c, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(f"algorithm.{key}", v, f"an integer >= {low}")
        if not c.fedbe_var_scale >= 0:
            raise bad("algorithm.fedbe_var_scale", c.fedbe_var_scale, "a number >= 0")
        if not c.fedbe_distill_lr > 0:
            raise bad("algorithm.fedbe_distill_lr", c.fedbe_distill_lr, "a number > 0")
        if not 0 <= c.fedbe_distill_momentum < 1:
            raise bad(
                "algorithm.fedbe_distill_momentum", c.fedbe_distill_momentum, "a number in [0, 1)"
            )
        if c.fedbe_swa and not 0 <= c.fedbe_swa_start < c.fedbe_distill_epochs:
            raise bad(
                "algorithm.fedbe_swa_start",
                c.fedbe_swa_start,
                f"an epoch in [0, fedbe_distill_epochs - 1 = {c.fedbe_distill_epochs - 1}] with "
                "fedbe_swa=true",
            )


# ----------------------------------------------------------------------------- kernels


def server_pool(fed: FederatedData, mode: str, size: int, seed: int) -> np.ndarray:
    """Indices of the server's unlabeled pool, int32 [P] sorted (host side, no labels read).

    train_split: every input outside all server sets and all clients' test / val rows;
    clients_unlabeled: the union of the clients' unlabeled (target) rows; server: the
    partition's `server_unlabeled` or `public` set. size > 0 keeps a uniform random subset.
    """
    if mode == "server":
        name = next((s for s in SERVER_SETS if s in fed.server), None)
        if name is None:
            raise bad(
                "algorithm.fedbe_pool",
                mode,
                f"'train_split' or 'clients_unlabeled': this partition has no server set "
                f"{list(SERVER_SETS)} (it has {sorted(fed.server)})",
            )
        cand = np.asarray(fed.server[name])
    elif mode == "clients_unlabeled":
        t = fed.roles[data_roles(fed.roles).unl]
        cand = np.unique(np.asarray(t.idx)[np.asarray(t.mask)])
    else:
        held = np.zeros(fed.x.shape[0], bool)
        for v in fed.server.values():
            held[np.asarray(v)] = True
        for role in ("test", "val"):
            if role in fed.roles:
                t = fed.roles[role]
                held[np.asarray(t.idx)[np.asarray(t.mask)]] = True
        cand = np.flatnonzero(~held)
    if 0 < size < len(cand):
        rng = np.random.default_rng([seed, POOL_STREAM])
        cand = np.sort(rng.choice(cand, size, replace=False))
    if len(cand) == 0:
        raise ConfigError(f"algorithm.fedbe_pool={mode!r} is not allowed: the pool is empty here")
    return cand.astype(np.int32)


def pool_logits(
    model: Model, variables: PyTree, x: jax.Array, idx: jax.Array, batch: int
) -> jax.Array:
    """One model's logits on the pool idx [P] in batches of `batch` -> [P, Q]."""
    p = idx.shape[0]
    batch = max(1, min(batch, p))  # a small pool is one batch, not one padded to `batch`
    nb = -(-p // batch)
    padded = jnp.pad(idx, (0, nb * batch - p)).reshape(nb, batch)
    logits = jax.lax.map(lambda ids: model.apply(variables, x[ids])[0], padded)
    return logits.reshape(nb * batch, -1)[:p]


# ----------------------------------------------------------------------------- the method


@struct.dataclass
class FedBEState:
    """What FedBE carries from round to round.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock.
    w: the global model's variables.
    pool: int32 [P] the server pool's rows of the data (drawn once at init; labels never read).
    pool_probs: float32 [P, Q] the last ensemble's mean probabilities p on the pool.
    comm: the models moved; clock: the uplink's fixed rates (shannon mode).
    """

    round: jax.Array
    w: PyTree
    pool: jax.Array
    pool_probs: jax.Array
    comm: common.Traffic
    clock: UplinkState
    sim_time: jax.Array


@struct.dataclass
class FedBEUpload:
    """What one participant returns, stacked [S, ...] by the mapping: its model theta_k, its
    weight |D_k| (float32 []), local training's mean loss and steps."""

    theta: PyTree
    weight: jax.Array
    loss: jax.Array
    steps: jax.Array


@dataclasses.dataclass
class FedBE(TargetTaskMethod):
    cfg: FedBEConfig
    name: str = "fedbe"
    has_global_model: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.distill_objective = DistillObjective(self.model)
        self.distill_tx = make_optimizer("sgd", c.fedbe_distill_lr, c.fedbe_distill_momentum)
        self.distill_schedule = Schedule(c.fedbe_distill_batch_size, 1, 0)  # one epoch per call
        # The server's single-model passes (no vmap, no gradient): XLA's conv is faster there.
        self.server_model = self.model.with_conv("xla")
        self.evaluator = common.client_evaluator(self.model, per_client=False)

    def init(self, key: jax.Array, fed: FederatedData) -> FedBEState:
        """One global model, the server pool [P] and its last pseudo-labels [P, Q]."""
        common.check_roles(self.name, fed)
        c = self.cfg
        pool = server_pool(fed, c.fedbe_pool, c.fedbe_pool_size, self.data_seed)
        return FedBEState(
            round=jnp.zeros((), jnp.int32),
            w=self.model.init(client_key(key, INIT, 0, 0)),
            pool=jnp.asarray(pool),
            pool_probs=jnp.zeros((len(pool), fed.num_classes), jnp.float32),
            comm=common.Traffic.zero(),
            clock=self.uplink.init_state(key, self.num_clients),
            sim_time=jnp.zeros((), jnp.float32),
        )

    def round(
        self,
        state: FedBEState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[FedBEState, dict]:
        """One round: sample S, broadcast w, map the participants' local training, then the
        Gaussian, the ensemble, its pseudo-labels and the distillation at the server."""
        cohort = self.sample_cohort(key, state.round)
        train = common.training_table(data.roles, self.cfg.baseline_train_data)
        rows = ClientTable(cohort, train.take(cohort))
        shared = RoundShared(state.w, data.x, data.y, state.round + 1, key)
        up = clients.map(self.client_update, rows, shared)
        unl = data.roles[data_roles(data.roles).unl]
        target = common.TargetPlan(cohort, train.count[cohort], unl, data.x)
        return clients.server(self.server_update)(state, target, up, key)

    def client_update(self, row: ClientTable, shared: RoundShared) -> FedBEUpload:
        """Local SGD from the global model on D_train + D_lab (row: id [], table row)."""
        theta, _, stats = self.train_client(
            shared.models, row.table, shared, row.id, SAMPLE, DROPOUT
        )
        return FedBEUpload(
            theta=theta,
            weight=row.table.count.astype(jnp.float32),
            loss=stats["loss"],
            steps=stats["steps"],
        )

    # ------------------------------------------------------------------ server

    def ensemble(
        self, mu: PyTree, var: PyTree, clients: PyTree, t: jax.Array, key: jax.Array
    ) -> PyTree:
        """{mu} + S_m Gaussian samples (+ the cohort's models): leaves [E, ...]."""
        c = self.cfg
        parts = [jax.tree.map(lambda a: a[None], mu)]
        if c.fedbe_samples > 0:
            params = gaussian_sample(
                round_key(key, GAUSSIAN, t), mu["params"], var, c.fedbe_samples, c.fedbe_var_scale
            )
            rest = {k: v for k, v in mu.items() if k != "params"}  # batch stats: mu's
            rest = jax.tree.map(lambda a: jnp.broadcast_to(a, (c.fedbe_samples, *a.shape)), rest)
            parts.append({"params": params, **rest})
        if c.fedbe_ensemble_clients:
            parts.append(clients)
        return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)

    def distill(
        self,
        mu: PyTree,
        targets: jax.Array,
        pool: jax.Array,
        x: jax.Array,
        t: jax.Array,
        key: jax.Array,
    ) -> tuple[PyTree, jax.Array]:
        """SGD from mu on KL(targets [P, Q] || f(w, x_pool)), one epoch per scan step. With SWA
        the parameters are the mean of the end-of-epoch ones from epoch `fedbe_swa_start` on
        (a running sum, so memory holds one extra model). Returns (w, loss per epoch [E])."""
        c = self.cfg
        table = RoleTable(pool, jnp.int32(pool.shape[0]))
        no_labels = jnp.full((x.shape[0],), -1, jnp.int32)  # the objective reads only targets
        start = c.fedbe_swa_start if c.fedbe_swa else c.fedbe_distill_epochs - 1

        def epoch(carry, e):
            variables, opt, total = carry
            sample = jax.random.fold_in(round_key(key, DISTILL_SAMPLE, t), e)
            drop = jax.random.fold_in(round_key(key, DISTILL_DROPOUT, t), e)
            variables, opt, stats = local_train(
                self.distill_objective, self.distill_tx, variables, opt, x, no_labels, table,
                self.distill_schedule, sample, drop, extras={"p": targets},
            )  # fmt: skip
            use = e >= start
            total = jax.tree.map(
                lambda s, p: s + jnp.where(use, p, 0.0), total, variables["params"]
            )
            return (variables, opt, total), stats["loss"]

        zeros = jax.tree.map(jnp.zeros_like, mu["params"])
        carry = (mu, self.distill_tx.init(mu["params"]), zeros)
        (last, _, total), losses = jax.lax.scan(epoch, carry, jnp.arange(c.fedbe_distill_epochs))
        count = c.fedbe_distill_epochs - start
        averaged = jax.tree.map(lambda s, p: (s / count).astype(p.dtype), total, last["params"])
        # Without SWA the "mean" is the last epoch's model alone, exactly.
        params = averaged if c.fedbe_swa else last["params"]
        return {**last, "params": params}, losses

    def server_update(
        self, state: FedBEState, target: common.TargetPlan, up: FedBEUpload, key: jax.Array
    ) -> tuple[FedBEState, dict]:
        """The Gaussian over the uploads, the ensemble's pool probabilities, the distilled
        global model, the clock and every client's labels."""
        c, n = self.cfg, self.num_clients
        t, cohort, x = state.round + 1, target.cohort, target.x
        weights = up.weight
        any_data = jnp.sum(weights) > 0
        # The Gaussian over client weights; mu is FedAvg's mean (all leaves).
        mu = aggregate.weighted_mean(up.theta, weights)
        mu = jax.tree.map(lambda m, g: jnp.where(any_data, m, g), mu, state.w)
        _, var = gaussian_fit(up.theta["params"], weights)
        members = self.ensemble(mu, var, up.theta, t, key)
        pool = state.pool
        probs = ensemble_average(
            lambda v: pool_logits(self.server_model, v, x, pool, self.eval_batch), members
        )  # [P, Q]
        w, distill_losses = self.distill(
            mu, distill_targets(probs, c.fedbe_target), pool, x, t, key
        )
        w = jax.tree.map(lambda a, g: jnp.where(any_data, a, g), w, state.w)

        chosen = jnp.zeros((n,), bool).at[cohort].set(True)
        t_up, per_upload = self.uplink.upload_time(key, chosen, t, state.clock)
        t_comp = self.compute.slowest(target.n_train, c.local_epochs)
        moved = jnp.int32(cohort.shape[0])
        comm = common.Traffic(
            uploads=state.comm.uploads + moved, downloads=state.comm.downloads + moved
        )
        # Labeling (DoFed-SPP Sec. 6.2): every client labels its D_unl with the global model.
        pl = common.predict_labels(self.server_model, w, x, target.unl, per_client=False)
        sigma = jnp.concatenate([jnp.sqrt(v).ravel() for v in jax.tree.leaves(var)])
        metrics = cohort_metrics(cohort, {"loss": up.loss, "steps": up.steps}, up.theta)
        metrics.update(
            ensemble_size=jnp.int32(jax.tree.leaves(members)[0].shape[0]),
            sigma_mean=jnp.mean(sigma),
            distill_loss=distill_losses[-1],
            pool_entropy=jnp.mean(-jnp.sum(probs * jnp.log(jnp.clip(probs, 1e-12)), axis=-1)),
            uploads=moved,
            comm_uploads=comm.uploads,
            comm_downloads=comm.downloads,
            upload_time=t_up,
            upload_times=per_upload,
            compute_time=t_comp,
            pl_index=target.unl.idx,
            pl_label=pl,
        )
        new = state.replace(
            round=t,
            w=w,
            pool_probs=probs,
            comm=comm,
            sim_time=wireless.advance_clock(state.sim_time, t_comp, t_up),
        )
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, state: FedBEState, fed: FederatedData, mapper: Clients) -> dict:
        """The global model on every client's target test split and D_unl (DoFed-SPP Sec. 6.1; the
        paper defines no test set: docs/choices.md: DoFed-SPP, the test data), on the server test
        set, and the accuracy of the last ensemble pseudo-labels of the pool."""
        out = common.evaluate_clients(self.evaluator, state.w, fed, mapper, per_client=False)
        g = evaluate_indices(
            self.server_model,
            state.w,
            fed.x,
            fed.eval_y,
            fed.server["test_global"],
            self.eval_batch,
        )
        truth = fed.eval_y[state.pool]
        known = truth >= 0  # a cross-dataset pool has no labels at all
        hits = (jnp.argmax(state.pool_probs, -1) == truth) & known
        out.update(
            global_acc=g["accuracy"],
            global_loss=g["loss"],
            server_pl_acc=jnp.sum(hits) / jnp.maximum(jnp.sum(known), 1),
        )
        return out


@register("fedbe", FedBEConfig)
def fedbe(cfg: FedBEConfig, **kw: Any) -> FedBE:
    return FedBE(cfg, **kw)
