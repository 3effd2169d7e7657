"""Engine kernels against plain NumPy references."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine import aggregate, clients, keys, train


def np_softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def test_losses_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    labels = np.array([0, 3, 1, -1, 2, 2])
    p = np_softmax(rng.normal(size=(6, 4)))
    q = np_softmax(logits)
    ce = np.array([-np.log(q[i, y]) if y >= 0 else 0.0 for i, y in enumerate(labels)])
    # float32 losses of O(1) logits vs float64: atol for losses near 0 (a confident row, a
    # KL of close distributions), rtol for the rest.
    np.testing.assert_allclose(train.cross_entropy(logits, labels), ce, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        train.soft_cross_entropy(logits, p), -(p * np.log(q)).sum(-1), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        train.kl_divergence(logits, p), (p * (np.log(p) - np.log(q))).sum(-1), rtol=1e-4, atol=1e-6
    )
    mask = np.array([1, 0, 1, 1, 0, 1], bool)
    np.testing.assert_allclose(
        train.masked_mean(jnp.asarray(ce), mask), ce[mask].mean(), rtol=1e-5, atol=1e-6
    )
    assert float(train.masked_mean(jnp.ones(3), jnp.zeros(3, bool))) == 0.0


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_weighted_mean_and_server_update(s, d, seed):
    rng = np.random.default_rng(seed)
    stacked = {"params": {"a": rng.normal(size=(s, d)), "b": rng.normal(size=(s, 2, d))}}
    w = rng.integers(0, 5, size=s).astype(np.float64)
    glob = {"params": {"a": rng.normal(size=d), "b": rng.normal(size=(2, d))}}
    mean = aggregate.weighted_mean(jax.tree.map(jnp.asarray, stacked), jnp.asarray(w))
    for k in ("a", "b"):
        ref = np.tensordot(w / max(w.sum(), 1e-12), stacked["params"][k], axes=1)
        np.testing.assert_allclose(mean["params"][k], ref, rtol=1e-5, atol=1e-6)
    mask = {"params": {"a": True, "b": False}}
    new = aggregate.server_update(glob, stacked, jnp.asarray(w), mask, server_lr=0.5)
    np.testing.assert_allclose(new["params"]["b"], glob["params"]["b"])  # not shared: unchanged
    if w.sum() > 0:
        ref_a = np.tensordot(w / w.sum(), stacked["params"]["a"], axes=1)
        want = glob["params"]["a"] + 0.5 * (ref_a - glob["params"]["a"])
    else:
        want = glob["params"]["a"]  # nobody had data
    np.testing.assert_allclose(new["params"]["a"], want, rtol=1e-5, atol=1e-6)


def test_segment_mean_matches_numpy():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(7, 3))
    w = rng.uniform(0.1, 1, size=7)
    seg = np.array([0, 1, 0, 2, 1, 0, 2])
    got = aggregate.segment_mean({"x": jnp.asarray(a)}, jnp.asarray(w), jnp.asarray(seg), 3)["x"]
    for c in range(3):
        m = seg == c
        # float32 weighted means of N(0, 1) values: they can cancel to near 0, hence atol.
        np.testing.assert_allclose(
            got[c], (w[m, None] * a[m]).sum(0) / w[m].sum(), rtol=1e-5, atol=1e-6
        )


def test_share_masks():
    variables = {
        "params": {"Conv_0": {"kernel": 0}, "BatchNorm_0": {"scale": 0}, "Dense_0": {"kernel": 0}},
        "batch_stats": {"BatchNorm_0": {"mean": 0}},
    }
    flat = lambda m: {k: v for k, v in __import__("flax").traverse_util.flatten_dict(m).items()}
    fedbn = flat(aggregate.share_mask(variables, "fedbn"))
    assert fedbn[("params", "Conv_0", "kernel")] and fedbn[("params", "Dense_0", "kernel")]
    assert not fedbn[("params", "BatchNorm_0", "scale")]
    assert not fedbn[("batch_stats", "BatchNorm_0", "mean")]
    fedper = flat(aggregate.share_mask(variables, "fedper"))
    assert not fedper[("params", "Dense_0", "kernel")] and fedper[("params", "Conv_0", "kernel")]
    lg = flat(aggregate.share_mask(variables, "lg"))
    assert lg[("params", "Dense_0", "kernel")] and not lg[("params", "Conv_0", "kernel")]
    assert not any(flat(aggregate.share_mask(variables, "none")).values())
    assert aggregate.all_shared(aggregate.share_mask(variables, "all"))


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(0, 40), st.integers(1, 8), st.integers(1, 3), st.integers(0, 1000))
def test_epoch_batches_visit_each_example_once_per_epoch(count, batch, epochs, seed):
    n_max = 40
    sched = train.Schedule(batch_size=batch, epochs=epochs, steps=0)
    pos, valid = train.batch_positions(jax.random.PRNGKey(seed), jnp.int32(count), n_max, sched)
    pos, valid = np.asarray(pos), np.asarray(valid)
    assert pos.shape == (sched.num_steps(n_max), batch)
    per_epoch = pos.shape[0] // epochs
    for e in range(epochs):
        p = pos[e * per_epoch : (e + 1) * per_epoch][valid[e * per_epoch : (e + 1) * per_epoch]]
        assert sorted(p.tolist()) == list(range(count))


def test_masked_steps_leave_client_unchanged():
    """A client with no data runs the cohort's steps without moving (momentum included)."""
    from fedjax_semi.models.zoo import make_model

    model = make_model("mlp", (8, 8, 1), 10, hidden=(16,))
    variables = model.init(jax.random.PRNGKey(0))
    tx = optax.sgd(0.5, momentum=0.9)
    x = jnp.zeros((5, 8, 8, 1), jnp.uint8)
    y = jnp.zeros(5, jnp.int32)
    table = RoleTable(jnp.zeros(5, jnp.int32), jnp.int32(0))
    obj = train.LocalObjective(model)
    new, opt, stats = train.local_train(
        obj,
        tx,
        variables,
        tx.init(variables["params"]),
        x,
        y,
        table,
        train.Schedule(4, 2, 0),
        jax.random.PRNGKey(1),
        jax.random.PRNGKey(2),
    )
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(variables), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(stats["steps"]) == 0


