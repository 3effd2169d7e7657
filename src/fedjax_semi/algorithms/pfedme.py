"""pFedMe (Dinh et al., 2020) with FixMatch local loss: personalized models by Moreau envelopes
(a baseline of UM-pFSSL, its Sec. 6.1; our settings: docs/choices.md: UM-pFSSL, the baselines'
settings).

    for each round:
        S = sample clients; w_k = w (the global model)
        for k in S in parallel, for each local step (batch b):
            theta_k <- K_in steps of SGD (personal_lr) on l_k(theta; b) + lambda/2 ||theta - w_k||^2
            w_k     <- w_k - lr * lambda * (w_k - theta_k)
        w <- (1 - beta) w + beta * mean_k w_k
    evaluate each client's personalized theta_k

l_k is the FixMatch loss (weak/strong augmentation, confident pseudo-labels) on D^s / D^u.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import RoundShared, cohort_metrics, register
from fedjax_semi.algorithms.fedavg import (
    POSITIVE,
    Comm,
    FedAvgClient,
    FedAvgConfig,
    FedAvgFamily,
    FedAvgState,
    check_required,
)
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import scatter
from fedjax_semi.engine.keys import DROPOUT, SAMPLE, client_key
from fedjax_semi.engine.train import LocalObjective, local_scan
from fedjax_semi.errors import bad


@dataclasses.dataclass
class PFedMeConfig(FedAvgConfig):
    """pFedMe's knobs (values from the pFedMe paper's experiments)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "server_lr",
        "pl_threshold",
        "prox_mu",
        "pfedme_personal_lr",
        "pfedme_beta",
    )

    name: str = "pfedme"
    pfedme_lambda: float = 15.0  # lambda of the Moreau envelope
    pfedme_inner_steps: int = 5  # K_in steps on theta per local step
    pfedme_personal_lr: float = 0.01
    pfedme_beta: float = 1.0  # server step: w <- (1 - beta) w + beta mean_k w_k

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, value in (
            ("pfedme_lambda", self.pfedme_lambda),
            ("pfedme_personal_lr", self.pfedme_personal_lr),
            ("pfedme_beta", self.pfedme_beta),
        ):
            if not value > 0:
                raise bad(f"algorithm.{key}", value, "a number > 0")
        if self.pfedme_inner_steps < 1:
            raise bad("algorithm.pfedme_inner_steps", self.pfedme_inner_steps, "an integer >= 1")


@struct.dataclass
class PFedMeUpload:
    """What a client returns [S, ...]: its local model w_k (sent to the server), its
    personalized model theta_k (kept), its weight in the server mean (float32), and the local
    scan's stats (loss, steps, pl_rate). Fields in the order of the older per-client dict's
    sorted keys, which the mapped program's outputs and XLA's compilation of the round follow
    (see FedAvgUpload)."""

    loss: jax.Array
    pl_rate: jax.Array
    steps: jax.Array
    theta_k: Any
    w_k: Any
    weight: jax.Array

    @property
    def stats(self) -> dict:
        return {"loss": self.loss, "steps": self.steps, "pl_rate": self.pl_rate}


