"""Ada-FedSemi's ``ada`` scheme: labeled clients and an unlabeled server pool. Knobs:
``partition.ada.*``.

A uniform random ``labeled_fraction`` of the train split is the clients' labeled pool, dealt
IID (equal split) or non-IID-``zeta`` (:func:`dominant_class_partition`); the rest of the
train split is the server's unlabeled pool ``server["server_unlabeled"]``. With
``server_unlabeled_extra`` the dataset's own unlabeled split joins it (:func:`pool_split`:
SVHN's extra, STL-10's unlabeled images, IMDB's unsup reviews; the paper's Sec. 5.2 pools),
its rows numbered after the test split (``meta["index_layout"]``). A random
``server_unlabeled_size`` subset is kept when > 0, then the first ``server_unlabeled_fraction``
of it (Fig. 13: smaller shares are subsets of larger ones). A random ``val_fraction`` of the
test split is ``server["server_val"]`` (labeled, for rewards and stopping) and the rest
``"test_global"``, dealt to clients' ``"test"`` by their class proportions. ``"unlabeled"`` is
empty; ``mu`` is 1. Assignments (non-IID): ``dominant_class`` int [C]. The cross-dataset
variant (a second dataset's images as the pool) is ``dataset.server_pool``
(``experiment.server_pool``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions.common import (
    _STAGE_PARTITION,
    _STAGE_PUBLIC,
    _STAGE_SPLIT,
    _STAGE_TEST,
    SchemeInput,
    SchemeOutput,
    _check,
    _require_official_split,
    _sorted_i64,
)
from fedjax_semi.data.partitions.label_skew import iid_partition
from fedjax_semi.data.partitions.roles import class_proportions, split_by_proportions

__all__ = ["build", "dominant_class_partition", "pool_split"]

# A dataset's own unlabeled split (ArrayDataset.side): images or tokens, and the hidden labels
# when the files have them (SVHN's extra split is labeled; STL-10's and IMDB's are not).
POOL_SPLITS = (("x_extra", "y_extra"), ("x_unlabeled", None))


def pool_split(ds: ArrayDataset) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The dataset's own unlabeled split beside train and test: (x [U, ...], hidden labels
    int [U] or None), or None when it has none (or it was not loaded)."""
    for x_key, y_key in POOL_SPLITS:
        if x_key in ds.side:
            return ds.side[x_key], ds.side.get(y_key) if y_key else None
    return None


