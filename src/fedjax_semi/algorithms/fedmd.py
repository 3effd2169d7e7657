"""FedMD (Li & Wang, "FedMD: Heterogenous Federated Learning via Model Distillation", 2019), as
CoFED's baseline (Cao et al., Sec. 5.8, Fig. 11, Table 2): heterogeneous models that exchange
class scores on a labeled public set, average them into a consensus and distill toward it.

    warm-up (transfer learning, FedMD Algorithm 1):
        for every participant i in parallel, one program per architecture:
            f_i = train on the labeled public set              (the public classes' outputs)
            f_i = train f_i on D_i                             (logits masked to Y_i)
            upload s_i = f_i(A_1)                              (scores [A, K + P] on round 1's
                                                                alignment subset A_1)
    every round t:
        consensus = mean_i s_i                                 (the center)
        for every i in parallel:
            digest:  train f_i to regress consensus on A_t     (L1 loss, digest_epochs)
            revisit: train f_i on D_i                          (revisit_epochs)
            upload s_i = f_i(A_{t+1})
    evaluation: every participant fine-tunes a copy on D_i (inside Y_i) and is scored with it
                (CoFED's adaptation, its Sec. 5.8); the best round is picked when reporting.

The head has K + P outputs: the task's K classes, then the public set's P classes (FedMD's
public data is labeled with classes of its own: dataset.server_pool with
dataset.server_pool_labels, numbered after the task's). A round's uploads are computed at the
end of the previous round (FedMD's Communicate step), so a round is one mapping of the clients:
Aggregate, Distribute, then Digest, Revisit and the next Communicate in each participant.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedjax_semi.algorithms.base import (
    Mapper,
    Method,
    clients_finite,
    concat_clients,
    register,
    sanity,
)
from fedjax_semi.algorithms.cofed import GroupInputs
from fedjax_semi.algorithms.label_spaces import (
    finetune_and_score,
    fit_in_space,
    fit_positions,
    label_spaces,
    position_labels,
)
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients, map_groups
from fedjax_semi.engine.keys import (
    FEDMD_ALIGN,
    FEDMD_DIGEST_DROPOUT,
    FEDMD_DIGEST_SAMPLE,
    FEDMD_PRIVATE_DROPOUT,
    FEDMD_PRIVATE_SAMPLE,
    FEDMD_PUBLIC_DROPOUT,
    FEDMD_PUBLIC_SAMPLE,
    INIT,
    client_key,
    round_key,
)
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import Schedule, make_optimizer, masked_mean
from fedjax_semi.errors import bad, check_choice
from fedjax_semi.models import pool
from fedjax_semi.models.zoo import Model


@dataclasses.dataclass
class FedMDConfig(AlgorithmConfig):
    """FedMD's knobs. The shared ones (optimizer, lr, batch_size, local_epochs) are the private
    training of the transfer-learning phase; revisit reuses its recipe for `revisit_epochs`."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "digest_lr",
        "finetune_lr",
    )

    name: str = "fedmd"
    model_pool: str = "table1"  # the participants' architectures, as CoFED's (models/pool.py)
    table1_models: int = 10
    public_classes: int = 10  # P: the labeled public set's classes (CIFAR-10 in the paper)
    public_epochs: int = 10  # transfer learning on the public set (FedMD: "to convergence")
    align_size: int = 5000  # public rows scored per round (FedMD's alignment subset)
    digest_epochs: int = 1
    digest_batch_size: int = 50
    digest_lr: float = 1.0e-3
    revisit_epochs: int = 4
    finetune_epochs: int = 5  # personalisation at evaluation (CoFED Sec. 5.8's adaptation)
    finetune_lr: float = 1.0e-3
    predict_batch: int = 500

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("algorithm.model_pool", self.model_pool, pool.POOLS)
        if not 1 <= self.table1_models <= len(pool.TABLE1):
            raise bad("algorithm.table1_models", self.table1_models, "an integer in [1, 10]")
        for key in ("public_classes", "align_size", "digest_batch_size", "predict_batch"):
            if getattr(self, key) < 1:
                raise bad(f"algorithm.{key}", getattr(self, key), "an integer >= 1")
        for key in ("public_epochs", "digest_epochs", "revisit_epochs", "finetune_epochs"):
            if getattr(self, key) < 0:
                raise bad(f"algorithm.{key}", getattr(self, key), "an integer >= 0")
        for key in ("digest_lr", "finetune_lr"):
            if not getattr(self, key) > 0:
                raise bad(f"algorithm.{key}", getattr(self, key), "a number > 0")


