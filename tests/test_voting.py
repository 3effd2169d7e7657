"""CoFED's consensus-voting kernels against a plain Python reference (Cao et al.'s
Algorithm 1 and Eqs. 18-19, the conflict and tie rules of docs/choices.md; the Appendix's worked
example)."""

from __future__ import annotations

from collections import defaultdict

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import voting as vt

# ----------------------------------------------------------------------------- references


def aggregate_reference(preds, Y, K, alpha, w=None, op="gt"):
    """Algorithm 1 with weights, one sample at a time -> (list of K sets P_k, ratio dict).

    The ratio and alpha are compared in float32, as the kernel does; the counts are exact
    because the tests' weights are multiples of 1/4.
    """
    N, M = len(preds), len(preds[0])
    w = [1.0] * N if w is None else [float(x) for x in w]
    total = {k: sum(w[i] for i in range(N) if k in Y[i]) for k in range(K)}
    P = {k: set() for k in range(K)}
    ratios = {}
    for m in range(M):
        count = defaultdict(float)
        for i in range(N):
            if preds[i][m] >= 0:
                count[int(preds[i][m])] += w[i]
        for k, c in count.items():
            if total[k] > 0 and c > 0:
                r = np.float32(c) / np.float32(total[k])
                ratios[m, k] = r
                a = np.float32(alpha)
                if (r > a) if op == "gt" else (r >= a):  # no break: multi-membership
                    P[k].add(m)
    return [P[k] for k in range(K)], ratios


def distribute_reference(P, Y_i, conflict="drop_in_client", ratios=None):
    """R_i as {public index: global label}, with the conflict rule of docs/choices.md (CoFED)."""
    R = {}
    for m in set().union(*[P[k] for k in Y_i]):
        claims = [k for k in Y_i if m in P[k]]
        if conflict == "drop_global" and sum(m in p for p in P) > 1:
            continue
        if conflict == "max_ratio":
            best = max(ratios[m, k] for k in claims)
            claims = [k for k in claims if ratios[m, k] == best]
        if len(claims) == 1:
            R[m] = claims[0]
    return R


def sets_of(accept):
    a = np.asarray(accept)
    return [set(np.nonzero(a[:, k])[0].tolist()) for k in range(a.shape[1])]


def dicts_of(keep, label):
    keep, label = np.asarray(keep), np.asarray(label)
    return [{int(m): int(label[i, m]) for m in np.nonzero(keep[i])[0]} for i in range(len(keep))]


def owns_of(Y, K):
    owns = np.zeros((len(Y), K), bool)
    for i, y in enumerate(Y):
        owns[i, sorted(y)] = True
    return owns


def random_instance(rng, C, K, M, weighted=True):
    """Random label spaces (each client owns >= 1 class), preds inside them, weights k/4."""
    owns = rng.random((C, K)) < 0.4
    owns[np.arange(C), rng.integers(0, K, C)] = True
    preds = np.stack([rng.choice(np.nonzero(o)[0], M) for o in owns]).astype(np.int32)
    w = rng.integers(1, 17, C) / 4.0 if weighted else np.ones(C)
    return preds, owns, w.astype(np.float32)


# Jitted once here: eager calls would compile every primitive of every shape separately.
consensus = jax.jit(vt.consensus_votes, static_argnames=("threshold_op", "axis_name"))
distribute = jax.jit(vt.distribute, static_argnames="conflict")
vote_counts = jax.jit(vt.vote_counts)


def all_kernels(preds, owns, w, alpha, op="gt"):
    """Every kernel on one instance."""
    count, total = vt.vote_counts(preds, owns, w)
    accept = vt.consensus_votes(preds, owns, alpha, w, threshold_op=op)
    out = {"accept": accept, "count": count, "total": total}
    for c in vt.CONFLICTS:
        out[c] = vt.distribute(accept, owns, conflict=c, count=count, total=total)
    return out


run_all = jax.jit(all_kernels, static_argnames="op")  # one compile per shape and op


# ----------------------------------------------------------------------------- worked example

