"""CFSL's worker selection (kernels/scheduling.py): segment ranks and the greedy, round-robin,
random and full schemes against NumPy loop references (acceptance 15, 16)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import scheduling

C, K = 24, 5


@functools.partial(jax.jit, static_argnames=("scheme", "k"))
def select(scheme, assign, stopped, latency, energy, last, key, k, member):
    return scheduling.select_workers(scheme, assign, stopped, latency, energy, last, key, k, member)


def reference_rank(keys: list[np.ndarray], segment: np.ndarray) -> np.ndarray:
    """Per segment, a Python sort of the members by (keys..., index)."""
    rank = np.zeros(len(segment), int)
    for s in np.unique(segment):
        members = [i for i in range(len(segment)) if segment[i] == s]
        members.sort(key=lambda i: (*(float(k[i]) for k in keys), i))
        for r, i in enumerate(members):
            rank[i] = r
    return rank


def reference_select(scheme, assign, stopped, latency, energy, last, k, member):
    sel = np.zeros(len(assign), bool)
    for g in range(len(stopped)):
        members = [i for i in range(len(assign)) if member[i] and assign[i] == g]
        if not stopped[g] or scheme == "all":
            chosen = members
        elif scheme == "greedy":
            chosen = sorted(members, key=lambda i: (latency[i], energy[i], i))[:k]
        else:  # round_robin
            chosen = sorted(members, key=lambda i: (last[i], i))[:k]
        sel[chosen] = True
    return sel


def random_inputs(seed: int):
    rng = np.random.default_rng(seed)
    assign = rng.integers(0, K, C)
    assign[:2] = K - 1  # at least one cluster of >= 2
    stopped = rng.random(K) < 0.6
    stopped[K - 1] = True
    # Few distinct values, so ties in latency (broken by energy) and in energy occur.
    latency = rng.integers(0, 4, C).astype(np.float32)
    energy = rng.integers(0, 3, C).astype(np.float32)
    last = rng.integers(-1, 3, C)
    member = rng.random(C) < 0.85
    return assign, stopped, latency, energy, last, member


class TestAgainstNumPy(chex.TestCase):
    """The kernels jitted and op by op (chex variants) against the NumPy loops above."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_segment_rank_matches_numpy(self):
        rank = self.variant(scheduling.segment_rank, static_argnums=2)
        for seed in range(3):
            rng = np.random.default_rng(seed)
            seg = rng.integers(0, 4, 30)
            score = rng.integers(0, 5, 30).astype(np.float32)  # many ties
            got = rank(score, seg, 4)
            assert got.dtype == jnp.int32
            np.testing.assert_array_equal(got, reference_rank([score], seg))
        # A hand example: ties go to the lower index.
        got = rank(jnp.array([3.0, 1, 1, 0, 1, 5]), jnp.array([0, 1, 0, 1, 0, 2]), 3)
        np.testing.assert_array_equal(got, [2, 1, 0, 0, 1, 0])

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(scheme=["greedy", "round_robin"], k=[1, 2])
    def test_greedy_and_round_robin_match_numpy_loop(self, scheme, k):
        select = self.variant(scheduling.select_workers, static_argnums=(0, 7))
        for seed in range(4):
            assign, stopped, latency, energy, last, member = random_inputs(seed)
            got = np.asarray(
                select(scheme, assign, stopped, latency, energy, last, jax.random.key(0), k, member)
            )
            ref = reference_select(scheme, assign, stopped, latency, energy, last, k, member)
            np.testing.assert_array_equal(got, ref)
            assert not (got & ~member).any()
            for g in range(K):
                size = int((member & (assign == g)).sum())
                n_sel = int((got & (assign == g)).sum())
                assert n_sel == (min(k, size) if stopped[g] else size)


