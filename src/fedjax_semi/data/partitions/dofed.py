"""DoFed-SPP's ``subset`` and ``normal`` schemes: per client a training set and a
differently distributed target set, drawn by class. Knobs: ``partition.dofed.*``.

SUBSET shuffles the classes into ``n_clusters`` clusters (leftovers join random clusters) and
gives client ``n`` a train cluster and a different target cluster (``assignment``: ``even``,
the default, spreads both the train and the target clusters evenly over the clients;
``balanced`` only the train clusters, the target uniform over the others; ``random``); NORMAL
draws a train and a target class set of ``U{min_classes..max_classes}`` classes
each, redrawn per ``reject``. Per class of the sets: ``train_per_class`` train samples
(role ``"labeled"``), ``target_per_class`` target samples of which a
``target_labeled_fraction`` (at least 1) is ``"target_labeled"`` and the rest
``"target_unlabeled"`` (NORMAL ``fixed_total``: SUBSET's per-client totals split evenly over
the drawn classes), and ``test_per_class`` official test samples (``"test"``). All from the
official train split, disjoint within a client; across clients ``overlap="allow"`` (the
default) reuses samples only when a class runs out and ``"none"`` forbids it (ValueError when
a class runs out). Target data has priority over train data of the same class; train
shortfalls are capped and counted in ``meta["train_capped"]``. Assignments:
``train_classes``/``target_classes`` bool [C, Q]; SUBSET also
``train_cluster``/``target_cluster`` int [C]. ``mu`` = labeled share (train + target
labeled) of the client's training data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_semi.data.dataset import ArrayDataset
from fedjax_semi.data.partitions.common import (
    _STAGE_GROUPS,
    _STAGE_TARGET,
    SchemeInput,
    SchemeOutput,
    _check,
    _even_split,
    _require_no_val,
    _require_official_split,
    _sorted_i64,
)

__all__ = ["build"]

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


def _even_pairs(
    kc: int, num_clients: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``assignment=even``: (train, target) cluster pairs with both the train and the target
    clusters spread evenly (counts per cluster differ by at most 1) and target != train.

    Clients take random slots ``0..N-1``; slot ``s`` trains cluster ``perm[s % kc]`` and
    targets ``perm[(s + shift) % kc]``, with one shift in ``1..kc-1`` per block of ``kc`` slots
    (the shifts cycle through a random order). A full block's targets are a permutation of
    the clusters and the last, partial block's are distinct, hence the even target counts.
    """
    perm = rng.permutation(kc)
    shifts = 1 + rng.permutation(kc - 1)
    slot = rng.permutation(num_clients)
    j, block = slot % kc, slot // kc
    a = perm[j]
    b = perm[(j + shifts[block % (kc - 1)]) % kc]
    return a, b


