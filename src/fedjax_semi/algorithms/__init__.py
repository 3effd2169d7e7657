"""Algorithms by name. Importing this package registers every built-in method; the registry
(`registry.py`) loads the methods of other installed packages when it is first read."""

from fedjax_semi.algorithms import (  # noqa: F401  (register methods)
    ada_fedsemi,
    cfsl,
    cofed,
    dofed_fedavg,
    dofed_spp,
    fedavg,
    fedbe,
    fedfomo,
    fedmd,
    fedopt,
    hetero_ada,
    pfedavg,
    pfedme,
    scaffold,
    um_pfssl,
)
from fedjax_semi.algorithms.base import Algorithm
from fedjax_semi.algorithms.registry import (
    ALGORITHM_CONFIGS,
    ALGORITHMS,
    algorithm_names,
    make_algorithm,
)

__all__ = [
    "ALGORITHM_CONFIGS",
    "ALGORITHMS",
    "Algorithm",
    "algorithm_names",
    "make_algorithm",
]
