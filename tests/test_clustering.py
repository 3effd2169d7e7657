"""CFSL's clustering kernels against NumPy / brute-force / SciPy references (spec cfsl.md sections
2.5, 2.6 and 7, acceptance checks 1-3, 5-7, kernel parts)."""

from __future__ import annotations

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from fedjax_semi.kernels import clustering as cl

C = 8  # one compiled shape for the brute-force checks
CP = 12  # the padded shape

maxst = jax.jit(cl.bipartition_maxst)
complete = jax.jit(cl.bipartition_complete_linkage)
cosine = jax.jit(cl.cosine_matrix)

# ----------------------------------------------------------------------------- references


def cosine_reference(delta, part):
    d = np.asarray(delta, np.float64)
    n = np.linalg.norm(d, axis=1)
    ok = np.asarray(part) & (n > 0)
    s = np.zeros((len(d), len(d)))
    for i, j in itertools.product(range(len(d)), repeat=2):
        if ok[i] and ok[j]:
            s[i, j] = 1.0 if i == j else d[i] @ d[j] / (n[i] * n[j])
    return s


def brute_force(s, member):
    """min over bipartitions of the members of the max cross similarity (each split once)."""
    m = np.flatnonzero(member)
    best = np.inf
    for bits in range(1, 2 ** (len(m) - 1)):  # the last member always on side 0
        a = [m[t] for t in range(len(m)) if bits >> t & 1]
        b = [i for i in m if i not in a]
        best = min(best, max(s[i, j] for i in a for j in b))
    return best


def random_sym(rng, c):
    a = rng.uniform(-1, 1, (c, c)).astype(np.float32)
    s = (a + a.T) / 2
    np.fill_diagonal(s, 1.0)
    return s


def check_split(s, member, side, alpha):
    side, member = np.asarray(side), np.asarray(member)
    assert not side[~member].any()  # non-members never move
    assert side[member].any() and (~side[member]).any()  # both parts non-empty
    cross = s[np.ix_(member & side, member & ~side)].max()
    assert float(alpha) == pytest.approx(cross, abs=0)  # the side found attains alpha


# ----------------------------------------------------------------------------- Eq. 4


