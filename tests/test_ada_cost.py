"""Ada-FedSemi's cost model (spec ada_fedsemi.md sections 1.5, 2.11; acceptance checks 15-17):
a hand-computed round, the masked straggler, budgets, and Tables 4-6 recomputed from the
time and traffic cells of Tables 1-3."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.errors import ConfigError
from fedjax_semi.systems import ada_cost as ac

# ----------------------------------------------------------------------------- one round


def test_hand_computed_round():
    """5 clients, clients 0-2 selected, 40,000 pseudo-labeled samples, VGG9, alpha = 0.5.

    t_{k,m} = broadcast + compute + upload = [30, 45, 20, 60, 10] s; the straggler among the
    selected is 45 s; the server adds 1.5e-4 * 40,000 = 6 s -> t_k = 51 s = 0.85 min.
    b_k = 3 clients * 2 directions * 13.4e6 B = 80.4e6 B = 0.0804 GB.
    Phi_k = 0.5 * 0.85 + 0.5 * 0.0804 = 0.4652.
    """
    broadcast = ac.transfer_time(13.4e6, jnp.asarray([2.68e6, 1.34e6, 6.7e6, 1.34e6, 13.4e6]))
    np.testing.assert_allclose(broadcast, [5.0, 10.0, 2.0, 10.0, 1.0], rtol=1e-6)
    upload = broadcast  # symmetric links in this example
    compute = jnp.asarray([20.0, 25.0, 16.0, 40.0, 8.0])
    t_client = ac.client_time(broadcast, compute, upload)
    np.testing.assert_allclose(t_client, [30.0, 45.0, 20.0, 60.0, 10.0], rtol=1e-6)
    mask = jnp.asarray([True, True, True, False, False])
    rc = jax.jit(ac.round_cost)(t_client, mask, 40_000, 0.5)
    assert float(rc.time_s) == pytest.approx(51.0, rel=1e-6)
    assert float(rc.traffic_bytes) == pytest.approx(80.4e6, rel=1e-6)
    assert float(rc.cost) == pytest.approx(0.4652, rel=1e-6)
    assert float(ac.weighted_cost(51.0, 80.4e6, 1.0)) == pytest.approx(0.85, rel=1e-6)
    assert float(ac.weighted_cost(51.0, 80.4e6, 0.0)) == pytest.approx(0.0804, rel=1e-6)


def test_straggler_ignores_unselected_clients():
    """Check 15: the masked max ignores non-selected clients, even inf or NaN ones."""
    mask = jnp.asarray([False, True, False, True])
    for junk in (1e9, np.inf, np.nan):
        t = jnp.asarray([junk, 7.0, junk, 3.0])
        assert float(ac.straggler_time(t, mask)) == 7.0
    assert float(ac.straggler_time(jnp.asarray([1.0, 2.0]), jnp.zeros(2, bool))) == 0.0
    # A scalar time (homogeneous clients) broadcasts over the mask.
    assert float(ac.round_time(31.0, mask, 0)) == 31.0


def test_traffic_counts_participants_both_ways():
    """Check 15: b_k = n * 2 * W; per-client sizes (sub-models) sum over the selected."""
    m = 20
    for n in (2, 6, 20):
        mask = jnp.arange(m) < n
        assert float(ac.round_traffic(mask)) == pytest.approx(n * 2 * 13.4e6, rel=1e-6)
        assert float(ac.round_traffic(mask, directions=1)) == pytest.approx(n * 13.4e6, rel=1e-6)
    sizes = jnp.asarray([0.11e6, 1.0e6, 13.4e6, 13.4e6])
    mask = jnp.asarray([True, True, True, False])
    assert float(ac.round_traffic(mask, sizes)) == pytest.approx(2 * 14.51e6, rel=1e-6)
    # FedAvg-1.0 on CIFAR10 (Table 1): 324 GB in 314 min is ~604 rounds of ~31 s.
    rounds = 324e9 / float(ac.round_traffic(jnp.ones(m, bool)))
    assert rounds == pytest.approx(604.5, abs=0.1)
    assert 314 * 60 / rounds == pytest.approx(31.2, abs=0.1)


def test_bad_settings_raise_config_error():
    with pytest.raises(ConfigError, match="cost.alpha"):
        ac.weighted_cost(1.0, 1.0, 1.5)
    with pytest.raises(ConfigError, match="cost.t_p"):
        ac.round_time(1.0, jnp.ones(2, bool), 10, t_p=-1.0)
    with pytest.raises(ConfigError, match="traffic_directions"):
        ac.round_traffic(jnp.ones(2, bool), directions=3)
    with pytest.raises(ConfigError, match="rate"):
        ac.transfer_time(1.0, 0.0)


# ----------------------------------------------------------------------------- a whole run


def test_budget_stop_and_charged_cost():
    """Check 17: stop at cumulative time >= T or traffic >= B; a run that misses the target
    is charged alpha T + (1 - alpha) B."""
    T, B = 480 * 60.0, 500e9
    assert not bool(ac.over_budget(479 * 60.0, 100e9, T, B))
    assert bool(ac.over_budget(480 * 60.0, 100e9, T, B))
    assert bool(ac.over_budget(10.0, 500e9, T, B))
    assert not bool(ac.over_budget(1e9, 1e15, jnp.inf, jnp.inf))
    assert float(ac.run_cost(True, 200.0, 100.0, 0.5, 480.0, 500.0)) == 150.0
    assert float(ac.run_cost(False, 200.0, 100.0, 0.5, 480.0, 500.0)) == 490.0
    assert float(ac.run_cost(False, 200.0, 100.0, 1.0, 480.0)) == 480.0  # no traffic budget


# ----------------------------------------------------------------------------- Tables 4-6

_ = np.nan
P_COLS = (0.1, 0.2, 0.5, 1.0)
# Tables 1-3, (b) time (min) and (c) traffic (GB) to the target; rows C, columns P_COLS.
TABLES = {
    "cifar10": (
        (0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0),
        [[_, _, _, 419], [_, 382, 312, 251], [_, 311, 240, 196], [_, 296, 199, 186],
         [_, 247, 211, 190], [356, 296, 221, 194], [395, 346, 326, 314]],
        [[_, _, _, 355], [_, 68, 139, 226], [_, 58, 113, 186], [_, 57, 98, 183],
         [_, 49, 103, 187], [36, 59, 108, 194], [41, 72, 169, 324]],
    ),
    "svhn": (
        (0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0),
        [[_, 63, 52, 31], [_, 59, 46, 27], [_, 54, 43, 25], [_, 52, 37, 23],
         [_, 51, 41, 27], [_, 59, 45, 28], [_, 58, 43, 28]],
        [[_, 0.77, 1.21, 2.07], [_, 0.71, 1.12, 1.94], [_, 0.69, 1.09, 1.76],
         [_, 0.64, 1.02, 1.69], [_, 0.59, 1.08, 1.81], [_, 0.76, 1.13, 2.20],
         [_, 0.76, 1.15, 2.04]],
    ),
    "stl10": (
        (0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0),
        [[_, _, 342, 329], [_, 549, 256, 244], [_, 340, 243, 181], [_, 324, 239, 167],
         [_, 325, 207, 178], [_, 303, 245, 189], [_, 355, 243, 192]],
        [[_, _, 131, 247], [_, 82, 99, 187], [_, 53, 93, 146], [_, 49, 93, 129],
         [_, 50, 84, 138], [_, 46, 95, 150], [_, 54, 96, 148]],
    ),
}  # fmt: skip
# Tables 4-6: the optimal (P, C) per alpha interval, and the exact breakpoints between them.
OPTIMA = {
    "cifar10": ([(0.1, 0.98), (0.2, 0.95), (0.5, 0.9), (1.0, 0.9)], [13 / 122, 49 / 97, 85 / 98]),
    "svhn": ([(0.2, 0.9), (0.5, 0.85), (1.0, 0.85)], [0.43 / 14.43, 0.67 / 14.67]),
    "stl10": ([(0.2, 0.99), (0.5, 0.98), (1.0, 0.95)], [38 / 134, 45 / 85]),
}


@pytest.mark.parametrize("dataset", sorted(TABLES))
def test_tables_4_to_6_from_tables_1_to_3(dataset):
    """Check 16: minimising Eq. 10 (min, GB) over the cells that reached the target gives the
    paper's optimal (P, C) in every alpha interval, switching at the exact breakpoints."""
    rows, times, traffic = TABLES[dataset]
    cells = [(p, c) for c in rows for p in P_COLS]
    t = jnp.asarray(np.asarray(times, np.float32).ravel())
    b = jnp.asarray(np.asarray(traffic, np.float32).ravel())
    best = jax.jit(jax.vmap(ac.best_cell, in_axes=(None, None, 0)))
    optima, breaks = OPTIMA[dataset]
    edges = [0.0, *breaks, 1.0]
    alphas, want = [], []
    for (lo, hi), opt in zip(zip(edges[:-1], edges[1:], strict=True), optima, strict=True):
        for a in (lo + 1e-4 if lo > 0 else lo, (lo + hi) / 2, hi - 1e-4 if hi < 1 else hi):
            alphas.append(a)
            want.append(opt)
    got = [cells[i] for i in np.asarray(best(t, b, jnp.asarray(alphas, jnp.float32)))]
    assert got == want
    printed = {"cifar10": (0.1066, 0.5052, 0.8673), "svhn": (0.0298, 0.0457),
               "stl10": (0.2836, 0.5294)}[dataset]  # fmt: skip
    np.testing.assert_allclose(breaks, printed, atol=5e-5)
    nan = jnp.full(3, jnp.nan)
    assert int(ac.best_cell(nan, nan, 0.5)) == -1  # no cell reached the target
