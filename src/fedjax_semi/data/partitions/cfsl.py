"""CFSL's ``cfsl`` scheme: workers under edge servers, with hidden clusters that see
permuted labels or rotated inputs. Knobs: ``partition.cfsl.*``.

Workers are partitioned by ``base`` (default shards with ``classes_per_client``),
labeled/unlabeled per worker as for the generic schemes. ``split="pooled"`` pools train+test
and splits each worker's data into local train and a ``local_test_fraction`` ``"test"`` part
(``"test_global"`` is their union); ``"official"`` is as for the generic schemes.
Assignments: ``edge`` int [C] (balanced random over ``num_edges``), ``cluster`` int [C]
(``clusters`` latent groups, balanced within every edge), ``label_map`` int [C, Q]
(``transform=label_permutation``: cluster 0 identity, others distinct derangements),
``rotation`` int [C] quarter turns (``rotation``: cluster g gets ``(4 g) // clusters``);
apply them with :func:`~fedjax_semi.data.partitions.transforms.apply_client_transforms`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.partitions.common import (
    _STAGE_GROUPS,
    _STAGE_LABELED,
    _STAGE_PARTITION,
    _STAGE_TEST,
    _STAGE_TRANSFORM,
    SchemeInput,
    SchemeOutput,
    _check,
    _sorted_i64,
)
from fedjax_semi.data.partitions.label_skew import _base_partition, _generic_partition
from fedjax_semi.data.partitions.roles import _split_labeled

__all__ = ["build"]


def _cfsl_assignments(
    num_clients: int, num_classes: int, k: dict[str, Any], stage: Any
) -> dict[str, np.ndarray]:
    """Edge association, latent clusters and their transforms; see the module docstring."""
    n_edges, n_groups = k["num_edges"], k["clusters"]
    rng = stage(_STAGE_GROUPS)
    edge = rng.permutation(np.arange(num_clients) % n_edges).astype(np.int64)  # balanced
    cluster = np.empty(num_clients, dtype=np.int64)
    for j in range(n_edges):  # every edge holds every cluster, so each edge can split them
        members = np.flatnonzero(edge == j)
        cluster[members] = rng.permutation(np.arange(len(members)) % n_groups)
    rng = stage(_STAGE_TRANSFORM)
    ident = np.arange(num_classes, dtype=np.int64)
    perms = np.tile(ident, (n_groups, 1))
    rotation = np.zeros(num_clients, dtype=np.int64)
    if k["transform"] == "label_permutation":
        # Cluster 0 keeps the labels; the others get distinct derangements (every class moves).
        for g in range(1, n_groups):
            for _ in range(1000):
                p = rng.permutation(num_classes)
                if (p != ident).all() and not (perms[1:g] == p).all(axis=1).any():
                    perms[g] = p
                    break
            else:
                raise ValueError(
                    f"partition.cfsl.clusters={n_groups!r} is invalid; {num_classes} classes "
                    f"do not give {n_groups - 1} distinct label derangements"
                )
    elif k["transform"] == "rotation":
        rotation = (cluster * 4) // n_groups  # 2 clusters: 0 and 180 degrees
    return {"edge": edge, "cluster": cluster, "label_map": perms[cluster], "rotation": rotation}


def _cfsl_pooled(
    labels_all: np.ndarray,
    base_scheme: str,
    num_clients: int,
    alpha: float,
    classes_per_client: int,
    labeled_mode: str,
    labeled_fraction: float,
    label_ratio_alpha: float,
    min_client_size: int,
    k: dict[str, Any],
    stage: Any,
) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray]:
    """Partitions pooled train+test, then splits each worker's data into local train and a
    ``local_test_fraction`` test part."""
    local = _base_partition(
        labels_all, base_scheme, num_clients, alpha, classes_per_client, min_client_size,
        stage(_STAGE_PARTITION),
    )  # fmt: skip
    rng = stage(_STAGE_TEST)
    train, test = [], []
    for idx in local:
        perm = rng.permutation(idx)
        n_te = int(round(k["local_test_fraction"] * len(idx)))
        test.append(_sorted_i64(perm[:n_te]))
        train.append(_sorted_i64(perm[n_te:]))
    labeled, unlabeled, mu = _split_labeled(
        train, labeled_mode, labeled_fraction, label_ratio_alpha, stage(_STAGE_LABELED)
    )
    clients = {"labeled": labeled, "unlabeled": unlabeled, "test": test}
    server = {"test_global": _sorted_i64(np.concatenate(test))}
    return clients, server, mu


def build(inp: SchemeInput) -> SchemeOutput:
    """``cfsl``; see the module docstring."""
    k = inp.knobs["cfsl"]
    _check(
        k["num_edges"] <= inp.num_clients,
        "partition.cfsl.num_edges",
        k["num_edges"],
        f"must be <= num_clients={inp.num_clients}",
    )
    base_scheme = k["base"]
    if inp.split == "pooled":
        clients, server, mu = _cfsl_pooled(
            inp.labels_all, base_scheme, inp.num_clients, inp.alpha, inp.classes_per_client,
            inp.labeled_mode, inp.labeled_fraction, inp.label_ratio_alpha, inp.min_client_size,
            k, inp.stage,
        )  # fmt: skip
    else:
        clients, server, mu = _generic_partition(
            inp.ds, inp.labels_all, base_scheme, inp.num_clients, inp.alpha,
            inp.classes_per_client, inp.labeled_mode, inp.labeled_fraction,
            inp.label_ratio_alpha, inp.split, inp.val_fraction, inp.min_client_size, inp.stage,
        )  # fmt: skip
    assignments = _cfsl_assignments(inp.num_clients, inp.ds.num_classes, k, inp.stage)
    return clients, server, mu, assignments, {}