def dominant_class_partition(
    labels: np.ndarray, num_clients: int, zeta: float, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Non-IID-ζ (as in Ada-FedSemi, after Wang et al. 2020).

    Client ``m`` has ``N_m`` samples (near-equal sizes, summing to ``N``) and dominant class
    ``m mod Q``: it first gets ``round(ζ N_m)`` samples of that class (fewer if the class
    runs out), then is filled from the shuffled rest skipping its dominant class, falling
    back to any sample when nothing else is left; such fallback samples are then swapped
    with other clients' fill samples where possible.

    Returns:
      ``num_clients`` sorted int64 index arrays into ``labels``; disjoint, covering all.
    """
    labels = np.asarray(labels)
    n = len(labels)
    sizes = np.array([len(a) for a in np.array_split(np.arange(n), num_clients)])
    free = np.ones(n, dtype=bool)
    parts: list[list[np.ndarray]] = []
    for m in range(num_clients):
        own = rng.permutation(np.flatnonzero(free & (labels == m % num_classes)))
        take = own[: int(round(zeta * sizes[m]))]
        free[take] = False
        parts.append([take])
    order = rng.permutation(n)
    for m in range(num_clients):
        need = sizes[m] - len(parts[m][0])
        rest = order[free[order]]
        pick = rest[labels[rest] != m % num_classes][:need]
        if len(pick) < need:  # greedy fallback: any remaining sample
            pick = np.concatenate([pick, rest[labels[rest] == m % num_classes][: need - len(pick)]])
        free[pick] = False
        parts[m].append(pick)
    # The greedy fill leaves the last clients mostly their own dominant class; swap each such
    # filler sample with another client's filler of a class both may hold, so that every
    # client keeps exactly round(ζ N_m) dominant samples whenever the classes allow it.
    dom = np.arange(num_clients) % num_classes
    for m in range(num_clients):
        fill_m = parts[m][1]
        for j in np.flatnonzero(labels[fill_m] == dom[m]):
            for m2 in rng.permutation(np.flatnonzero(dom != dom[m])):
                fill_2 = parts[m2][1]
                ok = np.flatnonzero(labels[fill_2] != dom[m])
                if len(ok):
                    fill_m[j], fill_2[ok[0]] = fill_2[ok[0]], fill_m[j]
                    break
    return [_sorted_i64(np.concatenate(p)) for p in parts]


def _ada_partition(
    ds: ArrayDataset,
    labels_all: np.ndarray,
    num_clients: int,
    labeled_fraction: float,
    val_fraction: float,
    k: dict[str, Any],
    stage: Any,
) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray, dict]:
    """Ada-FedSemi; see the module docstring."""
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    rng = stage(_STAGE_SPLIT)
    perm = rng.permutation(n_train)
    n_lab = int(round(labeled_fraction * n_train))
    lab_pool, rest = np.sort(perm[:n_lab]).astype(np.int64), perm[n_lab:]
    pool = rest  # shuffled
    if k["server_unlabeled_extra"]:  # the dataset's own unlabeled split, after the test split
        extra_ids = n_train + n_test + np.arange(len(pool_split(ds)[0]))
        pool = stage(_STAGE_PUBLIC).permutation(np.concatenate([rest, extra_ids]))
    size = k["server_unlabeled_size"]
    pool = pool[:size] if size > 0 else pool
    # Fig. 13: a prefix of one random order, so a smaller share is a subset of a larger one.
    server_unlabeled = _sorted_i64(pool[: int(round(k["server_unlabeled_fraction"] * len(pool)))])
    test_perm = n_train + rng.permutation(n_test)
    n_val = int(round(val_fraction * n_test))
    server_val, test_pool = _sorted_i64(test_perm[:n_val]), _sorted_i64(test_perm[n_val:])

    y_lab = labels_all[lab_pool]
    rng = stage(_STAGE_PARTITION)
    if k["variant"] == "iid":
        local = iid_partition(len(lab_pool), num_clients, rng)
    else:
        local = dominant_class_partition(y_lab, num_clients, k["zeta"], ds.num_classes, rng)
    labeled = [lab_pool[idx] for idx in local]
    props = class_proportions(y_lab, local, ds.num_classes)
    test = [
        test_pool[idx]
        for idx in split_by_proportions(labels_all[test_pool], props, stage(_STAGE_TEST))
    ]
    clients = {
        "labeled": labeled,
        "unlabeled": [np.empty(0, np.int64) for _ in range(num_clients)],
        "test": test,
    }
    server = {
        "server_unlabeled": server_unlabeled,
        "server_val": server_val,
        "test_global": test_pool,
    }
    assignments = {}
    if k["variant"] == "noniid":
        assignments["dominant_class"] = np.arange(num_clients, dtype=np.int64) % ds.num_classes
    return clients, server, np.ones(num_clients), assignments


def build(inp: SchemeInput) -> SchemeOutput:
    """``ada`` (official split, val_fraction > 0); see the module docstring."""
    n_train, n_test = len(inp.ds.y_train), len(inp.ds.y_test)
    k = inp.knobs["ada"]
    num_clients, labeled_fraction, val_fraction = (
        inp.num_clients, inp.labeled_fraction, inp.val_fraction,
    )  # fmt: skip
    _require_official_split(inp)
    _check(
        val_fraction > 0,
        "partition.val_fraction",
        val_fraction,
        "scheme 'ada' needs a server validation set: must be in (0, 1)",
    )
    _check(
        int(round(labeled_fraction * n_train)) >= num_clients,
        "partition.labeled_fraction",
        labeled_fraction,
        f"must give every one of {num_clients} clients a labeled sample",
    )
    n_rest = n_train - int(round(labeled_fraction * n_train))
    extra, what = {}, "the train samples left after the labeled pool"
    if k["server_unlabeled_extra"]:
        split = pool_split(inp.ds)
        _check(
            split is not None,
            "partition.ada.server_unlabeled_extra",
            True,
            f"false for {inp.ds.name!r}, which has no unlabeled split beside train and test "
            "(svhn with extra_32x32.mat, stl10 with unlabeled_X.bin, imdb with train/unsup)",
        )
        n_rest += len(split[0])
        what += f" and the {len(split[0])} of its unlabeled split"
        extra = {
            "index_layout": "concat(train, test, unlabeled split)",
            "pool_split_size": len(split[0]),
        }
    _check(
        k["server_unlabeled_size"] <= n_rest,
        "partition.ada.server_unlabeled_size",
        k["server_unlabeled_size"],
        f"must be <= {n_rest}, {what} (0 = all)",
    )
    _check(
        int(round(n_test * val_fraction)) >= 1,
        "partition.val_fraction",
        val_fraction,
        f"must leave a non-empty validation set of the {n_test} test samples",
    )
    clients, server, mu, assignments = _ada_partition(
        inp.ds, inp.labels_all, num_clients, labeled_fraction, val_fraction, k, inp.stage
    )
    return clients, server, mu, assignments, extra
