"""What every scheme shares once clients hold training data: the labeled/unlabeled split
(fixed fraction or Dir_2 ratios), class proportions, and the dealing of a val/test pool to
clients with their train class distribution."""

from __future__ import annotations

import numpy as np

from fedjax_semi.data.partitions.common import _sorted_i64

__all__ = ["class_proportions", "labeled_split", "split_by_proportions"]


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


def _split_labeled(
    train_clients: list[np.ndarray],
    labeled_mode: str,
    labeled_fraction: float,
    label_ratio_alpha: float,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    if labeled_mode == "fixed":
        return labeled_split(train_clients, rng, fraction=labeled_fraction)
    return labeled_split(train_clients, rng, ratio_alpha=label_ratio_alpha)


def _stratified_take(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask taking ``round(fraction * N_c)`` random samples of every class."""
    mask = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        mask[idx[: int(round(fraction * len(idx)))]] = True
    return mask