def test_local_training_matches_manual_sgd():
    """lax.scan local training == a NumPy-driven loop of the same SGD steps."""
    from fedjax_semi.models.zoo import make_model

    model = make_model("mlp", (8, 8, 1), 10, hidden=(16,))
    variables = model.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 255, size=(30, 8, 8, 1)), jnp.uint8)
    y = jnp.asarray(rng.integers(0, 10, size=30), jnp.int32)
    idx = jnp.asarray(np.r_[rng.permutation(30)[:20], np.zeros(5, int)], jnp.int32)
    table = RoleTable(idx, jnp.int32(20))
    sched = train.Schedule(batch_size=8, epochs=2, steps=0)
    tx = optax.sgd(0.1)
    ks = jax.random.PRNGKey(3)
    new, _, stats = train.local_train(
        train.LocalObjective(model),
        tx,
        variables,
        tx.init(variables["params"]),
        x,
        y,
        table,
        sched,
        ks,
        jax.random.PRNGKey(4),
    )
    pos, valid = train.batch_positions(ks, jnp.int32(20), 25, sched)
    params = variables["params"]

    @jax.jit  # one program per batch size (op by op, every op would compile apart)
    def sgd_step(prm, ids):
        def loss(prm):
            logits, _ = model.apply({"params": prm}, x[ids])
            return train.cross_entropy(logits, y[ids]).mean()

        return jax.tree.map(lambda a, b: a - 0.1 * b, prm, jax.grad(loss)(prm))

    for p, v in zip(np.asarray(pos), np.asarray(valid), strict=True):
        if not v.any():
            continue
        params = sgd_step(params, np.asarray(idx)[p][v])
    for a, b in zip(jax.tree.leaves(new["params"]), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert int(stats["steps"]) == 2 * 3  # ceil(20 / 8) = 3 active steps per epoch


def test_client_keys_do_not_depend_on_chunk_position():
    seed = jax.random.PRNGKey(0)
    ids = jnp.arange(6)
    direct = jax.vmap(lambda c: keys.client_key(seed, keys.SAMPLE, 3, c))(ids)
    chunked = clients.map_clients(lambda c: keys.client_key(seed, keys.SAMPLE, 3, c), ids, chunk=4)
    np.testing.assert_array_equal(direct, chunked)
    one = keys.client_key(seed, keys.SAMPLE, 3, 5)
    np.testing.assert_array_equal(direct[5], one)


@pytest.mark.parametrize("chunk", [1, 2, 4, "all"])
def test_map_clients_matches_loop(chunk):
    xs = {"a": jnp.arange(10.0).reshape(5, 2)}
    fn = lambda x, s: x["a"] * s + 1
    got = jax.jit(lambda xs: clients.map_clients(fn, xs, 3.0, chunk=chunk))(xs)
    ref = clients.LoopMapper()(fn, xs, 3.0)
    np.testing.assert_allclose(got, ref)
    np.testing.assert_allclose(got, np.arange(10.0).reshape(5, 2) * 3 + 1)


@pytest.mark.parametrize("n", [1, 3])
def test_a_loop_of_clients_is_traced_unbatched_even_over_one(n):
    # chunk=1 is a loop for any number of clients, one included (a one-job vectorized group has
    # a replica axis of one): traced as batched, a client's steps past its data would run.
    from fedjax_semi.batching import clients_batched

    seen = []

    def fn(x):
        seen.append(clients_batched())
        return x + 1.0

    xs = jnp.zeros((n, 2))
    jax.jit(lambda xs: clients.map_clients(fn, xs, chunk=1))(xs)
    jax.jit(lambda xs: clients.map_clients(fn, xs, chunk="all"))(xs)
    assert seen == [False, True]


def test_cohort_sampling_is_uniform_without_replacement():
    seed = jax.random.PRNGKey(0)
    counts = np.zeros(20)
    for r in range(400):
        ids = np.asarray(clients.select_cohort(seed, r, 20, 5))
        assert len(set(ids.tolist())) == 5
        counts[ids] += 1
    assert counts.min() > 60 and counts.max() < 140  # expected 100 each


def test_evaluate_indices_matches_numpy():
    from fedjax_semi.models.zoo import make_model

    model = make_model("mlp", (8, 8, 1), 10, hidden=(16,))
    variables = model.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 255, size=(50, 8, 8, 1)), jnp.uint8)
    y = jnp.asarray(rng.integers(0, 10, size=50), jnp.int32)
    idx = jnp.asarray(rng.permutation(50)[:37], jnp.int32)
    got = train.evaluate_indices(model, variables, x, y, idx, batch=8)
    logits, _ = model.apply(variables, x[idx])
    acc = np.mean(np.argmax(np.asarray(logits), -1) == np.asarray(y)[np.asarray(idx)])
    assert float(got["accuracy"]) == pytest.approx(acc)


