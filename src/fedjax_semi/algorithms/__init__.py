"""Algorithms by name. Importing this package registers every built-in method."""

from fedjax_semi.algorithms import (  # noqa: F401  (register methods)
    ada_fedsemi,
    cfsl,
    cofed,
    dofed_spp,
    fedavg,
    fedbe,
    fedfomo,
    fedmd,
    hetero_ada,
    pfedavg,
    pfedme,
    um_pfssl,
)
from fedjax_semi.algorithms.base import (
    ALGORITHM_CONFIGS,
    ALGORITHMS,
    Algorithm,
    FLState,
    algorithm_names,
    make_algorithm,
)
from fedjax_semi.names import ALGORITHM_NAMES

if sorted(ALGORITHMS) != sorted(ALGORITHM_NAMES):  # config validates against ALGORITHM_NAMES
    raise RuntimeError(
        f"fedjax_semi.names.ALGORITHM_NAMES {sorted(ALGORITHM_NAMES)} must list exactly the "
        f"registered algorithms {sorted(ALGORITHMS)}"
    )

__all__ = [
    "ALGORITHM_CONFIGS",
    "ALGORITHMS",
    "Algorithm",
    "FLState",
    "algorithm_names",
    "make_algorithm",
]
