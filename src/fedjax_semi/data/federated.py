"""FederatedData: one device copy of the data plus per-client index tables by role.

Images stay uint8 and are gathered by index inside the jitted round, never replicated per client.
Labels come in two arrays: `y` holds only what training may read (labels of labeled roles, -1
elsewhere); `eval_y` holds every true label and is handed to evaluation code only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fedjax_semi.data.partitions import Partition

# Roles whose labels training code may read. Everything else is hidden from training.
LABELED_ROLES = ("labeled", "target_labeled", "server_val", "public_labeled")


@struct.dataclass
class RoleTable:
    """Per-client index table of one role.

    idx: int32 [C, n_max] indices into `FederatedData.x`, padded with 0.
    count: int32 [C] number of valid entries per client.
    """

    idx: jax.Array
    count: jax.Array

    @property
    def n_max(self) -> int:
        return self.idx.shape[1]

    @property
    def mask(self) -> jax.Array:
        """bool [C, n_max]."""
        return jnp.arange(self.n_max)[None, :] < self.count[:, None]

    def take(self, clients: jax.Array) -> RoleTable:
        """The rows of the given client ids: [S, n_max]."""
        return RoleTable(self.idx[clients], self.count[clients])


@struct.dataclass
class TrainView:
    """What a client may see during training: inputs, visible labels and index tables."""

    x: jax.Array  # uint8 [N, ...]
    y: jax.Array  # int32 [N], -1 where the label is hidden
    roles: dict[str, RoleTable]
    server: dict[str, jax.Array]


@struct.dataclass
class FederatedData:
    x: jax.Array  # uint8 [N, H, W, C]: train split then test split
    y: jax.Array  # int32 [N] visible labels (-1 = hidden)
    eval_y: jax.Array  # int32 [N] true labels; evaluation code only
    roles: dict[str, RoleTable]
    server: dict[str, jax.Array]  # server-side index sets, e.g. "test_global"
    mu: jax.Array  # float32 [C] labeled ratio per client
    num_classes: int = struct.field(pytree_node=False)
    # Every client's test split lies inside server["test_global"] (lets evaluation of a single
    # global model reuse one pass over the global test set).
    test_in_global: bool = struct.field(pytree_node=False, default=False)
    # int32 [C]: the latent group the partition gave each client (CFSL's clusters), -1 where it
    # built none. Like eval_y, for evaluation only (cluster recovery); train_view omits it.
    eval_group: jax.Array | None = None

    @property
    def num_clients(self) -> int:
        return int(self.mu.shape[0])

    def train_view(self, oracle: bool = False) -> TrainView:
        """The data training code receives. `oracle=True` (fully supervised references only)
        reveals the labels of the clients' unlabeled data."""
        y = self.y
        if oracle and "unlabeled" in self.roles:
            t = self.roles["unlabeled"]
            idx = jnp.where(t.mask, t.idx, self.y.shape[0]).reshape(-1)  # padding -> dropped
            y = y.at[idx].set(self.eval_y[t.idx.reshape(-1)], mode="drop")
        return TrainView(self.x, y, self.roles, self.server)

    def with_hidden_labels(self, eval_y: jax.Array) -> FederatedData:
        """A copy with other true labels (for isolation tests)."""
        return dataclasses.replace(self, eval_y=eval_y)


def pad_table(lists: list[np.ndarray], min_width: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Ragged per-client index lists -> (idx [C, n_max] int32, count [C] int32)."""
    counts = np.array([len(a) for a in lists], dtype=np.int32)
    width = max(int(counts.max(initial=0)), min_width)
    idx = np.zeros((len(lists), width), dtype=np.int32)
    for k, a in enumerate(lists):
        idx[k, : len(a)] = a
    return idx, counts


def build_federated(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    partition: Partition,
    num_classes: int,
    server_extra: dict[str, np.ndarray] | None = None,
    server_labels: dict[str, np.ndarray] | None = None,
    server_hidden_labels: dict[str, np.ndarray] | None = None,
) -> FederatedData:
    """Put the data on the device once and index it per client and role.

    server_extra: server sets made of other inputs (a second dataset's images for a
    cross-dataset pool, or a pool drawn from the dataset's own unlabeled split), appended after
    the test split; they replace the partition's set of that name and their labels are unknown
    (-1), unless server_labels gives them (a labeled pool, e.g. FedMD's public set: visible, in
    their own classes after the task's) or server_hidden_labels does (true labels that only
    evaluation reads, e.g. the accuracy of pseudo-labels on SVHN's extra split).
    """
    extra = server_extra or {}
    known = server_labels or {}
    hidden = server_hidden_labels or {}
    x = np.concatenate([x_train, x_test, *extra.values()])
    pool_y = [
        np.asarray(known.get(k, hidden.get(k, np.full(len(v), -1)))) for k, v in extra.items()
    ]
    eval_y = np.concatenate([y_train, y_test, *pool_y]).astype(np.int32)
    y = np.full_like(eval_y, -1)
    start = len(x_train) + len(x_test)
    for name, xs in extra.items():
        if name in known:
            y[start : start + len(xs)] = eval_y[start : start + len(xs)]
        start += len(xs)
    roles = {}
    for role, lists in partition.clients.items():
        idx, count = pad_table(lists)
        roles[role] = RoleTable(jnp.asarray(idx), jnp.asarray(count))
        if role in LABELED_ROLES:
            flat = np.concatenate(lists) if lists else np.zeros(0, np.int64)
            y[flat] = eval_y[flat]
    for name, idx in partition.server.items():
        if name in LABELED_ROLES:  # e.g. Ada-FedSemi's labeled server validation set
            y[idx] = eval_y[idx]
    if "labeled" in partition.clients and "unlabeled" in partition.clients:
        # Every training example of a client, for the fully supervised references.
        train = [
            np.sort(np.concatenate([a, b]))
            for a, b in zip(
                partition.clients["labeled"], partition.clients["unlabeled"], strict=True
            )
        ]
        idx, count = pad_table(train)
        roles["train"] = RoleTable(jnp.asarray(idx), jnp.asarray(count))
    test_in_global = "test" in partition.clients and "test_global" in partition.server
    if test_in_global:
        flat = np.concatenate(partition.clients["test"]) if partition.clients["test"] else []
        test_in_global = bool(np.isin(flat, partition.server["test_global"]).all())
    server = {k: jnp.asarray(v.astype(np.int32)) for k, v in partition.server.items()}
    if "edge" in partition.assignments:
        # The network's worker-edge association (CFSL's A_i^j), known to the cloud: not an
        # index set, and not the hidden cluster the partition also records.
        server["edge_of"] = jnp.asarray(np.asarray(partition.assignments["edge"], np.int32))
    group = partition.assignments.get("cluster")
    start = len(x_train) + len(x_test)
    for name, xs in extra.items():
        server[name] = jnp.arange(start, start + len(xs), dtype=jnp.int32)
        start += len(xs)
    return FederatedData(
        x=jnp.asarray(x),
        y=jnp.asarray(y),
        eval_y=jnp.asarray(eval_y),
        roles=roles,
        server=server,
        mu=jnp.asarray(partition.mu, jnp.float32),
        num_classes=num_classes,
        test_in_global=test_in_global,
        eval_group=jnp.asarray(np.asarray(group, np.int32)) if group is not None else None,
    )
