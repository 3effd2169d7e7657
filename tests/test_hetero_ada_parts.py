"""HeteroAda-FedSemi's parts: the multi-exit VGG-9 (its exits, sub-model sizes and update
masks) and Alg. 3's kernels against NumPy references, the spec's acceptance checks 19-22. The
algorithm end to end is in test_hetero_ada.py."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_semi.algorithms.hetero_ada import ExitsObjective, masked_updates
from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.train import Schedule, local_train, make_optimizer
from fedjax_semi.kernels import depths
from fedjax_semi.models.layers import adaptive_avg_pool, avg_pool
from fedjax_semi.models.vgg import NUM_PARTS, exit_part, exit_parts
from fedjax_semi.models.zoo import make_model, num_params
from fedjax_semi.systems import ada_cost, tx2

L = NUM_PARTS

# ----------------------------------------------------------------------------- the model


def test_adaptive_avg_pool_matches_pytorch_bins():
    """Cell i averages rows floor(i H / s) .. ceil((i + 1) H / s) - 1 (PyTorch's bins)."""
    x = np.random.default_rng(0).normal(size=(2, 14, 7, 3)).astype(np.float32)

    def ref(x, s):
        h, w = x.shape[1:3]
        out = np.zeros((x.shape[0], s, s, x.shape[3]), np.float64)
        for i in range(s):
            for j in range(s):
                rows = slice(i * h // s, -(-(i + 1) * h // s))
                cols = slice(j * w // s, -(-(j + 1) * w // s))
                out[:, i, j] = x[:, rows, cols].mean(axis=(1, 2))
        return out

    for s in (1, 2, 4):
        np.testing.assert_allclose(adaptive_avg_pool(jnp.asarray(x), s), ref(x, s), atol=1e-6)
    even = jnp.asarray(np.random.default_rng(1).normal(size=(2, 16, 16, 3)), jnp.float32)
    np.testing.assert_allclose(adaptive_avg_pool(even, 4), avg_pool(even, 4), atol=1e-6)


def test_submodel_param_counts_at_32x32():
    """H^1 = conv1-2 (19,392) + c^1 (4x4x64 -> 10: 10,250); H^2 adds conv3-4 (221,440) + c^2
    (2x2x128 -> 10: 5,130); H^3 adds conv5-6 and the FC stack (3,250,698). The spec prints
    H^3 = 3,505,910: its own layer table gives 3,506,910 (the plain VGG-9's 3,491,530 plus the
    two heads), the same 1,000 it is off by in its VGG-9 total of 3,490,530."""
    model = make_model("vgg9_exits", (32, 32, 3), 10, dropout=0.1)
    params = jax.eval_shape(model.init, jax.random.key(0))["params"]
    per_part = {b: 0 for b in range(1, L + 1)}
    for b, leaf in zip(jax.tree.leaves(exit_parts(params)), jax.tree.leaves(params), strict=True):
        per_part[b] += leaf.size
    assert np.cumsum([per_part[b] for b in range(1, L + 1)]).tolist() == [
        29_642,
        256_212,
        3_506_910,
    ]
    plain = jax.eval_shape(make_model("vgg9", (32, 32, 3), 10).init, jax.random.key(0))
    assert num_params(plain) == 3_491_530
    shapes = lambda t: jax.tree.map(lambda a: a.shape, t)
    assert shapes(plain["params"]) == shapes({k: v for k, v in params.items() if "exit" not in k})


@pytest.fixture(scope="module")
def small_exits():
    """Width 0.25 on 28x28x1 (the stand-in's shape): 28 -> 14 -> 7 -> 3 before the FC stack."""
    model = make_model("vgg9_exits", (28, 28, 1), 10, width=0.25, dropout=0.1)
    all_exits = dataclasses.replace(model, module=model.module.clone(output="all"))
    variables = model.init(jax.random.key(0))
    x = np.random.default_rng(0).integers(0, 256, (4, 28, 28, 1), dtype=np.uint8)
    return model, all_exits, variables, x


def test_forward_at_depth_b_reads_only_parts_up_to_b(small_exits):
    """Acceptance 19 (first half): exit b does not change when parts > b do, and the depth-b
    sub-model run on the parameters of parts <= b alone gives exit b's logits. The plain
    VGG-9 on the shared layers gives the final exit (same layers, not a copy)."""
    model, all_exits, variables, x = small_exits
    logits, _ = all_exits.apply(variables, x)
    assert logits.shape == (L, 4, 10)
    final, _ = model.apply(variables, x)
    np.testing.assert_array_equal(final, logits[-1])
    params = variables["params"]
    for b in range(1, L + 1):
        moved = {k: jax.tree.map(lambda a: a + 1.0, v) if exit_part(k) > b else v
                 for k, v in params.items()}  # fmt: skip
        np.testing.assert_array_equal(all_exits.apply({"params": moved}, x)[0][b - 1],
                                      logits[b - 1])  # fmt: skip
        sub = dataclasses.replace(all_exits, module=all_exits.module.clone(depth=b))
        only = {k: v for k, v in params.items() if exit_part(k) <= b}
        out, _ = sub.apply({"params": only}, x)
        assert out.shape == (b, 4, 10)
        np.testing.assert_allclose(out[-1], logits[b - 1], atol=1e-6)
    plain = make_model("vgg9", (28, 28, 1), 10, width=0.25, dropout=0.1)
    shared = {k: v for k, v in params.items() if "exit" not in k}
    np.testing.assert_allclose(plain.apply({"params": shared}, x)[0], final, atol=1e-6)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_detach_between_parts_keeps_each_exit_on_its_own_part(small_exits):
    """detach=True (Eq. 21's reading): exit 2's loss has no gradient in part 1; joint
    backprop (the default) trains part 1 through exit 2 as well."""
    _, all_exits, variables, x = small_exits
    y = jnp.arange(4) % 10

    def part1_grad_norm(detach: bool) -> float:
        model = dataclasses.replace(all_exits, module=all_exits.module.clone(detach=detach))
        ce = optax.softmax_cross_entropy_with_integer_labels
        loss = lambda p: jnp.mean(ce(model.apply({"params": p}, x)[0][1], y))  # exit 2 only
        g = jax.grad(loss)(variables["params"])
        return sum(float(jnp.sum(jnp.abs(leaf))) for k, v in g.items() if exit_part(k) == 1
                   for leaf in jax.tree.leaves(v))  # fmt: skip

    assert part1_grad_norm(True) == 0.0
    assert part1_grad_norm(False) > 0.0


# Depth 1 (the shallowest sub-model, the same masking path) in make test-slow: the fast suite
# must stay under 12 minutes.
@pytest.mark.parametrize("depth", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_update_mask_keeps_deeper_parts_even_with_momentum(small_exits, depth):
    """Acceptance 19 (second half): a client at depth d trains with momentum 0.9 and weight
    decay (which moves parameters of zero gradient); the masked update leaves parts > d
    exactly as broadcast and trains parts <= d. Without the mask, weight decay moves them."""
    _, all_exits, variables, _ = small_exits
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.integers(0, 256, (32, 28, 28, 1), dtype=np.uint8))
    y = jnp.asarray(rng.integers(0, 10, 32), jnp.int32)
    table = RoleTable(jnp.arange(32), jnp.int32(32))
    parts = exit_parts(variables["params"])
    on = jnp.arange(1, L + 1) <= depth

    def train(mask: bool):
        tx = make_optimizer("sgd", 0.05, 0.9, weight_decay=0.01)
        if mask:
            tx = optax.chain(tx, masked_updates(jax.tree.map(lambda b: on[b - 1], parts)))
        obj = ExitsObjective(all_exits, on.astype(jnp.float32))
        new, _, stats = local_train(obj, tx, variables, tx.init(variables["params"]), x, y,
                                    table, Schedule(8, 0, 4), jax.random.key(2),
                                    jax.random.key(3))  # fmt: skip
        assert int(stats["steps"]) == 4
        return new["params"]

    for mask in (True, False):
        new = train(mask)
        for k, v in variables["params"].items():
            same = all(np.array_equal(a, b) for a, b in
                       zip(jax.tree.leaves(v), jax.tree.leaves(new[k]), strict=True))  # fmt: skip
            if exit_part(k) <= depth:
                assert not same, k
            else:
                assert same == mask, (k, mask)


# ----------------------------------------------------------------------------- kernels


def test_layerwise_aggregation_rules():
    """Acceptance 20 against NumPy: part b over the clients with d_m >= b, weighted by N_m; no
    trainer keeps the old value; every client at depth L is FedAvg (bit for bit)."""
    rng = np.random.default_rng(0)
    m = 6
    old = {"a": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
           "b": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32),
           "c": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}  # fmt: skip
    parts = {"a": 1, "b": 2, "c": 3}
    stacked = {k: jnp.asarray(rng.normal(size=(m, *v.shape)), jnp.float32) for k, v in old.items()}
    weights = jnp.asarray([5.0, 3.0, 0.0, 2.0, 7.0, 1.0])  # client 2 not selected
    depth = jnp.asarray([1, 2, 3, 1, 2, 1])  # nobody trains part 3 (client 2 is not selected)
    got = depths.layerwise_mean(stacked, weights, depth, parts, old)
    for k, b in parts.items():
        w = np.where(np.asarray(depth) >= b, np.asarray(weights), 0.0)
        if w.sum() == 0:
            np.testing.assert_array_equal(got[k], old[k])
        else:
            want = np.tensordot(w / w.sum(), np.asarray(stacked[k], np.float64), 1)
            np.testing.assert_allclose(got[k], want, rtol=1e-6)
    full = depths.layerwise_mean(stacked, weights, jnp.full((m,), L), parts, old)
    fedavg = aggregate.weighted_mean(stacked, weights)
    for k in old:
        np.testing.assert_array_equal(full[k], fedavg[k])


def np_kmeans(t, mask, init, cap=depths.KMEANS_MAX_ITER):
    """Lloyd's 1-D k-means in float64, as Alg. 3 lines 7-10 (the kernel's reference)."""
    c, a = np.asarray(init, np.float64), np.full(len(t), -1)
    nearest = lambda c: np.argmin(np.abs(t[:, None] - c[None, :]), axis=1)
    it = 0
    while it < cap:
        it += 1
        a_new = nearest(c)
        changed = np.any((a_new != a) & mask)
        for j in range(len(c)):
            if np.any((a_new == j) & mask):
                c[j] = t[(a_new == j) & mask].mean()
        a = a_new
        if not changed:
            break
    return nearest(c), c, it


def test_alg3_fixed_example_and_its_other_optimum():
    """Acceptance 21(b): t_hat = [10, 11, 12, 50, 52, 100], centroids from (100, 50, 11):
    {10, 11, 12} -> H^3, {50, 52} -> H^2, {100} -> H^1. From (12, 11, 10) Lloyd stops in
    the other local optimum {10}, {11, 12}, {50, 52, 100}: the init matters."""
    t = jnp.asarray([10.0, 11, 12, 50, 52, 100])
    mask = jnp.ones(6, bool)
    for init, want in (((100, 50, 11), [3, 3, 3, 2, 2, 1]), ((12, 11, 10), [3, 2, 2, 1, 1, 1])):
        a, c, _ = depths.kmeans_1d(t, mask, jnp.asarray(init, jnp.float32))
        assert depths.cluster_depths(a, c, mask).tolist() == want


def test_alg3_depths_are_monotone_in_the_estimated_time():
    """Acceptance 21(a) over 40 random draws (times, selections, seeds): t_i > t_j implies
    d_i <= d_j, so every depth is a contiguous interval of times; the fastest selected client
    trains the full model; Lloyd stops well inside the cap; unselected clients get 0."""
    assign = jax.jit(depths.assign_depths, static_argnums=(3, 4, 5, 6))
    rng = np.random.default_rng(0)
    for s in range(40):
        t = rng.lognormal(3.0, 0.6, 20).astype(np.float32)
        sel = rng.random(20) < rng.uniform(0.3, 1.0)
        sel[rng.integers(20)] = True
        d = np.asarray(assign(jax.random.key(s), jnp.asarray(t), jnp.asarray(sel), L, 1, 100, None))
        assert np.all(d[~sel] == 0) and np.all((d[sel] >= 1) & (d[sel] <= L))
        ts, ds = t[sel], d[sel]
        order = np.argsort(ts)
        assert np.all(np.diff(ds[order]) <= 0), (ts[order], ds[order])
        assert ds[np.argmin(ts)] == L
    _, _, it = depths.kmeans_1d(jnp.asarray(t), jnp.asarray(sel), jnp.asarray(t[:L]))
    assert int(it) < depths.KMEANS_MAX_ITER


def test_alg3_with_at_most_L_clients():
    """Acceptance 21(c): n = 2 -> the slower client H^2, the faster H^3; n = 3 -> 1, 2, 3 in
    order of decreasing t_hat."""
    t = jnp.asarray([30.0, 90.0, 60.0, 10.0])
    key = jax.random.key(0)
    d2 = depths.assign_depths(key, t, jnp.asarray([True, True, False, False]), L)
    assert d2.tolist() == [3, 2, 0, 0]
    d3 = depths.assign_depths(key, t, jnp.asarray([True, True, True, False]), L)
    assert d3.tolist() == [3, 1, 2, 0]


def np_quantile_depths(t, sel, num_parts):
    """Semi-HFL's split in plain NumPy: the selected clients sorted fastest first (ties: the
    higher index first, so the lower index counts as slower), cut into num_parts groups of
    n // L, the first n % L groups (the fastest) one larger; group g trains H^{L - g}."""
    ids = np.flatnonzero(sel)
    order = ids[np.lexsort((-ids, t[ids]))]  # by time, then by decreasing index
    n, out = len(ids), np.zeros(len(t), np.int32)
    sizes = [n // num_parts + (g < n % num_parts) for g in range(num_parts)]
    start = 0
    for g, size in enumerate(sizes):
        out[order[start : start + size]] = num_parts - g
        start += size
    return out


def test_semi_hfl_depths_match_numpy():
    """Equal groups by time among the selected clients, the slowest H^1, the fastest H^L; the
    faster groups take the remainder, so n < L gives depths L - n + 1 .. L as Alg. 3 does."""
    rng = np.random.default_rng(0)
    split = jax.jit(depths.quantile_depths, static_argnums=2)
    for trial in range(40):  # one shape (one compile); 0 to 12 selected, ties every third
        t = rng.choice([10.0, 20.0, 30.0, 40.0], 12) if trial % 3 == 0 else rng.uniform(5, 90, 12)
        sel = rng.random(12) < rng.uniform(0.05, 1.0)
        got = np.asarray(split(jnp.asarray(t, jnp.float32), jnp.asarray(sel), L))
        np.testing.assert_array_equal(got, np_quantile_depths(t, sel, L), err_msg=str(t))
    t = jnp.asarray([30.0, 90.0, 60.0, 10.0, 50.0, 20.0, 70.0])
    assert depths.quantile_depths(t, jnp.ones(7, bool), L).tolist() == [3, 1, 2, 3, 2, 3, 1]
    assert depths.quantile_depths(t[:2], jnp.ones(2, bool), L).tolist() == [3, 2]


def test_kmeans_restarts_and_min_rel_gap():
    """kmeans_restarts keeps the lowest within-cluster SSE over the draws (here: the better
    optimum of the fixed example); min_rel_gap merges near-identical clients into the deeper
    depth (off by default: every depth is used whenever n > L)."""
    # Jitted as in the round (op by op, each of the 20 draws dispatched every primitive anew).
    assign = jax.jit(
        depths.assign_depths, static_argnums=3, static_argnames=("restarts", "min_rel_gap")
    )
    t = jnp.asarray([10.0, 11, 12, 50, 52, 100])
    sel = jnp.ones(6, bool)
    sse = lambda d: sum(float(np.var(np.asarray(t)[np.asarray(d) == b]) * np.sum(d == b))
                        for b in range(1, L + 1) if np.any(np.asarray(d) == b))  # fmt: skip
    best = min(sse(assign(jax.random.key(s), t, sel, L)) for s in range(20))
    many = assign(jax.random.key(0), t, sel, L, restarts=20)
    assert sse(many) == pytest.approx(best)
    close = jnp.asarray([20.0, 20.1, 20.2, 20.3, 20.4])
    five = jnp.ones(5, bool)
    assert set(assign(jax.random.key(0), close, five, L).tolist()) == {1, 2, 3}
    merged = assign(jax.random.key(0), close, five, L, min_rel_gap=0.05)
    assert merged.tolist() == [3] * 5


def test_capability_estimate_recovers_the_full_model_time():
    """Acceptance 22: with no overhead and no bandwidth noise, in one mode period, Eqs. 23-25
    from the times a client reported at any depth in round k - 1 give its true full-model
    time in round k. (float32: rtol 1e-6, a few ulps of the divisions.) With the 5 s overhead
    the estimate from a sub-model is off: the overhead does not scale with the load."""
    loads, sizes = np.asarray([1.0, 2.3, 3.1]), np.asarray([0.11e6, 1.00e6, 13.4e6])
    pi, omega = 20 * loads, 2 * sizes
    key, m = jax.random.key(3), 20
    for overhead, exact in ((0.0, True), (5.0, False)):
        sys = tx2.Tx2System(overhead_s=overhead, bw_sigma=0.0)
        true = sum(tx2.client_times(sys, key, 6, m, 1.0, sizes[-1]))
        for d in range(L):
            t_cp, t_cm = tx2.client_times(sys, key, 5, m, loads[d] / loads[-1], sizes[d])
            psi, gamma = depths.capability(pi[d], omega[d], t_cp, t_cm)
            np.testing.assert_allclose(psi, pi[d] / np.asarray(t_cp), rtol=1e-6)  # NumPy Eq. 24
            t_hat = depths.full_model_time(pi[-1], omega[-1], psi, gamma)
            if exact or d == L - 1:
                np.testing.assert_allclose(t_hat, true, rtol=1e-6)
            else:
                assert not np.allclose(t_hat, true, rtol=1e-3)


def test_waiting_ratio_hand_example():
    """Acceptance 24: times [10, 20, 40] -> (30/40 + 20/40 + 0) / 3 = 41.7%; unselected clients
    do not count; over rounds, the sums of Eq. 34 (not a mean of the rounds' ratios)."""
    s, n = ada_cost.waiting_terms(jnp.asarray([10.0, 20.0, 40.0, 99.0]),
                                  jnp.asarray([True, True, True, False]))  # fmt: skip
    assert float(ada_cost.waiting_ratio(s, n)) == pytest.approx(100 * 1.25 / 3)
    assert round(float(ada_cost.waiting_ratio(s, n)), 1) == 41.7
    s2, n2 = ada_cost.waiting_terms(jnp.asarray([5.0, 5.0]), jnp.asarray([True, True]))
    assert float(ada_cost.waiting_ratio(s + s2, n + n2)) == pytest.approx(100 * 1.25 / 5)


def test_tx2_devices():
    """10 / 5 / 5 clients in the distance groups; modes fixed within a 20-round period (the
    profiling at k = 0 sees round 1's) and redrawn after; each group's mean bandwidth."""
    sys, key = tx2.Tx2System(), jax.random.key(0)
    assert np.bincount(tx2.client_groups(20, sys.group_shares)).tolist() == [10, 5, 5]
    modes = [np.asarray(tx2.modes(sys, key, r, 20)) for r in (0, 1, 20, 21)]
    assert np.array_equal(modes[0], modes[1]) and np.array_equal(modes[1], modes[2])
    assert not np.array_equal(modes[2], modes[3])
    bw = np.stack([np.asarray(tx2.bandwidth_mbps(sys, key, r, 20)) for r in range(1, 401)])
    group = tx2.client_groups(20, sys.group_shares)
    for g, mean in enumerate(sys.group_bw_mbps):
        assert bw[:, group == g].mean() == pytest.approx(mean, rel=0.03)
    # A nominal time (Semi-HFL's profile): the round's mode, the group's mean bandwidth.
    _, t_cm = tx2.client_times(sys, key, 0, 20, 1.0, 4e6, mean_bandwidth=True)
    np.testing.assert_allclose(t_cm, 2 * 4.0 / np.asarray(sys.group_bw_mbps)[group], rtol=1e-6)


class TestAgainstNumPy(chex.TestCase):
    """Alg. 3's k-means jitted and op by op (chex variants) against NumPy."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_kmeans_matches_numpy(self):
        kmeans = self.variant(depths.kmeans_1d)
        rng = np.random.default_rng(0)
        for _ in range(10):
            t = rng.uniform(10, 100, 20)
            mask = rng.random(20) < 0.7
            init = np.sort(rng.choice(t[mask], L, replace=False))[::-1]
            a, c, it = kmeans(jnp.asarray(t), jnp.asarray(mask), jnp.asarray(init))
            ra, rc, rit = np_kmeans(t, mask, init)
            np.testing.assert_array_equal(np.asarray(a)[mask], ra[mask])
            np.testing.assert_allclose(c, rc, rtol=1e-5)
            assert int(it) == rit
