"""CoFED's ``cofed`` scheme: participants own overlapping task subsets and hold disjoint
private samples of them (the CIFAR-100 setup of paper §5.2). Knobs: ``partition.cofed.*``.

A uniform random ``public_fraction`` of the train split is the server's unlabeled
``"public"`` set (the paper's cross-dataset public sets, e.g. CIFAR-10 for CIFAR-100 tasks,
need a second dataset and are not built here). Tasks are CIFAR-100 superclasses when
``ds.side["y_train_coarse"]`` exists, else the classes. Each participant owns
``U{min_classes..max_classes}`` tasks (redrawn until every participant shares a
task with another and the samples suffice) and gets ``samples_per_class`` private
``"labeled"`` samples per task, without replacement across participants: IID evenly over the
task's subclasses, non-IID from ``U{1..max_subclasses}`` of them (fine tasks have no
subclasses: non-IID skews the counts over the owned classes by ``Dir(alpha)`` instead).
``"test"``: every test sample of an owned task (shared across participants, as in the
paper). ``"unlabeled"`` is empty. Assignments: ``label_space`` bool [C, tasks],
``label_map`` int [C, Q] (fine -> task label).

``variant="writers"`` (paper §5.3, FEMNIST): natural writer clients instead. The
participants are the ``num_clients`` writers with the most samples (train and test split
pooled, as LEAF splits each writer's own samples; ties by writer order), from
``ds.side["writer_train"]``/``["writer_test"]`` (as ``load_femnist`` gives). Each writer's
samples are shuffled: a ``train_share`` (the paper's 40%, rounded, at least one) are its
private ``"labeled"`` set, the rest its ``"test"`` set.
``label_space``: ``"present"`` (Y_i = the classes of the writer's private set; test rows
of other classes are dropped, as the other variants test only owned tasks) or ``"all"`` (every
class, our choice; all test rows kept). The held-out ``public_fraction`` comes from the train
split rows of the writers who are not participants (0 with ``dataset.server_pool``, e.g.
Kannada crops). ``"test_global"``: the participants' test rows. Extra assignment: ``writer``
int [C], each participant's index into ``ds.side["writers"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions.common import (
    _STAGE_GROUPS,
    _STAGE_PARTITION,
    _STAGE_PUBLIC,
    SchemeInput,
    SchemeOutput,
    _check,
    _even_split,
    _require_no_val,
    _require_official_split,
    _sorted_i64,
)

__all__ = ["build"]


def _task_map(ds: ArrayDataset) -> tuple[np.ndarray, str]:
    """``int64 [num_classes]`` fine class -> task class, and the task source.

    ``"coarse"`` when ``ds.side["y_train_coarse"]`` exists (CIFAR-100 superclasses), else
    ``"fine"`` (every class is its own task).
    """
    coarse = (ds.side or {}).get("y_train_coarse")
    if coarse is None:
        return np.arange(ds.num_classes, dtype=np.int64), "fine"
    coarse = np.asarray(coarse, dtype=np.int64)
    y = np.asarray(ds.y_train, dtype=np.int64)
    fmap = np.full(ds.num_classes, -1, dtype=np.int64)
    fmap[y] = coarse
    if len(coarse) != len(y) or (fmap[y] != coarse).any() or (fmap < 0).any():
        raise ValueError(
            f"{ds.name}: side['y_train_coarse'] must give every fine class one coarse class"
        )
    return fmap, "coarse"


def _cofed_partition(
    ds: ArrayDataset, num_clients: int, alpha: float, k: dict[str, Any], stage: Any
) -> tuple[dict, dict, np.ndarray, dict, dict]:
    """CoFED; see the module docstring."""
    q = ds.num_classes
    n_train, n_test = len(ds.y_train), len(ds.y_test)
    y_tr, y_te = np.asarray(ds.y_train, np.int64), np.asarray(ds.y_test, np.int64)
    fmap, source = _task_map(ds)
    n_tasks = int(fmap.max()) + 1
    subs = [np.flatnonzero(fmap == t) for t in range(n_tasks)]
    lo, hi = k["min_classes"], min(k["max_classes"], n_tasks)
    _check(
        lo <= n_tasks,
        "partition.cofed.min_classes",
        lo,
        f"must be <= {n_tasks} ({source} classes of {ds.name})",
    )
    spc, variant = k["samples_per_class"], k["variant"]

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
                s = int(rng.integers(1, min(k["max_subclasses"], len(sub)) + 1))
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
            f"partition.cofed.samples_per_class={spc!r} is invalid; no label-space draw fits the "
            f"{int(cap.sum())} private training samples of {ds.name} in 1000 tries (lower it, "
            "partition.cofed.max_classes or partition.cofed.public_fraction, or use fewer clients)"
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


def _writer_ids(ds: ArrayDataset) -> np.ndarray:
    """``int64 [n_train + n_test]``: each sample's writer (index into ``ds.side["writers"]``)."""
    side = ds.side or {}
    _check(
        "writer_train" in side and "writer_test" in side,
        "partition.cofed.variant",
        "writers",
        f"needs per-sample writers (side['writer_train'], side['writer_test'], as "
        f"dataset=femnist has); {ds.name} has none",
    )
    w_tr = np.asarray(side["writer_train"], np.int64)
    w_te = np.asarray(side["writer_test"], np.int64)
    _check(
        len(w_tr) == len(ds.y_train) and len(w_te) == len(ds.y_test),
        "partition.cofed.variant",
        "writers",
        f"needs one writer per sample, but {ds.name} has {len(w_tr)}+{len(w_te)} writer ids for "
        f"{len(ds.y_train)}+{len(ds.y_test)} samples (dataset.fraction < 1 drops samples, not "
        "their writer ids: use dataset.fraction=1)",
    )
    return np.concatenate([w_tr, w_te])


