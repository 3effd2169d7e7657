"""CFSL's config: the knobs of Hamood et al.'s Algorithms 1-3 and Table II, and the choices the
paper leaves open (docs/choices.md, CFSL). Beside `cfsl.py`, which reads it.

A scenario is one choice on three axes (the paper's Sec. V): the prediction model (BM: the best
specialized model, EM: the weighted ensemble), the prediction time (SP: after the first split,
ST: once a cluster reaches its stopping point) and the selection in stopped clusters (GS:
greedy, RR: round-robin). `scenario` names the triple; `prediction_model`, `prediction_time` and
`selection` override one axis (the baselines: `selection=random`, `prediction_time=none`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.errors import bad, check_choice

_MODEL = {"bm": "best", "em": "ensemble"}
_TIME = {"sp": "split", "st": "stopping"}
_SELECTION = {"gs": "greedy", "rr": "round_robin"}
# The eight integrated scenarios, BMSPGS ... EMSTRR -> (prediction model, time, selection).
SCENARIOS: dict[str, tuple[str, str, str]] = {
    m + t + s: (_MODEL[m], _TIME[t], _SELECTION[s])
    for m in _MODEL
    for t in _TIME
    for s in _SELECTION
}

CHOICES = {
    "prediction_model": ("best", "ensemble"),
    "prediction_time": ("split", "stopping", "none"),
    "selection": ("greedy", "round_robin", "random", "all"),
    "eps_mode": ("absolute", "relative"),
    "bipartition": ("maxst", "complete"),
    "ensemble_weighting": ("proportional", "softmax"),
    "pseudo_mode": ("replace", "accumulate"),
    "agg_weight": ("n_train", "uniform"),
}


@dataclasses.dataclass
class CFSLConfig(AlgorithmConfig):
    """CFSL's knobs. Local training: Table II (10 epochs, batch 32, lr 0.01, plain SGD)."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "phi",
        "eps1",
        "eps2",
    )

    name: str = "cfsl"
    local_epochs: int = 10
    lr: float = 0.01
    batch_size: int = 32
    scenario: str = "bmspgs"
    # null: the scenario's choice on that axis.
    prediction_model: str | None = None  # best | ensemble
    prediction_time: str | None = None  # split | stopping | none (labeled-only CFL)
    selection: str | None = None  # greedy | round_robin | random | all
    clustering: bool = True  # false: HFSL's two-level FedAvg (Eqs. 5, 25 still time labeling)
    k_per_cluster: int = 1  # workers selected per stopped cluster ("the best worker")
    phi: float = 0.7  # confidence threshold (Eqs. 17-18)
    # Split thresholds on update norms (Eqs. 5, 6, 25). absolute: eps1, eps2 as given (Sattler et
    # al.'s CFL demo values); relative: kappa * the median update norm of the first
    # `calibration_rounds` rounds, frozen after them.
    eps_mode: str = "absolute"
    eps1: float = 0.4
    eps2: float = 1.6
    kappa1: float = 0.25
    kappa2: float = 1.0
    calibration_rounds: int = 5
    split_warmup: int = 20  # no split or stop before this round, nor within it of a split
    min_split_size: int = 3
    max_clusters: int = 64  # K_max cluster slots over all edges
    bipartition: str = "maxst"  # maxst (exact min-max split) | complete (CFL's linkage)
    gamma_gate: bool = False  # Alg. 1 lines 7-8 on the observable surrogate gamma-hat
    cloud_merge: bool = True  # average cross-edge specialized models whose mean updates agree
    cloud_tau: float = 0.8
    ensemble_weighting: str = "proportional"  # alpha proportional to utility | softmax(U / T)
    ensemble_temperature: float = 0.1
    pseudo_mode: str = "replace"  # replace each labeling round | accumulate (keep first label)
    relabel_every: int = 1
    agg_weight: str = "n_train"  # aggregation weight: training-pool size | uniform

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("algorithm.scenario", self.scenario, tuple(SCENARIOS))
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            if value is not None:
                check_choice(f"algorithm.{key}", value, allowed)
        for key in ("k_per_cluster", "relabel_every", "calibration_rounds", "min_split_size"):
            if getattr(self, key) < 1:
                raise bad(f"algorithm.{key}", getattr(self, key), "an integer >= 1")
        if self.max_clusters < 2:
            raise bad("algorithm.max_clusters", self.max_clusters, "an integer >= 2")
        if self.split_warmup < 0:
            raise bad("algorithm.split_warmup", self.split_warmup, "an integer >= 0")
        if self.local_epochs < 1:
            raise bad("algorithm.local_epochs", self.local_epochs, "an integer >= 1 for cfsl")
        for key in ("eps1", "eps2", "kappa1", "kappa2", "ensemble_temperature"):
            if not getattr(self, key) > 0:
                raise bad(f"algorithm.{key}", getattr(self, key), "a number > 0")
        if not 0 <= self.phi <= 1:
            # Eqs. 17-18 compare a softmax confidence with phi, so above 1 nothing would ever be
            # accepted: the labeled-only run is algorithm.prediction_time=none.
            raise bad(
                "algorithm.phi", self.phi, "a number in [0, 1] (labeled-only: prediction_time=none)"
            )
        if not -1 <= self.cloud_tau <= 1:
            raise bad("algorithm.cloud_tau", self.cloud_tau, "a cosine in [-1, 1]")
        if self.eps_mode == "relative" and self.split_warmup <= self.calibration_rounds:
            raise bad(
                "algorithm.split_warmup",
                self.split_warmup,
                f"> algorithm.calibration_rounds={self.calibration_rounds} with eps_mode=relative",
            )

    def axes(self) -> tuple[str, str, str]:
        """(prediction model, prediction time, selection): the scenario's, axis by axis
        overridden where set."""
        m, t, s = SCENARIOS[self.scenario]
        return (self.prediction_model or m, self.prediction_time or t, self.selection or s)