@dataclasses.dataclass
class PFedMe(FedAvgFamily):
    cfg: PFedMeConfig
    name: str = "pfedme"

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        # The personalized theta_k live in the state's w_k (every leaf personal for evaluation);
        # the server averages the local models w_k into the global model w.
        self.personal, self.has_global_model = True, True
        self.mask = jax.tree.map(lambda m: False, self.mask)
        self.inner = LocalObjective(
            self.model,
            prox_mu=c.pfedme_lambda,
            pl_weight=c.pl_weight,
            pl_threshold=c.pl_threshold,
            fixmatch=True,
        )

    def client_update(self, inp: FedAvgClient, shared: RoundShared) -> PFedMeUpload:
        """One client's local rounds of pFedMe (Dinh et al. 2020, Algorithm 1): from the received
        global model w, `local_step` on each batch of the shared masked scan. Returns the local
        model w_k (sent to the server) and the personalized model theta_k (kept by the client)."""
        c, rnd, cid = self.cfg, shared.round, inp.id
        w = shared.models
        model_state = {k: v for k, v in w.items() if k != "params"}
        # w_{k,0} = w; theta_k starts from the received model each round (pFedMe's reference code).
        (w_k, theta_k, model_state), stats = local_scan(
            self.local_step,
            (w["params"], w["params"], model_state),
            shared.x,
            shared.y,
            inp.table,
            self.schedule,
            client_key(shared.key, SAMPLE, rnd, cid),
            client_key(shared.key, DROPOUT, rnd, cid),
            utable=inp.utable,
            unlabeled_batch=self.unlabeled_batch,
        )
        count = inp.table.count
        return PFedMeUpload(
            loss=stats["loss"],
            pl_rate=stats["pl_rate"],
            steps=stats["steps"],
            theta_k={"params": theta_k, **model_state},
            w_k={"params": w_k, **model_state},
            weight=(count if c.weighting == "num_samples" else (count > 0)).astype(jnp.float32),
        )

    def local_step(
        self, carry: tuple, batch: dict, rng: jax.Array
    ) -> tuple[tuple, tuple[jax.Array, jax.Array]]:
        """One local round r of pFedMe's Algorithm 1 on the batch D (x [B, ...], ux [U, ...]).

        carry: (w, theta, model_state): the local model w_{k,r} and the personalized model
        theta_k (params pytrees of the model's shapes), and the model's state (BatchNorm).

            theta <- K_in SGD steps (personal_lr), from the last theta, on
                     h_k(theta; w, D) = l_k(theta; D) + lambda/2 ||theta - w||^2,
                     an approximate prox_{l_k/lambda}(w) (Eq. (3))
            w     <- w - lr * lambda * (w - theta)   (the local update: lambda (w - theta)
                     approximates the gradient at w of the Moreau envelope F_k of Eq. (2))

        Returns the new carry and (h_k at the new theta and the old w, its pseudo-label rate).
        """
        c = self.cfg
        w, theta, model_state = carry

        def personal_step(_, theta_state):
            th, ms = theta_state
            (_, (ms, _)), g = jax.value_and_grad(self.inner, has_aux=True)(
                th, ms, batch, rng, w, True
            )
            return jax.tree.map(lambda a, b: a - c.pfedme_personal_lr * b, th, g), ms

        theta, model_state = jax.lax.fori_loop(
            0, c.pfedme_inner_steps, personal_step, (theta, model_state)
        )
        w_next = jax.tree.map(lambda a, b: a - c.lr * c.pfedme_lambda * (a - b), w, theta)
        loss, (_, aux) = self.inner(theta, model_state, batch, rng, w, True)
        return (w_next, theta, model_state), (loss, aux["pl_rate"])

    def server_update(
        self, state: FedAvgState, cohort: jax.Array, up: PFedMeUpload
    ) -> tuple[FedAvgState, dict]:
        """w <- (1 - beta) w + beta mean_k w_k over every leaf (Algorithm 1's server step); each
        client of the cohort keeps its theta_k."""
        everything = jax.tree.map(lambda m: True, self.mask)
        w = aggregate.server_update(state.w, up.w_k, up.weight, everything, self.cfg.pfedme_beta)
        moved = cohort.shape[0]
        comm = Comm(downloads=state.comm.downloads + moved, uploads=state.comm.uploads + moved)
        metrics = {
            **cohort_metrics(cohort, up.stats, up.theta_k),
            "comm_cost": comm.downloads + comm.uploads,
        }
        new = state.replace(
            round=state.round + 1, w=w, w_k=scatter(state.w_k, cohort, up.theta_k), comm=comm
        )
        return new, metrics


@register("pfedme", PFedMeConfig)
def pfedme(cfg: PFedMeConfig, **kw: Any) -> PFedMe:
    check_required(cfg, "pfedme", pl_weight=POSITIVE)
    return PFedMe(cfg, name="pfedme", pseudo_labels=True, fixmatch=True, **kw)