@pytest.mark.parametrize("name", ["sgd", "adam", "rmsprop", "lion"])
def test_any_optax_optimizer_trains(name):
    params = {"w": jnp.ones(3)}
    tx = train.make_optimizer(name, 0.1, momentum=0.9, weight_decay=0.01)
    state = tx.init(params)
    updates, state = tx.update({"w": jnp.ones(3)}, state, params)
    assert float(optax.apply_updates(params, updates)["w"][0]) < 1.0


def test_unknown_optimizer_names_the_key():
    with pytest.raises(ValueError, match=r"algorithm.optimizer='nope'.*sgd"):
        train.make_optimizer("nope", 0.1)


def test_masked_batchnorm_equals_bn_on_the_valid_rows():
    from fedjax_semi.models.zoo import make_model

    model = make_model("resnet9", (8, 8, 1), 4, width=0.0625)
    v = jax.jit(model.init)(jax.random.PRNGKey(0))
    # One compiled program per call (op-by-op dispatch of a ResNet compiles every op apart).
    apply = jax.jit(functools.partial(model.apply, train=True))
    x = jax.random.randint(jax.random.PRNGKey(1), (6, 8, 8, 1), 0, 255).astype(jnp.uint8)
    mask = jnp.asarray([True, True, False, True, False, True])
    masked, s1 = apply(v, x, mask=mask)
    subset, s2 = apply(v, x[mask])
    np.testing.assert_allclose(masked[mask], subset, atol=1e-4)
    for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # The mask matters: with every row valid (the same compiled program, mask is an argument),
    # the statistics take in the other rows too.
    every, _ = apply(v, x, mask=jnp.ones_like(mask))
    assert float(jnp.abs(every[mask] - subset).max()) > 1e-4


# ResNet-9 compiles three training scans for a minute: a long check (make test-slow); the MLP
# checks the same masking in the fast suite, and the BatchNorm mask has its own test above.
@pytest.mark.parametrize("name", ["mlp", pytest.param("resnet9", marks=pytest.mark.slow)])
def test_padding_does_not_change_training(name):
    """A client padded to a wider table trains to the same parameters (same keys)."""
    from fedjax_semi.models.zoo import make_model

    model = make_model(name, (8, 8, 1), 4, hidden=(16,), width=0.0625)
    variables = model.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 255, size=(40, 8, 8, 1)), jnp.uint8)
    y = jnp.asarray(rng.integers(0, 4, size=40), jnp.int32)
    own = rng.permutation(40)[:10]
    tx = optax.sgd(0.1, momentum=0.9)
    results = []
    for n_max in (10, 13, 24):
        idx = jnp.asarray(np.r_[own, np.zeros(n_max - 10, int)], jnp.int32)
        new, _, _ = train.local_train(
            train.LocalObjective(model), tx, variables, tx.init(variables["params"]), x, y,
            RoleTable(idx, jnp.int32(10)), train.Schedule(4, 2, 0),
            jax.random.PRNGKey(3), jax.random.PRNGKey(4),
        )  # fmt: skip
        results.append(new)
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), results[0], variables)
    assert max(jax.tree.leaves(moved)) > 1e-3  # it trained: equal results are not three no-ops
    for other in results[1:]:
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(other), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_jit_forwarding_inputs_hands_back_unchanged_inputs_without_a_copy():
    """The reference backend's prepare/finish: same values as jax.jit, and an input returned
    unchanged is the input array itself (a jitted call would copy it, e.g. the whole dataset)."""

    def prepare(state, data):
        return {"n": state["round"] + 1, "x": data["x"], "ids": data["ids"][:2] * 2}, data["x"]

    state = {"round": jnp.asarray(3)}
    data = {"x": jnp.arange(12.0).reshape(4, 3), "ids": jnp.arange(4)}
    fast = clients.jit_forwarding_inputs(prepare)
    for _ in range(2):  # the second call reuses the compiled program
        got, x = fast(state, data)
        want, _ = jax.jit(prepare)(state, data)
        assert got["x"] is data["x"] and x is data["x"]
        assert int(got["n"]) == 4
        np.testing.assert_array_equal(got["ids"], want["ids"])
        assert jax.tree.structure(got) == jax.tree.structure(want)
