"""CFSL's typed state and what its round passes between its steps (Hamood et al.'s Algorithms
1-3): K cluster slots, C workers, U unlabeled rows per worker; every field may carry a leading
replica axis [R] in a run with replicas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.pytrees import PyTree


@struct.dataclass
class Clusters:
    """The K = max_clusters cluster slots (Sec. III-B), shared by all edges.

    cid: int32 [C] each worker's cluster slot cid(i); active: bool [K] the slot holds a cluster;
    edge: int32 [K] the slot's edge server j; root: bool [K] the edge's never-split cluster (the
    HFL trunk); stopped: bool [K] Eq. 25 has held (sticky until the cluster splits);
    last_split: int32 [K] the round the cluster was last split or born (0: never).
    """

    cid: jax.Array
    active: jax.Array
    edge: jax.Array
    root: jax.Array
    stopped: jax.Array
    last_split: jax.Array


@struct.dataclass
class PseudoLabels:
    """D_psdo,i of every worker (Eqs. 17-18) over its unlabeled rows [C, U].

    y: int32 [C, U] the last labeling's pseudo-labels; accepted: bool [C, U] max p >= phi (the
    rows in D_psdo,i); on: bool [] split-based labeling (SP) has started (HFSL: Eq. 5 held).
    """

    y: jax.Array
    accepted: jax.Array
    on: jax.Array


@struct.dataclass
class Devices:
    """Each worker's fixed draws for the run (Eqs. 22e-f as sampling bounds), f32 [C]: transmit
    power P_i in W, CPU frequency f_i in Hz, distance d_i to its edge server in m."""

    power_w: jax.Array
    cpu_hz: jax.Array
    dist_m: jax.Array

    def as_dict(self) -> dict[str, jax.Array]:
        """The form `hwn.worker_costs` reads."""
        return {"power_w": self.power_w, "cpu_hz": self.cpu_hz, "dist_m": self.dist_m}


@struct.dataclass
class CFSLState:
    """What CFSL (and HFSL) carry from round to round.

    round: int32 [] rounds done; sim_time: float32 [] the clock, sum of T_r (Eq. 15).
    theta: the cluster models theta_k, the model's variables with leaves [K, ...];
    theta_global: the data-weighted mean of the active theta_k (what `global_acc` evaluates);
    clusters: `Clusters`; labels: `PseudoLabels` [C, U]; devices: `Devices` [C];
    last_selected: int32 [C] the round each worker last trained (-1: never; round-robin's order);
    norm_hist: f32 [calibration_rounds] the first rounds' median update norms (eps_mode=relative);
    energy: f32 [] the energy spent so far, sum of E_r (Eq. 16).
    """

    round: jax.Array
    theta: PyTree
    theta_global: PyTree
    clusters: Clusters
    labels: PseudoLabels
    devices: Devices
    last_selected: jax.Array
    norm_hist: jax.Array
    energy: jax.Array
    sim_time: jax.Array


@struct.dataclass
class WorkerRow:
    """One row per worker [C] for its local training: its id, its cluster slot, its training
    pool D_i,new for this round (empty if not selected) and the pool's labels."""

    id: jax.Array
    cluster: jax.Array
    table: RoleTable
    labels: jax.Array


@struct.dataclass
class RoundPlan:
    """What the server fixes before the workers train (`CFSL.select`).

    sel: bool [C] C_r; n_train: int32 [C] |D_i,new| (Eq. 20); costs: `hwn.worker_costs` at this
    round's channel and bandwidth shares (f32 [C] each); labels: the `PseudoLabels` trained on;
    workers: the `WorkerRow`s [C].
    """

    sel: jax.Array
    n_train: jax.Array
    costs: dict
    labels: PseudoLabels
    workers: WorkerRow


@struct.dataclass
class WorkerUpdate:
    """What a worker uploads: d_i = theta_i - theta_cid(i) (the model's variables), and
    local_train's stats (loss, steps, pl_rate)."""

    delta: PyTree
    stats: dict


@struct.dataclass
class ClusterTable:
    """One row per worker [C] for evaluation: its cluster slot and its test table."""

    cluster: jax.Array
    table: RoleTable


def edge_of(server: dict, n: int) -> jax.Array:
    """int32 [C] each worker's edge server j (all 0 where the partition built no edges)."""
    return server.get("edge_of", jnp.zeros((n,), jnp.int32)).astype(jnp.int32)
