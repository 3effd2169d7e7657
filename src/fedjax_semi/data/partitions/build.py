"""``build_partition``: checks the arguments every scheme shares, then hands the scheme's
builder (:data:`~.registry.BUILDERS`) a :class:`~.common.SchemeInput`."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions.common import (
    _STAGE_HOLDOUT,
    SchemeInput,
    _check,
    _is_int,
    _is_num,
)
from fedjax_semi.data.partitions.container import Partition
from fedjax_semi.data.partitions.holdout import apply_holdout, check_holdout
from fedjax_semi.data.partitions.knobs import (
    LABELED_MODES,
    POOLED_FRACTIONS,
    SCHEME_GROUP,
    SCHEMES,
    SPLITS,
    check_knobs,
)
from fedjax_semi.data.partitions.registry import BUILDERS

__all__ = ["build_partition"]


def build_partition(
    ds: ArrayDataset,
    *,
    num_clients: int,
    scheme: str,
    alpha: float,
    classes_per_client: int,
    labeled_fraction: float,
    labeled_mode: str,
    label_ratio_alpha: float,
    split: str,
    val_fraction: float,
    min_client_size: int,
    seed: int,
    holdout: float = 0.0,
    **knobs: dict[str, Any],
) -> Partition:
    """Builds the client/server partition of ``ds``.

    Returned indices are indices into ``concat(train, test)``, i.e. test sample ``j`` is
    ``len(ds.x_train) + j``. ``knobs`` are the paper-scheme knobs by group, as in
    :data:`~.knobs.PAPER_DEFAULTS` (``cofed={"min_classes": 3}``; missing ones take those
    defaults).

    Splits (generic schemes and ``cfsl``):
      ``"official"``: clients' labeled/unlabeled data come from the official train split.
      The official test split (minus a stratified ``val_fraction`` pool when > 0) is dealt
      to clients' ``"test"`` role with each client's train class proportions, the val pool
      likewise to ``"val"``; server ``"test_global"`` is the non-val test split.
      ``"pooled"``: train+test are pooled, shuffled and split 70/10/20 into train/val/test
      pools (UM-pFSSL protocol; ``val_fraction`` is unused); the train pool is partitioned,
      val/test pools dealt by proportions; ``"test_global"`` is the test pool.

    Generic schemes: ``"iid"``, ``"dirichlet"`` (``alpha``, ``min_client_size``), ``"shards"``
    (``classes_per_client``). Labeled modes: ``"fixed"`` (``labeled_fraction``) or
    ``"dirichlet"`` (``label_ratio_alpha``), see :func:`~.roles.labeled_split`.

    Paper schemes (official split only unless said otherwise; roles not named are absent):
    ``"subset"`` / ``"normal"`` (DoFed-SPP), ``"cofed"`` (CoFED), ``"cfsl"`` (CFSL) and
    ``"ada"`` (Ada-FedSemi); the docstrings of :mod:`.dofed`, :mod:`.cofed`, :mod:`.cfsl`
    and :mod:`.ada` say what each builds. Their group's knobs are added to ``meta`` under the
    group's name (``meta["cofed"]``).

    ``holdout`` > 0 (every scheme): a stratified share of every client's training rows becomes
    its ``"test"`` role and their union ``"test_global"``, IN PLACE of the test split
    (:mod:`.holdout`); ``meta["holdout"]`` records it.

    Each stage draws from ``np.random.default_rng([seed, stage])`` so changing one stage's
    setting does not reshuffle the others.

    Raises:
      ValueError: naming the config key, value and what is allowed, for any bad argument.
    """
    k = _check_args(
        ds, num_clients, scheme, alpha, classes_per_client, labeled_fraction, labeled_mode,
        label_ratio_alpha, split, val_fraction, min_client_size, seed, knobs,
    )  # fmt: skip
    check_holdout(scheme, holdout, split, val_fraction)

    def stage(key: int) -> np.random.Generator:
        return np.random.default_rng([seed, key])

    labels_all = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    meta = {
        "dataset": ds.name,
        "num_classes": int(ds.num_classes),
        "num_clients": int(num_clients),
        "scheme": scheme,
        "alpha": float(alpha),
        "classes_per_client": int(classes_per_client),
        "labeled_fraction": float(labeled_fraction),
        "labeled_mode": labeled_mode,
        "label_ratio_alpha": float(label_ratio_alpha),
        "split": split,
        "val_fraction": float(val_fraction),
        "min_client_size": int(min_client_size),
        "seed": int(seed),
        "holdout": float(holdout),
        "n_train": int(len(ds.y_train)),
        "n_test": int(len(ds.y_test)),
        "index_layout": "concat(train, test)",
    }
    if scheme in SCHEME_GROUP:
        own = k[SCHEME_GROUP[scheme]]
        meta[SCHEME_GROUP[scheme]] = {
            key: (v.item() if isinstance(v, np.generic) else v) for key, v in own.items()
        }
    inp = SchemeInput(
        ds, labels_all, scheme, num_clients, alpha, classes_per_client, labeled_fraction,
        labeled_mode, label_ratio_alpha, split, val_fraction, min_client_size, k, stage,
    )  # fmt: skip
    clients, server, mu, assignments, extra = BUILDERS[scheme](inp)
    meta.update(extra)
    if holdout > 0:
        clients, server, mu, meta["holdout_rows"] = apply_holdout(
            clients, server, labels_all, scheme, holdout, stage(_STAGE_HOLDOUT)
        )
    return Partition(clients=clients, server=server, mu=mu, meta=meta, assignments=assignments)


def _check_args(
    ds: ArrayDataset,
    num_clients: int,
    scheme: str,
    alpha: float,
    classes_per_client: int,
    labeled_fraction: float,
    labeled_mode: str,
    label_ratio_alpha: float,
    split: str,
    val_fraction: float,
    min_client_size: int,
    seed: int,
    knobs: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Checks the arguments shared by every scheme (the schemes' builders check their own);
    returns the complete knobs by group."""
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    n_all = n_train + n_test
    _check(split in SPLITS, "partition.split", split, f"allowed: {list(SPLITS)}")
    _check(scheme in SCHEMES, "partition.scheme", scheme, f"allowed: {list(SCHEMES)}")
    _check(
        labeled_mode in LABELED_MODES,
        "partition.labeled_mode",
        labeled_mode,
        f"allowed: {list(LABELED_MODES)}",
    )
    _check(_is_num(alpha) and alpha > 0, "partition.alpha", alpha, "must be a number > 0")
    _check(
        _is_num(labeled_fraction) and 0 < labeled_fraction <= 1,
        "partition.labeled_fraction",
        labeled_fraction,
        "must be in (0, 1]",
    )
    _check(
        _is_num(label_ratio_alpha) and label_ratio_alpha > 0,
        "partition.label_ratio_alpha",
        label_ratio_alpha,
        "must be a number > 0",
    )
    _check(
        _is_num(val_fraction) and 0 <= val_fraction < 1,
        "partition.val_fraction",
        val_fraction,
        "must be in [0, 1)",
    )
    _check(
        _is_int(classes_per_client) and 1 <= classes_per_client <= ds.num_classes,
        "partition.classes_per_client",
        classes_per_client,
        f"must be an integer in [1, {ds.num_classes}] (num_classes of {ds.name})",
    )
    _check(
        _is_int(min_client_size) and min_client_size >= 0,
        "partition.min_client_size",
        min_client_size,
        "must be an integer >= 0",
    )
    _check(_is_int(seed) and seed >= 0, "seed", seed, "must be an integer >= 0")
    k = check_knobs(scheme, knobs)
    cfsl_pooled = scheme == "cfsl" and split == "pooled"
    if cfsl_pooled:
        pool_train = n_all
    else:
        pool_train = n_train if split == "official" else int(POOLED_FRACTIONS[0] * n_all)
    max_clients = pool_train // max(1, min_client_size)
    _check(
        _is_int(num_clients) and 1 <= num_clients <= max_clients,
        "num_clients",
        num_clients,
        f"must be an integer in [1, {max_clients}] ({pool_train} training samples / "
        f"partition.min_client_size={min_client_size})",
    )
    base_scheme = k["cfsl"]["base"] if scheme == "cfsl" else scheme
    if base_scheme == "shards":
        _check(
            num_clients * classes_per_client <= pool_train,
            "partition.classes_per_client",
            classes_per_client,
            f"num_clients * classes_per_client must be <= {pool_train} training samples",
        )
    return k
