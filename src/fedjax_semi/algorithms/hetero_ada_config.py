"""HeteroAda-FedSemi's config: Ada-FedSemi's knobs (ada_fedsemi_config.py) plus those of its
Sec. 4 (multi-exit sub-models, Alg. 3's clustering) and the choices the paper leaves open
(docs/choices.md: Ada-FedSemi, from the auxiliary classifiers to Alg. 3's details). Beside
`hetero_ada.py`, which reads it.
"""

from __future__ import annotations

import dataclasses

from fedjax_semi.algorithms.ada_fedsemi_config import AdaFedSemiConfig
from fedjax_semi.errors import bad, check_choice

SERVER_EXIT_LOSSES = ("all", "final")
# Table 9 (VGG9): the sub-models H^1, H^2, H^3: parameter size (MB) and normalised training load.
TABLE9_BYTES = (0.11e6, 1.00e6, 13.4e6)
TABLE9_LOADS = (1.0, 2.3, 3.1)


def _positive_list(key: str, values) -> None:
    ok = isinstance(values, list | tuple) and len(values) > 0
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    ok = ok and all(number(v) and v > 0 for v in values)
    if not ok:
        raise bad(key, values, "a non-empty list of numbers > 0, one per sub-model H^1 .. H^L")


@dataclasses.dataclass
class HeteroAdaConfig(AdaFedSemiConfig):
    """HeteroAda-FedSemi's knobs on top of Ada-FedSemi's (both agents as they are).

    part_bytes, part_loads: the size (bytes) and normalised training load of each sub-model
        H^1 .. H^L on the simulated clock and in the traffic (Table 9: the paper's
        measured constants, not the run model's parameter count or FLOPs).
    detach_between_parts: stop the gradient at each part's input (Eq. 21, exit b's loss trains
        part b only); false: joint backprop of sum_{b <= d} f^b (Eq. 22).
    server_exit_losses: the server's pseudo-label epoch on the sum of every exit's loss (all)
        or on the final exit's (final); pseudo-labels and validation use the final exit (not said).
    kmeans_restarts: Alg. 3's random initialisations, the lowest within-cluster SSE kept
        (1: the paper's single draw); kmeans_max_iter: its iteration cap; min_rel_gap: clusters
        whose centroids differ by less than this fraction take the faster one's depth (null:
        off, the paper).
    """

    name: str = "hetero_ada"
    part_bytes: list[float] = dataclasses.field(default_factory=lambda: list(TABLE9_BYTES))
    part_loads: list[float] = dataclasses.field(default_factory=lambda: list(TABLE9_LOADS))
    detach_between_parts: bool = False
    server_exit_losses: str = "all"
    kmeans_restarts: int = 1
    kmeans_max_iter: int = 100
    min_rel_gap: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_list("algorithm.part_bytes", self.part_bytes)
        _positive_list("algorithm.part_loads", self.part_loads)
        if len(self.part_loads) != len(self.part_bytes):
            raise bad(
                "algorithm.part_loads",
                self.part_loads,
                f"{len(self.part_bytes)} loads, as many as algorithm.part_bytes",
            )
        check_choice("algorithm.server_exit_losses", self.server_exit_losses, SERVER_EXIT_LOSSES)
        for key in ("kmeans_restarts", "kmeans_max_iter"):
            v = getattr(self, key)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise bad(f"algorithm.{key}", v, "an integer >= 1")
        if self.min_rel_gap is not None and not self.min_rel_gap >= 0:
            raise bad("algorithm.min_rel_gap", self.min_rel_gap, "a fraction >= 0, or null (off)")
