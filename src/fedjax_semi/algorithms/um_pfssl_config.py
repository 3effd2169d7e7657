"""UM-pFSSL's config: the knobs of the paper's Sec. 3 and Algorithms 1-2, and the choices it
leaves open (docs/choices.md, UM-pFSSL). Beside `um_pfssl.py`, which reads it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_semi.algorithms.fedavg import FedAvgConfig
from fedjax_semi.errors import bad, check_choice

CHOICES = {
    "corr_form": ("inverse", "complement"),
    "pseudo_label": ("soft", "hard"),
    "self_pl_model": ("pre_aggregation", "post_aggregation"),
    "helper_cache": ("exact", "fresh"),
    "entropy_reduction": ("mean", "sum"),
    "acc_mode": ("mc_mean", "deterministic"),
    "loss_schedule": ("joint", "alternating"),
    "search_schedule": ("global_rounds", "per_client_participations"),
    "refresh_trigger": ("global_mod", "per_client_elapsed", "every_round_after_nu"),
    "kl_direction": ("target_to_model", "model_to_target"),
    "mc_bn_mode": ("running", "batch"),
    "aggregation": ("corr", "uniform", "own"),
}


@dataclasses.dataclass
class UMPFSSLConfig(FedAvgConfig):
    """UM-pFSSL's knobs (the paper's Sec. 4, Algorithms 1-2 and Sec. 6.1; what the paper leaves
    open is a knob, with our default, docs/choices.md: UM-pFSSL). Local training reuses the
    FedAvg family's knobs."""

    # What a vectorized sweep may trace (AlgorithmConfig.traceable).
    traceable: ClassVar[tuple[str, ...]] = (
        "lr",
        "server_lr",
        "pl_threshold",
        "pl_weight",
        "entropy_eps",
    )

    name: str = "um_pfssl"
    helper_list_size: int = 5  # M, self included (Sec. 6.1 gives M, R, F inconsistently)
    num_replace: int = 2  # R (Sec. 6.1)
    search_rounds: int = 20  # F: search in rounds t <= F (Sec. 6.1 "first F"; Alg. 1 l.10: t < F)
    refresh_period: int = 10  # nu: refresh kept helpers when t % nu == 0 (Sec. 4.2)
    mc_samples: int = 10  # T_mc of Eq. 9, not given in the paper
    corr_form: str = "inverse"  # inverse (Eq. 13 literal) | complement ((1 - mu)(1 - H), bounded)
    pseudo_label: str = "soft"  # soft (MC mean of Eq. 11's helper) | hard (one-hot)
    self_pl_model: str = "pre_aggregation"  # self slot labels with: pre | post (Alg. 1 l.15-17)
    refresh_lowest_r: bool = False  # literal Alg. 2: the R lowest slots are not refreshed
    helper_cache: str = "exact"  # exact (stale local copies) | fresh (the latest upload)
    warmup_epochs: int = 5  # E_warm: labeled-only epochs before round 1 (Alg. 1 l.4, unstated)
    entropy_reduction: str = "mean"  # mean (H in [0, 1], as the paper reasons) | sum (Eq. 12)
    entropy_eps: float = 1e-6  # floor of H in Corr's reciprocal term (Eq. 13)
    acc_mode: str = "mc_mean"  # Eq. 13's Acc from the MC mean | deterministic (dropout off)
    loss_schedule: str = "joint"  # joint (Eq. 1's mu weights) | alternating (Alg. 1 l.19-20)
    search_schedule: str = "global_rounds"  # t <= F | per_client_participations (first F)
    # When kept helpers refresh: t % nu == 0 (Sec. 4.2, 6.2) | >= nu rounds since this client's
    # last refresh | every round t >= nu (Alg. 1 l.12 literally).
    refresh_trigger: str = "global_mod"
    kl_direction: str = "target_to_model"  # KL(y_hat || f_w) | KL(f_w || y_hat) as in Eq. 5
    aggregate_bn_stats: bool = True  # BN running stats Corr-averaged too | kept local (FedBN)
    mc_bn_mode: str = "running"  # BN in the MC passes of Eq. 9: running | batch stats
    # Where local training starts (Alg. 1 l.14-15): the Corr-weighted average of the helpers |
    # their plain average | the client's own model (an ablation: no averaging, the helpers
    # still give the pseudo-labels of Eq. 11).
    aggregation: str = "corr"

    pl_threshold_nullable: ClassVar[bool] = True  # null keeps every pseudo-label

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("algorithm.corr_form", self.corr_form, CHOICES["corr_form"])
        check_choice("algorithm.pseudo_label", self.pseudo_label, CHOICES["pseudo_label"])
        check_choice("algorithm.self_pl_model", self.self_pl_model, CHOICES["self_pl_model"])
        check_choice("algorithm.helper_cache", self.helper_cache, CHOICES["helper_cache"])
        check_choice(
            "algorithm.entropy_reduction", self.entropy_reduction, CHOICES["entropy_reduction"]
        )
        check_choice("algorithm.acc_mode", self.acc_mode, CHOICES["acc_mode"])
        check_choice("algorithm.loss_schedule", self.loss_schedule, CHOICES["loss_schedule"])
        check_choice("algorithm.search_schedule", self.search_schedule, CHOICES["search_schedule"])
        check_choice("algorithm.refresh_trigger", self.refresh_trigger, CHOICES["refresh_trigger"])
        check_choice("algorithm.kl_direction", self.kl_direction, CHOICES["kl_direction"])
        check_choice("algorithm.mc_bn_mode", self.mc_bn_mode, CHOICES["mc_bn_mode"])
        check_choice("algorithm.aggregation", self.aggregation, CHOICES["aggregation"])
        if not isinstance(self.aggregate_bn_stats, bool):
            raise bad("algorithm.aggregate_bn_stats", self.aggregate_bn_stats, "true or false")
        if self.refresh_period < 1 or self.mc_samples < 1 or self.search_rounds < 0:
            raise bad(
                "algorithm.refresh_period",
                self.refresh_period,
                "refresh_period >= 1, mc_samples >= 1 and search_rounds >= 0",
            )
        if not self.entropy_eps > 0:
            raise bad("algorithm.entropy_eps", self.entropy_eps, "a float > 0")
        if self.loss_schedule == "alternating" and self.local_epochs < 1:
            raise bad(
                "algorithm.loss_schedule",
                "alternating",
                "'joint' when training by steps (epochs 0)",
            )

    def round_flags(self, t: int) -> tuple[bool, bool]:
        """(replace possible, refresh possible) in round t, compiled as static switches.
        Refresh (Sec. 4.2 and Alg. 1 l.12 disagree; docs/choices.md: UM-pFSSL, when kept helpers
        are refreshed): global_mod t % nu == 0; every_round_after_nu t >= nu (Alg. 1 l.12);
        per_client_elapsed t >= nu, and each sampled client refreshes if nu rounds have passed
        since its last refresh. With search_schedule=per_client_participations each client
        decides in the round whether it searches."""
        searching = t <= self.search_rounds if self.search_schedule == "global_rounds" else True
        if self.refresh_trigger == "global_mod":
            return searching, t % self.refresh_period == 0
        return searching, t >= self.refresh_period
