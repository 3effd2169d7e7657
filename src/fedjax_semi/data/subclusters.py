"""Sub-clusters of each class as subclasses: a stand-in for CIFAR-100's superclass structure.

CoFED's non-IID split (its Sec. 5.2) draws each (participant, superclass) pair's samples from
one or two of the superclass's five subclasses. A dataset without subclasses (Fashion-MNIST)
gets them here: k-means on each class's training images splits it into `k` sub-clusters, which
become the fine labels (`class * k + cluster`), and the class becomes the coarse label
(`side["y_train_coarse"]`, the task the CoFED partition assigns). Test images take the cluster
of their nearest centroid, so their coarse label is their class.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset

__all__ = ["with_subclusters"]


def _features(x: np.ndarray, dims: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple]:
    """Flattened pixels projected on `dims` random Gaussian directions (a cheap, seeded
    stand-in for PCA: k-means only needs distances roughly preserved). -> ([N, dims], proj)."""
    flat = x.reshape(len(x), -1).astype(np.float32) / 255.0
    proj = rng.standard_normal((flat.shape[1], dims)).astype(np.float32) / np.sqrt(dims)
    return flat @ proj, proj


def _kmeans(z: np.ndarray, k: int, rng: np.random.Generator, iters: int = 25) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding on z [N, D] -> centroids [k, D]."""
    cent = [z[rng.integers(len(z))]]
    for _ in range(1, k):
        d = np.min(((z[:, None, :] - np.asarray(cent)[None]) ** 2).sum(-1), axis=1)
        cent.append(z[rng.choice(len(z), p=d / d.sum())] if d.sum() > 0 else z[0])
    cent = np.asarray(cent)
    for _ in range(iters):
        assign = np.argmin(((z[:, None, :] - cent[None]) ** 2).sum(-1), axis=1)
        new = np.stack(
            [z[assign == j].mean(0) if (assign == j).any() else cent[j] for j in range(k)]
        )
        if np.allclose(new, cent):
            break
        cent = new
    return cent


def with_subclusters(ds: ArrayDataset, k: int, seed: int, dims: int = 32) -> ArrayDataset:
    """`ds` with `k` k-means sub-clusters per class as its fine classes.

    Returns a dataset with num_classes = ds.num_classes * k, y = class * k + cluster (train and
    test), and side["y_train_coarse"] = the original train labels. Deterministic in `seed`.
    """
    if k < 1:
        raise ValueError(f"dataset.subclusters={k!r} is not allowed: an integer >= 1")
    if ds.kind != "image":
        raise ValueError(f"dataset.subclusters={k!r} is not allowed for {ds.kind} datasets")
    rng = np.random.default_rng([seed, 4051])
    z_tr, proj = _features(ds.x_train, dims, rng)
    z_te = ds.x_test.reshape(len(ds.x_test), -1).astype(np.float32) / 255.0 @ proj
    y_tr, y_te = np.asarray(ds.y_train, np.int64), np.asarray(ds.y_test, np.int64)
    fine_tr, fine_te = np.empty_like(y_tr), np.empty_like(y_te)
    for c in range(ds.num_classes):
        tr, te = np.flatnonzero(y_tr == c), np.flatnonzero(y_te == c)
        if len(tr) < k:
            raise ValueError(
                f"dataset.subclusters={k!r} is not allowed: class {c} of {ds.name} has only "
                f"{len(tr)} training images"
            )
        cent = _kmeans(z_tr[tr], k, rng)
        for idx, z, out in ((tr, z_tr, fine_tr), (te, z_te, fine_te)):
            d = ((z[idx][:, None, :] - cent[None]) ** 2).sum(-1)
            out[idx] = c * k + np.argmin(d, axis=1)
    return dataclasses.replace(
        ds,
        y_train=fine_tr.astype(np.int32),
        y_test=fine_te.astype(np.int32),
        num_classes=ds.num_classes * k,
        side={**ds.side, "y_train_coarse": y_tr.astype(np.int32)},
    )
