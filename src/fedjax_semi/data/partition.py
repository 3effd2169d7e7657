"""Federated partitions: which sample indices each client holds, per role.

Pure numpy and deterministic given a ``np.random.Generator``. Per-client index lists are
``list[np.ndarray]`` of sorted ``int64`` indices. :func:`build_partition` ties the pieces
together for a dataset; its indices refer to ``concat(train, test)`` (see there).

Besides the generic schemes (iid, dirichlet, shards) there is one scheme per paper spec:
``subset``/``normal`` (DoFed-SPP), ``cofed`` (CoFED), ``cfsl`` (CFSL) and ``ada``
(Ada-FedSemi); UM-pFSSL is ``dirichlet`` + ``labeled_mode=dirichlet`` + ``split=pooled``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_semi.data.sources import ArrayDataset

__all__ = [
    "Partition",
    "apply_client_transforms",
    "build_partition",
    "check_knobs",
    "class_proportions",
    "dirichlet_partition",
    "iid_partition",
    "labeled_split",
    "shard_partition",
    "split_by_proportions",
]

GENERIC_SCHEMES = ("iid", "dirichlet", "shards")
SCHEMES = (*GENERIC_SCHEMES, "subset", "normal", "cofed", "cfsl", "ada")
LABELED_MODES = ("fixed", "dirichlet")
SPLITS = ("official", "pooled")
POOLED_FRACTIONS = (0.7, 0.1, 0.2)  # train / val / test pools, UM-pFSSL's protocol
ASSIGNMENTS = ("balanced", "random")  # DoFed-SPP SUBSET cluster pairs
NORMAL_REJECTS = ("identical", "subset")  # DoFed-SPP NORMAL redraw rule
NORMAL_SIZE_MODES = ("per_class", "fixed_total")
OVERLAPS = ("allow", "none")  # DoFed-SPP: may clients share samples
VARIANTS = ("iid", "noniid")  # CoFED / Ada-FedSemi
CFSL_TRANSFORMS = ("label_permutation", "rotation", "none")

# Distinct seed-sequence keys per stage: changing one stage's knob leaves the others'
# random streams untouched.
_STAGE_SPLIT, _STAGE_PARTITION, _STAGE_LABELED, _STAGE_TEST, _STAGE_VAL = range(5)
_STAGE_GROUPS, _STAGE_TARGET, _STAGE_PUBLIC, _STAGE_TRANSFORM = range(5, 9)


def _sorted_i64(a: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(a, dtype=np.int64))


def iid_partition(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffles ``arange(n)`` and splits it into ``num_clients`` near-equal parts.

    Returns:
      ``num_clients`` sorted int64 arrays; sizes differ by at most one.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients={num_clients} must be >= 1")
    return [_sorted_i64(p) for p in np.array_split(rng.permutation(n), num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 10,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Label-skewed partition, NIID-Bench style (Li et al. 2022; as in UM-pFSSL).

    For each class ``c`` draw ``p_c ~ Dir_K(alpha)``; clients already holding ``>= N/K``
    samples get zero share (keeps sizes bounded); renormalize; cut class ``c``'s shuffled
    indices at ``floor(cumsum(p_c) * N_c)``. The whole draw is repeated until every client
    holds at least ``min_size`` samples.

    Args:
      labels: ``int [N]`` class labels.
      num_clients: ``K``.
      alpha: Dirichlet concentration (> 0); small is skewed, large is near-IID.
      rng: random generator.
      min_size: minimum number of samples per client.

    Returns:
      ``(client_indices, proportions)``: ``K`` sorted int64 index arrays into ``labels``,
      and ``float [num_classes, K]``, the renormalized proportions of the final draw
      (the realized share of class ``c`` for client ``k`` differs from it only by the
      integer cut, i.e. less than one sample). ``num_classes = labels.max() + 1``.

    Raises:
      ValueError: if no draw satisfies ``min_size`` within 1000 tries.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if num_clients < 1:
        raise ValueError(f"num_clients={num_clients} must be >= 1")
    if not alpha > 0:
        raise ValueError(f"alpha={alpha} must be > 0")
    if num_clients * min_size > n:
        raise ValueError(
            f"cannot give {num_clients} clients >= {min_size} samples each from {n} samples"
        )
    num_classes = int(labels.max()) + 1 if n else 0
    class_idx = [np.flatnonzero(labels == c) for c in range(num_classes)]
    cap = n / num_clients
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        props = np.zeros((num_classes, num_clients))
        for c, idx in enumerate(class_idx):
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, alpha))
            open_ = sizes < cap  # never all False: sum(sizes) < n while classes remain
            p = np.where(open_, p, 0.0)
            if p.sum() <= 0:  # tiny alpha can underflow every open share to exactly 0
                p = np.zeros(num_clients)
                p[np.flatnonzero(open_)[0]] = 1.0
            p = p / p.sum()
            props[c] = p
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        if sizes.min() >= min_size:
            clients = [
                _sorted_i64(np.concatenate(p) if p else np.empty(0, np.int64)) for p in parts
            ]
            return clients, props
    raise ValueError(
        f"dirichlet_partition: no draw with >= {min_size} samples per client for "
        f"{num_clients} clients and alpha={alpha} in 1000 tries; use a larger alpha "
        "(partition.alpha) or a smaller min size (partition.min_client_size)"
    )


def shard_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Pathological non-IID shards (McMahan et al. 2017).

    Sorts samples by label (random order within a class), cuts them into
    ``num_clients * classes_per_client`` contiguous shards and gives each client
    ``classes_per_client`` shards. Unlike a plain random deal, which often hands a client two
    shards of one class, shards are first dealt column-wise (client ``k`` gets shards
    ``k, k + K, ...``, which lie in distinct classes whenever each class fills at most ``K``
    shards) and then mixed by random pairwise swaps that never give a client a second shard
    of a (majority) class it already has. So when every class fills a whole number of
    shards each client sees exactly ``classes_per_client`` classes. Every sample is
    assigned exactly once.

    Returns:
      ``num_clients`` sorted int64 index arrays into ``labels``.
    """
    labels = np.asarray(labels)
    num_shards = num_clients * classes_per_client
    if num_clients < 1 or classes_per_client < 1:
        raise ValueError("num_clients and classes_per_client must be >= 1")
    if num_shards > len(labels):
        raise ValueError(f"{num_shards} shards requested from only {len(labels)} samples")
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    shards = np.array_split(order, num_shards)
    shard_cls = [int(np.bincount(labels[s]).argmax()) for s in shards]
    # Column-wise deal of the label-sorted shards, clients in random order.
    base = np.arange(num_shards).reshape(classes_per_client, num_clients).T
    assign = base[rng.permutation(num_clients)].tolist()
    cls = [[shard_cls[s] for s in row] for row in assign]
    # Symmetric random swap proposals, accepted only if both clients keep distinct classes:
    # randomizes the class combinations while preserving validity.
    n_prop = 5 * num_shards
    props = zip(
        rng.integers(num_clients, size=n_prop).tolist(),
        rng.integers(classes_per_client, size=n_prop).tolist(),
        rng.integers(num_clients, size=n_prop).tolist(),
        rng.integers(classes_per_client, size=n_prop).tolist(),
        strict=True,
    )
    for a, i, b, j in props:
        ca, cb = cls[a][i], cls[b][j]
        if a == b or (ca != cb and (cb in cls[a] or ca in cls[b])):
            continue
        assign[a][i], assign[b][j] = assign[b][j], assign[a][i]
        cls[a][i], cls[b][j] = cb, ca
    return [_sorted_i64(np.concatenate([shards[s] for s in row])) for row in assign]


