"""Pieces every scheme module uses: the per-stage random streams, argument checks, the
request a scheme's builder receives and the result it returns."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset

# Distinct seed-sequence keys per stage: changing one stage's knob leaves the others'
# random streams untouched.
_STAGE_SPLIT, _STAGE_PARTITION, _STAGE_LABELED, _STAGE_TEST, _STAGE_VAL = range(5)
_STAGE_GROUPS, _STAGE_TARGET, _STAGE_PUBLIC, _STAGE_TRANSFORM, _STAGE_HOLDOUT = range(5, 10)


def _sorted_i64(a: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(a, dtype=np.int64))


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid; {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float | np.number) and not isinstance(v, bool) and math.isfinite(v)


def _even_split(total: int, order: np.ndarray) -> np.ndarray:
    """``int64 [k]`` near-equal parts of ``total``; the ``total % k`` parts named first in
    ``order`` (a permutation of ``arange(k)``) get one more. Two splits with the same order
    and ``a <= b`` totals are elementwise ``<=``."""
    k = len(order)
    counts = np.full(k, total // k if k else 0, dtype=np.int64)
    counts[order[: total % k if k else 0]] += 1
    return counts


@dataclasses.dataclass(frozen=True)
class SchemeInput:
    """The validated arguments of :func:`~.build.build_partition`, as a scheme's builder
    gets them."""

    ds: ArrayDataset
    labels_all: np.ndarray  # int64 labels of concat(train, test)
    scheme: str
    num_clients: int
    alpha: float
    classes_per_client: int
    labeled_fraction: float
    labeled_mode: str
    label_ratio_alpha: float
    split: str
    val_fraction: float
    min_client_size: int
    knobs: dict[str, dict[str, Any]]  # group -> its knobs, every paper-scheme knob (check_knobs)
    stage: Callable[[int], np.random.Generator]  # stage key -> that stage's own stream


# (client roles, server sets, mu, assignments, meta entries added by the scheme)
SchemeOutput = tuple[
    dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray], dict
]
Builder = Callable[[SchemeInput], SchemeOutput]


def _require_official_split(inp: SchemeInput) -> None:
    _check(
        inp.split == "official",
        "partition.split",
        inp.split,
        f"scheme {inp.scheme!r} uses the official train/test split: must be 'official'",
    )


def _require_no_val(inp: SchemeInput) -> None:
    _check(
        inp.val_fraction == 0,
        "partition.val_fraction",
        inp.val_fraction,
        f"scheme {inp.scheme!r} has no validation split: must be 0",
    )
