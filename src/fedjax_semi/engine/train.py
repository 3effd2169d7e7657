"""Local training of one client (vmapped over the cohort by the caller), losses and evaluation.

All functions here see ONE client; `engine.clients.map_clients` adds the client axis.
Local training is a `lax.scan` over a static number of steps (`local_scan`). Clients with less
data than the cohort's widest table run masked steps that leave their state untouched, so every
client of a chunk follows one program. `local_train` runs an optax step on a loss in that scan;
a method with its own update rule (pFedMe) passes its step to `local_scan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.keys import AUGMENT_STREAM
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.models.zoo import Model

# ----------------------------------------------------------------------------- losses


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of values[mask]; 0 when the mask is empty. values, mask: [B]."""
    m = mask.astype(values.dtype)
    return jnp.sum(values * m) / jnp.maximum(jnp.sum(m), 1.0)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example CE with integer labels: [B, K], [B] -> [B]. Labels < 0 give 0."""
    safe = jnp.maximum(labels, 0)
    return optax.softmax_cross_entropy_with_integer_labels(logits, safe) * (labels >= 0)


def soft_cross_entropy(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    """Per-example CE against soft labels: [B, K], [B, K] -> [B]."""
    return -jnp.sum(target_probs * jax.nn.log_softmax(logits), axis=-1)


def kl_divergence(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    """Per-example KL(target || softmax(logits)): [B, K], [B, K] -> [B]."""
    logt = jnp.log(jnp.clip(target_probs, 1e-12, 1.0))
    return jnp.sum(target_probs * (logt - jax.nn.log_softmax(logits)), axis=-1)


def reverse_kl_divergence(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    """Per-example KL(softmax(logits) || target): [B, K], [B, K] -> [B]. The target is floored
    at 1e-12, so a one-hot target gives a large but finite loss."""
    logp = jax.nn.log_softmax(logits)
    logt = jnp.log(jnp.clip(target_probs, 1e-12, 1.0))
    return jnp.sum(jnp.exp(logp) * (logp - logt), axis=-1)


def sq_distance(a: PyTree, b: PyTree) -> jax.Array:
    """||a - b||^2 over all leaves."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return sum(jnp.sum(jnp.square(x - y)) for x, y in pairs)


# ----------------------------------------------------------------------------- optimizers


# optax optimizers whose update needs only (grads, state, params).
_OPTIMIZERS = (
    "sgd", "adam", "adamw", "nadam", "nadamw", "adagrad", "adadelta", "adafactor", "adamax",
    "adamaxw", "adabelief", "amsgrad", "lamb", "lars", "lion", "novograd", "radam", "rmsprop",
    "sm3", "yogi", "noisy_sgd", "fromage", "sign_sgd",
)  # fmt: skip


def optimizer_names() -> list[str]:
    """The optax optimizers the engine accepts by name."""
    return sorted(n for n in _OPTIMIZERS if hasattr(optax, n))


