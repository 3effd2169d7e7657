"""The tiny setups the DoFed test files share, on a SUBSET of digits with N = 6 clients.
DoFed-SPP (TINY): K = 3 uploaders, B = 2 labeling models, L = 3 warm-up rounds. Its baselines
(FOMO, FAVG, LOCAL, BE): S = 3 participants a round, M = 3 FedFomo downloads. And the helpers
that read their states and data."""

from __future__ import annotations

import jax
import numpy as np

from conftest import run_rounds

N, K, B, L, S, M, BATCH = 6, 3, 2, 3, 3, 3, 16
S_TRAIN, S_INFER = 2e-4, 5e-5
TINY = [
    "algorithm=dofed_spp",
    "partition=subset",
    "partition.dofed.assignment=balanced",  # the thresholds below were set on this partition
    f"num_clients={N}",
    "partition.dofed.train_per_class=40",  # 500 / 10 / 190 per class, scaled down
    "partition.dofed.target_per_class=40",
    "partition.dofed.target_labeled_fraction=0.1",
    "partition.dofed.test_per_class=15",
    f"algorithm.warmup_rounds={L}",
    f"algorithm.selection_k={K}",
    f"algorithm.selection_b={B}",
    "algorithm.lr=0.1",
    "algorithm.lr_tar=0.1",
    f"algorithm.batch_size={BATCH}",
    # A margin above the untrained student's loss keeps a few non-matching providers in the
    # SR rows, so the SRs are not one-hot and AC7 / AC27 compare real numbers.
    "algorithm.sr_g2=8.0",
    f"systems.wireless.time_sec_per_train_sample={S_TRAIN}",
    f"systems.wireless.time_sec_per_infer_sample={S_INFER}",
]


BASE = [
    "partition=subset",
    f"num_clients={N}",
    f"clients_per_round={S}",
    "partition.dofed.train_per_class=40",
    "partition.dofed.target_per_class=40",
    "partition.dofed.target_labeled_fraction=0.5",
    "partition.dofed.test_per_class=15",
    "algorithm.lr=0.1",
    f"algorithm.batch_size={BATCH}",
    f"systems.wireless.time_sec_per_train_sample={S_TRAIN}",
    f"systems.wireless.time_sec_per_infer_sample={S_INFER}",
]
FOMO = ["algorithm=fedfomo", *BASE, f"algorithm.fedfomo_m={M}"]
FAVG = ["algorithm=fedavg", *BASE]
LOCAL = ["algorithm=local", *BASE]
SAMPLES, POOL = 4, 200
BE = [
    "algorithm=fedbe",
    *BASE,
    f"algorithm.fedbe_samples={SAMPLES}",
    f"algorithm.fedbe_pool_size={POOL}",
    "algorithm.fedbe_distill_epochs=3",
    "algorithm.fedbe_swa_start=1",
    "algorithm.fedbe_distill_batch_size=64",
    "algorithm.fedbe_distill_lr=0.05",
]


def run(runner, rounds: int):
    """(states after rounds 0..rounds, each round's metrics) of a runner."""
    return run_rounds(runner, rounds, evaluate=False)


def leaves_equal(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def client_rows_equal(a, b, n) -> bool:
    return all(
        np.array_equal(np.asarray(x)[n], np.asarray(y)[n])
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def model_mb(exp) -> float:
    params = exp.model.init(jax.random.PRNGKey(0))["params"]
    return sum(np.size(p) for p in jax.tree.leaves(params)) * 4 / 1e6


ROLES = ("labeled", "target_labeled", "target_unlabeled")


def counts(exp, *roles):
    return [np.asarray(exp.fed.roles[r].count) for r in roles]


def check_partition(exp, scheme):
    """The data the algorithm reads: AC22 (SUBSET) / AC23 (NORMAL), AC24 for both."""
    part, y = exp.partition, np.asarray(exp.fed.eval_y)
    a = part.assignments

    for n in range(N):
        train_c = set(np.flatnonzero(a["train_classes"][n]))
        target_c = set(np.flatnonzero(a["target_classes"][n]))
        tr, lab, unl = (set(part.clients[r][n].tolist()) for r in ROLES)
        assert not lab & unl and not tr & (lab | unl)  # disjoint samples within a client
        assert set(y[list(tr)]) <= train_c and set(y[list(lab | unl)]) <= target_c
        assert set(y[part.clients["test"][n]]) <= target_c  # AC24
        assert train_c != target_c
        if scheme == "subset":
            assert a["train_cluster"][n] != a["target_cluster"][n] and not train_c & target_c
            for c in target_c:  # 500 / 10 / 190 per class, scaled to 40 / 4 / 36
                assert (y[list(lab)] == c).sum() == 4 and (y[list(unl)] == c).sum() == 36
            assert all((y[list(tr)] == c).sum() == 40 for c in train_c)
        else:
            assert 2 <= len(train_c) <= 10 and 2 <= len(target_c) <= 10
    if scheme == "subset":
        clusters = sorted(c for cl in part.meta["clusters"] for c in cl)
        assert clusters == list(range(exp.fed.num_classes))