EX_Y = [{0, 1, 2, 3}, {1, 4, 5}, {0, 1, 4}]
EX_OWNS = owns_of(EX_Y, 6)
EX_PREDS = np.array([[1, 0, 2, 0], [1, 4, 5, 1], [1, 4, 0, 1]], np.int32)  # [C, M]
E = set()
EXAMPLE = {  # (alpha, weights) -> (P_0..P_5, R_0..R_2)
    (0.5, None): (
        [E, {0, 3}, {2}, E, {1}, {2}],
        [{0: 1, 2: 2, 3: 1}, {0: 1, 1: 4, 2: 5, 3: 1}, {0: 1, 1: 4, 3: 1}],
    ),
    (0.4, None): (
        [{1, 2, 3}, {0, 3}, {2}, E, {1}, {2}],
        [{0: 1, 1: 0}, {0: 1, 1: 4, 2: 5, 3: 1}, {0: 1, 2: 0}],
    ),
    (0.0, None): (
        [{1, 2, 3}, {0, 3}, {2}, E, {1}, {2}],
        [{0: 1, 1: 0}, {0: 1, 1: 4, 2: 5, 3: 1}, {0: 1, 2: 0}],
    ),
    (1.0, None): ([E] * 6, [{}, {}, {}]),
    (0.5, (2.0, 1.0, 1.0)): (
        [{1, 3}, {0}, {2}, E, {1}, {2}],
        [{0: 1, 1: 0, 2: 2, 3: 0}, {0: 1, 1: 4, 2: 5}, {0: 1, 3: 0}],
    ),
}


@pytest.mark.parametrize("alpha, w", list(EXAMPLE))
def test_worked_example(alpha, w):
    P, R = EXAMPLE[alpha, w]
    accept = consensus(EX_PREDS, EX_OWNS, alpha, None if w is None else jnp.array(w))
    keep, label = distribute(accept, EX_OWNS)
    assert sets_of(accept) == P
    assert dicts_of(keep, label) == R
    counts = vt.pseudo_label_counts(accept, keep)
    assert int(counts["sum_pk"]) == sum(map(len, P))
    assert int(counts["union_pk"]) == len(set().union(*P))
    assert int(counts["sum_ri"]) == sum(map(len, R))


def test_worked_example_totals_and_class_maps():
    _, total = vote_counts(EX_PREDS, EX_OWNS)
    np.testing.assert_array_equal(total, [2, 3, 1, 1, 2, 1])
    _, total = vote_counts(EX_PREDS, EX_OWNS, jnp.array([2.0, 1.0, 1.0]))
    np.testing.assert_array_equal(total, [3, 4, 2, 2, 2, 1])
    l2g, g2l = vt.class_maps(EX_OWNS, kmax=4)
    np.testing.assert_array_equal(l2g[1], [1, 4, 5, -1])
    np.testing.assert_array_equal(g2l[1], [-1, 0, -1, -1, 1, 2])
    with pytest.raises(ValueError, match="kmax=3"):
        vt.class_maps(EX_OWNS, kmax=3)


# ----------------------------------------------------------------------------- oracle (check 1)

SHAPES = [(3, 4, 6), (7, 6, 10), (12, 9, 16)]  # (C, K, M): few shapes, few compiles
ALPHAS = st.sampled_from([0.0, 0.3, 0.5, 1.0, 0.25, 1 / 3, 2 / 3]) | st.floats(0.0, 1.0)


# ----------------------------------------------------------------------------- thresholds (2-6)


def test_unanimity_selects_below_one():
    preds, owns, _ = random_instance(np.random.default_rng(0), 7, 6, 10, weighted=False)
    for k in range(6):
        preds[owns[:, k], k] = k  # every owner of k votes k on sample k
    for alpha in (0.0, 0.3, 0.5, 0.99):
        accept = np.asarray(run_all(preds, owns, np.ones(7, np.float32), alpha)["accept"])
        assert all(accept[k, k] for k in range(6) if owns[:, k].any())


def test_alpha_one_selects_nothing_and_ge_selects_unanimous():
    preds, owns, w = random_instance(np.random.default_rng(1), 7, 6, 10)
    owns[0, 2] = True
    preds[owns[:, 2], 0] = 2  # unanimous on sample 0
    out = run_all(preds, owns, w, 1.0)
    assert not np.asarray(out["accept"]).any()
    assert all(not np.asarray(out[c][0]).any() for c in vt.CONFLICTS)
    ge = np.asarray(run_all(preds, owns, w, 1.0, op="ge")["accept"])
    count, total = vote_counts(preds, owns, w)
    count, total = np.asarray(count), np.asarray(total)[None, :]
    np.testing.assert_array_equal(ge, (count == total) & (total > 0))
    assert ge[0, 2]


def test_alpha_zero_is_any_vote():
    preds, owns, w = random_instance(np.random.default_rng(2), 7, 6, 10)
    accept = np.asarray(run_all(preds, owns, w, 0.0)["accept"])
    voted = np.zeros((10, 6), bool)
    voted[np.arange(10)[None, :], preds] = True
    np.testing.assert_array_equal(accept, voted)