def _subset_classes(
    num_classes: int, num_clients: int, k: dict[str, Any], rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    """DoFed-SPP SUBSET: class clusters and a (train, target) cluster pair
    per client. Returns per-client train/target class arrays, assignments and meta."""
    q, kc = num_classes, k["n_clusters"]
    order = rng.permutation(q)
    base = q // kc
    clusters = [list(order[i * base : (i + 1) * base]) for i in range(kc)]
    for c in order[kc * base :]:  # leftover classes join a uniformly random cluster
        clusters[int(rng.integers(kc))].append(c)
    clusters_a = [np.sort(np.asarray(c, dtype=np.int64)) for c in clusters]
    if k["assignment"] == "even":  # train and target clusters both spread evenly
        a, b = _even_pairs(kc, num_clients, rng)
    else:
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
    """DoFed-SPP NORMAL: independent random train and target class sets of
    ``U{min_classes..max_classes}`` classes (capped at ``num_classes``); a
    pair is redrawn when identical (``reject=subset``: also when target ⊆ train)."""
    lo, hi = k["min_classes"], min(k["max_classes"], num_classes)
    train, target = [], []
    for _ in range(num_clients):
        for _try in range(1000):
            tr = np.sort(rng.choice(num_classes, int(rng.integers(lo, hi + 1)), replace=False))
            tg = np.sort(rng.choice(num_classes, int(rng.integers(lo, hi + 1)), replace=False))
            bad = np.array_equal(tr, tg)
            if k["reject"] == "subset":
                bad = bad or bool(np.isin(tg, tr).all())
            if not bad:
                break
        else:
            raise ValueError(
                f"partition.dofed.reject={k['reject']!r} is invalid; no train/target "
                f"class-set pair passes it with {lo}..{hi} of {num_classes} classes"
            )
        train.append(tr.astype(np.int64))
        target.append(tg.astype(np.int64))
    return train, target, {}, {}


def _dofed_partition(
    ds: ArrayDataset, num_clients: int, scheme: str, k: dict[str, Any], stage: Any
) -> tuple[dict, dict, np.ndarray, dict, dict]:
    """DoFed-SPP SUBSET / NORMAL; see the module docstring."""
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
    fixed_total = scheme == "normal" and k["size_mode"] == "fixed_total"
    per_cluster = q // k["n_clusters"]  # SUBSET classes per cluster: fixed_total's unit
    rng = stage(_STAGE_TARGET)
    roles: dict[str, list[np.ndarray]] = {
        r: [] for r in ("labeled", "target_labeled", "target_unlabeled", "test")
    }
    capped = 0

    def short(key: str, c: int, want: int, got: int) -> ValueError:
        hint = "; use partition.dofed.overlap='allow'" if overlap == "none" else ""
        if fixed_total and key != "partition.dofed.overlap":  # SUBSET's totals on 2 classes
            hint = "; use partition.dofed.size_mode='per_class'"
        return ValueError(
            f"{key}={k[key.split('.')[-1]]!r} is invalid; class {c} has only {got} of the "
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
        # Target first: it has priority over train when the classes overlap.
        for c, tc, lc in zip(tg_c, t, lab, strict=True):
            a = _draw(train_pools[c], int(lc), _LAB, status, mine, overlap, rng)
            b = _draw(train_pools[c], int(tc - lc), _UNL, status, mine, overlap, rng)
            if len(a) + len(b) < tc:
                key = (
                    "partition.dofed.overlap"
                    if overlap == "none"
                    else "partition.dofed.target_per_class"
                )
                raise short(key, int(c), int(tc), len(a) + len(b))
            got["target_labeled"].append(a)
            got["target_unlabeled"].append(b)
        for c, nc in zip(tr_c, n_tr, strict=True):
            a = _draw(train_pools[c], int(nc), _LAB, status, mine, overlap, rng)
            if len(a) < nc:
                if overlap == "none":
                    raise short("partition.dofed.overlap", int(c), int(nc), len(a))
                capped += int(nc - len(a))  # train gets what the target draws left
            got["labeled"].append(a)
        for c in tg_c:
            want = k["test_per_class"]
            if overlap == "allow":
                want = min(want, len(test_pools[c]))  # CIFAR-100: all 100 test images
            a = _draw(test_pools[c], want, _TEST, status, mine, overlap, rng)
            if len(a) < want:
                raise short("partition.dofed.overlap", int(c), want, len(a))
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


def build(inp: SchemeInput) -> SchemeOutput:
    """``subset`` / ``normal`` (official split, no val); see the module docstring."""
    ds, k = inp.ds, inp.knobs["dofed"]
    _require_official_split(inp)
    _require_no_val(inp)
    _check(
        k["n_clusters"] <= ds.num_classes,
        "partition.dofed.n_clusters",
        k["n_clusters"],
        f"must be <= {ds.num_classes} (num_classes of {ds.name})",
    )
    _check(
        k["min_classes"] <= ds.num_classes,
        "partition.dofed.min_classes",
        k["min_classes"],
        f"must be <= {ds.num_classes} (num_classes of {ds.name})",
    )
    return _dofed_partition(ds, inp.num_clients, inp.scheme, k, inp.stage)