class TestAgainstNumPy(chex.TestCase):
    """The kernels jitted and op by op (chex variants) against the references above."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_cosine_matrix_vs_numpy(self):
        cosine = self.variant(cl.cosine_matrix)
        rng = np.random.default_rng(0)
        delta = rng.normal(size=(C, 40)).astype(np.float32) * rng.uniform(1e-3, 10, (C, 1))
        delta[2] = 0.0  # zero update: cosine undefined -> 0 row and column
        part = np.ones(C, bool)
        part[5] = False
        s = np.asarray(cosine(delta, part))
        ref = cosine_reference(delta, part)
        # f32 Gram over P = 40 terms: rounding ~ sqrt(P) * 6e-8 per entry, well below 1e-5.
        np.testing.assert_allclose(s, ref, atol=1e-5, rtol=0)
        assert np.array_equal(s, s.T) or np.allclose(s, s.T, atol=1e-7)
        assert (np.abs(s) <= 1).all()
        assert (s[[2, 5]] == 0).all() and (s[:, [2, 5]] == 0).all()
        ok = part.copy()
        ok[2] = False
        assert (np.diag(s)[ok] == 1).all()
        # invariant to positive rescaling of any update
        scaled = delta * rng.uniform(0.1, 100, (C, 1)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(cosine(scaled, part)), s, atol=1e-5, rtol=0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_maxst_matches_brute_force(self):
        maxst = self.variant(cl.bipartition_maxst)
        rng = np.random.default_rng(1)
        for trial in range(40):
            s = random_sym(rng, C)
            n = 2 + trial % 7  # 2..8 members
            member = np.zeros(C, bool)
            member[rng.choice(C, n, replace=False)] = True
            side, alpha = maxst(s, member)
            assert float(alpha) == pytest.approx(brute_force(s, member), abs=0)
            check_split(s, member, side, alpha)

    @chex.variants(with_jit=True, without_jit=True)
    def test_cluster_mean_max_size_vs_numpy(self):
        k, p = 5, 7
        cluster_mean = self.variant(cl.cluster_mean, static_argnums=2)
        cluster_max = self.variant(cl.cluster_max, static_argnums=3)
        cluster_size = self.variant(cl.cluster_size, static_argnums=2)
        rng = np.random.default_rng(6)
        values = rng.normal(size=(C, p)).astype(np.float32)
        assign = np.array([0, 1, 1, 3, 0, 3, 3, 1])
        part = np.array([1, 1, 0, 1, 1, 1, 0, 1], bool)
        w = rng.uniform(1, 5, C).astype(np.float32) * part
        mean, total = cluster_mean(values, assign, k, w)
        mx = cluster_max(np.linalg.norm(values, axis=1), part, assign, k)
        size = cluster_size(np.ones(C, bool), assign, k)
        for j in range(k):
            sel = assign == j
            tw = w[sel].sum()
            ref = (w[sel, None] * values[sel]).sum(0) / tw if tw > 0 else np.zeros(p)
            np.testing.assert_allclose(np.asarray(mean[j]), ref, atol=1e-6, rtol=1e-5)
            assert float(total[j]) == pytest.approx(tw, rel=1e-6)
            norms = np.linalg.norm(values[sel & part], axis=1)
            assert float(mx[j]) == pytest.approx(norms.max() if len(norms) else 0.0, rel=1e-6)
            assert int(size[j]) == sel.sum()

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(0, 1, 2)
    def test_adjusted_rand_index_matches_numpy(self, seed):
        ari = self.variant(cl.adjusted_rand_index, static_argnums=(2, 3))
        rng = np.random.default_rng(seed)
        c = 40
        truth = rng.integers(0, 4, c)
        found = np.where(rng.random(c) < 0.6, truth, rng.integers(0, 6, c))  # partly recovered
        mask = rng.random(c) < 0.8
        got = ari(found, truth, 6, 4, mask)
        want = _ari_numpy(found[mask], truth[mask])
        # Values lie in about [-0.5, 1] and can be near 0: atol fits float32 sums of ~800 pairs.
        np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_wrong_shapes_fail_chex_assertions(self):
        """The documented shapes are asserted at entry, while tracing under jit."""
        apply_splits = self.variant(cl.apply_splits)
        assign = jnp.array([0, 0, 1, 1, 1])
        side = jnp.zeros((2, 5), bool)  # [K, C]
        granted, new_id = jnp.array([True, False]), jnp.array([1, -1], jnp.int32)
        np.testing.assert_array_equal(apply_splits(assign, side, granted, new_id), assign)
        with pytest.raises(AssertionError, match="shape"):
            apply_splits(assign, side.T, granted, new_id)  # [C, K]
        cluster_mean = self.variant(cl.cluster_mean, static_argnums=2)
        with pytest.raises(AssertionError, match="shape"):
            cluster_mean(jnp.ones((5, 3)), assign, 2, jnp.ones(4))  # weights [C - 1]


def test_cosine_matrix_rejects_bad_shapes():
    with pytest.raises(ValueError, match="delta.shape"):
        cl.cosine_matrix(jnp.zeros((3, 4)), jnp.ones(4, bool))


# ----------------------------------------------------------------------------- Alg. 1 bipartition


def test_maxst_padding_neutral_and_vmap():
    rng = np.random.default_rng(2)
    batch = 5
    ss = np.stack([random_sym(rng, C) for _ in range(batch)])
    members = rng.uniform(size=(batch, C)) < 0.7
    members[:, :2] = True
    sides, alphas = jax.jit(jax.vmap(cl.bipartition_maxst))(ss, members)
    pos = np.sort(rng.choice(CP, C, replace=False))  # members keep their relative order
    for b in range(batch):
        side, alpha = maxst(ss[b], members[b])
        assert np.array_equal(np.asarray(sides[b]), np.asarray(side))
        assert float(alphas[b]) == float(alpha)
        # Padded: junk similarities on the extra rows/columns must not matter.
        big = rng.uniform(-5, 5, (CP, CP)).astype(np.float32)
        big = (big + big.T) / 2
        big[np.ix_(pos, pos)] = ss[b]
        mem = np.zeros(CP, bool)
        mem[pos] = members[b]
        pside, palpha = maxst(big, mem)
        assert float(palpha) == float(alpha)
        assert np.array_equal(np.asarray(pside)[pos], np.asarray(side))
        assert not np.asarray(pside)[~mem].any()


def test_bipartition_degenerate_member_sets():
    s = random_sym(np.random.default_rng(3), C)
    for fn in (maxst, complete):
        for n in (0, 1):
            member = np.arange(C) < n
            side, alpha = fn(s, member)
            assert not np.asarray(side).any() and float(alpha) == 1.0
        side, alpha = fn(s, np.arange(C) < 2)  # two members: one each side
        assert np.asarray(side).tolist() == [False, True] + [False] * (C - 2)
        assert float(alpha) == s[0, 1]


def two_groups(rng, n=C, p=30, noise=0.05):
    v = rng.normal(size=p)
    group = rng.permutation(np.arange(n) % 2).astype(bool)
    delta = np.where(group[:, None], v, -v) + noise * rng.normal(size=(n, p))
    delta *= rng.uniform(0.5, 2.0, (n, 1))
    return delta.astype(np.float32), group


@pytest.mark.parametrize("fn", [maxst, complete], ids=["maxst", "complete"])
def test_synthetic_separation(fn):
    rng = np.random.default_rng(4)
    for _ in range(3):
        delta, group = two_groups(rng)
        part = np.ones(C, bool)
        s = cosine(delta, part)
        side, alpha = fn(s, part)
        side = np.asarray(side)
        assert np.array_equal(side, group) or np.array_equal(side, ~group)  # purity 1.0
        assert float(alpha) < -0.9  # ~ -1 (Eq. 4's idealization)


def test_complete_linkage_vs_scipy():
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(5)
    for trial in range(20):
        s = random_sym(rng, C)
        n = 3 + trial % 6
        member = np.zeros(C, bool)
        member[rng.choice(C, n, replace=False)] = True
        m = np.flatnonzero(member)
        d = 1.0 - s[np.ix_(m, m)].astype(np.float64)  # monotone in -S, >= 0
        np.fill_diagonal(d, 0.0)
        z = hierarchy.linkage(squareform(d, checks=False), method="complete")
        lab = hierarchy.fcluster(z, 2, criterion="maxclust")
        side, alpha = complete(s, member)
        got = np.asarray(side)[m]
        assert np.array_equal(got, lab != lab[0])
        check_split(s, member, side, alpha)
        assert float(alpha) >= brute_force(s, member)  # never better than the exact split


# ----------------------------------------------------------------------------- Eqs. 5, 6, 25


def test_should_split_gating():
    k = 6
    base = dict(
        active=np.ones(k, bool),
        stopped=np.zeros(k, bool),
        size=np.full(k, 5),
        round_index=30,
        last_split=np.zeros(k, np.int32),
    )
    mean_n = np.full(k, 0.1, np.float32)
    max_n = np.full(k, 2.0, np.float32)
    mean_n[1] = 0.4  # Eq. 5 fails at equality (strict <)
    max_n[2] = 1.6  # Eq. 6 fails at equality (strict >)
    args = {**base, "stopped": base["stopped"].copy(), "size": base["size"].copy()}
    args["stopped"][3] = True
    args["size"][4] = 2  # below min_size 3
    args["last_split"] = np.array([0, 0, 0, 0, 0, 15], np.int32)  # created 15 rounds ago
    want = cl.should_split(mean_n, max_n, 0.4, 1.6, **args)
    assert np.asarray(want).tolist() == [True, False, False, False, False, False]
    early = cl.should_split(mean_n, max_n, 0.4, 1.6, **{**base, "round_index": 19})
    assert not np.asarray(early).any()  # global warm-up
    inactive = cl.should_split(mean_n, max_n, 0.4, 1.6, **{**base, "active": np.zeros(k, bool)})
    assert not np.asarray(inactive).any()


def test_stopping_point():
    max_n = np.array([1.0, 1.6, 0.5, 0.5, 0.5], np.float32)
    full = np.array([True, True, False, True, True])
    active = np.array([True, True, True, True, False])
    got = cl.reached_stopping_point(max_n, 1.6, active=active, full=full, round_index=20)
    assert np.asarray(got).tolist() == [True, False, False, True, False]
    early = cl.reached_stopping_point(max_n, 1.6, active=active, full=full, round_index=19)
    assert not np.asarray(early).any()


# ----------------------------------------------------------------------------- bookkeeping


def test_split_bookkeeping_respects_capacity():
    assign = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    # Slot 0 splits off {1, 2}, slot 1 off {5}, slot 2 off {7}; one free slot (3) only.
    split_one = cl.split_cluster(assign, 0, np.array([0, 1, 1, 0, 0, 1, 0, 0], bool), 3)
    assert np.asarray(split_one).tolist() == [0, 3, 3, 1, 1, 1, 2, 2]
    side = np.zeros((4, C), bool)
    side[0, [1, 2]] = side[1, 5] = side[2, 7] = True
    want = np.array([True, True, True, False])
    prio = np.array([1.0, 3.0, 2.0, 0.0], np.float32)
    active = np.array([True, True, True, False])
    granted, new_id = cl.allocate_children(want, prio, active)
    assert np.asarray(granted).tolist() == [False, True, False, False]  # largest max_norm first
    assert np.asarray(new_id).tolist() == [-1, 3, -1, -1]
    out = np.asarray(cl.apply_splits(assign, side, granted, new_id))
    assert out.tolist() == [0, 0, 0, 1, 1, 3, 2, 2]
    # With enough room every split happens, children in the lowest free slots.
    active6 = np.array([True, True, True, False, False, False])
    want6, prio6 = np.r_[want, False, False], np.r_[prio, 0.0, 0.0]
    side6 = np.r_[side, np.zeros((2, C), bool)]
    granted, new_id = cl.allocate_children(want6, prio6, active6)
    assert np.asarray(new_id).tolist() == [5, 3, 4, -1, -1, -1]
    out = np.asarray(cl.apply_splits(assign, side6, granted, new_id))
    assert out.tolist() == [0, 5, 5, 1, 1, 3, 2, 4]


def test_gamma_surrogate_and_gate():
    delta = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [5.0, 5.0]], np.float32)
    assign = np.array([0, 0, 1, 2])
    part = np.array([True, True, True, False])
    mean, _ = cl.cluster_mean(delta, assign, 3, part.astype(np.float32))
    g = np.asarray(cl.gamma_hat(delta, mean, assign, part))
    np.testing.assert_allclose(g, [0.5, 0.5, 0.0, 0.0], atol=1e-7)  # mean of slot 0 is (2, 0)
    # parents: slot 0 held all four; the bound sqrt((1 - alpha) / 2) = 0.5 at alpha = 0.5
    parent = np.zeros(4, int)
    ok = cl.gamma_check(g, part, parent, np.array([0.5, -1.0]), 2)
    assert np.asarray(ok).tolist() == [False, True]  # 0.5 < 0.5 fails; empty slot 1 passes
    ok = cl.gamma_check(g, part, parent, np.array([0.4, 1.0]), 2)
    assert np.asarray(ok).tolist()[0]  # sqrt(0.3) > 0.5


def test_one_round_of_splits_per_edge():
    """Two edges (root slots 0, 1) of four clients each, two directions in each: vmapped
    bipartition over the slots' member masks, then allocation; every cluster ends pure and
    inside one edge (acceptance checks 3, 5, 6)."""
    rng = np.random.default_rng(7)
    k = 4
    edge = np.array([0, 1] * (C // 2))
    group = np.array([0, 0, 1, 1, 0, 1, 1, 0], bool)  # both directions at both edges
    v = rng.normal(size=30)
    delta = np.where(group[:, None], v, -v) + 0.05 * rng.normal(size=(C, 30))
    part = np.ones(C, bool)
    s = cosine(delta.astype(np.float32), part)
    member = np.arange(k)[:, None] == edge[None, :]  # [K, C]; slots 2, 3 empty
    side, alpha = jax.jit(jax.vmap(cl.bipartition_maxst, in_axes=(None, 0)))(s, member)
    want = np.array([True, True, False, False])
    granted, new_id = cl.allocate_children(want, np.ones(k), np.array([1, 1, 0, 0], bool))
    out = np.asarray(cl.apply_splits(edge, side, granted, new_id))
    assert sorted(set(out.tolist())) == [0, 1, 2, 3]
    for j in range(k):
        assert len(set(edge[out == j])) == 1 and len(set(group[out == j])) == 1
    assert (np.asarray(alpha)[:2] < -0.9).all() and (np.asarray(alpha)[2:] == 1.0).all()


def _ari_numpy(found: np.ndarray, truth: np.ndarray) -> float:
    """Plain NumPy reference: Hubert & Arabie (1985) from the contingency table."""
    from math import comb

    table = np.zeros((found.max() + 1, truth.max() + 1), np.int64)
    for f, t in zip(found, truth, strict=True):
        table[f, t] += 1
    index = sum(comb(int(v), 2) for v in table.ravel())
    rows = sum(comb(int(v), 2) for v in table.sum(1))
    cols = sum(comb(int(v), 2) for v in table.sum(0))
    expected = rows * cols / comb(len(found), 2)
    top = (rows + cols) / 2
    return 1.0 if top == expected else (index - expected) / (top - expected)


def test_adjusted_rand_index_edge_cases():
    truth = np.array([0, 0, 1, 1, 2, 2])
    renamed = np.array([3, 3, 0, 0, 1, 1])  # the same partition under other names
    ones = np.ones(6, bool)
    assert float(cl.adjusted_rand_index(renamed, truth, 4, 3, ones)) == pytest.approx(1.0)
    single = np.zeros(6, int)
    assert float(cl.adjusted_rand_index(single, single, 1, 1, ones)) == 1.0
    # One cluster found for three true groups: no agreement beyond chance.
    assert float(cl.adjusted_rand_index(single, truth, 1, 3, ones)) == pytest.approx(0.0)


def test_cluster_recovery_shares_and_optional_ari():
    active = np.array([True, True, True, False])
    stopped = np.array([True, False, True, True])  # the dead slot's flag does not count
    assign = np.array([0, 0, 1, 2, 2])
    out = cl.cluster_recovery(assign, active, stopped, None)
    assert set(out) == {"stopped_cluster_share"}
    assert float(out["stopped_cluster_share"]) == pytest.approx(2 / 3)
    group = np.array([1, 1, 0, 2, 2])  # the same partition, renamed
    assert float(cl.cluster_recovery(assign, active, stopped, group)["cluster_ari"]) == 1.0
