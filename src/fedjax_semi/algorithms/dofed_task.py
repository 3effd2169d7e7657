"""What DoFed-SPP and its baselines share on DoFed-SPP's tasks (Ching et al., IEEE TSC 2023):
which role tables play D_train, D_lab and D_unl, the classification evaluation of Sec. 6.1;
and DoFed-SPP's own rows (clients, uploads, the base station's plan), config and low-rank
model copy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.base import Mapper, Method, client_accuracy, sanity
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.engine.train import evaluate_row
from fedjax_semi.errors import bad, check_choice
from fedjax_semi.kernels import similarity as sim
from fedjax_semi.models.zoo import Model


class Roles(NamedTuple):
    """Which role table plays D_train, D_lab and D_unl."""

    train: str
    lab: str
    unl: str


DOFED_ROLES = Roles("labeled", "target_labeled", "target_unlabeled")
GENERIC_ROLES = Roles("labeled", "labeled", "unlabeled")
# The roles DoFed-SPP and its baselines declare (they also run on GENERIC_ROLES).
TARGET_TASK_ROLES = ("labeled", "target_labeled", "target_unlabeled", "test")


def data_roles(roles: dict) -> Roles:
    """The SUBSET/NORMAL roles when the partition has them, else the own-distribution mapping."""
    return DOFED_ROLES if "target_labeled" in roles else GENERIC_ROLES


def client_evaluator(model: Model, *, per_client: bool) -> Callable[..., dict]:
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
    evaluator: Callable[..., dict],
    models: PyTree,
    fed: FederatedData,
    mapper: Mapper,
    *,
    per_client: bool,
) -> dict:
    """Classification accuracy (Sec. 6.1): each client's model (per_client: its own row of
    `models`, leaves [N, ...]; else `models` is the one global model) on its own held-out test
    split (the paper defines none; docs/choices.md: DoFed-SPP, the test data), and on its D_unl
    (a secondary metric; for a baseline also its labeling accuracy, Sec. 6.2). evaluator comes
    from `client_evaluator`."""
    out, checks = {}, {}
    unl = data_roles(fed.roles).unl
    for key, role in (("client", "test"), ("unl", unl)):
        if per_client:
            xs = {"table": fed.roles[role], "vars": models}
            r = mapper(evaluator, xs, fed.x, fed.eval_y)
        else:
            r = mapper(evaluator, {"table": fed.roles[role]}, models, fed.x, fed.eval_y)
        out[f"{key}_acc"], out[f"{key}_mean"] = client_accuracy(r)
        out[f"{key}_loss"] = jnp.sum(r["loss"]) / jnp.maximum(jnp.sum(r["count"]), 1)
        checks = checks or sanity(r)  # the test split's: the models behind `accuracy`
    return {
        "accuracy": out["client_mean"],
        "personal_acc": out["client_mean"],
        "client_acc": out["client_acc"],
        "test_loss": out["client_loss"],
        "cls_acc_on_unl": out["unl_mean"],
        **checks,
    }


@dataclasses.dataclass
class TargetTaskMethod(Method):
    """DoFed-SPP and its baselines FedFomo and FedBE: they read D_train, D_lab, D_unl and the
    target test split (TARGET_TASK_ROLES; a generic labeled/unlabeled/test partition also runs)
    and never the hidden labels."""

    roles: tuple[str, ...] = TARGET_TASK_ROLES
    oracle: bool = False


# ----------------------------------------------------------------------------- DoFed-SPP's rows


@struct.dataclass
class DoFedWarmupClient:
    """Phase 0's rows, one per client [N, ...]: its id, reciprocal model R_n and D_train."""

    id: jax.Array
    rec: PyTree
    train: RoleTable


@struct.dataclass
class DoFedClient:
    """A round's rows, one per client [N, ...] (everyone trains every round): its reciprocal
    model R_n, target (student) model T_n, the ids [B] and weights [B] of the models that label
    its data (B slots; N in budget mode), and its D_train, D_lab and D_unl tables."""

    id: jax.Array
    rec: PyTree
    tar: PyTree
    ids: jax.Array
    w: jax.Array
    train: RoleTable
    lab: RoleTable
    unl: RoleTable


@struct.dataclass
class DoFedUpload:
    """What one client's Phases 2-4 return, stacked [N, ...] by the mapping.

    tar, rec: the new T_n and R_n; loss, steps: the student's mean loss (float32 []) and steps
    (int32 []); rec_loss: float32 [] the reciprocal model's; pl_index / pl_label: int32 [Du] its
    D_unl rows and their pseudo-labels (-1 on padding), scored on the host.
    """

    tar: PyTree
    rec: PyTree
    loss: jax.Array
    steps: jax.Array
    rec_loss: jax.Array
    pl_index: jax.Array
    pl_label: jax.Array


@struct.dataclass
class DoFedComm:
    """Models uploaded to the base station: uploads int32 [] in rounds 1..t (Phase 1),
    warmup_uploads int32 [] in Phase 0 (N)."""

    uploads: jax.Array
    warmup_uploads: jax.Array


