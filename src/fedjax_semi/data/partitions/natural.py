"""``natural``: the dataset's own clients (LEAF's FEMNIST writers, the ``client_train`` /
``client_test`` ids of an ``npz:`` file) instead of a drawn partition.

Clients come from ``ds.side["writer_train"]`` (and ``["writer_test"]`` where given), each
example's index into ``ds.side["writers"]``, as ``load_femnist`` and ``load_npz`` give them.
The participants are the ``num_clients`` natural clients with the most training rows (ties
by id order), client 0 the largest. Each participant's training rows are split into
``labeled`` / ``unlabeled`` as in the generic schemes (``partition.labeled_mode``). Its
``test`` role is its own test rows when the dataset has test client ids, else the test split
dealt by its train class proportions (as the generic schemes deal it). ``test_global``: the
whole test split. Official split only, no val split. Assignment ``writer`` [C]: each
participant's index into ``ds.side["writers"]``.
"""

from __future__ import annotations

import numpy as np

from fedjax_semi.data.partitions.common import (
    _STAGE_LABELED,
    _STAGE_TEST,
    SchemeInput,
    SchemeOutput,
    _check,
    _require_no_val,
    _require_official_split,
)
from fedjax_semi.data.partitions.roles import (
    _split_labeled,
    class_proportions,
    split_by_proportions,
)

__all__ = ["build"]


def _ids(inp: SchemeInput, split: str) -> np.ndarray | None:
    """``int64 [n_split]`` client index per row of ``split``, or None if the dataset has none."""
    ds, key = inp.ds, f"writer_{split}"
    ids = (ds.side or {}).get(key)
    if ids is None:
        return None
    n = len(getattr(ds, f"y_{split}"))
    _check(
        len(ids) == n,
        "partition.scheme",
        inp.scheme,
        f"needs one client id per example, but {ds.name} has {len(ids)} in side[{key!r}] for "
        f"{n} {split} examples",
    )
    return np.asarray(ids, np.int64)


def build(inp: SchemeInput) -> SchemeOutput:
    """The natural clients' roles; see the module docstring."""
    _require_official_split(inp)
    _require_no_val(inp)
    ds = inp.ds
    w_train = _ids(inp, "train")
    _check(
        w_train is not None,
        "partition.scheme",
        inp.scheme,
        f"needs per-example client ids (dataset=femnist's writers, or client_train in an npz: "
        f"file); {ds.name} has none",
    )
    assert w_train is not None  # for the type checker: _check raised otherwise
    counts = np.bincount(w_train)
    n_natural = int((counts > 0).sum())
    _check(
        inp.num_clients <= n_natural,
        "num_clients",
        inp.num_clients,
        f"must be <= the {n_natural} natural clients of {ds.name} with training rows "
        "(partition.scheme=natural)",
    )
    chosen = np.argsort(-counts, kind="stable")[: inp.num_clients]  # most rows first
    n_train = len(ds.y_train)
    train = [np.flatnonzero(w_train == w).astype(np.int64) for w in chosen]
    labeled, unlabeled, mu = _split_labeled(
        train, inp.labeled_mode, inp.labeled_fraction, inp.label_ratio_alpha,
        inp.stage(_STAGE_LABELED),
    )  # fmt: skip
    w_test = _ids(inp, "test")
    test_split = np.arange(n_train, len(inp.labels_all), dtype=np.int64)
    if w_test is not None:
        test = [n_train + np.flatnonzero(w_test == w).astype(np.int64) for w in chosen]
    else:
        props = class_proportions(ds.y_train, train, ds.num_classes)
        parts = split_by_proportions(inp.labels_all[test_split], props, inp.stage(_STAGE_TEST))
        test = [test_split[p] for p in parts]
    clients = {"labeled": labeled, "unlabeled": unlabeled, "test": test}
    meta = {"natural_clients": n_natural, "natural_test": "own" if w_test is not None else "dealt"}
    return clients, {"test_global": test_split}, mu, {"writer": chosen.astype(np.int64)}, meta
