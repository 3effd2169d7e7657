"""UM-pFSSL's typed state and what its round passes to and from the clients (Shi, Chen and Zhang,
"Uncertainty Minimization for Personalized Federated Semi-Supervised Learning", Alg. 1-2). N is
the number of clients, M the helper list's size (self included), S the cohort; every field may
carry a leading replica axis [R] in a run with replicas.

`UMState` and `UMUpload` flatten their leaves in a fixed order, the order they had when this
method's reference results were recorded: the compiled round takes and returns the leaves in
that order, and XLA's fusion of the round follows it (another order moved a float32 training
loss by one ulp in a round that searches and refreshes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import struct

from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.pytrees import PyTree, ordered_pytree


@struct.dataclass
class HelperList:
    """H_k (Alg. 1 l.2): slot 0 is the client itself (its own w_k), slots 1..M-1 its helpers and
    the copies of their models it downloaded. Shapes for one client; the state stacks [N, ...].

    j: int32 [M] the helpers' ids (-1: an empty slot); valid: bool [M] the filled slots;
    w_j: the downloaded copies [M-1, ...] of slots 1..M-1 (stale until refreshed);
    version: int32 [M-1] the round each copy had been uploaded in (the server's record then).
    """

    j: jax.Array
    valid: jax.Array
    w_j: PyTree
    version: jax.Array


@struct.dataclass
class UMComm:
    """The transfers so far, in whole models (Sec. 6.2's unit), int32 [] each: the rounds'
    downloads split by the step that made them, fill (Alg. 1 l.9), replace (Alg. 2 l.19, the
    candidates) and update (Alg. 2 l.10, refreshed copies), the rounds' uploads (Alg. 1 l.21),
    and the warm-up's uploads (Alg. 1 l.4, outside the cost). `downloads` and `uploads` read
    like `fedavg.Comm`'s, so comm_cost = downloads + uploads as FedAvg's Cost_1."""

    fill_downloads: jax.Array
    replace_downloads: jax.Array
    update_downloads: jax.Array
    uploads: jax.Array
    warmup_uploads: jax.Array

    @property
    def downloads(self) -> jax.Array:
        return self.fill_downloads + self.replace_downloads + self.update_downloads


@ordered_pytree(
    "round", "w", "w_k", "opt_k", "sim_time", "H.w_j", "H.version", "comm", "H.j", "H.valid",
    "last_refresh", "participations", "record", parts={"H": HelperList},
)  # fmt: skip
@dataclasses.dataclass(frozen=True)
class UMState:
    """What UM-pFSSL carries from round to round.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock (not advanced here).
    w: w_0, the initial model (no global model; the evaluation's merge reads it, nothing else).
    w_k: [N, ...] every client's model, which is also the server's pool of uploads.
    opt_k: {} (local training starts each round with a fresh optimizer).
    H: every client's helper list H_k, [N, M] and [N, M-1, ...] (`HelperList`).
    record: int32 [N] the server's update record (Alg. 2 l.8): the round w_k was last uploaded
        in (0: the warm-up).
    participations: int32 [N] the rounds each client took part in (search_schedule=
        per_client_participations searches in the first F of them).
    last_refresh: int32 [N] each client's round of its last refresh (refresh_trigger=
        per_client_elapsed only; the warm-up counts as round 0), else None.
    comm: the transfers so far (`UMComm`).
    """

    round: jax.Array
    w: PyTree
    w_k: PyTree
    opt_k: PyTree
    H: HelperList
    record: jax.Array
    participations: jax.Array
    last_refresh: jax.Array | None
    comm: UMComm
    sim_time: jax.Array

    def replace(self, **changes: Any) -> UMState:
        """A copy with `changes` (as a flax.struct dataclass's `replace`)."""
        return dataclasses.replace(self, **changes)


@struct.dataclass
class UMClient:
    """One row per cohort client [S, ...]: its id k, its labeled (D_k^s) and unlabeled (D_k^u)
    tables, its model w_k, its H_k, its participations so far and (per_client_elapsed only,
    else None) the round of its last refresh."""

    id: jax.Array
    lab: RoleTable
    unl: RoleTable
    own: PyTree
    H: HelperList
    part: jax.Array
    last: jax.Array | None = None


@ordered_pytree(
    "H.w_j", "corr_mean", "n_fill", "n_replace", "n_update", "H.version", "H.j", "H.valid",
    "last", "loss", "pl_entropy", "pl_from_self", "pl_helper_label", "pl_index", "pl_kept",
    "pl_label", "pl_self_label", "steps", "w_k", parts={"H": HelperList},
)  # fmt: skip
@dataclasses.dataclass(frozen=True)
class UMUpload:
    """What a client returns, stacked [S, ...]: the trained w_k it uploads (l.21), its new H_k,
    its round of last refresh (or None), the models it downloaded (int32 [] each),
    local_train's loss and steps, and its diagnostics: the share of pseudo-labels from its
    own model, their mean entropy, the mean Corr(k|j), the share kept (float32 [] each); the
    unlabeled rows' ids [Nu] and their chosen, own and helpers' labels ([Nu], [Nu], [M, Nu];
    -1 where none)."""

    w_k: PyTree
    H: HelperList
    last: jax.Array | None
    n_fill: jax.Array
    n_replace: jax.Array
    n_update: jax.Array
    loss: jax.Array
    steps: jax.Array
    pl_from_self: jax.Array
    pl_entropy: jax.Array
    corr_mean: jax.Array
    pl_kept: jax.Array
    pl_index: jax.Array
    pl_label: jax.Array
    pl_self_label: jax.Array
    pl_helper_label: jax.Array
