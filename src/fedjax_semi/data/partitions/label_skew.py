"""Label-skew schemes: ``iid``, ``dirichlet`` (NIID-Bench) and ``shards``, with the
official or the pooled 70/10/20 split (the latter is UM-pFSSL's protocol: ``dirichlet`` +
``labeled_mode=dirichlet`` + ``split=pooled``). CFSL partitions its workers with these too."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions.common import (
    _STAGE_LABELED,
    _STAGE_PARTITION,
    _STAGE_SPLIT,
    _STAGE_TEST,
    _STAGE_VAL,
    SchemeInput,
    SchemeOutput,
    _sorted_i64,
)
from fedjax_semi.data.partitions.knobs import POOLED_FRACTIONS
from fedjax_semi.data.partitions.roles import (
    _split_labeled,
    _stratified_take,
    class_proportions,
    split_by_proportions,
)

__all__ = ["build", "dirichlet_partition", "iid_partition", "shard_partition"]


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


def _base_partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    alpha: float,
    classes_per_client: int,
    min_client_size: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Generic scheme on ``labels`` (positions into them)."""
    if scheme == "iid":
        return iid_partition(len(labels), num_clients, rng)
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients, alpha, rng, min_size=min_client_size)[0]
    return shard_partition(labels, num_clients, classes_per_client, rng)


def _generic_partition(
    ds: ArrayDataset,
    labels_all: np.ndarray,
    scheme: str,
    num_clients: int,
    alpha: float,
    classes_per_client: int,
    labeled_mode: str,
    labeled_fraction: float,
    label_ratio_alpha: float,
    split: str,
    val_fraction: float,
    min_client_size: int,
    stage: Any,
) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray]:
    """iid / dirichlet / shards with the official or pooled split; see build_partition."""
    n_train = len(ds.y_train)
    n_all = len(labels_all)
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
        pool_train = int(POOLED_FRACTIONS[0] * n_all)
        perm = stage(_STAGE_SPLIT).permutation(n_all)
        n_val = int(POOLED_FRACTIONS[1] * n_all)
        train_pool = np.sort(perm[:pool_train])
        val_pool = np.sort(perm[pool_train : pool_train + n_val])
        test_pool = np.sort(perm[pool_train + n_val :])

    y_pool = labels_all[train_pool]
    local = _base_partition(
        y_pool, scheme, num_clients, alpha, classes_per_client, min_client_size,
        stage(_STAGE_PARTITION),
    )  # fmt: skip
    train_clients = [train_pool[idx] for idx in local]
    labeled, unlabeled, mu = _split_labeled(
        train_clients, labeled_mode, labeled_fraction, label_ratio_alpha, stage(_STAGE_LABELED)
    )
    props = class_proportions(y_pool, local, ds.num_classes)

    def deal(pool: np.ndarray, key: int) -> list[np.ndarray]:
        return [pool[idx] for idx in split_by_proportions(labels_all[pool], props, stage(key))]

    clients = {"labeled": labeled, "unlabeled": unlabeled, "test": deal(test_pool, _STAGE_TEST)}
    server = {"test_global": test_pool}
    if val_pool is not None:
        clients["val"] = deal(val_pool, _STAGE_VAL)
        server["val_global"] = val_pool
    return clients, server, mu


def build(inp: SchemeInput) -> SchemeOutput:
    """``iid`` / ``dirichlet`` / ``shards``: labeled, unlabeled, test (+ val) roles; no
    assignments and no meta of their own."""
    clients, server, mu = _generic_partition(
        inp.ds, inp.labels_all, inp.scheme, inp.num_clients, inp.alpha, inp.classes_per_client,
        inp.labeled_mode, inp.labeled_fraction, inp.label_ratio_alpha, inp.split,
        inp.val_fraction, inp.min_client_size, inp.stage,
    )  # fmt: skip
    return clients, server, mu, {}, {}
