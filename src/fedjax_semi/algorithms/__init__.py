"""Algorithms by name. Importing this package registers every built-in method."""

from fedjax_semi.algorithms import fedavg  # noqa: F401  (registers the FedAvg family)
from fedjax_semi.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    FLState,
    algorithm_names,
    make_algorithm,
)

__all__ = ["ALGORITHMS", "Algorithm", "FLState", "algorithm_names", "make_algorithm"]