def test_greedy_picks_lowest_latency_then_energy():
    assign = jnp.zeros(5, jnp.int32)
    latency = jnp.array([3.0, 1.0, 1.0, 0.5, 2.0])
    energy = jnp.array([0.0, 5.0, 4.0, 9.0, 0.0])
    args = (assign, jnp.array([True]), latency, energy, jnp.zeros(5, jnp.int32), jax.random.key(0))
    sel = scheduling.select_workers("greedy", *args, k=2)
    np.testing.assert_array_equal(sel, [False, False, True, True, False])  # 0.5, then (1.0, 4.0)
    # Padding with a better latency takes no slot.
    member = jnp.array([True, True, True, False, True])
    sel = scheduling.select_workers("greedy", *args, k=2, member=member)
    np.testing.assert_array_equal(sel, [False, True, True, False, False])
    # k >= |g| keeps the whole cluster; k = 0 keeps nobody in it.
    assert bool(scheduling.select_workers("greedy", *args, k=9).all())
    assert not bool(scheduling.select_workers("greedy", *args, k=0).any())
    # Per-cluster k: cluster 0 keeps 1, cluster 1 keeps 2.
    assign2 = jnp.array([0, 0, 1, 1, 1])
    sel = scheduling.select_workers(
        "greedy",
        assign2,
        jnp.array([True, True]),
        latency,
        energy,
        jnp.zeros(5, jnp.int32),
        jax.random.key(0),
        k=jnp.array([1, 2]),
    )
    np.testing.assert_array_equal(sel, [False, True, True, True, False])


def test_round_robin_each_member_once_in_n_rounds():
    n = 5  # cluster 1: a static stopped cluster of 5; cluster 0 not stopped
    assign = jnp.array([0, 1, 1, 0, 1, 1, 1, 0])
    stopped = jnp.array([False, True])
    members = np.flatnonzero(np.asarray(assign) == 1)
    last = jnp.full(8, -1, jnp.int32)
    z = jnp.zeros(8)
    counts = np.zeros(8, int)
    for r in range(2 * n):
        sel = select(
            "round_robin", assign, stopped, z, z, last, jax.random.key(r), 1, jnp.ones(8, bool)
        )
        last = jnp.where(sel, r, last)
        sel = np.asarray(sel)
        assert sel[np.asarray(assign) == 0].all()
        assert sel[members].sum() == 1
        counts += sel
        if r == n - 1:
            np.testing.assert_array_equal(counts[members], np.ones(n))
    # Any window of n consecutive rounds (here rounds n..2n-1) also picks each member once.
    np.testing.assert_array_equal(counts[members], np.full(n, 2))


def test_random_is_uniform_and_keyed():
    assign = jnp.array([0, 0, 0, 0, 1, 1])
    stopped = jnp.array([True, False])
    z = jnp.zeros(6)
    last = jnp.zeros(6, jnp.int32)
    member = jnp.ones(6, bool)

    @jax.jit
    def many(keys):
        return jax.vmap(
            lambda kk: scheduling.select_workers(
                "random", assign, stopped, z, z, last, kk, 1, member
            )
        )(keys)

    draws = np.asarray(many(jax.random.split(jax.random.key(7), 4000)))
    assert (draws[:, :4].sum(axis=1) == 1).all() and draws[:, 4:].all()
    freq = draws[:, :4].mean(axis=0)
    np.testing.assert_allclose(freq, 0.25, atol=0.03)  # std 0.0068 per member
    assert not (draws[0] == draws).all()  # the key matters


def test_all_selects_every_member_and_schemes_jit():
    assign, stopped, latency, energy, last, member = random_inputs(0)
    got = select("all", assign, stopped, latency, energy, last, jax.random.key(0), 1, member)
    np.testing.assert_array_equal(got, member)
    got = scheduling.select_workers("all", assign, stopped, latency, energy, last, None, 1)
    assert bool(got.all())


def test_bad_scheme_and_k():
    args = (
        jnp.zeros(3, jnp.int32),
        jnp.array([True]),
        jnp.zeros(3),
        jnp.zeros(3),
        jnp.zeros(3, jnp.int32),
        jax.random.key(0),
    )
    with pytest.raises(ConfigError, match=r"^algorithm\.selection='best' is not allowed: one of"):
        scheduling.select_workers("best", *args, k=1)
    with pytest.raises(ConfigError, match=r"^algorithm\.k_per_cluster=-1 is not allowed"):
        scheduling.select_workers("greedy", *args, k=-1)
    with pytest.raises(ValueError, match="score.shape"):
        scheduling.segment_rank(jnp.zeros(3), jnp.zeros(4, jnp.int32), 2)