def class_proportions(
    labels: np.ndarray, client_indices: list[np.ndarray], num_classes: int
) -> np.ndarray:
    """Share of each class's samples held by each client.

    Returns:
      ``float [num_classes, C]``: ``counts[c, k] / sum_k counts[c, k]``; a class with no
      samples gives a zero row.
    """
    labels = np.asarray(labels)
    counts = np.stack(
        [np.bincount(labels[idx], minlength=num_classes)[:num_classes] for idx in client_indices],
        axis=1,
    ).astype(np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def split_by_proportions(
    labels: np.ndarray, proportions: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Distributes another split's samples (val/test pool) to clients per class.

    Class ``c``'s shuffled samples are cut at ``round(cumsum(proportions[c]) * N_c)`` so each
    client's set follows its train class distribution. A class whose row sums to zero
    (absent from train) is spread uniformly so that every sample is still assigned.

    Args:
      labels: ``int [M]`` labels of the split to distribute.
      proportions: ``float [num_classes, C]`` per-class client shares (rows sum to 1 or 0).
      rng: random generator.

    Returns:
      ``C`` sorted int64 index arrays into ``labels``.
    """
    labels = np.asarray(labels)
    proportions = np.asarray(proportions, dtype=np.float64)
    num_classes, num_clients = proportions.shape
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels outside [0, {num_classes}) of the proportions matrix")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        p = proportions[c]
        p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
        cuts = np.round(np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
        for k, chunk in enumerate(np.split(idx, np.clip(cuts, 0, len(idx)))):
            parts[k].append(chunk)
    return [_sorted_i64(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]


def labeled_split(
    client_indices: list[np.ndarray],
    rng: np.random.Generator,
    fraction: float | None = None,
    ratio_alpha: float | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Splits each client's samples into labeled and unlabeled subsets.

    The labeled subset is drawn uniformly at random (not stratified). Exactly one mode:
    fixed (``fraction``): ``n_s = max(1, round(fraction * n))``; Dirichlet
    (``ratio_alpha``): ``(p_s, p_u) ~ Dir_2(ratio_alpha)``, ``n_s = round(p_s * n)``
    (0 or n allowed; small ``ratio_alpha`` gives a U-shaped spread across clients).

    Returns:
      ``(labeled, unlabeled, mu)``: per-client sorted int64 arrays and ``float [C]``
      ``mu = n_s / n`` (0 for an empty client).
    """
    if (fraction is None) == (ratio_alpha is None):
        raise ValueError("labeled_split: give exactly one of fraction or ratio_alpha")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    if ratio_alpha is not None and not ratio_alpha > 0:
        raise ValueError(f"ratio_alpha={ratio_alpha} must be > 0")
    labeled, unlabeled = [], []
    mu = np.zeros(len(client_indices))
    for k, idx in enumerate(client_indices):
        idx = np.asarray(idx, dtype=np.int64)
        n = len(idx)
        if fraction is not None:
            n_s = min(n, max(1, int(round(fraction * n))))
        else:
            n_s = int(round(rng.dirichlet([ratio_alpha, ratio_alpha])[0] * n))
        perm = rng.permutation(n)
        labeled.append(_sorted_i64(idx[perm[:n_s]]))
        unlabeled.append(_sorted_i64(idx[perm[n_s:]]))
        mu[k] = n_s / n if n else 0.0
    return labeled, unlabeled, mu


# ----------------------------------------------------------------------------- Partition


@dataclasses.dataclass(eq=False)
class Partition:
    """A complete federated partition of one dataset.

    Attributes:
      clients: role -> ``C`` sorted int64 index arrays; roles ``"labeled"``,
        ``"unlabeled"``, ``"test"`` and optionally ``"val"``.
      server: server-side index sets, at least ``"test_global"`` (and ``"val_global"``
        when there is a val role).
      mu: ``float [C]`` labeled ratio per client.
      meta: JSON-serializable settings (scheme, alpha, seed, ...).
      assignments: per-client arrays with a leading ``[C]`` axis, e.g. ``"edge"`` int [C],
        ``"cluster"`` int [C], ``"label_map"`` int [C, num_classes] (the label client ``k``
        sees for true class ``y`` is ``label_map[k, y]``), ``"rotation"`` int [C] (quarter
        turns: inputs of client ``k`` are rotated by ``90 * rotation[k]`` degrees). Empty for
        the generic schemes; :func:`apply_client_transforms` applies the last two.

    All indices refer to ``concat(x_train, x_test)`` of the source dataset.
    """

    clients: dict[str, list[np.ndarray]]
    server: dict[str, np.ndarray]
    mu: np.ndarray
    meta: dict[str, Any]
    assignments: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.mu)

    def counts(self) -> dict[str, np.ndarray]:
        """Role -> ``int64 [C]`` number of samples per client."""
        return {r: np.array([len(a) for a in v], dtype=np.int64) for r, v in self.clients.items()}

    def save(self, path: str | Path) -> None:
        """Writes one ``.npz``: ragged lists as concatenated values + offsets, meta as JSON."""
        arrays: dict[str, np.ndarray] = {"mu": np.asarray(self.mu, dtype=np.float64)}
        for role, lists in self.clients.items():
            sizes = np.array([len(a) for a in lists], dtype=np.int64)
            arrays[f"clients/{role}/offsets"] = np.concatenate([[0], np.cumsum(sizes)])
            arrays[f"clients/{role}/values"] = (
                np.concatenate(lists).astype(np.int64) if lists else np.empty(0, np.int64)
            )
        for name, idx in self.server.items():
            arrays[f"server/{name}"] = np.asarray(idx, dtype=np.int64)
        for name, a in self.assignments.items():
            arrays[f"assignments/{name}"] = np.asarray(a)  # dtype kept by the .npz
        header = {
            "roles": list(self.clients),
            "server": list(self.server),
            "meta": self.meta,
            "assignments": list(self.assignments),
        }
        arrays["header"] = np.array(json.dumps(header))
        # A file object keeps np.savez from appending ".npz" to the requested path.
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Partition:
        """Reads a partition written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            clients = {}
            for role in header["roles"]:
                values, offsets = z[f"clients/{role}/values"], z[f"clients/{role}/offsets"]
                clients[role] = [
                    values[offsets[k] : offsets[k + 1]].copy() for k in range(len(offsets) - 1)
                ]
            server = {name: z[f"server/{name}"] for name in header["server"]}
            # Files written before assignments existed have no such header key.
            assignments = {a: z[f"assignments/{a}"] for a in header.get("assignments", [])}
            return cls(
                clients=clients,
                server=server,
                mu=z["mu"],
                meta=header["meta"],
                assignments=assignments,
            )


# ----------------------------------------------------------------------------- build


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r} is invalid; {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float | np.number) and not isinstance(v, bool) and math.isfinite(v)


def _stratified_take(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask taking ``round(fraction * N_c)`` random samples of every class."""
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        mask[idx[: int(round(fraction * len(idx)))]] = True
    return mask


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
) -> Partition:
    """Builds the client/server partition of ``ds``.

    Returned indices are indices into ``concat(train, test)``, i.e. test sample ``j`` is
    ``len(ds.x_train) + j``.

    Splits:
      ``"official"``: clients' labeled/unlabeled data come from the official train split.
      The official test split (minus a stratified ``val_fraction`` pool when > 0) is dealt
      to clients' ``"test"`` role with each client's train class proportions, the val pool
      likewise to ``"val"``; server ``"test_global"`` is the non-val test split.
      ``"pooled"``: train+test are pooled, shuffled and split 70/10/20 into train/val/test
      pools (UM-pFSSL protocol; ``val_fraction`` is unused); the train pool is partitioned,
      val/test pools dealt by proportions; ``"test_global"`` is the test pool.

    Schemes: ``"iid"``, ``"dirichlet"`` (``alpha``, ``min_client_size``), ``"shards"``
    (``classes_per_client``). Labeled modes: ``"fixed"`` (``labeled_fraction``) or
    ``"dirichlet"`` (``label_ratio_alpha``), see :func:`labeled_split`.

    Each stage draws from ``np.random.default_rng([seed, stage])`` so changing one stage's
    setting does not reshuffle the others.

    Raises:
      ValueError: naming the config key, value and what is allowed, for any bad argument.
    """
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
    pool_train = n_train if split == "official" else int(POOLED_FRACTIONS[0] * n_all)
    max_clients = pool_train // max(1, min_client_size)
    _check(
        _is_int(num_clients) and 1 <= num_clients <= max_clients,
        "num_clients",
        num_clients,
        f"must be an integer in [1, {max_clients}] ({pool_train} training samples / "
        f"partition.min_client_size={min_client_size})",
    )
    if scheme == "shards":
        _check(
            num_clients * classes_per_client <= pool_train,
            "partition.classes_per_client",
            classes_per_client,
            f"num_clients * classes_per_client must be <= {pool_train} training samples",
        )

    def stage(k: int) -> np.random.Generator:
        return np.random.default_rng([seed, k])

    labels_all = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    # Pools are sorted global indices into concat(train, test).
    if split == "official":
        train_pool = np.arange(n_train, dtype=np.int64)
        test_split = np.arange(n_train, n_all, dtype=np.int64)
        if val_fraction > 0:
            is_val = _stratified_take(labels_all[test_split], val_fraction, stage(_STAGE_SPLIT))
            val_pool, test_pool = test_split[is_val], test_split[~is_val]
        else:
            val_pool, test_pool = None, test_split
    else:
        perm = stage(_STAGE_SPLIT).permutation(n_all)
        n_val = int(POOLED_FRACTIONS[1] * n_all)
        train_pool = np.sort(perm[:pool_train])
        val_pool = np.sort(perm[pool_train : pool_train + n_val])
        test_pool = np.sort(perm[pool_train + n_val :])

    y_pool = labels_all[train_pool]
    rng = stage(_STAGE_PARTITION)
    if scheme == "iid":
        local = iid_partition(len(train_pool), num_clients, rng)
    elif scheme == "dirichlet":
        local, _ = dirichlet_partition(y_pool, num_clients, alpha, rng, min_size=min_client_size)
    else:
        local = shard_partition(y_pool, num_clients, classes_per_client, rng)
    train_clients = [train_pool[idx] for idx in local]

    if labeled_mode == "fixed":
        labeled, unlabeled, mu = labeled_split(
            train_clients, stage(_STAGE_LABELED), fraction=labeled_fraction
        )
    else:
        labeled, unlabeled, mu = labeled_split(
            train_clients, stage(_STAGE_LABELED), ratio_alpha=label_ratio_alpha
        )

    props = class_proportions(y_pool, local, ds.num_classes)

    def deal(pool: np.ndarray, k: int) -> list[np.ndarray]:
        return [pool[idx] for idx in split_by_proportions(labels_all[pool], props, stage(k))]

    clients = {"labeled": labeled, "unlabeled": unlabeled, "test": deal(test_pool, _STAGE_TEST)}
    server = {"test_global": test_pool}
    if val_pool is not None:
        clients["val"] = deal(val_pool, _STAGE_VAL)
        server["val_global"] = val_pool
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
        "n_train": int(n_train),
        "n_test": int(n_test),
        "index_layout": "concat(train, test)",
    }
    return Partition(clients=clients, server=server, mu=mu, meta=meta)
