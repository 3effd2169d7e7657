"""FedBE's Bayesian ensemble (Chen and Chao, "FedBE: Making Bayesian Model Ensemble Applicable
to Federated Learning", Sec. 4): a diagonal Gaussian fitted to the clients' models, samples drawn
from it, the ensemble's mean prediction on the server's pool, and the distillation loss toward it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import kl_divergence, masked_mean
from fedjax_semi.models.zoo import Model


def gaussian_fit(stacked: PyTree, weights: jax.Array) -> tuple[PyTree, PyTree]:
    """Diagonal Gaussian over client weights: leaves [S, ...], weights [S] >= 0 ->
    (mu, sigma^2), leaves [...] each: mu = sum_k a_k theta_k, sigma^2 = sum_k a_k (theta_k - mu)^2,
    a = weights / sum(weights) (FedAvg's data-size weights). All-zero weights give zeros."""
    a = weights / jnp.maximum(jnp.sum(weights), 1e-12)

    def moments(x):
        x = x.astype(jnp.float32)
        mu = jnp.tensordot(a, x, axes=1)
        return mu, jnp.tensordot(a, jnp.square(x - mu[None]), axes=1)

    pairs = jax.tree.map(moments, stacked)
    is_pair = lambda p: isinstance(p, tuple)  # noqa: E731
    return (
        jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair),
        jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair),
    )


def standard_normals(key: jax.Array, like: PyTree, num: int) -> PyTree:
    """z ~ N(0, I) with leaves [num, ...] shaped like `like`; leaf i uses fold_in(key, i)."""
    leaves, treedef = jax.tree.flatten(like)
    z = [
        jax.random.normal(jax.random.fold_in(key, i), (num, *leaf.shape), jnp.float32)
        for i, leaf in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, z)


def gaussian_sample(
    key: jax.Array, mu: PyTree, var: PyTree, num: int, scale: float = 1.0
) -> PyTree:
    """num models theta_s = mu + scale * sqrt(var) * z_s (leaves [num, ...]), z from
    `standard_normals(key, mu, num)`."""
    z = standard_normals(key, mu, num)
    return jax.tree.map(
        lambda m, v, e: (m[None] + scale * jnp.sqrt(v)[None] * e).astype(m.dtype), mu, var, z
    )


def ensemble_average(predict: Callable[[PyTree], jax.Array], members: PyTree) -> jax.Array:
    """p = mean over members e of softmax(predict(member_e)): members leaves [E, ...],
    predict(one member) -> logits [P, Q] -> [P, Q]. A scan, so memory holds one member's
    logits and the running sum."""

    def add(total, member):
        return total + jax.nn.softmax(predict(member).astype(jnp.float32), axis=-1), None

    first = jax.tree.map(lambda a: a[0], members)
    shape = jax.eval_shape(predict, first).shape
    total, _ = jax.lax.scan(add, jnp.zeros(shape, jnp.float32), members)
    return total / jax.tree.leaves(members)[0].shape[0]


def distill_targets(probs: jax.Array, mode: str = "soft") -> jax.Array:
    """What the global model is distilled on: the ensemble's probabilities [P, Q] ("soft"),
    or their argmax as one-hot rows ("hard", ties to the lowest class)."""
    if mode == "soft":
        return probs
    return jax.nn.one_hot(jnp.argmax(probs, axis=-1), probs.shape[-1], dtype=probs.dtype)


@dataclasses.dataclass(frozen=True)
class DistillObjective:
    """KL(target || softmax(f(w, x))) on a pool batch; the targets come as `batch["p"]`."""

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
        variables = {"params": params, **model_state}
        logits, new_state = self.model.apply(
            variables, batch["x"], train=True, rng=rng, mask=batch["valid"]
        )
        loss = masked_mean(kl_divergence(logits, batch["p"]), batch["valid"])
        return loss, (new_state, {"pl_rate": jnp.zeros(())})


# ----------------------------------------------------------------------------- the pool