@struct.dataclass
class DoFedPlan:
    """Phase 1 at the base station -> the clients and Phase 4.

    sel: the uploader selection; budget: Eq. 26's (C1, C2, C3) in budget mode, else ();
    cache / shown: the cache after this round's uploads [N] and the copies the clients are
    shown (low-rank with PCA); cache_round: int32 [N]; ids int32 [N, B] / w [N, B]: the models
    each client labels with and their Eq. 20 weights (B slots; N in budget mode);
    label_degenerate: bool [N] rows whose labeling weights fell back to uniform.
    """

    sel: sim.Selection
    budget: tuple
    cache: PyTree
    shown: PyTree
    cache_round: jax.Array
    ids: jax.Array
    w: jax.Array
    label_degenerate: jax.Array


# ----------------------------------------------------------------------------- config


CHOICES = {
    "init_mode": ("shared", "per_client"),
    "sr_target_version": ("pre_update", "post_update"),
    "sr_degenerate": ("keep_previous", "uniform"),
    "selection_mode": ("fixed", "budget"),
}


@dataclasses.dataclass
class DoFedSPPConfig(AlgorithmConfig):
    """DoFed-SPP's knobs (the paper's Secs. 4-5; what it leaves open is a knob, with our default,
    docs/choices.md: DoFed-SPP). The reciprocal models train with lr (gamma), local_epochs and
    batch_size; optimizer and momentum apply to both models and restart every round (the
    hyperparameters are in the paper's missing appendix). Every client trains every round
    (clients_per_round is not used); selection_k clients upload. The clock is `systems`' (uploads,
    seconds per sample)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "lr_tar",
        "sr_g2",
        "sr_eps",
    )

    name: str = "dofed_spp"
    init_mode: str = "shared"  # shared (one init broadcast) | per_client initial models
    warmup_rounds: int = 10  # L: rounds of local reciprocal training before Phase 0's uploads
    lr_tar: float = 0.01  # alpha: student (target model) learning rate
    local_epochs_tar: int = 1  # E_tar: student epochs per round over D^p = D_unl + D_lab
    sr_gamma: float | None = None  # gamma of Eq. 19; null = lr (the reciprocal learning rate)
    sr_g1: Any = 0.0  # G1 >= 0, or "auto": max pairwise distance (Assumption 1 literally)
    sr_g2: float = 3.0  # G2 >= 0, a loss margin (3 for the CNN, 1 for the text model)
    sr_eps: float = 1e-8  # floor of the distances in Eq. 19
    sr_target_version: str = "pre_update"  # target model of Eq. 19: pre_update | post_update
    sr_degenerate: str = "keep_previous"  # rows of Eq. 19 all 0 (0 / 0): keep_previous | uniform
    sr_exclude_self: bool = False  # drop S[n, n] (one local update away, so it can dominate)
    selection_mode: str = "fixed"  # fixed (selection_k, selection_b) | budget (Ineq. 26)
    selection_k: int = 10  # K uploaders per round (fixed mode)
    selection_b: int = 10  # B labeling models per client, 1 <= B <= K (fixed mode)
    selection_time_per_round_s: float | None = None  # T / G of Ineq. 25, budget mode only
    label_renormalize: bool = False  # Eq. 20 weights over B summing to 1 (argmax unchanged)
    pca_rank: int = 0  # > 0: low-rank SVD of every >= 2-D weight before broadcast (Sec. 4.5); 0 off

    def __post_init__(self) -> None:
        super().__post_init__()
        c = self
        check_choice("algorithm.init_mode", c.init_mode, CHOICES["init_mode"])
        check_choice(
            "algorithm.sr_target_version", c.sr_target_version, CHOICES["sr_target_version"]
        )
        check_choice("algorithm.sr_degenerate", c.sr_degenerate, CHOICES["sr_degenerate"])
        check_choice("algorithm.selection_mode", c.selection_mode, CHOICES["selection_mode"])
        if c.selection_mode == "fixed":
            if c.selection_k < 1:
                raise bad("algorithm.selection_k", c.selection_k, "an integer >= 1")
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


def check_selection_k(cfg: DoFedSPPConfig, num_clients: int) -> None:
    """Fixed mode uploads K <= N models per round."""
    if cfg.selection_mode == "fixed" and not cfg.selection_k <= num_clients:
        k, n = cfg.selection_k, num_clients
        raise bad("algorithm.selection_k", k, f"an integer in [1, num_clients={n}]")


def low_rank(variables: PyTree, rank: int) -> PyTree:
    """Our reading of Sec. 4.5's "PCA" (a single parameter vector has no principal components):
    every >= 2-D weight of each model, reshaped to [fan_in, out], replaced by its rank-`rank`
    truncated SVD and reconstructed to its full shape, so the same model code runs on the reduced
    copy. Leaves lead with the client axis [N]; biases and batch statistics are left alone."""

    def leaf(w):
        if w.ndim < 3:
            return w
        m = w.reshape(w.shape[0], -1, w.shape[-1]).astype(jnp.float32)
        u, s, vt = jnp.linalg.svd(m, full_matrices=False)
        r = min(rank, s.shape[-1])
        approx = jnp.einsum("nik,nk,nkj->nij", u[..., :r], s[..., :r], vt[..., :r, :])
        return approx.reshape(w.shape).astype(w.dtype)

    return {**variables, "params": jax.tree.map(leaf, variables["params"])}