@pytest.mark.parametrize("votes, owners, alpha", [(3, 10, 0.3), (1, 2, 0.5), (7, 35, 0.2)])
def test_strict_boundary(votes, owners, alpha):
    # `owners` clients own both classes; the rest of the 35 rows are padding (one shape).
    owns = np.zeros((35, 2), bool)
    owns[:owners] = True
    preds = np.full((35, 2), -1, np.int32)
    preds[:owners] = 1
    preds[:votes, 0] = 0  # sample 0: `votes` votes for class 0
    preds[: votes + 1, 1] = 0  # sample 1: one vote more
    w = (np.arange(35) < owners).astype(np.float32)
    gt = np.asarray(consensus(preds, owns, alpha, w))
    ge = np.asarray(consensus(preds, owns, alpha, w, threshold_op="ge"))
    assert not gt[0, 0] and gt[1, 0] and ge[0, 0] and ge[1, 0]


def test_unowned_class_selects_nothing_and_stays_finite():
    owns = EX_OWNS.copy()
    owns[0, 3] = False  # class 3 is now owned by nobody (and nobody votes it)
    count, total = vote_counts(EX_PREDS, owns)
    ratio = jax.jit(vt.vote_ratio)(count, total)
    assert float(total[3]) == 0.0 and np.isfinite(np.asarray(ratio)).all()
    for op in vt.THRESHOLD_OPS:
        assert not np.asarray(consensus(EX_PREDS, owns, 0.0, threshold_op=op))[:, 3].any()


def test_ratio_is_correctly_rounded():
    # Found by the oracle: XLA's x / broadcast(t) -> x * broadcast(1/t) made 6/12.75 > 2/4.25.
    rng = np.random.default_rng(12)
    count = (rng.integers(0, 200, (64, 16)) / 4).astype(np.float32)
    total = (rng.integers(1, 200, 16) / 4).astype(np.float32)
    count[0, :2], total[:2] = (6.0, 2.0), (12.75, 4.25)
    ratio = np.asarray(jax.jit(vt.vote_ratio)(count, total))
    np.testing.assert_array_equal(ratio, count / total)
    assert ratio[0, 0] == ratio[0, 1]


# ----------------------------------------------------------------------------- structure (7-10)


def test_vote_conservation():
    preds, owns, _ = random_instance(np.random.default_rng(3), 12, 9, 16, weighted=False)
    count, total = vote_counts(preds, owns)
    np.testing.assert_array_equal(np.asarray(count).sum(-1), 12.0)
    assert (np.asarray(count) <= np.asarray(total)[None, :]).all()
    preds, owns, w = random_instance(np.random.default_rng(4), 12, 9, 16)
    count, total = vote_counts(preds, owns, w)
    np.testing.assert_array_equal(np.asarray(count).sum(-1), w.sum())
    assert (np.asarray(count) <= np.asarray(total)[None, :]).all()


def test_locality_of_columns():
    rng = np.random.default_rng(5)
    preds, owns, w = random_instance(rng, 7, 6, 10)
    new_owns = np.zeros((1, 6), bool)
    new_owns[0, [1, 4]] = True
    new_preds = rng.choice([1, 4], (1, 10)).astype(np.int32)
    before = np.asarray(consensus(preds, owns, 0.3, w))
    after = np.asarray(
        consensus(
            np.concatenate([preds, new_preds]),
            np.concatenate([owns, new_owns]),
            0.3,
            np.concatenate([w, [2.0]]),
        )
    )
    untouched = [k for k in range(6) if k not in (1, 4)]
    np.testing.assert_array_equal(before[:, untouched], after[:, untouched])


def test_monotone_in_alpha():
    preds, owns, w = random_instance(np.random.default_rng(6), 12, 9, 16)
    alphas = np.linspace(0.0, 1.0, 11)
    accepts = [np.asarray(run_all(preds, owns, w, a)["accept"]) for a in alphas]
    for lo, hi in zip(accepts, accepts[1:], strict=False):
        assert (hi <= lo).all()
    sums = [a.sum() for a in accepts]
    assert sums == sorted(sums, reverse=True) and sums[-1] == 0


