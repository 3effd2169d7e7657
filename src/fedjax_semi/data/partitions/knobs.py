"""Scheme names, the paper-scheme knobs with their defaults, and their validation.

No dataset is needed here, so the config layer checks a partition group with
:func:`check_knobs` before anything is loaded.
"""

from __future__ import annotations

from typing import Any

from fedjax_semi.data.partitions.common import _check, _is_int, _is_num

__all__ = ["PAPER_DEFAULTS", "POOLED_FRACTIONS", "SCHEMES", "check_knobs"]

GENERIC_SCHEMES = ("iid", "dirichlet", "shards")
SCHEMES = (*GENERIC_SCHEMES, "natural", "subset", "normal", "cofed", "cfsl", "ada")
LABELED_MODES = ("fixed", "dirichlet")
SPLITS = ("official", "pooled")
POOLED_FRACTIONS = (0.7, 0.1, 0.2)  # train / val / test pools, UM-pFSSL's protocol
ASSIGNMENTS = ("even", "balanced", "random")  # DoFed-SPP SUBSET cluster pairs
NORMAL_REJECTS = ("identical", "subset")  # DoFed-SPP NORMAL redraw rule
NORMAL_SIZE_MODES = ("per_class", "fixed_total")
OVERLAPS = ("allow", "none")  # DoFed-SPP: may clients share samples
VARIANTS = ("iid", "noniid")  # Ada-FedSemi
# CoFED: its CIFAR setup (iid, noniid; Sec. 5.2) or natural writer clients (FEMNIST, Sec. 5.3)
COFED_VARIANTS = (*VARIANTS, "writers")
COFED_LABEL_SPACES = ("present", "all")  # writers: Y_i = the classes of D_i, or every class
CFSL_TRANSFORMS = ("label_permutation", "rotation", "none")


# Knobs of the paper schemes and their defaults. PartitionConfig carries the same fields and
# defaults (tests check they agree); see there for what each one means.
PAPER_DEFAULTS: dict[str, Any] = {
    # DoFed-SPP SUBSET / NORMAL
    "n_clusters": 5,
    "assignment": "even",
    "train_per_class": 500,
    "target_per_class": 200,
    "target_labeled_fraction": 0.05,
    "test_per_class": 100,
    "normal_min_classes": 2,
    "normal_max_classes": 10,
    "normal_reject": "identical",
    "normal_size_mode": "fixed_total",
    "overlap": "allow",
    # CoFED (its CIFAR-100 setup, paper §5.2)
    "cofed_variant": "iid",
    "cofed_min_classes": 6,
    "cofed_max_classes": 8,
    "samples_per_class": 50,
    "cofed_max_subclasses": 2,
    "public_fraction": 0.2,
    "cofed_train_share": 0.4,
    "cofed_label_space": "present",
    # CFSL
    "num_edges": 3,
    "cfsl_clusters": 2,
    "cfsl_transform": "label_permutation",
    "cfsl_base": "shards",
    "local_test_fraction": 0.2,
    # Ada-FedSemi
    "ada_variant": "noniid",
    "ada_zeta": 0.5,
    "server_unlabeled_size": 0,
    "server_unlabeled_extra": False,
    "server_unlabeled_fraction": 1.0,
}


def check_knobs(scheme: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Validates the scheme and the paper-scheme knobs without looking at a dataset.

    Every knob is checked whatever the scheme, so a bad value never lies dormant in a config.

    Args:
      scheme: ``partition.scheme``.
      knobs: a subset of :data:`PAPER_DEFAULTS`' keys; missing ones take the defaults.

    Returns:
      The complete knob dict.

    Raises:
      ValueError: ``partition.<knob>=<value> is invalid; <allowed>`` for the first bad knob.
    """
    _check(scheme in SCHEMES, "partition.scheme", scheme, f"allowed: {list(SCHEMES)}")
    for key, value in knobs.items():
        _check(key in PAPER_DEFAULTS, f"partition.{key}", value, "unknown partition knob")
    k = {**PAPER_DEFAULTS, **knobs}

    def choice(name: str, allowed: tuple[str, ...]) -> None:
        _check(k[name] in allowed, f"partition.{name}", k[name], f"allowed: {list(allowed)}")

    def integer(name: str, lo: int) -> None:
        v = k[name]
        _check(_is_int(v) and v >= lo, f"partition.{name}", v, f"must be an integer >= {lo}")

    def fraction(name: str, lo: float, hi: float, lo_open: bool, hi_open: bool) -> None:
        v = k[name]
        ok = _is_num(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        bounds = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        _check(ok, f"partition.{name}", v, f"must be a number in {bounds}")

    integer("n_clusters", 2)  # a client's train and target clusters must differ
    choice("assignment", ASSIGNMENTS)
    integer("train_per_class", 1)
    integer("target_per_class", 1)
    fraction("target_labeled_fraction", 0.0, 1.0, lo_open=True, hi_open=False)
    integer("test_per_class", 1)
    integer("normal_min_classes", 1)
    integer("normal_max_classes", 1)
    _check(
        k["normal_max_classes"] >= k["normal_min_classes"],
        "partition.normal_max_classes",
        k["normal_max_classes"],
        f"must be >= partition.normal_min_classes={k['normal_min_classes']}",
    )
    choice("normal_reject", NORMAL_REJECTS)
    choice("normal_size_mode", NORMAL_SIZE_MODES)
    choice("overlap", OVERLAPS)
    choice("cofed_variant", COFED_VARIANTS)
    integer("cofed_min_classes", 1)
    integer("cofed_max_classes", 1)
    _check(
        k["cofed_max_classes"] >= k["cofed_min_classes"],
        "partition.cofed_max_classes",
        k["cofed_max_classes"],
        f"must be >= partition.cofed_min_classes={k['cofed_min_classes']}",
    )
    integer("samples_per_class", 1)
    integer("cofed_max_subclasses", 1)
    fraction("public_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    fraction("cofed_train_share", 0.0, 1.0, lo_open=True, hi_open=True)
    choice("cofed_label_space", COFED_LABEL_SPACES)
    integer("num_edges", 1)
    integer("cfsl_clusters", 1)
    choice("cfsl_transform", CFSL_TRANSFORMS)
    if k["cfsl_transform"] == "rotation":
        _check(
            k["cfsl_clusters"] <= 4,
            "partition.cfsl_clusters",
            k["cfsl_clusters"],
            "must be <= 4 with partition.cfsl_transform=rotation (multiples of 90 degrees)",
        )
    choice("cfsl_base", GENERIC_SCHEMES)
    fraction("local_test_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    choice("ada_variant", VARIANTS)
    fraction("ada_zeta", 0.0, 1.0, lo_open=False, hi_open=False)
    integer("server_unlabeled_size", 0)
    v = k["server_unlabeled_extra"]
    _check(isinstance(v, bool), "partition.server_unlabeled_extra", v, "must be true or false")
    v = k["server_unlabeled_fraction"]
    _check(
        _is_num(v) and 0 < v <= 1,
        "partition.server_unlabeled_fraction",
        v,
        "must be a share of the pool in (0, 1] (Fig. 13's 0% point is a run in which no "
        "pseudo-label passes: algorithm.adaptive_c=false algorithm.fixed_c=1.0)",
    )
    return k