def _writers_partition(
    ds: ArrayDataset, num_clients: int, k: dict[str, Any], stage: Any
) -> SchemeOutput:
    """CoFED's FEMNIST setup (``variant="writers"``); see the module docstring."""
    n_train = len(ds.y_train)
    writer = _writer_ids(ds)
    counts = np.bincount(writer) if len(writer) else np.zeros(0, np.int64)
    n_writers = int((counts > 0).sum())
    _check(
        num_clients <= n_writers,
        "num_clients",
        num_clients,
        f"must be <= the {n_writers} writers of {ds.name} with samples "
        "(partition.cofed.variant=writers: one participant per writer)",
    )
    chosen = np.argsort(-counts, kind="stable")[:num_clients]  # most samples first
    smallest = int(counts[chosen].min())
    _check(
        smallest >= 2,
        "num_clients",
        num_clients,
        f"reaches a writer with {smallest} sample(s); each participant needs a private and a "
        "test sample (use fewer clients)",
    )
    fmap, source = _task_map(ds)
    n_tasks = int(fmap.max()) + 1
    task = fmap[np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)]
    share, space_mode = k["train_share"], k["label_space"]

    rng_pub = stage(_STAGE_PUBLIC)
    n_pub = int(round(k["public_fraction"] * n_train))
    outside = np.flatnonzero(~np.isin(writer[:n_train], chosen))
    _check(
        n_pub <= len(outside),
        "partition.cofed.public_fraction",
        k["public_fraction"],
        f"asks for {n_pub} public rows, but only {len(outside)} training rows of {ds.name} "
        f"belong to writers outside the {num_clients} participants (lower it, or 0 with "
        "dataset.server_pool)",
    )
    public = _sorted_i64(rng_pub.choice(outside, n_pub, replace=False))

    rng = stage(_STAGE_PARTITION)
    labeled, test = [], []
    spaces = np.zeros((num_clients, n_tasks), dtype=bool)
    dropped = 0
    for i, w in enumerate(chosen):
        rows = rng.permutation(np.flatnonzero(writer == w))
        n_own = min(max(int(round(share * len(rows))), 1), len(rows) - 1)
        own, rest = _sorted_i64(rows[:n_own]), _sorted_i64(rows[n_own:])
        if space_mode == "all":
            spaces[i] = True
        else:
            spaces[i, task[own]] = True
            kept = rest[spaces[i, task[rest]]]
            dropped += len(rest) - len(kept)
            rest = kept
        labeled.append(own)
        test.append(rest)
    roles = {
        "labeled": labeled,
        "unlabeled": [np.empty(0, np.int64) for _ in range(num_clients)],
        "test": test,
    }
    test_global = _sorted_i64(np.concatenate([np.zeros(0, np.int64), *test]))
    server = {"public": public, "test_global": test_global}
    assignments = {
        "label_space": spaces,
        "label_map": np.tile(fmap, (num_clients, 1)),
        "writer": chosen.astype(np.int64),
    }
    meta = {
        "num_tasks": n_tasks,
        "task_source": source,
        "writers_available": n_writers,
        "test_dropped": dropped,  # present: test rows outside the writer's label space
    }
    return roles, server, np.ones(num_clients), assignments, meta


def build(inp: SchemeInput) -> SchemeOutput:
    """``cofed`` (official split, no val); see the module docstring."""
    _require_official_split(inp)
    _require_no_val(inp)
    k = inp.knobs["cofed"]
    if k["variant"] == "writers":
        return _writers_partition(inp.ds, inp.num_clients, k, inp.stage)
    return _cofed_partition(inp.ds, inp.num_clients, inp.alpha, k, inp.stage)
