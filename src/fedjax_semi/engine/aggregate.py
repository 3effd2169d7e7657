"""Server-side aggregation: weighted means over the client axis, and which leaves are shared.

A share mask is a pytree of Python bools with the structure of the model variables: True leaves
are averaged by the server, False leaves stay with each client. FedAvg shares everything, Local
nothing, FedBN everything but BatchNorm, FedPer everything but the output layer, LG-FedAvg only
the output layer.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from fedjax_semi.engine.pytrees import PyTree


def _is_norm(path: tuple[str, ...]) -> bool:
    return path[0] == "batch_stats" or any("norm" in p.lower() or p.startswith("bn") for p in path)


def _head_name(variables: PyTree) -> str:
    """The output layer: the last top-level module in the params (flax keeps call order)."""
    return list(variables["params"].keys())[-1]


SHARE_PRESETS = {
    "all": lambda path, head: True,
    "none": lambda path, head: False,
    "fedbn": lambda path, head: not _is_norm(path),
    "fedper": lambda path, head: path[1] != head,
    "lg": lambda path, head: path[1] == head,
}


def share_mask(variables: PyTree, preset: str) -> PyTree:
    """A pytree of bools over `variables` for the named preset."""
    rule = SHARE_PRESETS[preset]
    head = _head_name(variables)
    flat = traverse_util.flatten_dict(variables)
    return traverse_util.unflatten_dict({p: bool(rule(p, head)) for p in flat})


def all_shared(mask: PyTree) -> bool:
    return all(jax.tree.leaves(mask))


def merge(shared: PyTree, personal: PyTree, mask: PyTree) -> PyTree:
    """Take shared leaves from `shared` and the rest from `personal`."""
    return jax.tree.map(lambda m, s, p: s if m else p, mask, shared, personal)


def select_rows(mask: jax.Array, new: PyTree, old: PyTree) -> PyTree:
    """Per leaf of two stacked trees [N, ...], new[i] where mask[i] (bool [N]), else old[i]."""
    return jax.tree.map(
        lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old
    )


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
    """Weighted mean over the leading client axis. stacked leaves [S, ...], weights [S].

    Returns zeros where every weight is zero; callers keep the old value then (see `server_update`).
    """
    w = weights / jnp.maximum(jnp.sum(weights), 1e-12)
    return jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1), stacked)


def server_update(
    global_vars: PyTree, stacked: PyTree, weights: jax.Array, mask: PyTree, server_lr: float = 1.0
) -> PyTree:
    """global + server_lr * (weighted mean of clients - global) on shared leaves.

    A cohort whose weights are all zero (nobody had data) leaves the global model unchanged.
    """
    mean = weighted_mean(stacked, weights)
    any_data = jnp.sum(weights) > 0

    def upd(m, g, a):
        if not m:
            return g
        return jnp.where(any_data, g + server_lr * (a - g), g).astype(g.dtype)

    return jax.tree.map(upd, mask, global_vars, mean)


def segment_mean(stacked: PyTree, weights: jax.Array, segments: jax.Array, num: int) -> PyTree:
    """Weighted mean per segment (cluster).

    stacked leaves [S, ...], weights [S], segments int [S] -> leaves [num, ...].
    """
    tot = jax.ops.segment_sum(weights, segments, num)
    w = weights / jnp.maximum(tot[segments], 1e-12)

    def f(a):
        wa = a * w.reshape((-1,) + (1,) * (a.ndim - 1)).astype(a.dtype)
        return jax.ops.segment_sum(wa, segments, num)

    return jax.tree.map(f, stacked)


def mean_delta(global_vars: PyTree, stacked: PyTree, weights: jax.Array) -> PyTree:
    """The server's step direction: the weighted mean of the uploads minus the server model,
    Δ = Σ_k w_k y_k / Σ_k w_k − x (the negated pseudo-gradient of FedOpt, Reddi et al. 2021,
    Alg. 2); zero where every weight is zero. x + Δ is `server_update` with server_lr 1, bit
    for bit. stacked leaves [S, ...], weights [S]."""
    mean = weighted_mean(stacked, weights)
    any_data = jnp.sum(weights) > 0
    return jax.tree.map(
        lambda a, g: jnp.where(any_data, a - g, jnp.zeros_like(g)), mean, global_vars
    )


# ----------------------------------------------------------------------------- server optimizers

SERVER_OPTIMIZERS = ("sgd", "adam", "yogi", "adagrad")


class ServerMoments(NamedTuple):
    """FedOpt's moments of the pseudo-gradient (Reddi et al. 2021, Alg. 2): m_t, v_t."""

    m: PyTree
    v: PyTree


def scale_by_fedopt(rule: str, b1: float, b2: float, tau: float) -> optax.GradientTransformation:
    """Reddi et al. 2021, Algorithm 2, on the gradient g = −Δ (optax descends):

        m_t = β1 m_{t−1} + (1 − β1) g                          (every rule)
        v_t = v_{t−1} + g²                                      (adagrad)
        v_t = v_{t−1} − (1 − β2) g² sign(v_{t−1} − g²)          (yogi)
        v_t = β2 v_{t−1} + (1 − β2) g²                          (adam)
        update = m_t / (√v_t + τ)      from m_{−1} = 0, v_{−1} = τ²

    No bias correction, as in the paper's box. optax's own optimizers differ: `optax.adam`
    corrects the bias and starts v at 0; `optax.yogi` corrects the bias and starts m and v at
    1e-6 (its v rule is the one above); `optax.adagrad` has no momentum and divides by
    √(v + eps)."""

    def init(params: PyTree) -> ServerMoments:
        v0 = jax.tree.map(lambda p: jnp.full_like(p, tau**2), params)
        return ServerMoments(m=jax.tree.map(jnp.zeros_like, params), v=v0)

    def second(g: jax.Array, v: jax.Array) -> jax.Array:
        g2 = jnp.square(g)
        if rule == "adagrad":
            return v + g2
        if rule == "yogi":
            return v - (1 - b2) * g2 * jnp.sign(v - g2)
        return b2 * v + (1 - b2) * g2

    def update(grads: PyTree, state: ServerMoments, params: PyTree = None):
        del params
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.m, grads)
        v = jax.tree.map(second, grads, state.v)
        step = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + tau), m, v)
        return step, ServerMoments(m, v)

    if rule not in SERVER_OPTIMIZERS[1:]:
        raise ValueError(f"FedOpt rule {rule!r} is not one of {list(SERVER_OPTIMIZERS[1:])}")
    return optax.GradientTransformation(init, update)


def server_optimizer(
    name: str, lr: float, b1: float = 0.9, b2: float = 0.99, tau: float = 1e-3
) -> optax.GradientTransformation:
    """The server's optimizer of the pseudo-gradient −Δ (`mean_delta`): sgd is x + lr Δ (lr 1:
    FedAvg), adam | yogi | adagrad are FedAdam, FedYogi, FedAdagrad (`scale_by_fedopt`)."""
    if name == "sgd":
        return optax.sgd(lr)
    return optax.chain(scale_by_fedopt(name, b1, b2, tau), optax.scale_by_learning_rate(lr))
