"""What DoFed-SPP and its baselines share on DoFed-SPP's tasks (Ching et al., IEEE TSC 2023):
which role tables play D_train, D_lab and D_unl, the classification evaluation of Sec. IV, the
checks of the clock's knobs and of DoFed-SPP's own, and the low-rank model copy."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_semi.algorithms.base import FLState, Mapper, client_accuracy
from fedjax_semi.config import AlgorithmConfig, bad
from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine.train import evaluate_row
from fedjax_semi.models.zoo import Model

PyTree = Any


class Roles(NamedTuple):
    """Which role table plays D_train, D_lab and D_unl."""

    train: str
    lab: str
    unl: str


DOFED_ROLES = Roles("labeled", "target_labeled", "target_unlabeled")
GENERIC_ROLES = Roles("labeled", "labeled", "unlabeled")


def data_roles(roles: dict) -> Roles:
    """The SUBSET/NORMAL roles when the partition has them, else the own-distribution mapping."""
    return DOFED_ROLES if "target_labeled" in roles else GENERIC_ROLES


def client_evaluator(model: Model, *, per_client: bool):
    """The per-client scoring function for `evaluate_clients`, built once per algorithm (the
    reference backend caches one jitted function per callable).

    per_client: fn(inp {table, vars}, x, labels); else fn(inp {table}, variables, x, labels).
    """
    if per_client:

        def own(inp: dict, x: jax.Array, labels: jax.Array) -> dict:
            return evaluate_row(model, inp["vars"], x, labels, inp["table"])

        return own

    def shared(inp: dict, variables: PyTree, x: jax.Array, labels: jax.Array) -> dict:
        return evaluate_row(model, variables, x, labels, inp["table"])

    return shared


def evaluate_clients(
    evaluator, state: FLState, fed: FederatedData, mapper: Mapper, *, per_client: bool
) -> dict:
    """Classification accuracy (spec 3.7): each client's model (per_client: its own
    `client_vars` row; else the global model) on its own test split, and on its D_unl (A5's
    secondary "cls", which for a baseline is also its labeling accuracy). evaluator comes from
    `client_evaluator`."""
    out = {}
    unl = data_roles(fed.roles).unl
    for key, role in (("client", "test"), ("unl", unl)):
        if per_client:
            xs = {"table": fed.roles[role], "vars": state.client_vars}
            r = mapper(evaluator, xs, fed.x, fed.eval_y)
        else:
            r = mapper(evaluator, {"table": fed.roles[role]}, state.global_vars, fed.x, fed.eval_y)
        out[f"{key}_acc"], out[f"{key}_mean"] = client_accuracy(r)
        out[f"{key}_loss"] = jnp.sum(r["loss"]) / jnp.maximum(jnp.sum(r["count"]), 1)
    return {
        "accuracy": out["client_mean"],
        "personal_acc": out["client_mean"],
        "client_acc": out["client_acc"],
        "test_loss": out["client_loss"],
        "cls_acc_on_unl": out["unl_mean"],
    }


# ----------------------------------------------------------------------------- config


CHOICES = {
    "init_mode": ("shared", "per_client"),
    "sr_target_version": ("pre_update", "post_update"),
    "sr_degenerate": ("keep_previous", "uniform"),
    "selection_mode": ("fixed", "budget"),
}


WIRELESS_MODES = ("empirical", "shannon")


def _range(key: str, value: Any) -> None:
    """A [low, high] pair with 0 < low <= high."""
    ok = isinstance(value, list | tuple) and len(value) == 2
    if not ok or not all(isinstance(v, int | float) for v in value) or not 0 < value[0] <= value[1]:
        raise bad(key, value, "a pair [low, high] with 0 < low <= high")


def check_clock_config(c: AlgorithmConfig) -> None:
    """The wireless and time knobs (spec 2.8) that DoFed-SPP and its baselines share."""
    if c.wireless_mode not in WIRELESS_MODES:
        raise bad("algorithm.wireless_mode", c.wireless_mode, f"one of {list(WIRELESS_MODES)}")
    _range("algorithm.wireless_rate_mbps", c.wireless_rate_mbps)
    _range("algorithm.wireless_distance_km", c.wireless_distance_km)
    for key in ("wireless_bandwidth_hz", "wireless_power_w"):
        if not getattr(c, key) > 0:
            raise bad(f"algorithm.{key}", getattr(c, key), "a number > 0")
    for key in ("time_sec_per_train_sample", "time_sec_per_infer_sample"):
        if not getattr(c, key) >= 0:
            raise bad(f"algorithm.{key}", getattr(c, key), "seconds >= 0")


def check_dofed_spp_config(cfg: AlgorithmConfig, num_clients: int) -> None:
    """DoFed-SPP's knobs: every bad value names key, value and what is allowed."""
    c = cfg
    for key, allowed in CHOICES.items():
        if getattr(c, key) not in allowed:
            raise bad(f"algorithm.{key}", getattr(c, key), f"one of {list(allowed)}")
    n = num_clients
    if c.selection_mode == "fixed":
        if not 1 <= c.selection_k <= n:
            raise bad("algorithm.selection_k", c.selection_k, f"an integer in [1, num_clients={n}]")
        if not 1 <= c.selection_b <= c.selection_k:
            raise bad(
                "algorithm.selection_b",
                c.selection_b,
                f"an integer in [1, selection_k={c.selection_k}]",
            )
    else:
        t = c.selection_time_per_round_s
        if t is None or not t > 0:
            raise bad(
                "algorithm.selection_time_per_round_s",
                t,
                "a number of seconds > 0 (T / G) with selection_mode=budget",
            )
    if c.local_epochs < 1:
        raise bad("algorithm.local_epochs", c.local_epochs, "an integer >= 1 for dofed_spp")
    if c.local_epochs_tar < 1:
        raise bad("algorithm.local_epochs_tar", c.local_epochs_tar, "an integer >= 1")
    if c.warmup_rounds < 0:
        raise bad("algorithm.warmup_rounds", c.warmup_rounds, "an integer >= 0")
    if not c.lr_tar > 0:
        raise bad("algorithm.lr_tar", c.lr_tar, "a number > 0")
    if c.sr_gamma is not None and not c.sr_gamma > 0:
        raise bad("algorithm.sr_gamma", c.sr_gamma, "a number > 0, or null for algorithm.lr")
    g1 = c.sr_g1
    if g1 != "auto" and (isinstance(g1, bool) or not isinstance(g1, int | float) or g1 < 0):
        raise bad("algorithm.sr_g1", g1, "a number >= 0 or 'auto'")
    if not c.sr_g2 >= 0:
        raise bad("algorithm.sr_g2", c.sr_g2, "a number >= 0")
    if not c.sr_eps > 0:
        raise bad("algorithm.sr_eps", c.sr_eps, "a number > 0")
    if c.pca_rank < 0:
        raise bad("algorithm.pca_rank", c.pca_rank, "an integer >= 0 (0 = off)")
    check_clock_config(c)


def low_rank(variables: PyTree, rank: int) -> PyTree:
    """Spec 2.7 [rec] "PCA": every >= 2-D weight of each model, reshaped to [fan_in, out], replaced
    by its rank-`rank` truncated SVD and reconstructed to its full shape, so the same model code
    runs on the reduced copy. Leaves lead with the client axis [N]; biases and batch statistics
    are left alone."""

    def leaf(w):
        if w.ndim < 3:
            return w
        m = w.reshape(w.shape[0], -1, w.shape[-1]).astype(jnp.float32)
        u, s, vt = jnp.linalg.svd(m, full_matrices=False)
        r = min(rank, s.shape[-1])
        approx = jnp.einsum("nik,nk,nkj->nij", u[..., :r], s[..., :r], vt[..., :r, :])
        return approx.reshape(w.shape).astype(w.dtype)

    return {**variables, "params": jax.tree.map(leaf, variables["params"])}
