"""Personalized FedAvg, CoFED's baseline (Cao et al., Sec. 5.8, Fig. 10, Table 2): FedAvg trains
one model of one shared architecture on the union of the participants' label spaces; each
participant then fine-tunes its own copy on its private data inside its label space ("local
transfer learning") and is scored with it.

    every round: FedAvg (fedavg.py) with the unmasked K-way softmax
    evaluation:  for every participant i in parallel:
                     f_i = the global model fine-tuned on D_i       (logits masked to Y_i)
                     accuracy of f_i on i's test split              (argmax over Y_i)

The fine-tuned copies are never sent back. The architecture is one of CoFED's pool
(`architecture`, the paper's Table 1 Model 4 by default); the fine-tuning recipe is ours
(docs/choices.md, CoFED).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import Mapper, register, sanity
from fedjax_semi.algorithms.fedavg import FedAvgConfig, FedAvgFamily, FedAvgState
from fedjax_semi.algorithms.label_spaces import finetune_and_score, label_spaces
from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine.train import Schedule, make_optimizer
from fedjax_semi.errors import bad
from fedjax_semi.models import pool


@dataclasses.dataclass
class PFedAvgConfig(FedAvgConfig):
    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "server_lr",
        "pl_threshold",
        "finetune_lr",
    )
    name: str = "pfedavg"
    architecture: list[int] = dataclasses.field(default_factory=lambda: [24, 40, 56])
    finetune_epochs: int = 5
    finetune_lr: float = 0.01  # with the shared optimizer and momentum

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 2 <= len(self.architecture) <= 3 or min(self.architecture) < 1:
            raise bad("algorithm.architecture", self.architecture, "2 or 3 conv widths, each >= 1")
        if self.finetune_epochs < 0:
            raise bad("algorithm.finetune_epochs", self.finetune_epochs, "an integer >= 0")
        if not self.finetune_lr > 0:
            raise bad("algorithm.finetune_lr", self.finetune_lr, "a number > 0")


@struct.dataclass
class PFedAvgState(FedAvgState):
    """FedAvg's state (w: the shared architecture's global model) and what the evaluation's
    fine-tuning reads:

    owns: bool [N, K] each participant's label space Y_i (from its labeled rows).
    key: the run's key, from which each evaluation draws its fine-tuning batches (folded with
        the round): `evaluate` receives no key, and the draws must stay those of every result.
    """

    key: jax.Array  # before owns: the older state's leaf order (see FedAvgState)
    owns: jax.Array


@dataclasses.dataclass
class PersonalizedFedAvg(FedAvgFamily):
    cfg: PFedAvgConfig
    name: str = "pfedavg"
    roles: tuple[str, ...] = ("labeled", "test")

    def __post_init__(self) -> None:
        # The shared architecture replaces the configured model (same inputs and classes).
        self.model = pool.make_pool_models(self.model, [tuple(self.cfg.architecture)])[0]
        super().__post_init__()
        c = self.cfg
        self.finetune_tx = make_optimizer(c.optimizer, c.finetune_lr, c.momentum, c.weight_decay)
        self.finetune_schedule = Schedule(c.batch_size, c.finetune_epochs, 0)

    def init(self, key: jax.Array, fed: FederatedData) -> PFedAvgState:
        state = super().init(key, fed)
        owns = label_spaces(fed.y, fed.roles["labeled"], self.model.num_classes)
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        return PFedAvgState(**fields, key=key, owns=owns)

    def _personal_score(self, inp: dict, w, x, y, eval_y, key) -> dict:
        return finetune_and_score(
            self.model,
            self.finetune_tx,
            self.finetune_schedule,
            w,
            (x, y, eval_y),
            inp["train"],
            inp["test"],
            inp["owns"],
            key,
            inp["id"],
            self.eval_batch,
        )

    def evaluate(self, state: PFedAvgState, fed: FederatedData, mapper: Mapper) -> dict:
        """Every participant's accuracy with its fine-tuned copy of the global model."""
        key = jax.random.fold_in(state.key, state.round)
        xs = {
            "id": jnp.arange(self.num_clients, dtype=jnp.int32),
            "train": fed.roles["labeled"],
            "test": fed.roles["test"],
            "owns": state.owns,
        }
        r = mapper(self._personal_score, xs, state.w, fed.x, fed.y, fed.eval_y, key)
        acc = r["correct"] / jnp.maximum(r["count"], 1)
        return {
            "accuracy": jnp.mean(acc),
            "personal_acc": jnp.mean(acc),
            "client_acc": acc,
            **sanity(r),
        }


@register("pfedavg", PFedAvgConfig)
def pfedavg(cfg: PFedAvgConfig, **kw: Any) -> PersonalizedFedAvg:
    return PersonalizedFedAvg(cfg, **kw)
