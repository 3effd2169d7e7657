"""Scheme names, the paper-scheme knobs with their defaults, and their validation.

No dataset is needed here, so the config layer checks a partition group with
:func:`check_knobs` before anything is loaded.
"""

from __future__ import annotations

from typing import Any

from fedjax_semi.data.partitions.common import _check, _is_int, _is_num

__all__ = ["PAPER_DEFAULTS", "POOLED_FRACTIONS", "SCHEMES", "SCHEME_GROUP", "check_knobs"]

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
# The scheme -> the group of `partition` holding its knobs.
SCHEME_GROUP = {
    "subset": "dofed",
    "normal": "dofed",
    "cofed": "cofed",
    "cfsl": "cfsl",
    "ada": "ada",
}


# Knobs of the paper schemes and their defaults, by group (`partition.<group>.<knob>`).
# PartitionConfig's groups (config_groups.py) carry the same fields and defaults (tests check
# they agree); see there for what each one means.
PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "dofed": {  # DoFed-SPP SUBSET / NORMAL
        "n_clusters": 5,
        "assignment": "even",
        "train_per_class": 500,
        "target_per_class": 200,
        "target_labeled_fraction": 0.05,
        "test_per_class": 100,
        "min_classes": 2,
        "max_classes": 10,
        "reject": "identical",
        "size_mode": "fixed_total",
        "overlap": "allow",
    },
    "cofed": {  # CoFED (its CIFAR-100 setup, paper §5.2)
        "variant": "iid",
        "min_classes": 6,
        "max_classes": 8,
        "samples_per_class": 50,
        "max_subclasses": 2,
        "public_fraction": 0.2,
        "train_share": 0.4,
        "label_space": "present",
    },
    "cfsl": {
        "num_edges": 3,
        "clusters": 2,
        "transform": "label_permutation",
        "base": "shards",
        "local_test_fraction": 0.2,
    },
    "ada": {  # Ada-FedSemi
        "variant": "noniid",
        "zeta": 0.5,
        "server_unlabeled_size": 0,
        "server_unlabeled_extra": False,
        "server_unlabeled_fraction": 1.0,
    },
}


def check_knobs(scheme: str, knobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Validates the scheme and the paper-scheme knobs without looking at a dataset.

    Every knob is checked whatever the scheme, so a bad value never lies dormant in a config.

    Args:
      scheme: ``partition.scheme``.
      knobs: group -> {knob: value}, a subset of :data:`PAPER_DEFAULTS`' groups and keys;
        missing ones take the defaults.

    Returns:
      The complete knobs, group -> {knob: value}.

    Raises:
      ValueError: ``partition.<group>.<knob>=<value> is invalid; <allowed>`` for the first bad
      knob.
    """
    _check(scheme in SCHEMES, "partition.scheme", scheme, f"allowed: {list(SCHEMES)}")
    k: dict[str, dict[str, Any]] = {}
    for group, defaults in PAPER_DEFAULTS.items():
        given = knobs.get(group, {})
        for key, value in given.items():
            _check(key in defaults, f"partition.{group}.{key}", value, "unknown partition knob")
        k[group] = {**defaults, **given}
    for group, value in knobs.items():
        _check(group in PAPER_DEFAULTS, f"partition.{group}", value, "unknown partition group")

    def get(name: str) -> Any:
        group, key = name.split(".")
        return k[group][key]

    def choice(name: str, allowed: tuple[str, ...]) -> None:
        _check(get(name) in allowed, f"partition.{name}", get(name), f"allowed: {list(allowed)}")

    def integer(name: str, lo: int) -> None:
        v = get(name)
        _check(_is_int(v) and v >= lo, f"partition.{name}", v, f"must be an integer >= {lo}")

    def fraction(name: str, lo: float, hi: float, lo_open: bool, hi_open: bool) -> None:
        v = get(name)
        ok = _is_num(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        bounds = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        _check(ok, f"partition.{name}", v, f"must be a number in {bounds}")

    def ordered(group: str) -> None:  # max_classes >= min_classes
        lo, hi = k[group]["min_classes"], k[group]["max_classes"]
        _check(
            hi >= lo,
            f"partition.{group}.max_classes",
            hi,
            f"must be >= partition.{group}.min_classes={lo}",
        )

    integer("dofed.n_clusters", 2)  # a client's train and target clusters must differ
    choice("dofed.assignment", ASSIGNMENTS)
    integer("dofed.train_per_class", 1)
    integer("dofed.target_per_class", 1)
    fraction("dofed.target_labeled_fraction", 0.0, 1.0, lo_open=True, hi_open=False)
    integer("dofed.test_per_class", 1)
    integer("dofed.min_classes", 1)
    integer("dofed.max_classes", 1)
    ordered("dofed")
    choice("dofed.reject", NORMAL_REJECTS)
    choice("dofed.size_mode", NORMAL_SIZE_MODES)
    choice("dofed.overlap", OVERLAPS)
    choice("cofed.variant", COFED_VARIANTS)
    integer("cofed.min_classes", 1)
    integer("cofed.max_classes", 1)
    ordered("cofed")
    integer("cofed.samples_per_class", 1)
    integer("cofed.max_subclasses", 1)
    fraction("cofed.public_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    fraction("cofed.train_share", 0.0, 1.0, lo_open=True, hi_open=True)
    choice("cofed.label_space", COFED_LABEL_SPACES)
    integer("cfsl.num_edges", 1)
    integer("cfsl.clusters", 1)
    choice("cfsl.transform", CFSL_TRANSFORMS)
    if k["cfsl"]["transform"] == "rotation":
        _check(
            k["cfsl"]["clusters"] <= 4,
            "partition.cfsl.clusters",
            k["cfsl"]["clusters"],
            "must be <= 4 with partition.cfsl.transform=rotation (multiples of 90 degrees)",
        )
    choice("cfsl.base", GENERIC_SCHEMES)
    fraction("cfsl.local_test_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    choice("ada.variant", VARIANTS)
    fraction("ada.zeta", 0.0, 1.0, lo_open=False, hi_open=False)
    integer("ada.server_unlabeled_size", 0)
    v = k["ada"]["server_unlabeled_extra"]
    _check(isinstance(v, bool), "partition.ada.server_unlabeled_extra", v, "must be true or false")
    v = k["ada"]["server_unlabeled_fraction"]
    _check(
        _is_num(v) and 0 < v <= 1,
        "partition.ada.server_unlabeled_fraction",
        v,
        "must be a share of the pool in (0, 1] (Fig. 13's 0% point is a run in which no "
        "pseudo-label passes: algorithm.adaptive_c=false algorithm.fixed_c=1.0)",
    )
    return k
