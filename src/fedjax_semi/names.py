"""Names that `config` validates against and the packages that implement them also use.

A leaf module (it imports nothing from the package), so `config` can check `algorithm.name`
without importing `algorithms`, which imports `config`. `fedjax_semi.algorithms` checks on
import that its registry holds exactly these names.
"""

from __future__ import annotations

ALGORITHM_NAMES: tuple[str, ...] = (
    "ada_fedsemi",
    "cfsl",
    "cofed",
    "dofed_spp",
    "fedavg",
    "fedavg_p",
    "fedavg_pl",
    "fedavg_sl",
    "fedbe",
    "fedbn_sl",
    "fedfomo",
    "fedmd",
    "fedper",
    "fedprox",
    "fedprox_sl",
    "fedsemi",
    "fixavg",
    "fixbn",
    "fixprox",
    "hetero_ada",
    "hfsl",
    "lg_fedavg",
    "local",
    "pfedavg",
    "pfedme",
    "um_pfssl",
)
