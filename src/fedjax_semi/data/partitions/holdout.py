"""The validation split of a tuning run (``partition.holdout``).

With ``holdout = h > 0`` a stratified share ``h`` of every client's training rows is removed
from training and evaluated IN PLACE of the test split: client ``k``'s ``"test"`` role becomes
its held-out rows and the server's ``"test_global"`` their union, so every method's evaluation
reads validation data without any method changing, and the real test split is not in the
partition's evaluation sets at all. Held-out rows leave every training role, so their labels
(labeled and unlabeled rows alike) reach evaluation only, as the test split's do. The test
split's rows stay listed in the server set ``"withheld_test"``, which nothing reads: a method
that draws unlabeled server data from "every row outside the server sets and test roles"
(FedBE's ``fedbe_pool=train_split``) must not take test inputs during tuning either.

The rule, per client and per training role holding ``n`` rows (:data:`HOLDOUT_ROLES`):
``m = min(floor(h n + 1/2), n - 1)`` rows are held out (round half up, never the role's last
row), apportioned over the classes by largest remainder of ``h n_c`` (each class gives
``floor(h n_c)`` or one more; equal remainders are ordered at random), drawn at random within a
class. Only rows that no other client holds in a training role are eligible (DoFed-SPP's
``overlap=allow`` may share rows), so no held-out row is trained on by anyone.
"""

from __future__ import annotations

import numpy as np

from fedjax_semi.data.partitions.common import _check, _is_num, _sorted_i64

__all__ = ["HOLDOUT_ROLES", "apply_holdout", "check_holdout", "holdout_counts"]

# Scheme -> (roles rows are held out of, the labeled ones among them (mu), every training role).
# DoFed-SPP's test split follows the target distribution, so its validation rows come from the
# target sets (D_lab, D_unl), never from D_train ("labeled").
_GENERIC = (("labeled", "unlabeled"), ("labeled",), ("labeled", "unlabeled"))
_DOFED = (
    ("target_labeled", "target_unlabeled"),
    ("labeled", "target_labeled"),
    ("labeled", "target_labeled", "target_unlabeled"),
)
# Ada-FedSemi's clients hold only labeled rows; its server pool (unlabeled) and its validation set
# D_V (the agents' rewards and stop rule, Eqs. 11, 14-16) are server sets and stay as they are.
_ADA = (("labeled",), ("labeled",), ("labeled",))
# CoFED's participants hold private labeled rows only (no unlabeled role rows; the public set is
# the server's and stays). CFSL's workers hold labeled and unlabeled rows: the generic rule.
HOLDOUT_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "iid": _GENERIC,
    "dirichlet": _GENERIC,
    "shards": _GENERIC,
    "natural": _GENERIC,
    "subset": _DOFED,
    "normal": _DOFED,
    "ada": _ADA,
    "cofed": _GENERIC,
    "cfsl": _GENERIC,
}


def check_holdout(scheme: str, holdout: float, split: str, val_fraction: float) -> None:
    """ValueError (one line naming partition.holdout) unless ``holdout`` is a share in
    [0, 0.5] the scheme supports. Needs no dataset."""
    _check(
        _is_num(holdout) and 0 <= holdout <= 0.5,
        "partition.holdout",
        holdout,
        "must be a share in [0, 0.5] (0 = no validation split)",
    )
    if holdout == 0:
        return
    _check(
        scheme in HOLDOUT_ROLES,
        "partition.holdout",
        holdout,
        f"scheme {scheme!r} has no validation split: must be 0 (holdout works with "
        f"{sorted(HOLDOUT_ROLES)})",
    )
    # Ada-FedSemi's val_fraction is D_V, rows of the test split that the table's test set
    # (test_global) never holds: the agents read it in every run, tuning or not.
    _check(
        scheme == "ada" or not (split == "official" and val_fraction > 0),
        "partition.holdout",
        holdout,
        f"must be 0 with partition.val_fraction={val_fraction} and split=official (that val "
        "pool is carved from the test split, which a tuning run must not read)",
    )


def holdout_counts(n: int, holdout: float) -> int:
    """Rows held out of a role of ``n`` rows: round half up of ``holdout * n``, never the last."""
    return 0 if n == 0 else min(int(np.floor(holdout * n + 0.5)), n - 1)


def _take(
    idx: np.ndarray, labels: np.ndarray, eligible: np.ndarray, h: float, rng: np.random.Generator
) -> np.ndarray:
    """The held-out rows of one client's role ``idx``: bool mask over ``idx``."""
    take = np.zeros(len(idx), dtype=bool)
    m = holdout_counts(len(idx), h)
    if m == 0:
        return take
    y = labels[idx]
    classes, n_c = np.unique(y, return_counts=True)
    quota = h * n_c
    base = np.floor(quota).astype(np.int64)
    order = rng.permutation(len(classes))  # random order among equal remainders
    extra = order[np.argsort(-(quota - base)[order], kind="stable")][: max(0, m - base.sum())]
    base[extra] += 1
    for c, want in zip(classes, base, strict=True):
        pos = np.flatnonzero((y == c) & eligible)
        take[rng.permutation(pos)[:want]] = True
    return take


def apply_holdout(
    clients: dict[str, list[np.ndarray]],
    server: dict[str, np.ndarray],
    labels_all: np.ndarray,
    scheme: str,
    holdout: float,
    rng: np.random.Generator,
) -> tuple[dict[str, list[np.ndarray]], dict[str, np.ndarray], np.ndarray, int]:
    """The partition with ``holdout`` of the training rows as its test split (module docstring).

    Args:
      clients, server: a scheme's roles (indices into ``concat(train, test)``).
      labels_all: ``int [N]`` labels of ``concat(train, test)``.
      scheme: a key of :data:`HOLDOUT_ROLES`.
      holdout: the share, in (0, 0.5].
      rng: the holdout stage's stream.

    Returns:
      ``(clients, server, mu, n_held)``: the new roles (``"test"`` = held-out rows), server sets
      (``"test_global"`` = their union, ``"withheld_test"`` = the scheme's test split; the others
      kept), the labeled share ``mu`` of the remaining training rows, and the number of rows
      held out.
    """
    held_roles, labeled_roles, train_roles = HOLDOUT_ROLES[scheme]
    num_clients = len(clients["test"])
    holders = np.bincount(
        np.concatenate([np.zeros(0, np.int64), *(a for r in train_roles for a in clients[r])]),
        minlength=len(labels_all),
    )
    out = {r: list(v) for r, v in clients.items()}
    tests = []
    for k in range(num_clients):
        held = []
        for r in held_roles:
            idx = clients[r][k]
            take = _take(idx, labels_all, holders[idx] == 1, holdout, rng)
            out[r][k] = _sorted_i64(idx[~take])
            held.append(idx[take])
        tests.append(_sorted_i64(np.concatenate(held)))
    out["test"] = tests
    test_split = np.concatenate([server["test_global"], *clients["test"]])
    server = {
        **server,
        "test_global": _sorted_i64(np.concatenate(tests)),
        "withheld_test": np.unique(test_split).astype(np.int64),
    }
    seen = np.array([sum(len(out[r][k]) for r in labeled_roles) for k in range(num_clients)])
    total = np.array([sum(len(out[r][k]) for r in train_roles) for k in range(num_clients)])
    mu = np.divide(seen, total, out=np.zeros(num_clients), where=total > 0)
    return out, server, mu, int(sum(len(t) for t in tests))
