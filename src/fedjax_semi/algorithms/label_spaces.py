"""Training and scoring inside a client's own label space (CoFED and its baselines).

A CoFED participant classifies among its own classes Y_i, a subset of the K global ones (CoFED
Sec. 3, Eq. 2). Every model here keeps a K-wide head and masks the logits of the classes outside
Y_i to -1e9, in the loss and in prediction: the same classifier as a |Y_i|-way softmax (masked
logits get no gradient), and every client of one architecture stays shape-compatible for vmap.
Labels come per table position (`labels`), so the same trainer runs on private data alone
(CoFED's Step 1) and on private data plus public pseudo-labels (Step 4).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.keys import FINETUNE_DROPOUT, FINETUNE_SAMPLE, client_key
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import (
    Schedule,
    cross_entropy,
    local_scan,
    logit_stats,
    masked_mean,
)
from fedjax_semi.kernels.voting import masked_argmax
from fedjax_semi.models.zoo import Model

NEG = -1e9  # the logit of a class outside the label space


def label_spaces(y: jax.Array, table: RoleTable, num_classes: int) -> jax.Array:
    """bool [C, K]: the classes among each client's visible labels (its declared Y_i).
    y [N] visible labels (-1 hidden); table [C, n] the clients' labeled rows."""
    labels = jnp.where(table.mask, y[table.idx], -1)  # [C, n]
    hit = labels[:, :, None] == jnp.arange(num_classes)[None, None, :]
    return jnp.any(hit, axis=1)


def masked_logits(logits: jax.Array, owns: jax.Array) -> jax.Array:
    """logits [..., K] with the classes outside owns [K] at -1e9."""
    return jnp.where(owns, logits, NEG)


def position_labels(y: jax.Array, table: RoleTable) -> jax.Array:
    """int32 [n]: the visible label of each position of one client's table row (-1 padding)."""
    return jnp.where(jnp.arange(table.idx.shape[0]) < table.count, y[table.idx], -1)


def fit_positions(
    model: Model,
    tx: optax.GradientTransformation,
    variables: PyTree,
    x: jax.Array,
    table: RoleTable,
    extras: dict[str, jax.Array],
    loss: Callable[[jax.Array, dict], jax.Array],
    schedule: Schedule,
    key_sample: jax.Array,
    key_dropout: jax.Array,
) -> tuple[PyTree, dict]:
    """One client's training with a fresh `tx` state on the rows of `table` (idx [n], count
    []), with per-position targets `extras` ({name: [n, ...]}) gathered into each batch and
    `loss(logits [B, K], batch) -> []`. -> (variables, stats: loss, steps)."""

    def step(carry, batch, rng):
        params, opt = carry

        def loss_fn(p):
            logits, _ = model.apply({"params": p}, batch["x"], train=True, rng=rng)
            return loss(logits, batch)

        value, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), (value, jnp.zeros(()))

    params = variables["params"]
    (params, _), stats = local_scan(
        step,
        (params, tx.init(params)),
        x,
        jnp.zeros(x.shape[:1], jnp.int32),  # unused by the step: targets come per position
        table,
        schedule,
        key_sample,
        key_dropout,
        extras=extras,
    )
    return {"params": params}, {"loss": stats["loss"], "steps": stats["steps"]}


def fit_in_space(
    model: Model,
    tx: optax.GradientTransformation,
    variables: PyTree,
    x: jax.Array,
    table: RoleTable,
    labels: jax.Array,
    owns: jax.Array,
    schedule: Schedule,
    key_sample: jax.Array,
    key_dropout: jax.Array,
) -> tuple[PyTree, dict]:
    """Masked cross-entropy of the model's logits restricted to owns [K], on the rows of
    `table` with labels [n] per position (-1: none). -> (variables, stats: loss, steps)."""

    def loss(logits, batch):
        ce = cross_entropy(masked_logits(logits, owns), batch["label"])
        return masked_mean(ce, batch["valid"] & (batch["label"] >= 0))

    return fit_positions(
        model, tx, variables, x, table, {"label": labels}, loss, schedule, key_sample, key_dropout
    )


def predict_in_space(
    model: Model, variables: PyTree, x: jax.Array, idx: jax.Array, owns: jax.Array, batch: int
) -> jax.Array:
    """int32 [M]: one model's hard labels (global ids inside owns [K]) of the rows idx [M],
    `batch` rows at a time (eval mode)."""
    m = idx.shape[0]
    nb = -(-m // batch)
    padded = jnp.pad(idx, (0, nb * batch - m)).reshape(nb, batch)

    def one(ids):
        logits, _ = model.apply(variables, x[ids])
        return masked_argmax(logits, owns)

    return jax.lax.map(one, padded).reshape(-1)[:m]


def score_in_space(
    model: Model,
    variables: PyTree,
    x: jax.Array,
    labels: jax.Array,
    table: RoleTable,
    owns: jax.Array,
    batch: int,
) -> dict:
    """Correct predictions (argmax over owns [K]) of one model on one client's table row
    (idx [n], count []), `batch` rows at a time: {"correct": int32 [], "count": int32 [], and
    the `logit_stats` of its predictions inside owns}."""
    n = table.idx.shape[0]
    nb = -(-n // batch)
    padded = jnp.pad(table.idx, (0, nb * batch - n)).reshape(nb, batch)
    valid = (jnp.arange(nb * batch) < table.count).reshape(nb, batch)

    def one(args):
        ids, ok = args
        logits, _ = model.apply(variables, x[ids])
        pred = masked_argmax(logits, owns)
        y = labels[ids]
        stats = logit_stats(masked_logits(logits, owns), pred, y, ok, owns)
        return jnp.sum((pred == y) & ok), stats

    correct, stats = jax.lax.map(one, (padded, valid))
    return {
        "correct": jnp.sum(correct),
        "count": table.count,
        **jax.tree.map(lambda a: jnp.sum(a, 0), stats),
    }


def finetune_and_score(
    model: Model,
    tx: optax.GradientTransformation,
    schedule: Schedule,
    variables: PyTree,
    data: tuple[jax.Array, jax.Array, jax.Array],
    train: RoleTable,
    test: RoleTable,
    owns: jax.Array,
    key: jax.Array,
    client: jax.Array,
    batch: int,
) -> dict:
    """A participant's personalised score (CoFED's baselines, Sec. 5.8): a copy of `variables`
    fine-tuned on its own rows `train` inside owns [K] (skipped when the schedule has no epoch),
    scored on its rows `test` with argmax over owns. data = (x [N, ...], visible y [N], true
    eval_y [N]); the true labels are read only for the score."""
    x, y, eval_y = data
    if schedule.epochs > 0:
        variables, _ = fit_in_space(
            model,
            tx,
            variables,
            x,
            train,
            position_labels(y, train),
            owns,
            schedule,
            client_key(key, FINETUNE_SAMPLE, 0, client),
            client_key(key, FINETUNE_DROPOUT, 0, client),
        )
    return score_in_space(model, variables, x, eval_y, test, owns, batch)
