"""UM-pFSSL's tiny setting (K=6, M=3, R=1, F=3, nu=2), shared by test_um_pfssl.py and
test_um_pfssl_switches.py."""

from __future__ import annotations

import jax

ROUNDS = 4  # t=1,3: replace; t=2: replace + refresh; t=4: refresh only (F=3, nu=2)
TINY = [
    "algorithm=um_pfssl",
    "num_clients=6",
    "clients_per_round=3",
    "algorithm.helper_list_size=3",
    "algorithm.num_replace=1",
    "algorithm.search_rounds=3",
    "algorithm.refresh_period=2",
    "algorithm.mc_samples=3",
    "algorithm.local_epochs=1",
    "algorithm.warmup_epochs=1",
    "algorithm.batch_size=16",
    "algorithm.lr=0.05",
    "algorithm.model_dropout=0.5",
    "partition.labeled_mode=dirichlet",
]


def rounds(runner, n):
    state, rows = runner.init(), []
    states = [state]
    for _ in range(n):
        state, m = runner.round(state)
        rows.append(jax.device_get(m))
        states.append(state)
    return states, rows
