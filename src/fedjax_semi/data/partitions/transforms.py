"""Per-client input and label transforms (CFSL's rotated or label-permuted clusters,
CoFED's task labels), applied to the data the clients see."""

from __future__ import annotations

import numpy as np

from fedjax_semi.data.partitions.container import Partition

__all__ = ["apply_client_transforms"]


def apply_client_transforms(
    x: np.ndarray, y: np.ndarray, partition: Partition
) -> tuple[np.ndarray, np.ndarray]:
    """Applies ``assignments["label_map"]`` and ``assignments["rotation"]`` per client.

    Meant for the data layer (CFSL's label-permuted or rotated clusters, CoFED's task labels):
    every index a client holds in any role takes that client's transform, so it works as one
    global relabel/rotation because clients with different transforms never share a sample.

    Args:
      x: ``[N, H, W, ...]`` inputs of ``concat(train, test)``.
      y: ``int [N]`` true labels.
      partition: the partition; missing assignments mean identity.

    Returns:
      ``(x', y')``: ``y'[i] = label_map[k, y[i]]`` and ``x'[i] = rot90(x[i], rotation[k])``
      over axes (1, 2) for every index ``i`` client ``k`` holds; other indices (server-only
      sets) unchanged. ``x`` is returned as is when nothing rotates; ``y'`` is a copy.

    Raises:
      ValueError: if clients with different transforms hold the same index.
    """
    c = partition.num_clients
    lm = partition.assignments.get("label_map")
    rot = partition.assignments.get("rotation")
    lm = np.zeros((c, 0), np.int64) if lm is None else np.asarray(lm)  # [C, 0]: identity
    rot = np.zeros(c, np.int64) if rot is None else np.asarray(rot) % 4
    owner = np.full(len(y), -1, dtype=np.int64)
    for lists in partition.clients.values():
        for k, idx in enumerate(lists):
            prev = owner[idx]
            other = prev[(prev >= 0) & (prev != k)]
            same = (lm[other] == lm[k]).all(axis=1) & (rot[other] == rot[k])
            if not same.all():
                raise ValueError(
                    f"client {k} shares samples with a client that has another transform"
                )
            owner[idx] = k
    held = np.flatnonzero(owner >= 0)
    y_out = np.array(y, copy=True)
    if lm.shape[1] and (lm == lm[:1]).all():
        # One labelling for every client (CoFED's tasks): server sets (the public set) take it
        # too, so their hidden labels score pseudo-labels in the clients' label space.
        y_out = lm[0][np.asarray(y)]
    elif lm.shape[1]:
        y_out[held] = lm[owner[held], np.asarray(y)[held]]
    if not rot[owner[held]].any():
        return x, y_out
    x_out = np.array(x, copy=True)
    for q in (1, 2, 3):
        sel = held[rot[owner[held]] == q]
        x_out[sel] = np.rot90(np.asarray(x)[sel], q, axes=(1, 2))
    return x_out, y_out
