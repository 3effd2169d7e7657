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
    "PartitionFileError",
    "apply_client_transforms",
    "build_partition",
    "check_knobs",
    "class_proportions",
    "dirichlet_partition",
    "dominant_class_partition",
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


class PartitionFileError(ValueError):
    """A partition file that cannot be read or is not a consistent partition."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _os_problem(e: OSError) -> str:
    """What an OSError means for a file the user named, in words."""
    if isinstance(e, FileNotFoundError):
        return "no such file"
    if isinstance(e, IsADirectoryError):
        return "a directory, not a file"
    if isinstance(e, PermissionError):
        return "not readable (permission denied)"
    return f"cannot be read ({e.strerror or _first_line(e)})"


@dataclasses.dataclass(eq=False)
class Partition:
    """A complete federated partition of one dataset.

    Attributes:
      clients: role -> ``C`` sorted int64 index arrays; roles ``"labeled"``,
        ``"unlabeled"``, ``"test"`` and optionally ``"val"``; DoFed-SPP has
        ``"target_labeled"``/``"target_unlabeled"`` instead of ``"unlabeled"``.
      server: server-side index sets, at least ``"test_global"`` (and ``"val_global"``
        when there is a val role); CoFED adds ``"public"``, Ada-FedSemi
        ``"server_unlabeled"`` and ``"server_val"``.
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
        """Reads a partition written by :meth:`save`.

        Raises :class:`PartitionFileError` saying what is wrong when the path cannot be read or
        does not hold a consistent partition (truncated, junk, offsets that do not add up), so
        a bad file ends in one clear line instead of an error from deep inside numpy or zipfile.
        """
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise PartitionFileError(path, _os_problem(e)) from None
        if not magic:
            raise PartitionFileError(path, "the file is empty")
        if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # np.load would try it as a pickle
            raise PartitionFileError(path, "not a .npz archive")
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls._from_npz(z, path)
        except PartitionFileError:
            raise
        except OSError as e:
            raise PartitionFileError(path, _os_problem(e)) from None
        except Exception as e:  # noqa: BLE001 (zipfile, zlib, numpy and json raise many types)
            problem = f"damaged or truncated .npz archive ({_first_line(e)})"
            raise PartitionFileError(path, problem) from None

    @classmethod
    def _from_npz(cls, z: Any, path: str | Path) -> Partition:
        """The partition in an open .npz, checked for consistency (PartitionFileError)."""

        def field(name: str) -> np.ndarray:
            if name not in z.files:
                raise PartitionFileError(path, f"no {name!r} array (not written by Partition.save)")
            return z[name]

        def indices(name: str) -> np.ndarray:
            a = field(name)
            if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
                raise PartitionFileError(path, f"{name!r} is not a 1-D integer array")
            return a

        header = json.loads(str(field("header")))
        if not isinstance(header, dict) or not {"roles", "server", "meta"} <= set(header):
            raise PartitionFileError(path, "its header lacks roles, server or meta")
        mu = field("mu")
        if mu.ndim != 1:
            raise PartitionFileError(path, f"'mu' has shape {mu.shape}, not [num_clients]")
        c = len(mu)
        clients = {}
        for role in header["roles"]:
            values = indices(f"clients/{role}/values")
            offsets = indices(f"clients/{role}/offsets")
            ok = len(offsets) == c + 1 and offsets[0] == 0 and offsets[-1] == len(values)
            if not ok or (np.diff(offsets) < 0).any():
                raise PartitionFileError(
                    path, f"the offsets of role {role!r} do not split its indices into {c} clients"
                )
            clients[role] = [values[offsets[k] : offsets[k + 1]].copy() for k in range(c)]
        server = {name: indices(f"server/{name}") for name in header["server"]}
        # Files written before assignments existed have no such header key.
        assignments = {a: field(f"assignments/{a}") for a in header.get("assignments", [])}
        for name, a in assignments.items():
            if a.ndim == 0 or len(a) != c:
                raise PartitionFileError(
                    path, f"assignment {name!r} has shape {a.shape}, not [{c}, ...]"
                )
        return cls(
            clients=clients, server=server, mu=mu, meta=header["meta"], assignments=assignments
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


def _even_split(total: int, order: np.ndarray) -> np.ndarray:
    """``int64 [k]`` near-equal parts of ``total``; the ``total % k`` parts named first in
    ``order`` (a permutation of ``arange(k)``) get one more. Two splits with the same order
    and ``a <= b`` totals are elementwise ``<=``."""
    k = len(order)
    counts = np.full(k, total // k if k else 0, dtype=np.int64)
    counts[order[: total % k if k else 0]] += 1
    return counts


# Knobs of the paper schemes, with the specs' defaults. PartitionConfig carries the same
# fields and defaults (tests check they agree); see there for what each one means.
PAPER_DEFAULTS: dict[str, Any] = {
    # DoFed-SPP, dofed_spp.md §3.4
    "n_clusters": 5,
    "assignment": "balanced",
    "train_per_class": 500,
    "target_per_class": 200,
    "target_labeled_fraction": 0.05,
    "test_per_class": 100,
    "normal_min_classes": 2,
    "normal_max_classes": 10,
    "normal_reject": "identical",
    "normal_size_mode": "per_class",
    "overlap": "allow",
    # CoFED, cofed.md §3.3
    "cofed_variant": "iid",
    "cofed_min_classes": 6,
    "cofed_max_classes": 8,
    "samples_per_class": 50,
    "cofed_max_subclasses": 2,
    "public_fraction": 0.2,
    # CFSL, cfsl.md §3.1-3.2
    "num_edges": 3,
    "cfsl_clusters": 2,
    "cfsl_transform": "label_permutation",
    "cfsl_base": "shards",
    "local_test_fraction": 0.2,
    # Ada-FedSemi, ada_fedsemi.md §4.2
    "ada_variant": "noniid",
    "ada_zeta": 0.5,
    "server_unlabeled_size": 0,
}


def check_knobs(scheme: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """Validates the scheme and the paper-scheme knobs without looking at a dataset.

    Every knob is checked whatever the scheme, so a bad value never lies dormant in a config.

    Args:
      scheme: ``partition.scheme``.
      knobs: a subset of :data:`PAPER_DEFAULTS`' keys; missing ones take the defaults.

    Returns:
      The complete knob dict.

    Raises:
      ValueError: ``partition.<knob>=<value> is invalid; <allowed>`` for the first bad knob.
    """
    _check(scheme in SCHEMES, "partition.scheme", scheme, f"allowed: {list(SCHEMES)}")
    for key, value in knobs.items():
        _check(key in PAPER_DEFAULTS, f"partition.{key}", value, "unknown partition knob")
    k = {**PAPER_DEFAULTS, **knobs}

    def choice(name: str, allowed: tuple[str, ...]) -> None:
        _check(k[name] in allowed, f"partition.{name}", k[name], f"allowed: {list(allowed)}")

    def integer(name: str, lo: int) -> None:
        v = k[name]
        _check(_is_int(v) and v >= lo, f"partition.{name}", v, f"must be an integer >= {lo}")

    def fraction(name: str, lo: float, hi: float, lo_open: bool, hi_open: bool) -> None:
        v = k[name]
        ok = _is_num(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        bounds = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        _check(ok, f"partition.{name}", v, f"must be a number in {bounds}")

    integer("n_clusters", 2)  # a client's train and target clusters must differ
    choice("assignment", ASSIGNMENTS)
    integer("train_per_class", 1)
    integer("target_per_class", 1)
    fraction("target_labeled_fraction", 0.0, 1.0, lo_open=True, hi_open=False)
    integer("test_per_class", 1)
    integer("normal_min_classes", 1)
    integer("normal_max_classes", 1)
    _check(
        k["normal_max_classes"] >= k["normal_min_classes"],
        "partition.normal_max_classes",
        k["normal_max_classes"],
        f"must be >= partition.normal_min_classes={k['normal_min_classes']}",
    )
    choice("normal_reject", NORMAL_REJECTS)
    choice("normal_size_mode", NORMAL_SIZE_MODES)
    choice("overlap", OVERLAPS)
    choice("cofed_variant", VARIANTS)
    integer("cofed_min_classes", 1)
    integer("cofed_max_classes", 1)
    _check(
        k["cofed_max_classes"] >= k["cofed_min_classes"],
        "partition.cofed_max_classes",
        k["cofed_max_classes"],
        f"must be >= partition.cofed_min_classes={k['cofed_min_classes']}",
    )
    integer("samples_per_class", 1)
    integer("cofed_max_subclasses", 1)
    fraction("public_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    integer("num_edges", 1)
    integer("cfsl_clusters", 1)
    choice("cfsl_transform", CFSL_TRANSFORMS)
    if k["cfsl_transform"] == "rotation":
        _check(
            k["cfsl_clusters"] <= 4,
            "partition.cfsl_clusters",
            k["cfsl_clusters"],
            "must be <= 4 with partition.cfsl_transform=rotation (multiples of 90 degrees)",
        )
    choice("cfsl_base", GENERIC_SCHEMES)
    fraction("local_test_fraction", 0.0, 1.0, lo_open=False, hi_open=True)
    choice("ada_variant", VARIANTS)
    fraction("ada_zeta", 0.0, 1.0, lo_open=False, hi_open=False)
    integer("server_unlabeled_size", 0)
    return k


# ----------------------------------------------------------------------------- DoFed-SPP

_LAB, _UNL, _TEST = 1, 2, 4  # status bits: held as labeled / unlabeled / test by some client


def _draw(
    pool: np.ndarray,
    n: int,
    kind: int,
    status: np.ndarray,
    mine: np.ndarray,
    overlap: str,
    rng: np.random.Generator,
) -> np.ndarray:
    """Picks up to ``n`` random indices of ``pool`` the current client does not hold yet.

    ``overlap="none"``: only indices no client holds. ``"allow"``: unheld indices first, then
    ones other clients hold as the same kind, last ones held as another kind; this keeps a
    client's unlabeled samples out of other clients' labeled sets whenever the class is big
    enough. Marks the picks in ``mine`` (this client) and ``status`` (``|= kind``).

    Returns:
      ``int64 [<= n]`` picked global indices (fewer than ``n`` when the pool runs out).
    """
    cand = pool[~mine[pool]]
    st = status[cand]
    if overlap == "none":
        cand = cand[st == 0]
        rank = np.zeros(len(cand), dtype=np.int8)
    else:
        rank = np.where(st == 0, 0, np.where((st & ~kind) != 0, 2, 1))
    perm = rng.permutation(len(cand))
    pick = cand[perm[np.argsort(rank[perm], kind="stable")][:n]]
    mine[pick] = True
    status[pick] |= kind
    return pick.astype(np.int64)


def _subset_classes(
    num_classes: int, num_clients: int, k: dict[str, Any], rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    """DoFed-SPP SUBSET (§3.4 steps 1-2): class clusters and a (train, target) cluster pair
    per client. Returns per-client train/target class arrays, assignments and meta."""
    q, kc = num_classes, k["n_clusters"]
    order = rng.permutation(q)
    base = q // kc
    clusters = [list(order[i * base : (i + 1) * base]) for i in range(kc)]
    for c in order[kc * base :]:  # leftover classes join a uniformly random cluster
        clusters[int(rng.integers(kc))].append(c)
    clusters_a = [np.sort(np.asarray(c, dtype=np.int64)) for c in clusters]
    if k["assignment"] == "balanced":  # every cluster has trainers
        a = rng.permutation(kc)[np.arange(num_clients) % kc]
    else:
        a = rng.integers(kc, size=num_clients)
    b = rng.integers(kc - 1, size=num_clients)
    b = b + (b >= a)  # uniform over the clusters other than a
    assignments = {"train_cluster": a.astype(np.int64), "target_cluster": b.astype(np.int64)}
    meta = {"clusters": [c.tolist() for c in clusters_a]}
    return [clusters_a[i] for i in a], [clusters_a[i] for i in b], assignments, meta


def _normal_classes(
    num_classes: int, num_clients: int, k: dict[str, Any], rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    """DoFed-SPP NORMAL (§3.4 steps 1-2): independent random train and target class sets of
    ``U{normal_min_classes..normal_max_classes}`` classes (capped at ``num_classes``); a
    pair is redrawn when identical (``normal_reject=subset``: also when target ⊆ train)."""
    lo, hi = k["normal_min_classes"], min(k["normal_max_classes"], num_classes)
    train, target = [], []
    for _ in range(num_clients):
        for _try in range(1000):
            tr = np.sort(rng.choice(num_classes, int(rng.integers(lo, hi + 1)), replace=False))
            tg = np.sort(rng.choice(num_classes, int(rng.integers(lo, hi + 1)), replace=False))
            bad = np.array_equal(tr, tg)
            if k["normal_reject"] == "subset":
                bad = bad or bool(np.isin(tg, tr).all())
            if not bad:
                break
        else:
            raise ValueError(
                f"partition.normal_reject={k['normal_reject']!r} is invalid; no train/target "
                f"class-set pair passes it with {lo}..{hi} of {num_classes} classes"
            )
        train.append(tr.astype(np.int64))
        target.append(tg.astype(np.int64))
    return train, target, {}, {}


def _dofed_partition(
    ds: ArrayDataset, num_clients: int, scheme: str, k: dict[str, Any], stage: Any
) -> tuple[dict, dict, np.ndarray, dict, dict]:
    """DoFed-SPP SUBSET / NORMAL (dofed_spp.md §3.4); see :func:`build_partition`."""
    q = ds.num_classes
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    y_tr, y_te = np.asarray(ds.y_train, np.int64), np.asarray(ds.y_test, np.int64)
    classes_fn = _subset_classes if scheme == "subset" else _normal_classes
    train_cls, target_cls, assignments, meta = classes_fn(q, num_clients, k, stage(_STAGE_GROUPS))
    member = np.zeros((2, num_clients, q), dtype=bool)
    for n in range(num_clients):
        member[0, n, train_cls[n]] = True
        member[1, n, target_cls[n]] = True
    assignments["train_classes"], assignments["target_classes"] = member[0], member[1]

    train_pools = [np.flatnonzero(y_tr == c) for c in range(q)]
    test_pools = [n_train + np.flatnonzero(y_te == c) for c in range(q)]
    status = np.zeros(n_train + n_test, dtype=np.int8)
    mine = np.zeros(n_train + n_test, dtype=bool)
    overlap, frac = k["overlap"], k["target_labeled_fraction"]
    fixed_total = scheme == "normal" and k["normal_size_mode"] == "fixed_total"
    per_cluster = q // k["n_clusters"]  # SUBSET classes per cluster: fixed_total's unit
    rng = stage(_STAGE_TARGET)
    roles: dict[str, list[np.ndarray]] = {
        r: [] for r in ("labeled", "target_labeled", "target_unlabeled", "test")
    }
    capped = 0

    def short(key: str, c: int, want: int, got: int) -> ValueError:
        hint = "; use partition.overlap='allow'" if overlap == "none" else ""
        return ValueError(
            f"{key}={k[key.split('.')[1]]!r} is invalid; class {c} has only {got} of the "
            f"{want} samples a client needs left{hint}"
        )

    for n in range(num_clients):
        tr_c, tg_c = train_cls[n], target_cls[n]
        order = rng.permutation(len(tg_c))
        if fixed_total:  # SUBSET per-client totals split evenly over the drawn classes
            t = _even_split(k["target_per_class"] * per_cluster, order)
            lab = _even_split(max(1, int(round(frac * t.sum()))), order)
            n_tr = _even_split(k["train_per_class"] * per_cluster, rng.permutation(len(tr_c)))
        else:  # per class of the set: 500 train, 10 labeled + 190 unlabeled target
            t = np.full(len(tg_c), k["target_per_class"], dtype=np.int64)
            lab = np.full(len(tg_c), max(1, int(round(frac * k["target_per_class"]))))
            n_tr = np.full(len(tr_c), k["train_per_class"], dtype=np.int64)
        lab = np.minimum(lab, t)
        got: dict[str, list[np.ndarray]] = {r: [] for r in roles}
        # Target first: it has priority over train when the classes overlap (step 4).
        for c, tc, lc in zip(tg_c, t, lab, strict=True):
            a = _draw(train_pools[c], int(lc), _LAB, status, mine, overlap, rng)
            b = _draw(train_pools[c], int(tc - lc), _UNL, status, mine, overlap, rng)
            if len(a) + len(b) < tc:
                key = "partition.overlap" if overlap == "none" else "partition.target_per_class"
                raise short(key, int(c), int(tc), len(a) + len(b))
            got["target_labeled"].append(a)
            got["target_unlabeled"].append(b)
        for c, nc in zip(tr_c, n_tr, strict=True):
            a = _draw(train_pools[c], int(nc), _LAB, status, mine, overlap, rng)
            if len(a) < nc:
                if overlap == "none":
                    raise short("partition.overlap", int(c), int(nc), len(a))
                capped += int(nc - len(a))  # step 4: train capped at available - n_target
            got["labeled"].append(a)
        for c in tg_c:
            want = k["test_per_class"]
            if overlap == "allow":
                want = min(want, len(test_pools[c]))  # CIFAR-100: all 100 test images
            a = _draw(test_pools[c], want, _TEST, status, mine, overlap, rng)
            if len(a) < want:
                raise short("partition.overlap", int(c), want, len(a))
            got["test"].append(a)
        for r, parts in got.items():
            idx = _sorted_i64(np.concatenate(parts)) if parts else np.empty(0, np.int64)
            mine[idx] = False
            roles[r].append(idx)

    sizes = {r: np.array([len(a) for a in v], dtype=np.float64) for r, v in roles.items()}
    seen = sizes["labeled"] + sizes["target_labeled"]
    total = seen + sizes["target_unlabeled"]
    mu = np.divide(seen, total, out=np.zeros_like(seen), where=total > 0)
    server = {"test_global": np.arange(n_train, n_train + n_test, dtype=np.int64)}
    meta["train_capped"] = capped
    return roles, server, mu, assignments, meta


# ----------------------------------------------------------------------------- CoFED


def _task_map(ds: ArrayDataset) -> tuple[np.ndarray, str]:
    """``int64 [num_classes]`` fine class -> task class, and the task source.

    ``"coarse"`` when ``ds.extra["y_train_coarse"]`` exists (CIFAR-100 superclasses), else
    ``"fine"`` (every class is its own task).
    """
    coarse = (ds.extra or {}).get("y_train_coarse")
    if coarse is None:
        return np.arange(ds.num_classes, dtype=np.int64), "fine"
    coarse = np.asarray(coarse, dtype=np.int64)
    y = np.asarray(ds.y_train, dtype=np.int64)
    fmap = np.full(ds.num_classes, -1, dtype=np.int64)
    fmap[y] = coarse
    if len(coarse) != len(y) or (fmap[y] != coarse).any() or (fmap < 0).any():
        raise ValueError(
            f"{ds.name}: extra['y_train_coarse'] must give every fine class one coarse class"
        )
    return fmap, "coarse"


def _cofed_partition(
    ds: ArrayDataset, num_clients: int, alpha: float, k: dict[str, Any], stage: Any
) -> tuple[dict, dict, np.ndarray, dict, dict]:
    """CoFED (cofed.md §3.3); see :func:`build_partition`."""
    q = ds.num_classes
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    y_tr, y_te = np.asarray(ds.y_train, np.int64), np.asarray(ds.y_test, np.int64)
    fmap, source = _task_map(ds)
    n_tasks = int(fmap.max()) + 1
    subs = [np.flatnonzero(fmap == t) for t in range(n_tasks)]
    lo, hi = k["cofed_min_classes"], min(k["cofed_max_classes"], n_tasks)
    _check(
        lo <= n_tasks,
        "partition.cofed_min_classes",
        lo,
        f"must be <= {n_tasks} ({source} classes of {ds.name})",
    )
    spc, variant = k["samples_per_class"], k["cofed_variant"]

    # Public set first: a uniform random held-out part of the train split.
    rng_pub = stage(_STAGE_PUBLIC)
    n_pub = int(round(k["public_fraction"] * n_train))
    public = _sorted_i64(rng_pub.choice(n_train, n_pub, replace=False))
    private = np.ones(n_train, dtype=bool)
    private[public] = False
    pools = [rng_pub.permutation(np.flatnonzero(private & (y_tr == f))) for f in range(q)]
    cap = np.array([len(p) for p in pools], dtype=np.int64)

    rng_groups, rng = stage(_STAGE_GROUPS), stage(_STAGE_PARTITION)

    def fill(spaces: np.ndarray) -> list[list[np.ndarray]] | None:
        """Samples every participant's private set without replacement; None if a class
        runs out (the caller redraws the label spaces)."""
        used = np.zeros(q, dtype=np.int64)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        quota = None
        if variant == "noniid" and source == "fine":
            # No subclasses to restrict to: skew the per-class counts over Y_i instead.
            quota = np.zeros((num_clients, n_tasks), dtype=np.int64)
            for i in range(num_clients):
                own = np.flatnonzero(spaces[i])
                p = rng.dirichlet(np.full(len(own), alpha)) * spc * len(own)
                base = np.floor(p).astype(np.int64)
                rest = spc * len(own) - base.sum()
                base[np.argsort(base - p, kind="stable")[:rest]] += 1
                quota[i, own] = base
        pairs = np.argwhere(spaces)
        for i, t in pairs[rng.permutation(len(pairs))]:
            sub = subs[t]
            if quota is not None:
                chosen, counts = sub, np.array([quota[i, t]])
            elif variant == "iid":  # "evenly" across the subclasses (10 from each of 5)
                chosen, counts = sub, _even_split(spc, rng.permutation(len(sub)))
            else:  # 1..max subclasses, equal shares, among those with room left
                s = int(rng.integers(1, min(k["cofed_max_subclasses"], len(sub)) + 1))
                counts = _even_split(spc, np.arange(s))
                room = sub[cap[sub] - used[sub] >= counts[0]]
                if len(room) < s:
                    return None
                chosen = rng.choice(room, s, replace=False)
            if (cap[chosen] - used[chosen] < counts).any():
                return None
            for f, c in zip(chosen, counts, strict=True):
                parts[i].append(pools[f][used[f] : used[f] + c])
                used[f] += c
        return parts

    for _ in range(1000):
        sizes = rng_groups.integers(lo, hi + 1, size=num_clients)
        spaces = np.zeros((num_clients, n_tasks), dtype=bool)
        for i, s in enumerate(sizes):
            spaces[i, rng_groups.choice(n_tasks, int(s), replace=False)] = True
        owners = spaces.sum(axis=0)
        # Paper Eq. 2: every participant shares a class with at least one other.
        if num_clients >= 2 and not all((owners[spaces[i]] >= 2).any() for i in range(len(spaces))):
            continue
        parts = fill(spaces)
        if parts is not None:
            break
    else:
        raise ValueError(
            f"partition.samples_per_class={spc!r} is invalid; no label-space draw fits the "
            f"{int(cap.sum())} private training samples of {ds.name} in 1000 tries (lower it, "
            "partition.cofed_max_classes or partition.public_fraction, or use fewer clients)"
        )
    labeled = [_sorted_i64(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]
    test_tasks = fmap[y_te]
    test = [n_train + np.flatnonzero(spaces[i][test_tasks]) for i in range(num_clients)]
    roles = {
        "labeled": labeled,
        "unlabeled": [np.empty(0, np.int64) for _ in range(num_clients)],
        "test": [a.astype(np.int64) for a in test],
    }
    server = {
        "public": public,
        "test_global": np.arange(n_train, n_train + n_test, dtype=np.int64),
    }
    assignments = {
        "label_space": spaces,
        "label_map": np.tile(fmap, (num_clients, 1)),
    }
    meta = {"num_tasks": n_tasks, "task_source": source}
    return roles, server, np.ones(num_clients), assignments, meta


# ----------------------------------------------------------------------------- CFSL


def _cfsl_assignments(
    num_clients: int, num_classes: int, k: dict[str, Any], stage: Any
) -> dict[str, np.ndarray]:
    """Edge association, latent clusters and their transforms (CFSL; see build_partition)."""
    n_edges, n_groups = k["num_edges"], k["cfsl_clusters"]
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
    if k["cfsl_transform"] == "label_permutation":
        # Cluster 0 keeps the labels; the others get distinct derangements (every class moves).
        for g in range(1, n_groups):
            for _ in range(1000):
                p = rng.permutation(num_classes)
                if (p != ident).all() and not (perms[1:g] == p).all(axis=1).any():
                    perms[g] = p
                    break
            else:
                raise ValueError(
                    f"partition.cfsl_clusters={n_groups!r} is invalid; {num_classes} classes "
                    f"do not give {n_groups - 1} distinct label derangements"
                )
    elif k["cfsl_transform"] == "rotation":
        rotation = (cluster * 4) // n_groups  # 2 clusters: 0 and 180 degrees
    return {"edge": edge, "cluster": cluster, "label_map": perms[cluster], "rotation": rotation}


# ----------------------------------------------------------------------------- Ada-FedSemi


def dominant_class_partition(
    labels: np.ndarray, num_clients: int, zeta: float, num_classes: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Non-IID-ζ (Ada-FedSemi §4.2, after Wang et al. 2020).

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


# ----------------------------------------------------------------------------- build


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
    **knobs: Any,
) -> Partition:
    """Builds the client/server partition of ``ds``.

    Returned indices are indices into ``concat(train, test)``, i.e. test sample ``j`` is
    ``len(ds.x_train) + j``. ``knobs`` are the paper-scheme knobs of
    :data:`PAPER_DEFAULTS` (missing ones take those defaults).

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
    ``"dirichlet"`` (``label_ratio_alpha``), see :func:`labeled_split`.

    Paper schemes (official split only unless said otherwise; roles not named are absent):
      ``"subset"`` / ``"normal"`` (DoFed-SPP §3.4): SUBSET shuffles the classes into
      ``n_clusters`` clusters (leftovers join random clusters) and gives client ``n`` a
      train cluster and a different target cluster (``assignment``); NORMAL draws a train and
      a target class set of ``U{normal_min_classes..normal_max_classes}`` classes each,
      redrawn per ``normal_reject``. Per class of the sets: ``train_per_class`` train
      samples (role ``"labeled"``), ``target_per_class`` target samples of which a
      ``target_labeled_fraction`` (at least 1) is ``"target_labeled"`` and the rest
      ``"target_unlabeled"`` (NORMAL ``fixed_total``: SUBSET's per-client totals split
      evenly over the drawn classes), and ``test_per_class`` official test samples
      (``"test"``). All from the official train split, disjoint within a client; across
      clients ``overlap="allow"`` (the spec) reuses samples only when a class runs out and
      ``"none"`` forbids it (ValueError when a class runs out). Target data has priority
      over train data of the same class; train shortfalls are capped and counted in
      ``meta["train_capped"]``. Assignments: ``train_classes``/``target_classes`` bool
      [C, Q]; SUBSET also ``train_cluster``/``target_cluster`` int [C]. ``mu`` = labeled
      share (train + target labeled) of the client's training data.
      ``"cofed"`` (CoFED §3.3): a uniform random ``public_fraction`` of the train split is
      the server's unlabeled ``"public"`` set (the paper's cross-dataset public sets, e.g.
      CIFAR-10 for CIFAR-100 tasks, need a second dataset and are not built here). Tasks are
      CIFAR-100 superclasses when ``ds.extra["y_train_coarse"]`` exists, else the classes.
      Each participant owns ``U{cofed_min_classes..cofed_max_classes}`` tasks (redrawn until
      every participant shares a task with another and the samples suffice) and gets
      ``samples_per_class`` private ``"labeled"`` samples per task, without replacement
      across participants: IID evenly over the task's subclasses, non-IID from
      ``U{1..cofed_max_subclasses}`` of them (fine tasks have no subclasses: non-IID skews
      the counts over the owned classes by ``Dir(alpha)`` instead). ``"test"``: every test
      sample of an owned task (shared across participants, as in the paper). ``"unlabeled"``
      is empty. Assignments: ``label_space`` bool [C, tasks], ``label_map`` int [C, Q]
      (fine -> task label).
      ``"cfsl"`` (CFSL §3.2): workers partitioned by ``cfsl_base`` (default shards with
      ``classes_per_client``), labeled/unlabeled per worker as for the generic schemes.
      ``split="pooled"`` pools train+test and splits each worker's data into local train
      and a ``local_test_fraction`` ``"test"`` part (``"test_global"`` is their union);
      ``"official"`` is as above. Assignments: ``edge`` int [C] (balanced random over
      ``num_edges``), ``cluster`` int [C] (``cfsl_clusters`` latent groups, balanced within
      every edge), ``label_map`` int [C, Q] (``cfsl_transform=label_permutation``: cluster 0
      identity, others distinct derangements), ``rotation`` int [C] quarter turns
      (``rotation``: cluster g gets ``(4 g) // cfsl_clusters``); apply them with
      :func:`apply_client_transforms`.
      ``"ada"`` (Ada-FedSemi §4.2): a uniform random ``labeled_fraction`` of the train split
      is the clients' labeled pool, dealt IID (equal split) or non-IID-``ada_zeta``
      (:func:`dominant_class_partition`); the rest of the train split (or a random
      ``server_unlabeled_size`` subset when > 0) is ``server["server_unlabeled"]``; a random
      ``val_fraction`` of the test split is ``server["server_val"]`` (labeled, for rewards
      and stopping) and the rest ``"test_global"``, dealt to clients' ``"test"`` by their
      class proportions. ``"unlabeled"`` is empty; ``mu`` is 1. Assignments (non-IID):
      ``dominant_class`` int [C]. The cross-dataset variant
      (e.g. STL-10 images as the server pool) needs a second dataset and is not built here.

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
    base_scheme = k["cfsl_base"] if scheme == "cfsl" else scheme
    if base_scheme == "shards":
        _check(
            num_clients * classes_per_client <= pool_train,
            "partition.classes_per_client",
            classes_per_client,
            f"num_clients * classes_per_client must be <= {pool_train} training samples",
        )
    if scheme in ("subset", "normal", "cofed", "ada"):
        _check(
            split == "official",
            "partition.split",
            split,
            f"scheme {scheme!r} uses the official train/test split: must be 'official'",
        )
    if scheme in ("subset", "normal", "cofed"):
        _check(
            val_fraction == 0,
            "partition.val_fraction",
            val_fraction,
            f"scheme {scheme!r} has no validation split: must be 0",
        )
    if scheme in ("subset", "normal"):
        _check(
            k["n_clusters"] <= ds.num_classes,
            "partition.n_clusters",
            k["n_clusters"],
            f"must be <= {ds.num_classes} (num_classes of {ds.name})",
        )
        _check(
            k["normal_min_classes"] <= ds.num_classes,
            "partition.normal_min_classes",
            k["normal_min_classes"],
            f"must be <= {ds.num_classes} (num_classes of {ds.name})",
        )
    if scheme == "cfsl":
        _check(
            k["num_edges"] <= num_clients,
            "partition.num_edges",
            k["num_edges"],
            f"must be <= num_clients={num_clients}",
        )
    if scheme == "ada":
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
        _check(
            k["server_unlabeled_size"] <= n_rest,
            "partition.server_unlabeled_size",
            k["server_unlabeled_size"],
            f"must be <= {n_rest}, the train samples left after the labeled pool (0 = all)",
        )

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
        "n_train": int(n_train),
        "n_test": int(n_test),
        "index_layout": "concat(train, test)",
    }
    if scheme in GENERIC_SCHEMES:
        clients, server, mu = _generic_partition(
            ds, labels_all, scheme, num_clients, alpha, classes_per_client, labeled_mode,
            labeled_fraction, label_ratio_alpha, split, val_fraction, min_client_size, stage,
        )  # fmt: skip
        return Partition(clients=clients, server=server, mu=mu, meta=meta)

    meta.update({key: (v.item() if isinstance(v, np.generic) else v) for key, v in k.items()})
    assignments: dict[str, np.ndarray] = {}
    if scheme in ("subset", "normal"):
        clients, server, mu, assignments, extra = _dofed_partition(
            ds, num_clients, scheme, k, stage
        )
        meta.update(extra)
    elif scheme == "cofed":
        clients, server, mu, assignments, extra = _cofed_partition(ds, num_clients, alpha, k, stage)
        meta.update(extra)
    elif scheme == "cfsl":
        if cfsl_pooled:
            clients, server, mu = _cfsl_pooled(
                labels_all, base_scheme, num_clients, alpha, classes_per_client, labeled_mode,
                labeled_fraction, label_ratio_alpha, min_client_size, k, stage,
            )  # fmt: skip
        else:
            clients, server, mu = _generic_partition(
                ds, labels_all, base_scheme, num_clients, alpha, classes_per_client,
                labeled_mode, labeled_fraction, label_ratio_alpha, split, val_fraction,
                min_client_size, stage,
            )  # fmt: skip
        assignments = _cfsl_assignments(num_clients, ds.num_classes, k, stage)
    else:
        clients, server, mu, assignments = _ada_partition(
            ds, labels_all, num_clients, labeled_fraction, val_fraction, k, stage
        )
    return Partition(clients=clients, server=server, mu=mu, meta=meta, assignments=assignments)


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
    """CFSL §3.2: partition pooled train+test, then each worker's data 80/20 train/test."""
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


def _ada_partition(
    ds: ArrayDataset,
    labels_all: np.ndarray,
    num_clients: int,
    labeled_fraction: float,
    val_fraction: float,
    k: dict[str, Any],
    stage: Any,
) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray, dict]:
    """Ada-FedSemi §4.2; see build_partition."""
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    rng = stage(_STAGE_SPLIT)
    perm = rng.permutation(n_train)
    n_lab = int(round(labeled_fraction * n_train))
    lab_pool, rest = np.sort(perm[:n_lab]).astype(np.int64), perm[n_lab:]
    size = k["server_unlabeled_size"]
    server_unlabeled = _sorted_i64(rest[:size] if size > 0 else rest)  # rest is shuffled
    test_perm = n_train + rng.permutation(n_test)
    n_val = int(round(val_fraction * n_test))
    server_val, test_pool = _sorted_i64(test_perm[:n_val]), _sorted_i64(test_perm[n_val:])

    y_lab = labels_all[lab_pool]
    rng = stage(_STAGE_PARTITION)
    if k["ada_variant"] == "iid":
        local = iid_partition(len(lab_pool), num_clients, rng)
    else:
        local = dominant_class_partition(y_lab, num_clients, k["ada_zeta"], ds.num_classes, rng)
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
    if k["ada_variant"] == "noniid":
        assignments["dominant_class"] = np.arange(num_clients, dtype=np.int64) % ds.num_classes
    return clients, server, np.ones(num_clients), assignments


# ----------------------------------------------------------------------------- transforms


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
    if lm.shape[1]:
        y_out[held] = lm[owner[held], np.asarray(y)[held]]
    if not rot[owner[held]].any():
        return x, y_out
    x_out = np.array(x, copy=True)
    for q in (1, 2, 3):
        sel = held[rot[owner[held]] == q]
        x_out[sel] = np.rot90(np.asarray(x)[sel], q, axes=(1, 2))
    return x_out, y_out
