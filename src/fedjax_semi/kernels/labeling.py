"""CFSL's labeling kernels (Hamood et al., Eqs. 17-20 and problems P2, P3):
confidence thresholding of pseudo-labels (Eqs. 17-18), the utility U[m, i] of cluster model m
for worker i, the best-performing specialized model (BM, P2's one-hot z_i), the weighted
ensemble (EM, P3's alpha_i with probability-level averaging) and the labeling accuracy.

Eqs. 19-20 (the loss over D_i^l and D_psdo,i, and n_train = n_lab + sum accepted) are the
caller's: `threshold` returns the acceptance mask whose sum is D_psdo,i.

Everything here is pure jnp over fixed shapes, jit/vmap-compatible, with no Python loop over
clients or models. `C` is the client (worker) axis, `N` the padded per-worker sample axis,
`Y` the classes and `K` the cluster-model slots (K_max); `active [K] bool` marks the slots
that hold a cluster model. Shapes and settings are checked when concrete; under jit or vmap
the caller checks them before tracing.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.errors import bad, check_choice
from fedjax_semi.kernels.checks import as_float, concrete

WEIGHTINGS = ("proportional", "softmax")  # option `ensemble_weighting`: P3's alpha from U


def _check_shape(key: str, shape: tuple[int, ...], want: tuple[int, ...], allowed: str) -> None:
    if tuple(shape) != tuple(want):
        raise bad(key, tuple(shape), allowed)


def _check_probs(probs: jax.Array, mask: jax.Array, mask_key: str) -> None:
    if probs.ndim != 3:
        raise bad("probs.shape", probs.shape, "[C, N, Y]")
    _check_shape(
        f"{mask_key}.shape", jnp.shape(mask), probs.shape[:2], f"[C, N] = {probs.shape[:2]}"
    )


def _check_slots(utility: jax.Array, active: jax.Array, key: str = "utility") -> None:
    if utility.ndim != 2:
        raise bad(f"{key}.shape", utility.shape, "[K, C]")
    _check_shape("active.shape", jnp.shape(active), utility.shape[:1], f"[K] = {utility.shape[:1]}")


def _check_some_active(active: jax.Array) -> None:
    a = concrete(active)
    if a is not None and not a.any():
        raise bad("active", a.tolist(), "at least one active model slot")


# ----------------------------------------------------------------------------- Eqs. 17-18


def threshold(
    probs: jax.Array, phi: float | jax.Array, eligible: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Eqs. 17-18: pseudo-label = argmax_c p_c(x), accepted iff max_c p_c(x) >= phi.

    probs [C, N, Y] (softmax outputs of the labeling model: BM's chosen model or the EM
    ensemble), phi [] (Phi; 0 accepts every eligible sample, > 1 none), eligible [C, N] bool
    (unlabeled, non-padding samples of workers due for labeling) -> (pseudo_y int32 [C, N],
    accepted bool [C, N]). pseudo_y is the argmax everywhere (lowest class on ties), so the
    caller can also score rejected samples; only `accepted` says which enter D_psdo,i.
    Ineligible samples (labeled or padding) are never accepted.
    """
    probs = as_float(probs)
    _check_probs(probs, eligible, "eligible")
    p = concrete(phi)
    if p is not None and (p.shape != () or np.isnan(p)):
        raise bad("algorithm.phi", phi, "a number (0 accepts every eligible sample, > 1 none)")
    chex.assert_rank(phi, 0)  # traced phi: concrete() could not check it
    pseudo_y = jnp.argmax(probs, axis=-1).astype(jnp.int32)
    conf = jnp.max(probs, axis=-1)
    return pseudo_y, (conf >= phi) & jnp.asarray(eligible, bool)


# ----------------------------------------------------------------------------- pass 1 statistics