@struct.dataclass
class AlignShared:
    """What every participant reads in a phase: inputs x [D, ...], visible labels y [D], the
    public set's rows public [M] and their labels public_y [M] (K .. K+P-1), the alignment
    rows of this round and the next (int32 [A] each), the consensus [A, K + P] (zeros before
    round 1), the round and the run's key."""

    x: jax.Array
    y: jax.Array
    public: jax.Array
    public_y: jax.Array
    align: jax.Array
    next_align: jax.Array
    consensus: jax.Array
    round: jax.Array
    key: jax.Array


@struct.dataclass
class FedMDState:
    """What FedMD carries. Client-ordered arrays lead with [N] (every participant takes part);
    per-group trees are tuples over the architecture groups with leaves [Cg, ...] (the members
    `FedMD.members[g]`, in id order). W = K + P outputs.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock (not advanced here).
    f: the participants' models f_i per group.
    Y: bool [N, W] the label spaces (the P public classes are in none).
    s: float32 [N, A, W] the uploads: each f_i's class scores on the next round's alignment
        rows A_{t+1} (Communicate, computed at the end of round t or of the transfer learning).
    key: the run's key, uint32 [2]. Kept because `evaluate` (the fine-tuning's draws) receives
        no key from the engine.
    """

    round: jax.Array
    f: tuple
    Y: jax.Array
    s: jax.Array
    key: jax.Array
    sim_time: jax.Array


def alignment_rows(key: jax.Array, rnd: jax.Array, m: int, size: int) -> jax.Array:
    """int32 [size]: positions in the public set of round `rnd`'s alignment subset."""
    return jax.random.permutation(round_key(key, FEDMD_ALIGN, rnd), m)[:size].astype(jnp.int32)


def fit_to_scores(
    model: Model,
    tx: optax.GradientTransformation,
    variables: PyTree,
    x: jax.Array,
    table: RoleTable,
    targets: jax.Array,
    schedule: Schedule,
    key_sample: jax.Array,
    key_dropout: jax.Array,
) -> tuple[PyTree, dict]:
    """FedMD's digest: regress the model's logits [B, K + P] toward targets [n, K + P] per
    position of `table` (idx [n], count []) with the mean absolute error, fresh `tx` state."""

    def loss(logits, batch):
        return masked_mean(jnp.abs(logits - batch["target"]).mean(-1), batch["valid"])

    extras = {"target": targets}
    return fit_positions(
        model, tx, variables, x, table, extras, loss, schedule, key_sample, key_dropout
    )


