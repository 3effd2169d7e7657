"""Ada-FedSemi's config: the knobs of Xu et al.'s Algorithms 1-2 and Sec. 5.1, and the choices
the paper leaves open (docs/choices.md, Ada-FedSemi). Beside `ada_fedsemi.py`, which reads it.

One config serves the three methods of the paper's comparison: Ada-FedSemi (both agents on),
FedSemi-P-C (`adaptive_p=false`, `adaptive_c=false`: P and C fixed) and FedAvg-P (FedSemi-P-1.0:
no confidence exceeds C = 1.0, so no pseudo-label is ever selected).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import ClassVar

from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.errors import bad, check_choice
from fedjax_semi.kernels.bandit import C_ARMS, P_ARMS

LR_SCHEDULES = ("cosine_restart", "constant")
INIT_VAL_ACC = ("measure", "zero")
SWITCH_METRICS = ("test", "val")


def _grid(key: str, values, low_open: bool) -> None:
    """A non-empty list of numbers in [0, 1] ((0, 1] where `low_open`)."""
    lo = "(0, 1]" if low_open else "[0, 1]"
    ok = isinstance(values, list | tuple) and len(values) > 0
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    ok = ok and all((v > 0 if low_open else v >= 0) and v <= 1 for v in values)
    if not ok:
        raise bad(key, values, f"a non-empty list of numbers in {lo}")


@dataclasses.dataclass
class AdaFedSemiConfig(AlgorithmConfig):
    """Ada-FedSemi's knobs. Local training (Eq. 4): tau = local_steps SGD steps of batch
    batch_size with momentum 0.9, momentum reset every round (clients are stateless); `lr` is
    eta_max of Eq. 13, used by the clients and by the server's pseudo-label epoch (Eq. 7)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "eta_min",
        "beta",
        "psi",
        "alpha",
    )

    name: str = "ada_fedsemi"
    local_epochs: int = 0
    local_steps: int = 20  # tau (not given by the paper)
    batch_size: int = 32
    lr: float = 0.05  # eta_max (Sec. 5.1)
    momentum: float = 0.9
    # Eq. 13: cosine annealing with warm restarts by round, or a constant eta_max (Fig. 14).
    lr_schedule: str = "cosine_restart"
    eta_min: float = 1e-4
    lr_restart: int = 100  # K~ (rounds)
    # The decision grids (Sec. 3.3: 10 values in [0, 1] and in [0.8, 1]).
    p_arms: list[float] = dataclasses.field(default_factory=lambda: list(P_ARMS))
    c_arms: list[float] = dataclasses.field(default_factory=lambda: list(C_ARMS))
    adaptive_p: bool = True  # false: P = fixed_p every round (FedSemi-P-C, FedAvg-P)
    adaptive_c: bool = True  # false: C = fixed_c every round
    fixed_p: float = 0.5
    # Table 7's baselines replay Ada-FedSemi's P_k round by round: the metrics.jsonl of an Ada
    # run (its `P` column; with replicas, one seed's seed_<s>/metrics.jsonl). Round k uses the
    # k-th P, the last one after the trace ends; needs adaptive_p=false (fixed_p is then unused).
    p_trace_from: str | None = None
    fixed_c: float = 0.9  # 1.0: FedAvg-P (strict >, nothing is selected)
    # The agents (Eqs. 17-18): step size beta, inverse temperature psi, initial estimates q0.
    beta: float = 0.1
    psi: float = 1.0
    q0: float = 0.0
    init_val_acc: str = "measure"  # u_{0,C}: the initial model's validation accuracy | zero
    # Teacher (Eq. 12) and pseudo-labels (Eqs. 2, 6): EMA weight gamma, relabel period R.
    gamma: float = 0.1
    relabel_every: int = 1
    server_batch: int = 64  # one epoch over the selected pseudo-labels per round (Eq. 7)
    # Cost (Eqs. 8-10): every client's round time t_{k,m} (homogeneous, Sec. 5.3), the server's
    # time per pseudo-labeled sample t_p, the model's size W (null: 4 bytes per parameter),
    # transfers per participant and round (2: broadcast and upload), and alpha.
    alpha: float = 0.5
    client_time_s: float = 31.0
    t_p: float = 1.5e-4
    model_bytes: float | None = None
    traffic_directions: int = 2
    # Eq. 11's budgets (null: none) and target eps (validation accuracy, %): the run loop stops
    # a run after the round that spends a budget (or reaches the target with stop_on_target),
    # and a run driven round by round keeps its state from then on.
    time_budget_min: float | None = None
    traffic_budget_gb: float | None = None
    target_acc: float | None = None
    stop_on_target: bool = False
    # The change of preference (Figs. 9-10): alpha until the accuracy reaches alpha_switch_at (a
    # fraction; null: never), alpha_after from the next round on. alpha_switch_metric: test (the
    # paper; the run loop sets the switch between rounds from the evaluation, test labels never
    # enter a round) | val (u_C of the round, the validation set the agents already read).
    alpha_switch_at: float | None = None
    alpha_after: float = 0.1
    alpha_switch_metric: str = "test"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("algorithm.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice("algorithm.init_val_acc", self.init_val_acc, INIT_VAL_ACC)
        _grid("algorithm.p_arms", self.p_arms, low_open=True)
        _grid("algorithm.c_arms", self.c_arms, low_open=False)
        if not (isinstance(self.fixed_p, int | float) and 0 < self.fixed_p <= 1):
            raise bad("algorithm.fixed_p", self.fixed_p, "a number in (0, 1]")
        if not (isinstance(self.fixed_c, int | float) and 0 <= self.fixed_c <= 1):
            raise bad("algorithm.fixed_c", self.fixed_c, "a number in [0, 1] (1.0: FedAvg-P)")
        if not 0 < self.beta <= 1:
            raise bad("algorithm.beta", self.beta, "a number in (0, 1] (Eq. 17's step size)")
        if not (0 <= self.psi < math.inf):
            raise bad("algorithm.psi", self.psi, "a finite number >= 0 (Eq. 18)")
        if not math.isfinite(self.q0):
            raise bad("algorithm.q0", self.q0, "a finite number")
        if not 0 < self.gamma <= 1:
            raise bad("algorithm.gamma", self.gamma, "a number in (0, 1] (Eq. 12)")
        for key in ("relabel_every", "server_batch", "lr_restart"):
            if not getattr(self, key) >= 1:
                raise bad(f"algorithm.{key}", getattr(self, key), "an integer >= 1")
        if not 0 <= self.eta_min <= self.lr:
            raise bad("algorithm.eta_min", self.eta_min, f"a number in [0, lr={self.lr}]")
        if not 0 <= self.alpha <= 1:
            raise bad("algorithm.alpha", self.alpha, "a number in [0, 1] (Eq. 10)")
        if not self.client_time_s > 0:
            raise bad("algorithm.client_time_s", self.client_time_s, "seconds > 0")
        if not self.t_p >= 0:
            raise bad("algorithm.t_p", self.t_p, "seconds per sample >= 0")
        if self.model_bytes is not None and not self.model_bytes > 0:
            raise bad("algorithm.model_bytes", self.model_bytes, "bytes > 0, or null")
        if self.traffic_directions not in (1, 2):
            raise bad("algorithm.traffic_directions", self.traffic_directions, "1 or 2")
        for key in ("time_budget_min", "traffic_budget_gb"):
            v = getattr(self, key)
            if v is not None and not v > 0:
                raise bad(f"algorithm.{key}", v, "a budget > 0, or null (none)")
        if self.target_acc is not None and not 0 < self.target_acc <= 100:
            raise bad("algorithm.target_acc", self.target_acc, "a percentage in (0, 100]")
        check_choice("algorithm.alpha_switch_metric", self.alpha_switch_metric, SWITCH_METRICS)
        if self.alpha_switch_at is not None and not 0 < self.alpha_switch_at <= 1:
            raise bad(
                "algorithm.alpha_switch_at", self.alpha_switch_at, "an accuracy in (0, 1], or null"
            )
        if not 0 <= self.alpha_after <= 1:
            raise bad("algorithm.alpha_after", self.alpha_after, "a number in [0, 1] (Eq. 10)")
        if self.p_trace_from is not None:
            if self.adaptive_p:
                raise bad(
                    "algorithm.p_trace_from",
                    self.p_trace_from,
                    "null with adaptive_p=true (a trace replaces the P agent)",
                )
            read_p_trace(self.p_trace_from)  # a missing or P-less file fails here, before work
        if self.stop_on_target and self.target_acc is None:
            raise bad("algorithm.stop_on_target", True, "false without algorithm.target_acc")


def read_p_trace(path: str) -> tuple[float, ...]:
    """P_1, P_2, ... of an Ada-FedSemi run: the `P` column of its metrics.jsonl, by round."""
    import json
    from pathlib import Path

    key = "algorithm.p_trace_from"
    f = Path(path)
    if not f.is_file():
        raise bad(key, path, "the path of an Ada-FedSemi run's metrics.jsonl (no such file)")
    by_round = {}
    for line in f.read_text().splitlines():
        try:
            row = json.loads(line) if line.strip() else {}
        except json.JSONDecodeError:
            raise bad(key, path, "a metrics.jsonl of JSON lines (a line does not parse)") from None
        if isinstance(row.get("P"), int | float) and isinstance(row.get("round"), int):
            by_round[row["round"]] = float(row["P"])
    trace = tuple(by_round[k] for k in sorted(by_round))
    if not trace or not all(0 < p <= 1 for p in trace):
        raise bad(key, path, "a metrics.jsonl whose rows carry P in (0, 1] (an Ada-FedSemi run)")
    return trace


def participant_counts(p_values: Iterable[float], num_clients: int) -> tuple[int, ...]:
    """n = ceil(P M) for each P, exactly: P read as the decimal it was written as (0.3 is
    3/10), so float round-off cannot add a client (ceil(0.30000000000000004 * 20) = 7)."""
    from fractions import Fraction

    return tuple(math.ceil(Fraction(str(float(p))) * num_clients) for p in p_values)