def correct_count(probs: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Samples where argmax p(x) equals the label, per worker: probs [C, N, Y], labels [C, N]
    int, mask [C, N] bool (e.g. worker i's labeled set D_i^l) -> int32 [C]. One model's row of
    the `correct_counts [K, C]` that `accuracy_utility` takes (lax.map over the K models)."""
    probs, labels = as_float(probs), jnp.asarray(labels)
    _check_probs(probs, mask, "mask")
    chex.assert_shape(labels, probs.shape[:2])
    hit = (jnp.argmax(probs, axis=-1) == labels) & jnp.asarray(mask, bool)
    return jnp.sum(hit, axis=-1, dtype=jnp.int32)


def mean_confidence(probs: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over the masked samples of max_c p_c(x) per worker: probs [C, N, Y], mask [C, N]
    bool (e.g. D_i^u) -> f32 [C], 0 for a worker with no masked sample. One model's row of
    the `tiebreak [K, C]` that `best_model` takes."""
    probs = as_float(probs)
    _check_probs(probs, mask, "mask")
    mask = jnp.asarray(mask, bool)
    total = jnp.sum(jnp.where(mask, jnp.max(probs, axis=-1), 0.0), axis=-1)
    n = jnp.sum(mask, axis=-1)
    return total / jnp.maximum(n, 1)


# ----------------------------------------------------------------------------- utility


def accuracy_utility(correct_counts: jax.Array, counts: jax.Array, active: jax.Array) -> jax.Array:
    """U[m, i] = accuracy of model m on worker i's labeled set D_i^l, the only label signal
    a worker has -> f32 [K, C].

    correct_counts [K, C] int (`correct_count` per model), counts [C] = |D_i^l|, active [K]
    bool. Inactive slots get -inf, so no argmax can choose them; a worker with no labeled
    sample gets 0 on every active slot (no evidence, so EM falls back to uniform weights and
    BM to the tie-break). The quotient of two integers is correctly rounded, so equal
    accuracies (1/3 and 2/6) give bitwise-equal U and tie exactly in `best_model`.
    """
    correct = as_float(correct_counts)
    _check_slots(correct, active, "correct_counts")
    _check_shape("counts.shape", jnp.shape(counts), correct.shape[1:], f"[C] = {correct.shape[1:]}")
    n = as_float(counts)
    u = jnp.where(n > 0, correct / jnp.where(n > 0, n, 1.0), 0.0)
    return jnp.where(jnp.asarray(active, bool)[:, None], u, -jnp.inf)


# ----------------------------------------------------------------------------- BM (P2)


def best_model(utility: jax.Array, tiebreak: jax.Array, active: jax.Array) -> jax.Array:
    """P2's z_i: the active slot with the highest U[m, i], ties broken by the higher tiebreak
    (mean max-softmax confidence of m on D_i^u), then by the lowest m -> int32 [C].

    utility [K, C], tiebreak [K, C], active [K] bool (at least one). A strict lexicographic
    choice: first the slots attaining the top utility, then among those the top tiebreak, then
    the first; no weighted sum, so a tiebreak can never outrank a utility difference. NaN
    ranks below every number. Utility entries of inactive slots are never read, whatever they
    hold. `jax.nn.one_hot(best, K)` is the one-hot z_i (and BM's alpha for
    `accumulate_ensemble`).
    """
    utility, tiebreak = as_float(utility), as_float(tiebreak)
    _check_slots(utility, active)
    _check_shape("tiebreak.shape", tiebreak.shape, utility.shape, f"[K, C] = {utility.shape}")
    _check_some_active(active)
    active = jnp.asarray(active, bool)[:, None]
    ninf = jnp.asarray(-jnp.inf, utility.dtype)

    u = jnp.where(active & ~jnp.isnan(utility), utility, ninf)
    cand = active & (u == jnp.max(u, axis=0))  # every active slot if all are -inf / NaN
    t = jnp.where(cand & ~jnp.isnan(tiebreak), tiebreak, ninf)
    cand = cand & (t == jnp.max(t, axis=0))
    return jnp.argmax(cand, axis=0).astype(jnp.int32)  # first True: the lowest m


def keep_better(
    best: tuple[jax.Array, jax.Array, jax.Array],
    utility_m: jax.Array,
    tiebreak_m: jax.Array,
    probs_m: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One step of `best_model` streamed over the models, keeping the best model's outputs:
    the body of a lax.scan over slots m = 0..K-1 (inactive slots skipped), so BM reads each
    model's outputs on D^u once and holds [C, N, Y], not [K, C, N, Y].

    best = (utility [C], tiebreak [C], probs [C, N, Y]) of the best model so far (start with
    -inf, -inf, zeros); utility_m, tiebreak_m [C] and probs_m [C, N, Y] of model m. Model m
    replaces the best where its (utility, tiebreak) is strictly greater lexicographically, so
    ties keep the lower m: after every active slot the result is `best_model`'s choice.
    """
    bu, bt, bp = best
    u, t = as_float(utility_m), as_float(tiebreak_m)
    chex.assert_rank(probs_m, 3)
    chex.assert_shape([bu, bt, u, t, bp], [probs_m.shape[:1]] * 4 + [probs_m.shape])
    better = (u > bu) | ((u == bu) & (t > bt))
    return (
        jnp.where(better, u, bu),
        jnp.where(better, t, bt),
        jnp.where(better[:, None, None], probs_m, bp),
    )


# ----------------------------------------------------------------------------- EM (P3)


def ensemble_weights(
    utility: jax.Array,
    active: jax.Array,
    mode: str = "proportional",
    temperature: float = 0.1,
) -> jax.Array:
    """P3's alpha_{i, m} from the utility -> f32 [C, K].

    utility [K, C] (>= 0 on active slots for `proportional`), active [K] bool.
    `proportional`: alpha_{i, m} = U[m, i] / sum_{m' active} U[m', i], uniform over the active
    slots where that sum is 0. `softmax`: softmax over active m of U[m, i] / temperature
    (uniform if every active U is -inf).
    alpha is 0 on inactive slots (whatever their utility entry) and each row sums to 1; with no
    active slot at all (not allowed when concrete) every row is 0.
    """
    check_choice("algorithm.ensemble_weighting", mode, WEIGHTINGS)
    utility = as_float(utility)
    _check_slots(utility, active)
    _check_some_active(active)
    t = concrete(temperature)
    if t is not None and not (t.shape == () and np.isfinite(t) and t > 0):
        raise bad("algorithm.ensemble_temperature", temperature, "a finite number > 0")
    a = jnp.asarray(active, bool)[:, None]
    u = jnp.where(a, utility, 0.0)  # inactive entries (-inf from accuracy_utility) never enter
    if mode == "proportional":
        u_ok = concrete(u)
        if u_ok is not None and (np.isnan(u_ok).any() or (u_ok < 0).any()):
            raise bad("utility", "negative or NaN on an active slot", "U >= 0 on active slots")
        w = u
    else:
        logits = jnp.where(a, u / temperature, -jnp.inf)
        top = jnp.max(logits, axis=0)  # shift for exp; finite whenever some U is finite
        w = jnp.where(a, jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    total = jnp.sum(w, axis=0)
    uniform = a / jnp.maximum(jnp.sum(a, axis=0), 1)  # all U = 0 (or all -inf for softmax)
    w = jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), uniform)
    return w.T.astype(utility.dtype)


def accumulate_ensemble(alpha_m: jax.Array, probs_m: jax.Array, acc: jax.Array) -> jax.Array:
    """One step of p_i^ens(x) = sum_m alpha_{i, m} p_m(x): acc + alpha_m[:, None, None] * probs_m.

    alpha_m [C] (column m of `ensemble_weights`), probs_m [C, N, Y] (model m on every worker's
    data), acc [C, N, Y] -> [C, N, Y]. The body of a lax.scan over the K models, so memory is
    [C, N, Y] rather than [K, C, N, Y]. Terms with alpha = 0 add exactly 0, so an inactive
    slot's outputs (even NaN from never-trained params) cannot leak into the ensemble.
    """
    probs_m, acc, alpha_m = as_float(probs_m), as_float(acc), as_float(alpha_m)
    chex.assert_rank(probs_m, 3)
    chex.assert_shape([alpha_m, acc], [probs_m.shape[:1], probs_m.shape])
    alpha_m = alpha_m[:, None, None]
    return acc + jnp.where(alpha_m != 0, alpha_m * probs_m, 0.0)


# ----------------------------------------------------------------------------- evaluation (5.3)


def labeling_accuracy(
    pseudo_y: jax.Array, accepted: jax.Array, true_y: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Labeling accuracy pooled over workers: correct accepted / accepted.

    pseudo_y [C, N], accepted [C, N] bool, true_y [C, N] (the hidden labels of D_i^u) ->
    (acc f32 [], correct int32 [], accepted int32 []); acc is 0 when nothing is accepted.
    The counts let callers pool over rounds or chunks; accepted is also the numerator of the
    coverage accepted / eligible, whose denominator the caller holds.
    """
    _check_shape(
        "accepted.shape", jnp.shape(accepted), jnp.shape(pseudo_y), "the shape of pseudo_y"
    )
    _check_shape("true_y.shape", jnp.shape(true_y), jnp.shape(pseudo_y), "the shape of pseudo_y")
    chex.assert_rank(jnp.asarray(pseudo_y), 2)
    ok = jnp.asarray(accepted, bool)
    correct = jnp.sum(ok & (jnp.asarray(pseudo_y) == jnp.asarray(true_y)), dtype=jnp.int32)
    n = jnp.sum(ok, dtype=jnp.int32)
    acc = jnp.where(n > 0, correct / jnp.maximum(n, 1), 0.0).astype(jnp.float32)
    return acc, correct, n