@dataclasses.dataclass
class FedMD(Method):
    cfg: FedMDConfig
    name: str = "fedmd"
    roles: tuple[str, ...] = ("labeled", "test")
    oracle: bool = False
    has_global_model: bool = False
    has_warmup: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        self.k = self.model.num_classes  # the task's classes; the public ones follow
        filters, assign = pool.pool_filters(
            c.model_pool, self.num_clients, self.data_seed, table1_models=c.table1_models
        )
        self.models = pool.make_pool_models(self.model, filters, self.k + c.public_classes)
        self.members = pool.group_members(assign, len(filters))
        self.digest_tx = make_optimizer(c.optimizer, c.digest_lr, c.momentum, c.weight_decay)
        self.finetune_tx = make_optimizer(c.optimizer, c.finetune_lr, c.momentum, c.weight_decay)
        self.public_schedule = Schedule(c.batch_size, c.public_epochs, 0)
        self.digest_schedule = Schedule(c.digest_batch_size, c.digest_epochs, 0)
        self.revisit_schedule = Schedule(c.batch_size, c.revisit_epochs, 0)
        self.finetune_schedule = Schedule(c.batch_size, c.finetune_epochs, 0)
        groups = range(len(self.models))
        self.transfer_fns = tuple(functools.partial(self._transfer_client, g) for g in groups)
        self.round_fns = tuple(functools.partial(self._round_client, g) for g in groups)
        self.eval_fns = tuple(functools.partial(self._eval_client, g) for g in groups)

    # ------------------------------------------------------------------ state

    def init(self, key: jax.Array, fed: FederatedData) -> FedMDState:
        """Fresh models (the transfer learning runs in `warmup`), the label spaces, no scores."""
        public = fed.server.get("public")
        if public is None or public.shape[0] == 0:
            raise bad("dataset.server_pool", None, "a labeled public set for FedMD")
        public_y = np.asarray(fed.y[public])
        p = self.cfg.public_classes
        if public_y.min() < self.k or public_y.max() >= self.k + p:
            raise bad(
                "dataset.server_pool_labels",
                f"public labels {public_y.min()}..{public_y.max()}",
                f"visible labels in {self.k}..{self.k + p - 1} (server_pool_labels=true and "
                f"algorithm.public_classes={p} classes)",
            )
        m = public.shape[0]
        if self.cfg.align_size > m:
            raise bad("algorithm.align_size", self.cfg.align_size, f"at most {m} public rows")
        groups = tuple(
            jax.vmap(self.models[g].init)(
                jax.vmap(lambda i: client_key(key, INIT, 0, i))(jnp.asarray(ids))
            )
            for g, ids in enumerate(self.members)
        )
        width = self.k + p
        return FedMDState(
            round=jnp.zeros((), jnp.int32),
            f=groups,
            # [N, K + P]: the public classes are in no participant's label space.
            Y=label_spaces(fed.y, fed.roles["labeled"], width),
            s=jnp.zeros((self.num_clients, self.cfg.align_size, width)),
            key=key,
            sim_time=jnp.zeros((), jnp.float32),
        )

    def _inputs(self, variables, data: TrainView, owns) -> tuple[GroupInputs, ...]:
        private = data.roles["labeled"]
        labels = jax.vmap(position_labels, in_axes=(None, 0))(data.y, private)
        return tuple(
            GroupInputs(ids, variables[g], private.take(ids), labels[ids], owns[ids])
            for g, ids in enumerate(map(jnp.asarray, self.members))
        )

    def _shared(
        self, rnd: jax.Array, data: TrainView, key: jax.Array, consensus: jax.Array
    ) -> AlignShared:
        """What every participant reads in round `rnd` (int32 []): A_rnd, A_rnd+1, consensus."""
        public = data.server["public"]
        m, a = public.shape[0], self.cfg.align_size
        return AlignShared(
            data.x,
            data.y,
            public,
            data.y[public],
            alignment_rows(key, rnd, m, a),
            alignment_rows(key, rnd + 1, m, a),
            consensus,
            rnd,
            key,
        )

    def _private(self, g: int, variables, inp: GroupInputs, shared: AlignShared, schedule, rnd):
        return fit_in_space(
            self.models[g],
            self.tx,
            variables,
            shared.x,
            inp.table,
            inp.labels,
            inp.owns,
            schedule,
            client_key(shared.key, FEDMD_PRIVATE_SAMPLE, rnd, inp.id),
            client_key(shared.key, FEDMD_PRIVATE_DROPOUT, rnd, inp.id),
        )

    def _scores(self, g: int, variables, shared: AlignShared, rows: jax.Array) -> jax.Array:
        """float32 [A, K + P]: one model's logits on the public rows at positions `rows`."""
        b = self.cfg.predict_batch
        idx = shared.public[rows]
        nb = -(-idx.shape[0] // b)
        padded = jnp.pad(idx, (0, nb * b - idx.shape[0])).reshape(nb, b)
        out = jax.lax.map(lambda ids: self.models[g].apply(variables, shared.x[ids])[0], padded)
        return out.reshape(nb * b, -1)[: idx.shape[0]]

    # ------------------------------------------------------------------ transfer learning

    def _transfer_client(self, g: int, inp: GroupInputs, shared: AlignShared) -> dict:
        """FedMD's transfer learning: the public classes, then the private data; scores on A_1."""
        m = shared.public.shape[0]
        in_public = jnp.arange(self.k + self.cfg.public_classes) >= self.k
        variables, _ = fit_in_space(
            self.models[g],
            self.tx,
            inp.variables,
            shared.x,
            RoleTable(shared.public, jnp.int32(m)),
            shared.public_y,
            in_public,
            self.public_schedule,
            client_key(shared.key, FEDMD_PUBLIC_SAMPLE, 0, inp.id),
            client_key(shared.key, FEDMD_PUBLIC_DROPOUT, 0, inp.id),
        )
        variables, _ = self._private(g, variables, inp, shared, self.schedule, 0)
        return {"vars": variables, "scores": self._scores(g, variables, shared, shared.align)}

    def warmup(
        self, state: FedMDState, data: TrainView, mapper: Mapper, key: jax.Array
    ) -> FedMDState:
        """FedMD's transfer learning, once before round 1, and round 1's Communicate."""
        inputs = self._inputs(state.f, data, state.Y)
        shared = self._shared(state.round, data, key, jnp.zeros(()))
        # Round 1's alignment subset: the round counter is 0 here, so score A_{round + 1}.
        shared = shared.replace(align=shared.next_align)
        outs = map_groups(mapper, self.transfer_fns, inputs, shared)
        scores = pool.scatter_rows([o["scores"] for o in outs], self.members)
        return state.replace(f=tuple(o["vars"] for o in outs), s=scores)

    # ------------------------------------------------------------------ a round

    def round(
        self,
        state: FedMDState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[FedMDState, dict]:
        """Round t of FedMD's collaboration (its Algorithm 1's loop). Communicate ran at the
        end of round t - 1 (the scores s_i on A_t are in the state); Aggregate and Distribute at
        the center; Digest, Revisit and round t + 1's Communicate in each participant."""
        consensus = clients.server(self.aggregate)(state)  # Aggregate
        rows, shared = clients.server(self.distribute)(state, data, key, consensus)  # Distribute
        outs = clients.map_groups(self.round_fns, rows, shared)  # Digest, Revisit, Communicate
        return clients.server(self.server_update)(state, outs)

    def aggregate(self, state: FedMDState) -> jax.Array:
        """The consensus [A, K + P]: the mean of the uploaded scores s_i on A_t."""
        return jnp.mean(state.s, axis=0)

    def distribute(
        self, state: FedMDState, data: TrainView, key: jax.Array, consensus: jax.Array
    ) -> tuple[tuple[GroupInputs, ...], AlignShared]:
        """Per group the members' models and private tables, and what every participant
        reads: the consensus on A_t and the rows of A_{t+1}."""
        shared = self._shared(state.round + 1, data, key, consensus)
        return self._inputs(state.f, data, state.Y), shared

    def _round_client(self, g: int, inp: GroupInputs, shared: AlignShared) -> dict:
        """Digest (regress the consensus on A_t), revisit (D_i), upload the scores on A_{t+1}."""
        a = shared.align.shape[0]
        variables, digest = fit_to_scores(
            self.models[g],
            self.digest_tx,
            inp.variables,
            shared.x,
            RoleTable(shared.public[shared.align], jnp.int32(a)),
            shared.consensus,
            self.digest_schedule,
            client_key(shared.key, FEDMD_DIGEST_SAMPLE, shared.round, inp.id),
            client_key(shared.key, FEDMD_DIGEST_DROPOUT, shared.round, inp.id),
        )
        rnd = shared.round
        variables, revisit = self._private(g, variables, inp, shared, self.revisit_schedule, rnd)
        return {
            "vars": variables,
            "scores": self._scores(g, variables, shared, shared.next_align),
            "digest_loss": digest["loss"],
            "loss": revisit["loss"],
            "steps": digest["steps"] + revisit["steps"],
        }

    def _rows(self, outs: tuple, name: str) -> jax.Array:
        """[N, ...]: the groups' outputs `name` ([Cg, ...] each) in client order."""
        return pool.scatter_rows([o[name] for o in outs], self.members)

    def server_update(self, state: FedMDState, outs: tuple) -> tuple[FedMDState, dict]:
        """Keep the new models and the uploads on A_{t+1}; the round's metrics."""
        loss, steps = self._rows(outs, "loss"), self._rows(outs, "steps").astype(jnp.float32)
        finite = pool.scatter_rows([clients_finite(o["vars"]) for o in outs], self.members)
        metrics = {
            "cohort": jnp.arange(self.num_clients, dtype=jnp.int32),
            "client_loss": loss,
            "client_finite": finite & jnp.isfinite(loss),
            "train_loss": jnp.sum(loss * steps) / jnp.maximum(jnp.sum(steps), 1.0),
            "digest_loss": jnp.mean(self._rows(outs, "digest_loss")),
            "local_steps": jnp.mean(steps),
            # The uplink: A x (K + P) scores per participant a round (FedMD Sec. 2).
            "upload_scores_per_client": jnp.int32(state.s[0].size),
        }
        s = self._rows(outs, "scores")  # Communicate: the uploads on A_{t+1}
        new = state.replace(round=state.round + 1, f=tuple(o["vars"] for o in outs), s=s)
        return new, metrics

    # ------------------------------------------------------------------ evaluation

    def _eval_client(self, g: int, inp: dict, data, key) -> dict:
        return finetune_and_score(
            self.models[g],
            self.finetune_tx,
            self.finetune_schedule,
            inp["vars"],
            data,
            inp["train"],
            inp["test"],
            inp["owns"],
            key,
            inp["id"],
            self.cfg.predict_batch,
        )

    def evaluate(self, state: FedMDState, fed: FederatedData, mapper: Mapper) -> dict:
        """Every participant's accuracy with its fine-tuned copy, on its own test split."""
        key = jax.random.fold_in(state.key, state.round)
        owns = state.Y
        xs = tuple(
            {
                "id": jnp.asarray(ids),
                "vars": state.f[g],
                "train": fed.roles["labeled"].take(jnp.asarray(ids)),
                "test": fed.roles["test"].take(jnp.asarray(ids)),
                "owns": owns[ids],
            }
            for g, ids in enumerate(self.members)
        )
        outs = map_groups(mapper, self.eval_fns, xs, (fed.x, fed.y, fed.eval_y), key)
        correct = pool.scatter_rows([o["correct"] for o in outs], self.members)
        count = pool.scatter_rows([o["count"] for o in outs], self.members)
        acc = correct / jnp.maximum(count, 1)
        return {
            "accuracy": jnp.mean(acc),
            "personal_acc": jnp.mean(acc),
            "client_acc": acc,
            **sanity(concat_clients(outs)),
        }


@register("fedmd", FedMDConfig)
def fedmd(cfg: FedMDConfig, **kw: Any) -> FedMD:
    return FedMD(cfg, **kw)
