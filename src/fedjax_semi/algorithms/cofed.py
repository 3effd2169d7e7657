"""CoFED (Cao et al., "Cross-Silo Heterogeneous Model Federated Multitask Learning"): one-shot
co-training over a public unlabeled set, for participants with their own architectures and
their own label spaces (its Sec. 4, Algorithm 1).

    warm-up (Step 1, 2):   for every participant i in parallel, one program per architecture:
                               f_i = train on D_i                      (logits masked to Y_i)
                               upload yhat_i = f_i(U)                  (M hard labels, Sec. 4.2)
    round 1 (Step 3, 4):   P_k = {m : votes of class-k owners for k / owners of k > alpha}
                                                                       (Eq. 15-18, the center)
                           R_i = {(m, k) : m in P_k, k in Y_i, one k of Y_i claims m}  (Eq. 19)
                           for every i in parallel: f_i = train f_i on D_i + R_i

One round of communication (Sec. 4.2 argues against iterating): Steps 1-2 are the warm-up,
Steps 3-4 are `round`. The participants' models are grouped by architecture: each step maps one
client function per group (`clients.map_groups`). The center sees only the hard labels and the
label spaces; `evaluate` reports every participant's accuracy after CoFED and with its
local-only model (kept in the state), and their ratio (Fig. 2). Our choices where the paper is
silent: docs/choices.md, CoFED.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import (
    Mapper,
    Method,
    clients_finite,
    concat_clients,
    register,
    sanity,
)
from fedjax_semi.algorithms.cofed_config import CoFEDConfig
from fedjax_semi.algorithms.label_spaces import (
    fit_in_space,
    label_spaces,
    position_labels,
    predict_in_space,
    score_in_space,
)
from fedjax_semi.data.federated import FederatedData, RoleTable, TrainView
from fedjax_semi.engine.clients import Clients, map_groups
from fedjax_semi.engine.keys import (
    COFED_LOCAL_DROPOUT,
    COFED_LOCAL_SAMPLE,
    COFED_PUBLIC_ORDER,
    COFED_UPDATE_DROPOUT,
    COFED_UPDATE_SAMPLE,
    INIT,
    client_key,
    round_key,
)
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import Schedule, make_optimizer
from fedjax_semi.errors import bad
from fedjax_semi.kernels import voting
from fedjax_semi.models import pool


@struct.dataclass
class GroupInputs:
    """One architecture group's rows [Cg, ...]: client ids, models, the table each trains on
    with a label per position, and the label spaces."""

    id: jax.Array
    variables: PyTree
    table: RoleTable
    labels: jax.Array
    owns: jax.Array


@struct.dataclass
class PublicShared:
    """What every participant reads in a phase: the inputs x [D, ...] and visible labels y [D],
    the public set's rows public [M], the round and the run's key."""

    x: jax.Array
    y: jax.Array
    public: jax.Array
    round: jax.Array
    key: jax.Array


@struct.dataclass
class CenterSettings:
    """The center's knobs that a sweep varies WITHOUT recompiling the round, hence state, not
    config: Steps 1-2 do not depend on them, so `results/cofed_sweep.py` runs them once and
    Steps 3-4 for every setting (`CoFED.with_center`). `init` sets them from the config.

    alpha: float32 [] Eq. 18's agreement threshold (algorithm.alpha).
    public_size: int32 [] how many public rows the center votes on (algorithm.public_size;
        0 there means all M).
    """

    alpha: jax.Array
    public_size: jax.Array


@struct.dataclass
class CoFEDState:
    """What CoFED carries. Every participant takes part, so client-ordered arrays lead with [N];
    per-group trees are tuples over the architecture groups with leaves [Cg, ...] (the members
    `CoFED.members[g]`, in id order).

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock (not advanced here).
    f: the participants' models f_i per group (after Step 4 once a round has run).
    f_local: the same after Step 1 only, the local-only models of Fig. 2's ratio.
    Y: bool [N, K] the label spaces Y_i (Y[i, k]: participant i owns class k).
    y_hat: int32 [N, M] the uploads, f_i's hard labels on the M public rows (Step 2; -1 before).
    public_rank: int32 [M] each public row's place in the center's order (`public_order` of the
        run's key): the center votes on the rows of rank < center.public_size. Derived from the
        key at init and kept, because drawing it inside the round changed XLA's fusion of the
        round and moved the training loss by a float32 ulp.
    center: the center's knobs (alpha, public_size), see CenterSettings.
    """

    round: jax.Array
    f: tuple
    f_local: tuple
    Y: jax.Array
    y_hat: jax.Array
    public_rank: jax.Array
    center: CenterSettings
    sim_time: jax.Array


@struct.dataclass
class Consensus:
    """Step 3's result at the center. accept bool [M, K]: P_k as a mask (Eq. 15-18);
    keep bool [N, M] and label int32 [N, M]: R_i, the public rows and labels each participant
    receives (Eq. 19)."""

    accept: jax.Array
    keep: jax.Array
    label: jax.Array


def public_order(key: jax.Array, m: int) -> jax.Array:
    """int32 [M]: each public row's rank in the order the center takes rows (public_size keeps
    the rows of rank < size, so smaller sizes are subsets of larger ones, as Fig. 6's sweep)."""
    return jnp.argsort(jax.random.permutation(round_key(key, COFED_PUBLIC_ORDER, 0), m)).astype(
        jnp.int32
    )


def combined_table(
    private: RoleTable, y: jax.Array, public: jax.Array, keep: jax.Array, label: jax.Array
) -> tuple[RoleTable, jax.Array]:
    """Each client's D_i + R_i as one table: idx [C, n + M] (valid entries first, private then
    public) and labels [C, n + M] (visible labels, then pseudo-labels; -1 padding)."""
    c = private.idx.shape[0]
    idx = jnp.concatenate([private.idx, jnp.broadcast_to(public, (c, public.shape[0]))], 1)
    priv_labels = jnp.where(private.mask, y[private.idx], -1)
    labels = jnp.concatenate([priv_labels, jnp.where(keep, label, -1)], 1)
    valid = jnp.concatenate([private.mask, keep], 1)
    order = jnp.argsort(~valid, axis=1, stable=True)
    table = RoleTable(jnp.take_along_axis(idx, order, 1), private.count + keep.sum(1))
    return table, jnp.where(
        jnp.take_along_axis(valid, order, 1), jnp.take_along_axis(labels, order, 1), -1
    )


@dataclasses.dataclass
class CoFED(Method):
    cfg: CoFEDConfig
    name: str = "cofed"
    roles: tuple[str, ...] = ("labeled", "test")
    oracle: bool = False
    has_global_model: bool = False
    has_warmup: ClassVar[bool] = True
    # Step 3's consensus labels on the public set: their accuracy (hidden labels, scored after
    # the round) and how many rows the participants receive (Fig. 7's sum of |P_k|).
    mechanism_metrics: ClassVar[tuple[str, ...]] = ("pl_acc", "pl_sum_pk")

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        filters, assign = pool.pool_filters(
            c.model_pool, self.num_clients, self.data_seed, table1_models=c.table1_models
        )
        self.filters = filters
        self.models = pool.make_pool_models(self.model, filters)
        self.members = tuple(
            jnp.asarray(m, jnp.int32) for m in pool.group_members(assign, len(filters))
        )
        self.update_tx = make_optimizer(c.optimizer, c.update_lr, c.momentum, c.weight_decay)
        self.update_schedule = Schedule(c.update_batch_size, c.update_epochs, 0)
        self.k = self.model.num_classes
        # One client function per group, made once (the reference loop caches by function).
        groups = range(len(self.models))
        self.local_fns = tuple(functools.partial(self._local_client, g) for g in groups)
        self.update_fns = tuple(functools.partial(self._update_client, g) for g in groups)
        self.eval_fns = tuple(functools.partial(self._eval_client, g) for g in groups)

    # ------------------------------------------------------------------ state

    def _init_group(self, g: int, key: jax.Array) -> PyTree:
        ids = self.members[g]
        keys = jax.vmap(lambda i: client_key(key, INIT, 0, i))(ids)
        return jax.vmap(self.models[g].init)(keys)

    def init(self, key: jax.Array, fed: FederatedData) -> CoFEDState:
        """Fresh models (Steps 1-2 run in `warmup`), the label spaces Y_i, no uploads yet."""
        public = fed.server.get("public")
        if public is None or public.shape[0] == 0:
            raise bad(
                "partition.cofed.public_fraction",
                "(0 public rows)",
                "a share that leaves CoFED a public set (partition=cofed), or dataset.server_pool",
            )
        groups = tuple(self._init_group(g, key) for g in range(len(self.models)))
        if self.cfg.label_space == "all":
            owns = jnp.ones((self.num_clients, self.k), bool)
        else:
            owns = label_spaces(fed.y, fed.roles["labeled"], self.k)  # visible labels only
        m = public.shape[0]
        if self.cfg.public_size > m:
            raise bad(
                "algorithm.public_size",
                self.cfg.public_size,
                f"at most the {m} rows of the public set (0 = all of them)",
            )
        center = CenterSettings(jnp.float32(self.cfg.alpha), jnp.int32(self.cfg.public_size or m))
        return CoFEDState(
            round=jnp.zeros((), jnp.int32),
            f=groups,
            f_local=groups,
            Y=owns,
            y_hat=jnp.full((self.num_clients, m), -1, jnp.int32),
            public_rank=public_order(key, m),
            center=center,
            sim_time=jnp.zeros((), jnp.float32),
        )

    def _group_inputs(self, g: int, variables, table: RoleTable, labels, owns) -> GroupInputs:
        ids = self.members[g]
        return GroupInputs(ids, variables, table.take(ids), labels[ids], owns[ids])

    # ------------------------------------------------------------------ Step 1, 2

    def _local_client(self, g: int, inp: GroupInputs, shared: PublicShared) -> dict:
        """Step 1 and 2 of one participant: train on D_i, label the public rows [M]."""
        model = self.models[g]
        variables, stats = fit_in_space(
            model,
            self.tx,
            inp.variables,
            shared.x,
            inp.table,
            inp.labels,
            inp.owns,
            self.schedule,
            client_key(shared.key, COFED_LOCAL_SAMPLE, 0, inp.id),
            client_key(shared.key, COFED_LOCAL_DROPOUT, 0, inp.id),
        )
        preds = predict_in_space(
            model, variables, shared.x, shared.public, inp.owns, self.cfg.predict_batch
        )
        return {"vars": variables, "preds": preds, **stats}

    def warmup(
        self, state: CoFEDState, data: TrainView, mapper: Mapper, key: jax.Array
    ) -> CoFEDState:
        """Steps 1-2, once before round 1: every participant trains on D_i and uploads its hard
        labels on the public set; the local-only models are kept as f_local."""
        private = data.roles["labeled"]
        labels = jax.vmap(position_labels, in_axes=(None, 0))(data.y, private)
        inputs = tuple(
            self._group_inputs(g, state.f[g], private, labels, state.Y)
            for g in range(len(self.models))
        )
        shared = PublicShared(data.x, data.y, data.server["public"], state.round, key)
        outs = map_groups(mapper, self.local_fns, inputs, shared)  # Steps 1-2
        groups = tuple(o["vars"] for o in outs)
        y_hat = state.y_hat
        for g, o in enumerate(outs):
            y_hat = y_hat.at[self.members[g]].set(o["preds"])
        return state.replace(f=groups, f_local=groups, y_hat=y_hat)

    # ------------------------------------------------------------------ Step 3, 4

    def round(
        self,
        state: CoFEDState,
        data: TrainView,
        key: jax.Array,
        clients: Clients,
        flags: tuple = (),
    ) -> tuple[CoFEDState, dict]:
        """Steps 3-4 of Algorithm 1 (Steps 1-2 ran once, in `warmup`): the center votes on the
        uploads and hands out R_i, every participant trains on D_i + R_i (one program per
        architecture group), the new models are kept."""
        r = clients.server(self.vote)(state, data)  # Step 3: P_k (Eq. 15-18), R_i (Eq. 19)
        rows, shared = clients.server(self.update_rows)(state, data, key, r)  # D_i + R_i
        outs = clients.map_groups(self.update_fns, rows, shared)  # Step 4
        return clients.server(self.server_update)(state, r, outs, shared.public)

    def vote_weights(self, data: TrainView) -> jax.Array | None:
        """float32 [N] each participant's vote weight (Sec. 4.6's data size), or None (1 each)."""
        if self.cfg.vote_weights == "data_size":
            return data.roles["labeled"].count.astype(jnp.float32)
        return None

    def vote(self, state: CoFEDState, data: TrainView) -> Consensus:
        """Step 3 at the center, on the uploads y_hat [N, M] and the label spaces Y only:
        P_k (Eq. 15-18) on the public rows in use, then R_i (Eq. 19, conflicts per Sec. 4.3)."""
        c, center = self.cfg, state.center
        weights = self.vote_weights(data)
        in_use = state.public_rank < center.public_size  # [M]
        accept = voting.consensus_votes(
            state.y_hat, state.Y, center.alpha, weights, threshold_op=c.threshold_op
        )
        accept = accept & in_use[:, None]
        count, total = voting.vote_counts(state.y_hat, state.Y, weights)
        keep, label = voting.distribute(
            accept, state.Y, conflict=c.conflict, count=count, total=total
        )
        return Consensus(accept, keep, label)

    def update_rows(
        self, state: CoFEDState, data: TrainView, key: jax.Array, r: Consensus
    ) -> tuple[tuple[GroupInputs, ...], PublicShared]:
        """Step 4's inputs: per group the members' start models (f_i, or fresh ones with
        update_init=scratch) and tables D_i + R_i; what every participant reads."""
        public = data.server["public"]
        table, labels = combined_table(data.roles["labeled"], data.y, public, r.keep, r.label)
        start = state.f
        if self.cfg.update_init == "scratch":
            start = tuple(self._init_group(g, key) for g in range(len(self.models)))
        groups = range(len(self.models))
        rows = tuple(self._group_inputs(g, start[g], table, labels, state.Y) for g in groups)
        return rows, PublicShared(data.x, data.y, public, state.round, key)

    def _update_client(self, g: int, inp: GroupInputs, shared: PublicShared) -> dict:
        """Step 4 of one participant: train its model on D_i + R_i."""
        variables, stats = fit_in_space(
            self.models[g],
            self.update_tx,
            inp.variables,
            shared.x,
            inp.table,
            inp.labels,
            inp.owns,
            self.update_schedule,
            client_key(shared.key, COFED_UPDATE_SAMPLE, shared.round, inp.id),
            client_key(shared.key, COFED_UPDATE_DROPOUT, shared.round, inp.id),
        )
        return {"vars": variables, **stats}

    def _in_client_order(self, outs, name: str) -> jax.Array:
        """[N, ...]: the groups' outputs `name` ([Cg, ...] each) written back in client order."""
        first = outs[0][name]
        full = jnp.zeros((self.num_clients, *first.shape[1:]), first.dtype)
        for g, o in enumerate(outs):
            full = full.at[self.members[g]].set(o[name])
        return full

    def server_update(
        self, state: CoFEDState, r: Consensus, outs: tuple, public: jax.Array
    ) -> tuple[CoFEDState, dict]:
        """Keep the participants' new models; the round's metrics (public: int32 [M] rows)."""
        loss = self._in_client_order(outs, "loss")
        steps = self._in_client_order(outs, "steps").astype(jnp.float32)
        finite = jnp.zeros((self.num_clients,), bool)
        for g, o in enumerate(outs):
            finite = finite.at[self.members[g]].set(clients_finite(o["vars"]))
        counts = voting.pseudo_label_counts(r.accept, r.keep)
        metrics = {
            "cohort": jnp.arange(self.num_clients, dtype=jnp.int32),
            "client_loss": loss,
            "client_finite": finite & jnp.isfinite(loss),
            "train_loss": jnp.sum(loss * steps) / jnp.maximum(jnp.sum(steps), 1.0),
            "local_steps": jnp.mean(steps),
            "pl_sum_pk": counts["sum_pk"],  # sum_k |P_k| (Fig. 7's count)
            "pl_union_pk": counts["union_pk"],
            "pl_sum_ri": counts["sum_ri"],
            # The uplink: M hard labels per participant and nothing else (Sec. 4.2).
            "upload_labels_per_client": jnp.int32(state.y_hat.shape[1]),
            # R_i, scored on the host against the hidden labels (a diagnostic only).
            "pl_index": jnp.broadcast_to(public, r.label.shape),
            "pl_label": r.label,
        }
        new = state.replace(round=state.round + 1, f=tuple(o["vars"] for o in outs))
        return new, metrics

    def with_center(self, state: CoFEDState, alpha: float, public_size: int = 0) -> CoFEDState:
        """`state` with other center knobs (after Steps 1-2, which do not depend on them):
        the round from it equals a run with algorithm.alpha=alpha, algorithm.public_size=..."""
        m = state.y_hat.shape[-1]
        if not 0 <= alpha <= 1 or not 0 <= public_size <= m:
            raise bad("with_center", (alpha, public_size), f"alpha in [0, 1], size in [0, {m}]")
        c = state.center
        center = CenterSettings(
            alpha=jnp.full_like(c.alpha, alpha),
            public_size=jnp.full_like(c.public_size, public_size or m),
        )
        return state.replace(center=center)

    # ------------------------------------------------------------------ evaluation

    def _eval_client(self, g: int, inp: dict, x, labels) -> dict:
        model = self.models[g]
        b = self.cfg.predict_batch
        fed = score_in_space(model, inp["fed"], x, labels, inp["table"], inp["owns"], b)
        loc = score_in_space(model, inp["local"], x, labels, inp["table"], inp["owns"], b)
        return {**fed, "local_correct": loc["correct"]}  # fed: the models behind `accuracy`

    def evaluate(self, state: CoFEDState, fed: FederatedData, mapper: Mapper) -> dict:
        """Each participant's accuracy on its own test split (argmax over Y_i) after CoFED and
        with its local-only model, and their ratio (Fig. 2: mean of ratios, min, max)."""
        test, owns = fed.roles["test"], state.Y
        xs = tuple(
            {
                "fed": state.f[g],
                "local": state.f_local[g],
                "table": test.take(self.members[g]),
                "owns": owns[self.members[g]],
            }
            for g in range(len(self.models))
        )
        outs = map_groups(mapper, self.eval_fns, xs, fed.x, fed.eval_y)
        count = jnp.maximum(self._in_client_order(outs, "count"), 1).astype(jnp.float32)
        acc = self._in_client_order(outs, "correct") / count
        local = self._in_client_order(outs, "local_correct") / count
        rel = acc / jnp.maximum(local, 1e-12)
        return {
            "accuracy": jnp.mean(acc),
            "local_acc": jnp.mean(local),
            "rel_acc": jnp.mean(rel),  # the mean of per-participant ratios (Fig. 2)
            "rel_acc_min": jnp.min(rel),
            "rel_acc_max": jnp.max(rel),
            "rel_of_means": jnp.mean(acc) / jnp.maximum(jnp.mean(local), 1e-12),
            "improved_frac": jnp.mean(rel > 1.0),
            "client_acc": acc,
            "client_local_acc": local,
            "client_rel_acc": rel,
            **sanity(concat_clients(outs)),
        }


@register("cofed", CoFEDConfig)
def cofed(cfg: CoFEDConfig, **kw: Any) -> CoFED:
    return CoFED(cfg, **kw)
