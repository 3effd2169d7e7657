"""The standard throughput workloads (issue "Throughput", `../shared/specs/anchors.md` A1, A5, A6).

    W0  The default job's setting (`+experiment=fmnist_supervised`): the FedAvg CNN (5x5 conv
        32 / 64, Dense 512, 1.66 M params) on Fashion-MNIST shapes, 100 clients x 600, 10 per round,
        1 epoch, batch 32, lr 0.05: what a new user runs first.
    W1  pfl-research's CIFAR-10 benchmark: 1000 clients x 50 images, 50 per round, 1 local epoch,
        batch 10, lr 0.1, server lr 1.0, `simple_cnn`, FedAvg.
    W2  FLUTE's FEMNIST CNN (LEAF's: 5x5 conv 32 / 64, Dense 2048, 62 classes, 6.6 M params):
        3400 clients, 10 per round; 226 images per client (FEMNIST's mean per writer), 1 epoch,
        batch 20 (an assumption: FLUTE's README gives clients and rounds only).
    W3  A 2-layer MLP (784-200-200-10) on MNIST shapes: 1000 clients x 60 images, 10 per round,
        1 epoch, batch 10 (the setting of FLUTE's LR-MNIST comparison with Flower, with the MLP).
    W4  One UM-pFSSL round (ResNet-9 with MC dropout, spec `uncertainty_pfssl.md`): 100 clients,
        10 per round, Fashion-MNIST shapes, `model.width` of the CPU preset unless told.
    W4R W4 in UM-pFSSL's setting of record (`+experiment=um_pfssl_table1_record`, α = 5): 100
        clients, 20 per round, 5 warm-up epochs; not in the default list (its warm-up is long).

Inputs are synthetic images and labels of the real shapes (speed does not depend on pixel
values); `learnable_dataset` gives real Fashion-MNIST in a workload's shape for the accuracy
agreement checks (W1: padded to 32x32 and repeated to 3 channels).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    title: str
    input_shape: tuple[int, int, int]
    num_classes: int
    clients: int
    per_client: int
    cohort: int
    local_epochs: int
    batch: int
    lr: float
    server_lr: float
    model: tuple[str, ...]  # Hydra overrides of the model group
    extra: tuple[str, ...] = ()  # further overrides (W4: the UM-pFSSL preset)

    @property
    def steps_per_client(self) -> int:
        """SGD steps one client runs per round (the last batch may be partial)."""
        return self.local_epochs * math.ceil(self.per_client / self.batch)

    def overrides(self, **changes) -> list[str]:
        """The `fedjax-semi` overrides of this workload (FedAvg on every label, IID split of
        clients x per_client images, plain SGD). `changes` replace fields first."""
        w = dataclasses.replace(self, **changes)
        if w.extra:  # W4: a preset plus the scale
            return [*w.extra, f"num_clients={w.clients}", f"clients_per_round={w.cohort}"]
        return [
            "algorithm=fedavg_sl",
            "partition=iid",
            f"num_clients={w.clients}",
            f"clients_per_round={w.cohort}",
            f"algorithm.local_epochs={w.local_epochs}",
            f"algorithm.batch_size={w.batch}",
            f"algorithm.lr={w.lr}",
            f"algorithm.server_lr={w.server_lr}",
            "algorithm.optimizer=sgd",
            "algorithm.momentum=0.0",
            "algorithm.weight_decay=0.0",
            *w.model,
            "save_partition=false",
        ]


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "W0",
            "the default job: FedAvg CNN 1.66M, Fashion-MNIST shapes, 100 x 600, cohort 10",
            (28, 28, 1),
            10,
            clients=100,
            per_client=600,
            cohort=10,
            local_epochs=1,
            batch=32,
            lr=0.05,
            server_lr=1.0,
            model=("model=cnn",),
        ),
        Workload(
            "W1",
            "pfl-research CIFAR-10: simple_cnn, 1000 x 50, cohort 50",
            (32, 32, 3),
            10,
            clients=1000,
            per_client=50,
            cohort=50,
            local_epochs=1,
            batch=10,
            lr=0.1,
            server_lr=1.0,
            model=("model=simple_cnn",),
        ),
        Workload(
            "W2",
            "FLUTE FEMNIST CNN: 6.6M params, 3400 clients, cohort 10",
            (28, 28, 1),
            62,
            clients=3400,
            per_client=226,
            cohort=10,
            local_epochs=1,
            batch=20,
            lr=0.01,
            server_lr=1.0,
            model=("model=cnn", "model.dense=2048"),
        ),
        Workload(
            "W3",
            "MLP 784-200-200-10 on MNIST shapes: 1000 x 60, cohort 10",
            (28, 28, 1),
            10,
            clients=1000,
            per_client=60,
            cohort=10,
            local_epochs=1,
            batch=10,
            lr=0.05,
            server_lr=1.0,
            model=("model=mlp",),
        ),
        Workload(
            "W4",
            "UM-pFSSL round: ResNet-9 + MC dropout, 100 clients, cohort 10",
            (28, 28, 1),
            10,
            clients=100,
            per_client=600,
            cohort=10,
            local_epochs=1,
            batch=32,
            lr=0.05,
            server_lr=1.0,
            model=(),
            extra=("+experiment=um_pfssl_table1_cpu",),
        ),
    )
}
# W4 in the setting of record: only the cohort, batch, lr and preset differ.
WORKLOADS["W4R"] = dataclasses.replace(
    WORKLOADS["W4"],
    name="W4R",
    title="UM-pFSSL round of the setting of record: 100 clients, cohort 20, alpha 5",
    cohort=20,
    batch=64,
    lr=0.03,
    extra=("+experiment=um_pfssl_table1_record", "partition.alpha=5.0"),
)


def synthetic_dataset(w: Workload, clients: int | None = None, test: int = 1000, seed: int = 0):
    """Random uint8 images and labels of the workload's shapes: clients x per_client training
    images (an IID split gives each client exactly per_client) and `test` test images."""
    from fedjax_semi.data.registry import ArrayDataset

    n = (clients or w.clients) * w.per_client
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n + test, *w.input_shape), dtype=np.uint8)
    y = rng.integers(0, w.num_classes, size=n + test).astype(np.int32)
    c = w.input_shape[-1]
    return ArrayDataset(
        f"synthetic_{w.name.lower()}",
        x[:n],
        y[:n],
        x[n:],
        y[n:],
        w.num_classes,
        (0.5,) * c,
        (0.29,) * c,
    )


def learnable_dataset(w: Workload, clients: int | None = None, seed: int = 0):
    """Real Fashion-MNIST in the workload's input shape, clients x per_client training images
    (drawn without replacement) and the full 10,000-image test set, for accuracy checks.
    Raises DatasetNotFoundError where Fashion-MNIST is not installed."""
    from fedjax_semi.data.registry import ArrayDataset, load_dataset

    if w.num_classes != 10:
        raise ValueError(f"{w.name}: accuracy checks use 10-class Fashion-MNIST")
    fm = load_dataset("fashion_mnist")
    n = (clients or w.clients) * w.per_client
    take = np.random.default_rng(seed).permutation(len(fm.x_train))[:n]

    def shape(x: np.ndarray) -> np.ndarray:
        h, _, c = w.input_shape
        if h > x.shape[1]:  # 28 -> 32: zero border, then repeat the channel
            p = (h - x.shape[1]) // 2
            x = np.pad(x, ((0, 0), (p, h - x.shape[1] - p), (p, h - x.shape[1] - p), (0, 0)))
        return np.repeat(x, c, axis=-1) if x.shape[-1] != c else x

    x_tr, x_te = shape(fm.x_train[take]), shape(fm.x_test)
    mean = tuple(float(m) for m in (x_tr / 255.0).mean(axis=(0, 1, 2)))
    std = tuple(float(s) for s in (x_tr / 255.0).std(axis=(0, 1, 2)))
    return ArrayDataset(
        f"fashion_mnist_{w.name.lower()}",
        x_tr,
        fm.y_train[take].astype(np.int32),
        x_te,
        fm.y_test.astype(np.int32),
        10,
        mean,
        std,
    )
