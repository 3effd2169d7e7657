"""Ada-FedSemi's typed state and what its round passes between the server and the clients (Xu et
al., "Enhancing Federated Learning with Server-Side Unlabeled Data by Adaptive Client and Data
Selection", Algorithms 1-2). M is the number of clients, N = |D_U| the server's unlabeled pool,
A an agent's number of arms; every field may carry a leading replica axis [R] in a run with
replicas. HeteroAda-FedSemi's state (hetero_ada.py) extends `AdaState`.

The state's leaves flatten in a fixed order (`ordered_pytree`), the order they had when this
method's reference results were recorded: the compiled round takes and returns the leaves in
that order, and XLA's fusion of the round follows it (another order moved float32 sums by an
ulp, e.g. u_C - u_P of two equal accuracies came out 8e-7 instead of 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import struct

from fedjax_semi.engine.pytrees import PyTree, ordered_pytree
from fedjax_semi.kernels.bandit import BanditState


@struct.dataclass
class Agent:
    """One decision agent of Alg. 2 (Eqs. 17-18): over the grid of P (or C) values.

    bandit: its reward estimates r_hat_a float32 [A] and update counts int32 [A];
    arm: int32 [] the arm drawn for the coming round k (P_k or C_k is the grid's value at it;
        always 0 when the value is fixed, a one-arm grid).
    """

    bandit: BanditState
    arm: jax.Array


@struct.dataclass
class PoolLabels:
    """The teacher's latest labeling of the pool D_U (Eqs. 2, 6), renewed every R rounds.

    a: float32 [N] each sample's confidence a_j = max_q p_jq; y_hat: int32 [N] its pseudo-label
    argmax_q p_jq; ready: bool [] whether the pool was labeled yet (the C agent waits for it).
    """

    a: jax.Array
    y_hat: jax.Array
    ready: jax.Array


@struct.dataclass
class Spent:
    """What the run has spent besides its clock (the clock is the state's sim_time, sum t_k).

    traffic_gb: float32 [] sum_k b_k in GB (Eq. 9); cost: float32 [] sum_k Phi_k (Eq. 10);
    wait_sum, wait_count: float32 [] Eq. 34's sums of the selected clients' waiting shares and
    of their number over the rounds so far (the cumulative waiting ratio is their quotient).
    """

    traffic_gb: jax.Array
    cost: jax.Array
    wait_sum: jax.Array
    wait_count: jax.Array


# The parts a state's `ordered_pytree` order may reach into, by field name.
PARTS: dict[str, type] = {"agent_p": Agent, "agent_c": Agent, "labels": PoolLabels, "spent": Spent}


@ordered_pytree(
    "round", "w", "sim_time", "agent_c.bandit", "agent_c.arm", "labels.a", "spent.cost", "done",
    "labels.ready", "agent_p.bandit", "agent_p.arm", "switched", "w_tilde", "spent.traffic_gb",
    "u_prev", "spent.wait_count", "spent.wait_sum", "labels.y_hat", parts=PARTS,
)  # fmt: skip
@dataclasses.dataclass(frozen=True)
class AdaState:
    """What Ada-FedSemi, FedSemi-P-C and FedAvg-P carry from round k to round k + 1.

    round: int32 [] rounds done; sim_time: float32 [] the simulated clock in seconds (sum t_k).
    w: the global model w_k's variables (w_{k+1} after the round);
    w_tilde: the EMA teacher w~_{k-1} (Eq. 12), its variables shaped like w's;
    labels: the pool's pseudo-labels and confidences (`PoolLabels`, [N]);
    agent_p, agent_c: the P and C agents (`Agent`: estimates [A], the next arm []);
    u_prev: float32 [] u_{k-1,C}, last round's validation accuracy in % (Eq. 14);
    spent: the cumulative traffic, cost and waiting sums (`Spent`, each []);
    switched: bool [] the preference switch happened (alpha_after from then on, Figs. 9-10;
        set in the round on the validation accuracy, or between rounds by `ada_run`'s hook);
    done: bool [] a budget is spent or the target reached (Eq. 11): the state stays as it is.
    """

    round: jax.Array
    sim_time: jax.Array
    w: PyTree
    w_tilde: PyTree
    labels: PoolLabels
    agent_p: Agent
    agent_c: Agent
    u_prev: jax.Array
    spent: Spent
    switched: jax.Array
    done: jax.Array

    def replace(self, **changes: Any) -> AdaState:
        """A copy with `changes` (as a flax.struct dataclass's `replace`)."""
        return dataclasses.replace(self, **changes)


@struct.dataclass
class AdaPlan:
    """What the server keeps from the selection to its update: the selection sel bool [M] and
    n_k int32 [], and what the server's step reads of the training view (inputs x [D, ...],
    visible labels y [D], pool ids [N] and validation ids [V])."""

    sel: jax.Array
    n: jax.Array
    x: jax.Array
    y: jax.Array
    pool: jax.Array
    val: jax.Array
    depth: jax.Array | None = None  # HeteroAda-FedSemi: each client's depth d_m int32 [M]


@struct.dataclass
class AdaUpload:
    """What each of the M clients returns (Eq. 4), stacked [M, ...]: its model w_{k,m}, its
    weight N_m in Eq. 5 (float32; 0 when not selected) and local_train's stats. (The stats
    come first: the order of the mapped clients' outputs the reference results had.)"""

    stats: dict
    w: PyTree
    weight: jax.Array
