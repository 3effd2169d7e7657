"""UM-pFSSL's local training (Shi, Chen and Zhang, Alg. 1 l.18-20 with Eq. 1 and Eq. 5): E epochs
from the client's Corr-aggregated model on its labeled rows (cross-entropy) and its pseudo-labeled
rows (KL to the helpers' labels y_hat). `um_pfssl.py` calls it for each client of its round."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_semi.algorithms.base import RoundShared
from fedjax_semi.algorithms.um_pfssl_config import UMPFSSLConfig
from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.keys import DROPOUT, SAMPLE, client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import (
    Schedule,
    kl_divergence,
    local_train,
    masked_mean,
    reverse_kl_divergence,
)
from fedjax_semi.models.zoo import Model


@dataclasses.dataclass(frozen=True)
class UMObjective:
    """(mu CE(labeled) + (1 - mu) KL(y_hat || f_w)) summed over the batch / n_valid (Eq. 1;
    Eq. 5's KL in the distillation direction, defined for one-hot targets, where it equals CE).
    The batch carries each row's target [B, C] and weight [B] (mu, 1 - mu, or 0 for a dropped
    pseudo-label); with kl_direction=model_to_target the rows with batch["reverse"] (the
    pseudo-labeled ones) take KL(f_w || y_hat), Alg. 1 l.20 as printed."""

    model: Model

    def __call__(
        self,
        params: PyTree,
        model_state: dict[str, Any],
        batch: dict,
        rng: jax.Array,
        anchor: PyTree,
        pl_on: jax.Array | bool,
    ) -> tuple[jax.Array, tuple[dict[str, Any], dict[str, jax.Array]]]:
        logits, new_state = self.model.apply(
            {"params": params, **model_state}, batch["x"], train=True, rng=rng, mask=batch["valid"]
        )
        per = kl_divergence(logits, batch["target"])
        if "reverse" in batch:
            per = jnp.where(batch["reverse"], reverse_kl_divergence(logits, batch["target"]), per)
        per = per * batch["weight"]
        return masked_mean(per, batch["valid"]), (new_state, {"pl_rate": jnp.zeros(())})


def train_personal(
    cfg: UMPFSSLConfig,
    objective: UMObjective,
    tx: optax.GradientTransformation,
    schedule: Schedule,
    agg: PyTree,
    inp: Any,
    shared: RoundShared,
    y_hat: jax.Array,
    keep: jax.Array,
    mu: jax.Array,
) -> tuple[PyTree, dict]:
    """E local epochs (E is not given in the paper) from the aggregated model `agg` of client
    inp.id (its tables inp.lab [Ns], inp.unl [Nu]); momentum starts fresh, as in standard FL.
    y_hat [Nu, C] are the pseudo-labels; unlabeled rows with keep [Nu] false (below
    pl_threshold) get weight 0. -> (variables, {"loss", "steps"}).

    joint: each epoch shuffles D_k = D_k^s + D_k^u (compacted into one table row) with
    per-sample weights mu (labeled, one-hot target) and 1 - mu (unlabeled, y_hat).
    alternating: each epoch is a CE pass over D_k^s, then a KL pass over D_k^u, unweighted
    (Alg. 1 l.19-20).
    """
    c, k, t = cfg, inp.id, shared.round
    lab, unl = inp.lab, inp.unl
    n_s, n_u = lab.count, unl.count
    one_hot = lambda idx: jax.nn.one_hot(shared.y[idx], y_hat.shape[-1])
    key_s = client_key(shared.key, SAMPLE, t, k)
    key_d = client_key(shared.key, DROPOUT, t, k)
    train = functools.partial(local_train, objective, tx, data_x=shared.x, data_y=shared.y)
    if c.loss_schedule == "joint":
        ns_max, nu_max = lab.idx.shape[0], unl.idx.shape[0]
        p = jnp.arange(ns_max + nu_max)
        is_lab = p < n_s
        upos = jnp.clip(p - n_s, 0, nu_max - 1)
        idx = jnp.where(is_lab, lab.idx[jnp.clip(p, 0, ns_max - 1)], unl.idx[upos])
        target = jnp.where(is_lab[:, None], one_hot(idx), y_hat[upos])
        weight = jnp.where(is_lab, mu, (1.0 - mu) * keep[upos])
        extras = {"target": target, "weight": weight}
        if c.kl_direction == "model_to_target":
            extras["reverse"] = ~is_lab  # labeled rows keep CE (KL of a one-hot target)
        new_vars, _, stats = train(
            variables=agg,
            opt_state=tx.init(agg["params"]),
            table=RoleTable(idx, n_s + n_u),
            schedule=schedule,
            key_sample=key_s,
            key_dropout=key_d,
            extras=extras,
        )
        return new_vars, stats

    one_epoch = Schedule(schedule.batch_size, 1, 0)
    unl_extras = {"target": y_hat, "weight": keep.astype(jnp.float32)}
    if c.kl_direction == "model_to_target":
        unl_extras["reverse"] = jnp.ones(unl.idx.shape[0], bool)
    passes = [
        (lab, {"target": one_hot(lab.idx), "weight": jnp.ones(lab.idx.shape[0])}),
        (unl, unl_extras),
    ]

    def epoch(carry, e):
        variables, opt, loss_sum, steps = carry
        for j, (table, extras) in enumerate(passes):
            variables, opt, st = train(
                variables=variables,
                opt_state=opt,
                table=table,
                schedule=one_epoch,
                key_sample=jax.random.fold_in(key_s, 2 * e + j),
                key_dropout=jax.random.fold_in(key_d, 2 * e + j),
                extras=extras,
            )
            loss_sum, steps = loss_sum + st["loss"] * st["steps"], steps + st["steps"]
        return (variables, opt, loss_sum, steps), None

    init = (agg, tx.init(agg["params"]), jnp.zeros(()), jnp.zeros((), jnp.int32))
    (new_vars, _, loss_sum, steps), _ = jax.lax.scan(epoch, init, jnp.arange(schedule.epochs))
    return new_vars, {"loss": loss_sum / jnp.maximum(steps, 1), "steps": steps}