def test_invariances():
    rng = np.random.default_rng(7)
    preds, owns, w = random_instance(rng, 12, 9, 16)
    base = run_all(preds, owns, w, 0.3)
    perm_c, perm_m = rng.permutation(12), rng.permutation(16)
    out = run_all(preds[perm_c], owns[perm_c], w[perm_c], 0.3)
    np.testing.assert_array_equal(out["accept"], base["accept"])
    for c in vt.CONFLICTS:
        for got, ref in zip(out[c], base[c], strict=True):
            np.testing.assert_array_equal(got, np.asarray(ref)[perm_c])
    out = run_all(preds[:, perm_m], owns, w, 0.3)
    np.testing.assert_array_equal(out["accept"], np.asarray(base["accept"])[perm_m])
    for scale in (0.5, 3.0, 10.0):
        out = run_all(preds, owns, w * np.float32(scale), 0.3)
        np.testing.assert_array_equal(out["accept"], base["accept"])
    ones = run_all(preds, owns, np.ones(12, np.float32), 0.3)["accept"]
    np.testing.assert_array_equal(ones, consensus(preds, owns, 0.3))


# ----------------------------------------------------------------------------- R_i (check 11)


def test_distribution_properties():
    preds, owns, w = random_instance(np.random.default_rng(8), 12, 9, 16)
    out = run_all(preds, owns, w, 0.2)
    accept = np.asarray(out["accept"])
    claims = owns.astype(int) @ accept.T.astype(int)  # [C, M]
    for c in vt.CONFLICTS:
        keep, label = map(np.asarray, out[c])
        rows, cols = np.nonzero(keep)
        assert owns[rows, label[rows, cols]].all() and accept[cols, label[rows, cols]].all()
        assert (keep <= (claims >= 1)).all()
    np.testing.assert_array_equal(out["drop_in_client"][0], claims == 1)


def test_conflict_rules_on_a_hand_example():
    # m0 in P_0 and P_1; m1 in P_0 and P_2; m2 in P_2 only.
    accept = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 1]], bool)
    owns = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 1]], bool)  # Y = {0,1}, {0}, {1,2}
    keep, label = distribute(accept, owns)
    assert dicts_of(keep, label) == [{1: 0}, {0: 0, 1: 0}, {0: 1, 1: 2, 2: 2}]
    keep, label = distribute(accept, owns, conflict="drop_global")
    assert dicts_of(keep, label) == [{}, {}, {2: 2}]
    count = np.array([[3, 1, 0], [1, 0, 2], [0, 0, 2]], np.float32)
    total = np.array([4, 2, 4], np.float32)  # ratios m0: 3/4, 1/2; m1: 1/4, 1/2
    keep, label = distribute(accept, owns, conflict="max_ratio", count=count, total=total)
    assert dicts_of(keep, label) == [{0: 0, 1: 0}, {0: 0, 1: 0}, {0: 1, 1: 2, 2: 2}]
    tie = np.array([[2, 1, 0], [1, 0, 2], [0, 0, 2]], np.float32)  # m0: 2/4 == 1/2, dropped
    keep, label = distribute(accept, owns, conflict="max_ratio", count=tie, total=total)
    assert dicts_of(keep, label)[0] == {1: 0}


def test_bad_choices_name_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.threshold_op='lt'.*\['gt', 'ge'\]"):
        vt.consensus_votes(EX_PREDS, EX_OWNS, 0.5, threshold_op="lt")
    with pytest.raises(ConfigError, match=r"algorithm\.conflict='keep_all'.*max_ratio"):
        vt.distribute(np.zeros((4, 6), bool), EX_OWNS, conflict="keep_all")
    with pytest.raises(ValueError, match="count and total"):
        vt.distribute(np.zeros((4, 6), bool), EX_OWNS, conflict="max_ratio")
    with pytest.raises(ValueError, match="preds.shape=.2, 4. and owns.shape=.3, 6."):
        vt.vote_counts(EX_PREDS[:2], EX_OWNS)


# ----------------------------------------------------------------------------- class maps (12)


def test_class_maps_round_trip_and_masked_argmax():
    rng = np.random.default_rng(9)
    _, owns, _ = random_instance(rng, 12, 9, 1)
    kmax = int(owns.sum(-1).max())
    l2g, g2l = map(np.asarray, jax.jit(vt.class_maps, static_argnames="kmax")(owns, kmax=kmax))
    for i in range(12):
        n = owns[i].sum()
        assert (np.diff(l2g[i, :n]) > 0).all() and (l2g[i, n:] == -1).all()
        np.testing.assert_array_equal(g2l[i, l2g[i, :n]], np.arange(n))
        np.testing.assert_array_equal(l2g[i, g2l[i, owns[i]]], np.nonzero(owns[i])[0])
        np.testing.assert_array_equal(g2l[i] == -1, ~owns[i])
    logits = rng.normal(size=(12, 5, 9)).astype(np.float32)
    got = np.asarray(vt.masked_argmax(logits, owns[:, None, :]))
    for i in range(12):
        head = logits[i][:, l2g[i, : owns[i].sum()]]  # the |Y_i|-way head
        np.testing.assert_array_equal(got[i], l2g[i, head.argmax(-1)])
    assert owns[np.arange(12)[:, None], got].all()


