"""Server-side aggregation: weighted means over the client axis, and which leaves are shared.

A share mask is a pytree of Python bools with the structure of the model variables: True leaves
are averaged by the server, False leaves stay with each client. FedAvg shares everything, Local
nothing, FedBN everything but BatchNorm, FedPer everything but the output layer, LG-FedAvg only
the output layer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

PyTree = Any


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
