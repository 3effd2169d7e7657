"""What DoFed-SPP's baselines FedFomo and FedBE share (DoFed-SPP Sec. 6.1): the data they train
on, the simulated clock, the labels they report and how they are scored.

The paper leaves how it ran its baselines to an appendix that is not public; our choices
(docs/choices.md: DoFed-SPP, the baselines' details):

* Baselines train on D_train + D_lab, every label a client holds (`baseline_train_data`).
  D_unl is never trained on; it is only predicted, for the labeling accuracy.
* `clients_per_round` clients, drawn uniformly, train and upload per round (K = 10, as Sec. 6.1).
* Their clock is DoFed-SPP's (Sec. 6.1's upload rates; compute time is our analytic model): the
  slowest participant's compute plus the serialized uploads m / r_i, with the same random streams as
  DoFed-SPP, so client i uploads at the same rate in round t under every method (common random
  numbers); downloads and the server are free (Sec. 3.1).
* Labeling accuracy (Sec. 6.2: the baselines label with their classification models): a
  baseline's labels of D_unl are its classification model's hard predictions; its server
  update reports them for every client as `pl_index` / `pl_label` and the engine scores them into
  `pl_acc` on the host.
* Classification accuracy: the model a client uses (FedFomo: its personalized model; FedBE: the
  global model) on its own target test split; `accuracy` is the mean over clients, like
  DoFed-SPP's, so the methods compare on one metric.

On a generic semi-supervised partition (`labeled`, `unlabeled`, `test`) the roles map like
DoFed-SPP's fallback: D_train = D_lab = labeled, D_unl = unlabeled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_semi.algorithms.dofed_task import (  # noqa: F401 (re-exported for the baselines)
    DOFED_ROLES,
    Roles,
    client_evaluator,
    data_roles,
    evaluate_clients,
)
from fedjax_semi.config import AlgorithmConfig
from fedjax_semi.data.federated import FederatedData, RoleTable
from fedjax_semi.engine.pytrees import PyTree
from fedjax_semi.errors import ConfigError, bad
from fedjax_semi.models.zoo import Model


@struct.dataclass
class Traffic:
    """Models moved so far (int32 [] each): uploads to the server, downloads from it."""

    uploads: jax.Array
    downloads: jax.Array

    @classmethod
    def zero(cls) -> Traffic:
        return cls(uploads=jnp.int32(0), downloads=jnp.int32(0))


@struct.dataclass
class TargetPlan:
    """What a baseline's server update reads on DoFed-SPP's tasks besides the uploads: the
    clock's inputs and the rows every client labels (the labeling accuracy of Table 1).

    cohort: int32 [S] the participants.
    n_train: int32 [S] the rows each participant trains on (its compute time).
    unl: RoleTable [N, Du] every client's unlabeled target rows.
    x: the inputs [D, ...] the rows index.
    """

    cohort: jax.Array
    n_train: jax.Array
    unl: RoleTable
    x: jax.Array


def is_target_task(roles: dict) -> bool:
    """The partition is DoFed-SPP's SUBSET/NORMAL (D_train, D_lab, D_unl, target test)."""
    return data_roles(roles) == DOFED_ROLES


def check_roles(name: str, fed: FederatedData) -> Roles:
    """The roles a baseline reads, or a ConfigError naming the missing ones."""
    roles = data_roles(fed.roles)
    missing = sorted({*roles, "test"} - set(fed.roles))
    if missing:
        raise ConfigError(
            f"algorithm.name={name!r} needs the data roles {missing}, which this partition does "
            "not build: use partition=subset or partition=normal (or a semi-supervised "
            "partition with labeled, unlabeled and test roles)"
        )
    return roles


def concat_tables(a: RoleTable, b: RoleTable) -> RoleTable:
    """Row-wise union of two index tables [N, Da] + [N, Db] -> [N, Da + Db], each row's valid
    entries packed first (a's, then b's), as `local_train` expects."""
    idx = jnp.concatenate([a.idx, b.idx], axis=1)
    valid = jnp.concatenate([a.mask, b.mask], axis=1)
    order = jnp.argsort(~valid, axis=1, stable=True)
    return RoleTable(jnp.take_along_axis(idx, order, axis=1), a.count + b.count)


def training_table(roles: dict[str, RoleTable], mode: str) -> RoleTable:
    """What a baseline trains on [N, D]: D_train + D_lab, all the labels a client holds (Local's
    0.15 on CIFAR-10 SUBSET fits that reading), or D_train alone. With the generic fallback D_lab is
    D_train, so the union is D_train itself (no duplicates)."""
    r = data_roles(roles)
    if mode == "train" or r.lab == r.train:
        return roles[r.train]
    return concat_tables(roles[r.train], roles[r.lab])


# ----------------------------------------------------------------------------- labels, scores


def predict_labels(
    model: Model, variables: PyTree, x: jax.Array, table: RoleTable, *, per_client: bool
) -> jax.Array:
    """Hard predictions on each client's table row: int32 [N, D], -1 on padding.

    per_client: variables lead with [N] (each client its own model); else one model for all.
    One client at a time (`lax.map`), so memory holds one row's logits.
    """

    def row(args):
        v, idx = args if per_client else (variables, args)
        logits, _ = model.apply(v, x[idx])
        return jnp.argmax(logits, -1).astype(jnp.int32)

    xs = (variables, table.idx) if per_client else table.idx
    labels = jax.lax.map(row, xs)
    return jnp.where(table.mask, labels, -1)


def check_epochs(cfg: AlgorithmConfig, name: str) -> None:
    """A baseline on DoFed-SPP's tasks trains by epochs over its rows (its compute time counts
    them), never by a fixed number of steps."""
    if cfg.local_epochs < 1:
        raise bad("algorithm.local_epochs", cfg.local_epochs, f"an integer >= 1 for {name}")