def test_masked_argmax_edges():
    ninf = -np.inf
    logits = np.array([[ninf, ninf, ninf], [5.0, 1.0, 1.0], [0.0, 9.0, 0.0]], np.float32)
    owns = np.array([[0, 1, 1], [0, 1, 1], [0, 0, 0]], bool)
    np.testing.assert_array_equal(vt.masked_argmax(logits, owns), [1, 1, -1])


# ----------------------------------------------------------------------------- padding (13)


def test_padding_neutrality():
    rng = np.random.default_rng(10)
    preds, owns, w = random_instance(rng, 7, 6, 10)
    base = run_all(preds, owns, w, 0.3)
    # Dummy clients: weight 0 and no classes; their preds are junk or -1.
    junk = np.concatenate([rng.integers(0, 6, (4, 10)), -np.ones((1, 10))]).astype(np.int32)
    out = run_all(
        np.concatenate([preds, junk]),
        np.concatenate([owns, np.zeros((5, 6), bool)]),
        np.concatenate([w, np.zeros(5, np.float32)]),
        0.3,
    )
    np.testing.assert_array_equal(out["accept"], base["accept"])
    for c in vt.CONFLICTS:
        np.testing.assert_array_equal(np.asarray(out[c][0])[:7], base[c][0])
        assert not np.asarray(out[c][0])[7:].any()
    # -1 predictions cast no vote but their client still counts in the totals.
    padded = preds.copy()
    padded[:, :3] = -1
    count, total = vote_counts(padded, owns, w)
    assert not np.asarray(count)[:3].any()
    np.testing.assert_array_equal(total, vote_counts(preds, owns, w)[1])


# ----------------------------------------------------------------------------- sharding, jit (14)


def test_axis_name_psum_equals_unsharded():
    preds, owns, w = random_instance(np.random.default_rng(11), 12, 9, 16)
    single = consensus(preds, owns, 0.3, w)

    def shard(p, o, ws):
        return consensus(p, o, 0.3, ws, axis_name="shards")

    for s in (2, 3):
        split = [x.reshape((s, 12 // s) + x.shape[1:]) for x in (preds, owns, w)]
        sharded = jax.jit(jax.vmap(shard, axis_name="shards"))(*split)
        for part in np.asarray(sharded):
            np.testing.assert_array_equal(part, single)
    unreduced = jax.jit(jax.vmap(lambda p, o, ws: consensus(p, o, 0.3, ws)))(*split)
    assert not all(np.array_equal(part, single) for part in np.asarray(unreduced))


def test_alpha_is_traced():
    # A fresh function, so the cache holds only this test's compiles (jit caches per function).
    f = jax.jit(lambda p, o, a: vt.consensus_votes(p, o, a))
    for alpha, (P, _) in ((0.5, EXAMPLE[0.5, None]), (0.4, EXAMPLE[0.4, None])):
        assert sets_of(f(EX_PREDS, EX_OWNS, jnp.float32(alpha))) == P
    assert f._cache_size() == 1


class TestAgainstNumPy(chex.TestCase):
    """Every kernel jitted and op by op (chex variants) against the Python oracle; each
    variant draws half the examples the property had before."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=examples(20), deadline=None)
    @given(
        shape=st.sampled_from(SHAPES),
        seed=st.integers(0, 2**31 - 1),
        alpha=ALPHAS,
        weighted=st.booleans(),
        op=st.sampled_from(vt.THRESHOLD_OPS),
    )
    def test_oracle_equivalence(self, shape, seed, alpha, weighted, op):
        C, K, M = shape
        preds, owns, w = random_instance(np.random.default_rng(seed), C, K, M, weighted)
        out = self.variant(all_kernels, static_argnames="op")(preds, owns, w, alpha, op=op)
        Y = [set(np.nonzero(o)[0].tolist()) for o in owns]
        P, ratios = aggregate_reference(preds, Y, K, alpha, w, op)
        assert sets_of(out["accept"]) == P
        for conflict in vt.CONFLICTS:
            R = [distribute_reference(P, y, conflict, ratios) for y in Y]
            assert dicts_of(*out[conflict]) == R, conflict
            assert (np.asarray(out[conflict][1]) == -1).sum() == (
                ~np.asarray(out[conflict][0])
            ).sum()
