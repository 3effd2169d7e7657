"""Cohort sampling: Floyd's O(S^2) draw against a plain NumPy Floyd, distinct ids, uniform over
subsets, and the auto rule (the permutation draw up to 1000 clients, Floyd's above)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.engine.clients import (
    PERMUTATION_MAX_CLIENTS,
    floyd_draws,
    floyd_sample,
    select_cohort,
)
from fedjax_semi.engine.keys import SELECT, round_key


def numpy_floyd(draws: np.ndarray, n: int) -> list[int]:
    """Floyd's algorithm as written: for j = n-S .. n-1, take t = draws[i] unless taken, else j."""
    chosen: list[int] = []
    for i, t in enumerate(draws.tolist()):
        j = n - len(draws) + i
        chosen.append(j if t in chosen else t)
    return chosen


@pytest.mark.parametrize("n, size", [(5, 5), (7, 3), (1000, 10), (100_000, 50)])
def test_floyd_matches_numpy_and_draws_distinct_ids(n, size):
    for k in range(20):
        key = jax.random.PRNGKey(k)
        draws = np.asarray(floyd_draws(key, n, size))
        assert all(0 <= t <= n - size + i for i, t in enumerate(draws))
        got = np.asarray(jax.jit(floyd_sample, static_argnums=(1, 2))(key, n, size))
        assert got.tolist() == numpy_floyd(draws, n)
        assert len(set(got.tolist())) == size and got.min() >= 0 and got.max() < n


def test_floyd_is_uniform_over_subsets():
    n, size, draws = 5, 2, 6000
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(draws))
    got = np.sort(np.asarray(jax.vmap(lambda k: floyd_sample(k, n, size))(keys)), axis=1)
    subsets = list(itertools.combinations(range(n), size))
    counts = np.array([np.sum(np.all(got == s, axis=1)) for s in subsets])
    assert counts.sum() == draws
    expected = draws / len(subsets)
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < 27.9, counts  # 9 degrees of freedom, p = 0.001


def test_auto_keeps_the_permutation_draw_up_to_the_threshold():
    key, size = jax.random.PRNGKey(3), 10
    for n, sampler in ((PERMUTATION_MAX_CLIENTS, "permutation"), (5000, "floyd")):
        auto = select_cohort(key, 4, n, size)
        np.testing.assert_array_equal(auto, select_cohort(key, 4, n, size, sampler))
    perm = jax.random.choice(round_key(key, SELECT, 4), 1000, (size,), replace=False)
    np.testing.assert_array_equal(select_cohort(key, 4, 1000, size), np.sort(perm))
    floyd = select_cohort(key, 4, 5000, size, "floyd")
    assert np.all(np.diff(np.asarray(floyd)) > 0)  # sorted and distinct
    want = np.sort(np.asarray(floyd_sample(round_key(key, SELECT, 4), 5000, size)))
    np.testing.assert_array_equal(floyd, want)  # Floyd's draw, not the permutation's
    with pytest.raises(ValueError, match="cohort sampler"):
        select_cohort(key, 4, 50, 5, "reservoir")