def make_optimizer(
    name: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> optax.GradientTransformation:
    """Any optax optimizer by alias name. `momentum` applies to sgd; `weight_decay` is decoupled
    for adamw and added to the gradient (L2) for the others."""
    if name not in optimizer_names():
        raise ValueError(
            f"algorithm.optimizer={name!r} is not allowed: an optax optimizer, one of "
            f"{optimizer_names()}"
        )
    if name == "sgd":
        tx = optax.sgd(lr, momentum=momentum or None)
    elif name == "adamw":
        return optax.adamw(lr, weight_decay=weight_decay)
    else:
        tx = getattr(optax, name)(lr)
    return optax.chain(optax.add_decayed_weights(weight_decay), tx) if weight_decay else tx


# ----------------------------------------------------------------------------- batches


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How many local steps a client runs, and over which batches (static)."""

    batch_size: int
    epochs: int  # > 0: epochs over the primary table; 0: `steps` random batches
    steps: int

    def num_steps(self, n_max: int) -> int:
        if self.epochs > 0:
            return self.epochs * -(-n_max // self.batch_size)
        return self.steps


def batch_positions(
    key: jax.Array, count: jax.Array, n_max: int, schedule: Schedule
) -> tuple[jax.Array, jax.Array]:
    """Positions into a client's table row for every step.

    Returns (pos int32 [T, B], valid bool [T, B]). Epoch mode walks a fresh permutation of the
    client's `count` valid entries each epoch; step mode draws B positions uniformly per step.
    """
    b = schedule.batch_size
    if schedule.epochs > 0:
        spe = -(-n_max // b)
        keys = jax.random.split(key, schedule.epochs)
        # Valid entries first, in random order; padding last.
        slot = jnp.arange(n_max)

        # One draw per slot, keyed on the slot: the order of a client's valid entries does not
        # depend on how far its row is padded.
        def perm(k):
            u = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(k, i)))(slot)
            return jnp.argsort(jnp.where(slot < count, u, 2.0))

        perms = jax.vmap(perm)(keys)
        pad = spe * b - n_max
        perms = jnp.pad(perms, ((0, 0), (0, pad)))
        valid = jnp.pad(slot < count, (0, pad))
        pos = perms.reshape(schedule.epochs * spe, b)
        valid = jnp.tile(valid.reshape(spe, b), (schedule.epochs, 1))
        return pos.astype(jnp.int32), valid
    pos = jax.random.randint(key, (schedule.steps, b), 0, jnp.maximum(count, 1))
    valid = jnp.broadcast_to(count > 0, (schedule.steps, b))
    return pos.astype(jnp.int32), valid


def random_positions(
    key: jax.Array, count: jax.Array, steps: int, size: int
) -> tuple[jax.Array, jax.Array]:
    """`size` uniform positions per step into a table row: (pos [T, size], valid [T, size])."""
    pos = jax.random.randint(key, (steps, size), 0, jnp.maximum(count, 1))
    return pos.astype(jnp.int32), jnp.broadcast_to(count > 0, (steps, size))


# ----------------------------------------------------------------------------- local training


@dataclasses.dataclass(frozen=True)
class LocalObjective:
    """The local loss: masked CE on labeled batches, plus optional terms (all knobs).

    prox_mu: FedProx's (mu / 2) ||w - w_anchor||^2.
    pl_weight, pl_threshold: CE on the client's own confident pseudo-labels (argmax of the
        model's deterministic prediction at the current step, stop-gradient) of unlabeled inputs.
    fixmatch: FixMatch's augmentations: labeled inputs and the teacher see weak(x), the student
        sees strong(x) of the unlabeled inputs (Sohn et al. 2020).
    """

    model: Model
    prox_mu: float = 0.0
    pl_weight: float = 0.0
    pl_threshold: float = 0.95
    fixmatch: bool = False

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
        x, y, valid = batch["x"], batch["y"], batch["valid"]
        use_pl = self.pl_weight > 0 and "ux" in batch
        ux_teacher = ux_student = batch.get("ux")
        if self.fixmatch:
            from fedjax_semi.engine import augment

            k_l, k_w, k_s = jax.random.split(jax.random.fold_in(rng, AUGMENT_STREAM), 3)
            x = augment.augment_batch(augment.weak, x, k_l)
            if use_pl:
                ux_teacher = augment.augment_batch(augment.weak, batch["ux"], k_w)
                ux_student = augment.augment_batch(augment.strong, batch["ux"], k_s)
        if use_pl:
            # One forward over labeled and unlabeled inputs, so BatchNorm sees both (FixMatch).
            logits_all, new_state = self.model.apply(
                variables,
                jnp.concatenate([x, ux_student.astype(x.dtype)]),
                train=True,
                rng=rng,
                mask=jnp.concatenate([valid, batch["uvalid"]]),
            )
            logits, ulogits = logits_all[: x.shape[0]], logits_all[x.shape[0] :]
        else:
            logits, new_state = self.model.apply(variables, x, train=True, rng=rng, mask=valid)
        loss = masked_mean(cross_entropy(logits, y), valid & (y >= 0))
        aux = {"pl_rate": jnp.zeros(())}
        if use_pl:
            teacher, _ = self.model.apply(jax.lax.stop_gradient(variables), ux_teacher)
            probs = jax.nn.softmax(teacher)
            confident = (jnp.max(probs, -1) >= self.pl_threshold) & batch["uvalid"] & pl_on
            pseudo = jnp.argmax(probs, -1)
            ce_u = cross_entropy(ulogits, pseudo) * confident
            loss = loss + self.pl_weight * masked_mean(ce_u, batch["uvalid"])
            aux["pl_rate"] = masked_mean(confident.astype(jnp.float32), batch["uvalid"])
        if self.prox_mu > 0:
            loss = loss + 0.5 * self.prox_mu * sq_distance(params, anchor)
        return loss, (new_state, aux)


# A local step: step(carry, batch, rng) -> (carry, (loss [], pl_rate [])). `batch` holds x [B, ...],
# y [B], valid [B], the table row's extras [B, ...] and, with an unlabeled table, ux [U, ...] and
# uvalid [U]; rng is the step's dropout key. The carry is whatever the method trains.
LocalStep = Callable[[PyTree, dict, jax.Array], tuple[PyTree, tuple[jax.Array, jax.Array]]]


def local_scan(
    step: LocalStep,
    carry: PyTree,
    data_x: jax.Array,
    data_y: jax.Array,
    table: RoleTable,
    schedule: Schedule,
    key_sample: jax.Array,
    key_dropout: jax.Array,
    utable: RoleTable | None = None,
    unlabeled_batch: int = 0,
    extras: dict | None = None,
) -> tuple[PyTree, dict]:
    """Run `step` over one client's batches: a `lax.scan` of schedule.num_steps(n_max) steps.

    `table` is this client's row of the primary role (idx [n_max], count []); `utable` its row of
    the unlabeled role, from which each step draws `unlabeled_batch` uniform positions. `extras`
    are per-position arrays of the table row ([n_max, ...], e.g. soft targets), gathered into each
    batch under their own names. A step without a valid example leaves `carry` as it was.

    Returns (carry, stats) with stats: loss (mean over active steps), steps (number of active
    steps), pl_rate (mean over active steps).
    """
    n_max = table.idx.shape[0]
    steps = schedule.num_steps(n_max)
    pos, valid = batch_positions(key_sample, table.count, n_max, schedule)
    xs = {"pos": pos, "valid": valid, "step": jnp.arange(steps)}
    if utable is not None and unlabeled_batch > 0:
        upos, uvalid = random_positions(
            jax.random.fold_in(key_sample, 1), utable.count, steps, unlabeled_batch
        )
        xs.update(upos=upos, uvalid=uvalid)

    def active_step(carry, s):
        ids = table.idx[s["pos"]]
        batch = {"x": data_x[ids], "y": data_y[ids], "valid": s["valid"]}
        batch.update({k: v[s["pos"]] for k, v in (extras or {}).items()})
        if "upos" in s:
            batch.update(ux=data_x[utable.idx[s["upos"]]], uvalid=s["uvalid"])
        return step(carry, batch, jax.random.fold_in(key_dropout, s["step"]))

    def masked_step(carry, s):
        # A step with no valid example leaves the client as it was (momentum included). A
        # client mapped on its own (chunk=1) skips such steps; under vmap both branches run
        # and the select keeps the old state.
        active = jnp.any(s["valid"])
        skip = lambda carry, s: (carry, (jnp.zeros(()), jnp.zeros(())))
        carry, (loss, pl) = jax.lax.cond(active, active_step, skip, carry, s)
        return carry, (loss * active, active, pl * active)

    carry, (losses, active, pl_rate) = jax.lax.scan(masked_step, carry, xs)
    n_active = jnp.sum(active)
    denom = jnp.maximum(n_active, 1)
    stats = {
        "loss": jnp.sum(losses) / denom,
        "steps": n_active,
        "pl_rate": jnp.sum(pl_rate) / denom,
    }
    return carry, stats


def local_train(
    objective: Callable,
    tx: optax.GradientTransformation,
    variables: PyTree,
    opt_state: PyTree,
    data_x: jax.Array,
    data_y: jax.Array,
    table: RoleTable,
    schedule: Schedule,
    key_sample: jax.Array,
    key_dropout: jax.Array,
    anchor: PyTree | None = None,
    utable: RoleTable | None = None,
    unlabeled_batch: int = 0,
    pl_on: jax.Array | bool = True,
    extras: dict | None = None,
) -> tuple[PyTree, PyTree, dict]:
    """Train one client: a step of `tx` on the gradient of `objective(params, model_state, batch,
    rng, anchor, pl_on) -> (loss, (model_state, {"pl_rate": []}))` per batch of `local_scan`.
    `variables` holds params and the model's state; `anchor` (default: the initial params) is
    FedProx's reference point.

    Returns (variables, opt_state, stats) with stats: loss (mean over active steps), steps
    (number of active steps), pl_rate (mean share of confident pseudo-labels).
    """
    anchor = variables["params"] if anchor is None else anchor
    model_state = {k: v for k, v in variables.items() if k != "params"}

    def sgd_step(carry, batch, rng):
        params, mstate, opt = carry
        (loss, (new_mstate, aux)), grads = jax.value_and_grad(objective, has_aux=True)(
            params, mstate, batch, rng, anchor, pl_on
        )
        updates, new_opt = tx.update(grads, opt, params)
        new_params = optax.apply_updates(params, updates)
        return (new_params, new_mstate, new_opt), (loss, aux["pl_rate"])

    (params, model_state, opt_state), stats = local_scan(
        sgd_step,
        (variables["params"], model_state, opt_state),
        data_x,
        data_y,
        table,
        schedule,
        key_sample,
        key_dropout,
        utable=utable,
        unlabeled_batch=unlabeled_batch,
        extras=extras,
    )
    return {"params": params, **model_state}, opt_state, stats


# ----------------------------------------------------------------------------- evaluation


def histogram(values: jax.Array, mask: jax.Array, k: int) -> jax.Array:
    """int32 [K]: how many of values[mask] fall in each class 0..K-1 (values < 0 are left out)."""
    ids = jnp.where(values >= 0, values, k)  # out of range: dropped by the scatter
    return jnp.zeros(k, jnp.int32).at[ids].add(mask.astype(jnp.int32), mode="drop")


def example_stats(logits: jax.Array, classes: jax.Array | None = None) -> dict:
    """Per example of logits [B, K]: the predictive entropy (nats) of the softmax and max |logit|.
    `classes` bool [K] (a client's label space, its other logits masked) limits both to those."""
    logp = jax.nn.log_softmax(logits)
    plogp = jnp.exp(logp) * logp
    size = jnp.abs(logits)
    if classes is not None:
        plogp, size = jnp.where(classes, plogp, 0.0), jnp.where(classes, size, 0.0)
    return {"entropy": -jnp.sum(plogp, -1), "max_logit": jnp.max(size, -1)}


def logit_stats(
    logits: jax.Array,
    pred: jax.Array,
    labels: jax.Array,
    mask: jax.Array,
    classes: jax.Array | None = None,
) -> dict:
    """What shows a broken model, summed over one model's valid rows (mask [B]): histograms [K]
    of its predictions `pred` [B] and of the true labels [B], and the summed entropy and max
    |logit| of `example_stats`. `algorithms.base.sanity` turns them into a row's columns."""
    k = logits.shape[-1]
    each = example_stats(logits, classes)
    m = mask.astype(logits.dtype)
    return {
        "pred_hist": histogram(pred, mask, k),
        "label_hist": histogram(labels, mask, k),
        "entropy": jnp.sum(each["entropy"] * m),
        "max_logit": jnp.sum(each["max_logit"] * m),
    }


def evaluate_row(
    model: Model, variables: PyTree, data_x: jax.Array, labels: jax.Array, table: RoleTable
) -> dict:
    """Accuracy and loss of one model on one client's table row (idx [n_max], count []), and the
    `logit_stats` of its predictions."""
    logits, _ = model.apply(variables, data_x[table.idx])
    mask = jnp.arange(table.idx.shape[0]) < table.count
    y = labels[table.idx]
    pred = jnp.argmax(logits, -1)
    correct = jnp.sum((pred == y) & mask)
    loss = jnp.sum(cross_entropy(logits, y) * mask)
    return {
        "correct": correct,
        "count": table.count,
        "loss": loss,
        **logit_stats(logits, pred, y, mask),
    }


def evaluate_indices(
    model: Model,
    variables: PyTree,
    data_x: jax.Array,
    labels: jax.Array,
    idx: jax.Array,
    batch: int,
) -> dict:
    """One model on a server-side index set idx [M], in batches of `batch`.

    Returns accuracy, mean loss, the per-example `correct` bool [M], `stats` (the set's
    `logit_stats` and its size `count`) and `each` (per example: pred [M] and `example_stats`,
    which `table_stats` splits by client).
    """
    m = idx.shape[0]
    nb = -(-m // batch)
    padded = jnp.pad(idx, (0, nb * batch - m)).reshape(nb, batch)
    valid = (jnp.arange(nb * batch) < m).reshape(nb, batch)

    def one(args):
        ids, ok = args
        logits, _ = model.apply(variables, data_x[ids])
        y = labels[ids]
        pred = jnp.argmax(logits, -1)
        each = {"pred": pred, **example_stats(logits)}
        k = logits.shape[-1]
        hists = histogram(pred, ok, k), histogram(y, ok, k)
        return pred == y, cross_entropy(logits, y), each, hists

    correct, loss, each, (pred_hist, label_hist) = jax.lax.map(one, (padded, valid))
    correct, loss = correct.reshape(-1)[:m], loss.reshape(-1)[:m]
    each = {k: v.reshape(-1)[:m] for k, v in each.items()}
    stats = {
        "pred_hist": jnp.sum(pred_hist, 0),
        "label_hist": jnp.sum(label_hist, 0),
        "entropy": jnp.sum(each["entropy"]),
        "max_logit": jnp.sum(each["max_logit"]),
        "count": jnp.asarray(m, jnp.int32),
    }
    return {
        "accuracy": jnp.mean(correct),
        "loss": jnp.mean(loss),
        "correct": correct,
        "stats": stats,
        "each": each,
    }


def table_stats(each: dict, idx: jax.Array, table: RoleTable, labels: jax.Array, k: int) -> dict:
    """Per-client `logit_stats` [C, ...] of one model's per-example values `each` on the index set
    idx [M] (`evaluate_indices`' "each"), for client tables whose rows all lie in idx
    (fed.test_in_global): no second pass over the data."""
    n = labels.shape[0]
    full = {key: jnp.zeros(n, v.dtype).at[idx].set(v) for key, v in each.items()}
    mask = table.mask
    rows = {key: v[table.idx] for key, v in full.items()}  # [C, n_max]
    hist = jax.vmap(lambda v, m: histogram(v, m, k))
    m = mask.astype(rows["entropy"].dtype)
    return {
        "pred_hist": hist(rows["pred"], mask),
        "label_hist": hist(labels[table.idx], mask),
        "entropy": jnp.sum(rows["entropy"] * m, axis=1),
        "max_logit": jnp.sum(rows["max_logit"] * m, axis=1),
    }
