"""CoFED's config: the knobs of its Algorithm 1 (Cao et al., Sec. 4-5) and where the paper is
silent (docs/choices.md, CoFED)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.errors import bad, check_choice
from fedjax_semi.kernels import voting
from fedjax_semi.models import pool

VOTE_WEIGHTS = ("uniform", "data_size")
UPDATE_INITS = ("warm", "scratch")
LABEL_SPACES = ("present", "all")


@dataclasses.dataclass
class CoFEDConfig(AlgorithmConfig):
    """CoFED's knobs. The shared ones (optimizer, lr, batch_size, local_epochs) are Step 1's
    local training; `update_*` are Step 4's."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = ("lr", "alpha", "update_lr")

    name: str = "cofed"
    alpha: float = 0.3  # agreement threshold (Eq. 18; Sec. 5.2: 0.3 on CIFAR)
    threshold_op: str = "gt"  # gt (Eq. 18, strict) | ge
    conflict: str = "drop_in_client"  # drop_in_client (Sec. 4.3) | drop_global | max_ratio
    vote_weights: str = "uniform"  # uniform (Alg. 1) | data_size (Sec. 4.6's credibility)
    model_pool: str = "table1"  # table1 (Table 1, round-robin) | random_cnn | single
    table1_models: int = 10  # table1: the first n of Table 1's ten models
    update_epochs: int = 30
    update_batch_size: int = 1000  # Sec. 5.2
    update_lr: float = 1.0e-3
    update_init: str = "warm"  # warm (from the local model) | scratch
    predict_batch: int = 500  # rows a participant labels (or is scored on) at a time
    # Public rows the center votes on: a random subset of this size (nested across sizes, Fig.
    # 6's sweep); 0 = the whole public set. Participants label every row regardless.
    public_size: int = 0
    # Y_i: the classes among the participant's private labels (present; the CIFAR setup draws
    # them) or all K classes for everyone (all: ours for FEMNIST, partition.cofed.label_space).
    label_space: str = "present"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:
            raise bad("algorithm.alpha", self.alpha, "a number in [0, 1]")
        check_choice("algorithm.threshold_op", self.threshold_op, voting.THRESHOLD_OPS)
        check_choice("algorithm.conflict", self.conflict, voting.CONFLICTS)
        check_choice("algorithm.vote_weights", self.vote_weights, VOTE_WEIGHTS)
        check_choice("algorithm.model_pool", self.model_pool, pool.POOLS)
        check_choice("algorithm.update_init", self.update_init, UPDATE_INITS)
        check_choice("algorithm.label_space", self.label_space, LABEL_SPACES)
        if not 1 <= self.table1_models <= len(pool.TABLE1):
            raise bad("algorithm.table1_models", self.table1_models, "an integer in [1, 10]")
        for key in ("update_epochs", "update_batch_size", "predict_batch"):
            if getattr(self, key) < 1:
                raise bad(f"algorithm.{key}", getattr(self, key), "an integer >= 1")
        if self.public_size < 0:
            raise bad("algorithm.public_size", self.public_size, "an integer >= 0 (0 = all)")
        if not self.update_lr > 0:
            raise bad("algorithm.update_lr", self.update_lr, "a number > 0")
