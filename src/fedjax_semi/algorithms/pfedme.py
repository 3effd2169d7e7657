"""pFedMe (Dinh et al., 2020) with FixMatch local loss: personalized models by Moreau envelopes
(a baseline of UM-pFSSL, its Sec. 6.1; our settings: docs/choices.md, UM-pFSSL A37).

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

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms.base import FLState, cohort_metrics, register
from fedjax_semi.algorithms.fedavg import FedAvgConfig, FedAvgFamily, FedAvgPlan, _check
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import scatter
from fedjax_semi.engine.keys import DROPOUT, SAMPLE, client_key
from fedjax_semi.engine.train import LocalObjective, batch_positions, random_positions
from fedjax_semi.errors import bad


@dataclasses.dataclass
class PFedMeConfig(FedAvgConfig):
    """pFedMe's knobs (values from the pFedMe paper's experiments)."""

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


@dataclasses.dataclass
class PFedMe(FedAvgFamily):
    cfg: PFedMeConfig
    name: str = "pfedme"

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self.cfg
        # Personalized theta_k live in client_vars (every leaf personal for evaluation); the
        # server averages the local models w_k into the global model.
        self.personal, self.has_global_model = True, True
        self.mask = jax.tree.map(lambda m: False, self.mask)
        self.inner = LocalObjective(
            self.model,
            prox_mu=c.pfedme_lambda,
            pl_weight=c.pl_weight,
            pl_threshold=c.pl_threshold,
            fixmatch=True,
        )

    def client_update(self, inp, shared):
        c, rnd, cid = self.cfg, shared["round"], inp["id"]
        table, utable = inp["table"], inp["utable"]
        w = shared["global"]
        theta = w  # theta_k starts from the received model each round (pFedMe's reference code)
        n_max = table.idx.shape[0]
        steps = self.schedule.num_steps(n_max)
        key_s = client_key(shared["key"], SAMPLE, rnd, cid)
        pos, valid = batch_positions(key_s, table.count, n_max, self.schedule)
        upos, uvalid = random_positions(
            jax.random.fold_in(key_s, 1), utable.count, steps, self.unlabeled_batch
        )
        key_d = client_key(shared["key"], DROPOUT, rnd, cid)
        x, y = shared["x"], shared["y"]

        def step(carry, s):
            w_p, theta_p, mstate = carry
            ids = table.idx[s["pos"]]
            batch = {
                "x": x[ids],
                "y": y[ids],
                "valid": s["valid"],
                "ux": x[utable.idx[s["upos"]]],
                "uvalid": s["uvalid"],
            }
            rng = jax.random.fold_in(key_d, s["step"])

            def inner(_, th):
                th_p, ms = th
                (_, (new_ms, _)), g = jax.value_and_grad(self.inner, has_aux=True)(
                    th_p, ms, batch, rng, w_p, True
                )
                th_p = jax.tree.map(lambda a, b: a - c.pfedme_personal_lr * b, th_p, g)
                return th_p, new_ms

            theta_new, ms_new = jax.lax.fori_loop(0, c.pfedme_inner_steps, inner, (theta_p, mstate))
            w_new = jax.tree.map(lambda a, b: a - c.lr * c.pfedme_lambda * (a - b), w_p, theta_new)
            active = jnp.any(s["valid"])
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(active, a, b), new, old)
            loss, _ = self.inner(theta_new, ms_new, batch, rng, w_p, True)
            return (keep(w_new, w_p), keep(theta_new, theta_p), keep(ms_new, mstate)), (
                loss * active,
                active,
            )

        model_state = {k: v for k, v in theta.items() if k != "params"}
        xs = {
            "pos": pos,
            "valid": valid,
            "upos": upos,
            "uvalid": uvalid,
            "step": jnp.arange(steps),
        }
        (w_k, theta_k, mstate), (losses, active) = jax.lax.scan(
            step, (w["params"], theta["params"], model_state), xs
        )
        n_active = jnp.sum(active)
        count = table.count
        return {
            "vars": {"params": w_k, **mstate},
            "theta": {"params": theta_k, **mstate},
            "opt": {},
            "weight": (count if c.weighting == "num_samples" else (count > 0)).astype(jnp.float32),
            "loss": jnp.sum(losses) / jnp.maximum(n_active, 1),
            "steps": n_active,
            "pl_rate": jnp.zeros(()),
        }

    def finish(self, state: FLState, plan: FedAvgPlan, out, key: jax.Array):
        c, cohort = self.cfg, plan.cohort
        everything = jax.tree.map(lambda m: True, self.mask)
        new_global = aggregate.server_update(
            state.global_vars, out["vars"], out["weight"], everything, c.pfedme_beta
        )
        comm = {k: v + cohort.shape[0] for k, v in state.extra["comm"].items()}
        metrics = {
            **cohort_metrics(cohort, out, out["theta"]),
            "comm_cost": comm["downloads"] + comm["uploads"],
        }
        return state.replace(
            round=state.round + 1,
            global_vars=new_global,
            client_vars=scatter(state.client_vars, cohort, out["theta"]),
            extra={**state.extra, "comm": comm},
        ), metrics


@register("pfedme", PFedMeConfig)
def pfedme(cfg: PFedMeConfig, **kw) -> PFedMe:
    _check(cfg, "pfedme", pl_weight=(lambda v: v > 0, "a number > 0"))
    return PFedMe(cfg, name="pfedme", pseudo_labels=True, fixmatch=True, **kw)
