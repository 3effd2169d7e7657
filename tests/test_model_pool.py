"""Tests for fedjax_semi.models.pool: CoFED's Table-1 / random CNN pool and grouped execution."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.errors import ConfigError
from fedjax_semi.models import make_model, num_params
from fedjax_semi.models.pool import (
    POOLS,
    TABLE1,
    FilterCNN,
    gather_rows,
    group_members,
    init_groups,
    make_pool_models,
    pool_filters,
    random_filters,
    scatter_rows,
)

K = 10


def _base(shape: tuple[int, ...], conv_impl: str = "im2col"):
    """A registered model carrying the input spec the pool models copy."""
    return make_model("cnn", shape, K, mean=(0.5,), std=(0.25,), width=0.125, conv_impl=conv_impl)


def _images(shape: tuple[int, ...], batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (batch, *shape), dtype=np.uint8)


def _expected_params(shape: tuple[int, ...], filters: tuple[int, ...]) -> int:
    """By hand: 3x3 SAME convs (9 * cin * cout + cout), each halving H and W (floor), then the
    dense on the flattened last feature map."""
    h, w, cin = shape
    total = 0
    for c in filters:
        total += 9 * cin * c + c
        h, w, cin = h // 2, w // 2, c
    return total + h * w * cin * K + K


def _random_variables(model, seed: int) -> dict:
    """Variables of ``model``'s shapes drawn with NumPy (He-scaled kernels, non-zero biases):
    distinct per client like ``model.init`` but with no init program to compile."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(model.init, jax.random.key(0))

    def draw(s):
        scale = math.sqrt(2 / math.prod(s.shape[:-1])) if len(s.shape) > 1 else 0.1
        return (scale * rng.standard_normal(s.shape)).astype(np.float32)

    return jax.tree_util.tree_map(draw, shapes)


def test_table1_is_the_papers_table() -> None:
    # CoFED Table 1, Models 1-10 (filters of the 3x3 conv layers).
    assert TABLE1 == (
        (24, 40),
        (24, 32, 56),
        (20, 32),
        (24, 40, 56),
        (20, 32, 80),
        (24, 32, 80),
        (32, 32),
        (40, 56),
        (32, 48),
        (48, 56, 96),
    )


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_parameter_counts_of_table1_models(shape: tuple[int, ...]) -> None:
    models = make_pool_models(_base(shape), TABLE1)
    # The hand formula worked out: Model 1 on 28x28x1 (28 -> 14 -> 7) is 240 + 8,680 + 19,610;
    # Model 10 on 32x32x3 (32 -> 16 -> 8 -> 4) is 1,344 + 24,248 + 48,480 + 15,370.
    assert _expected_params((28, 28, 1), TABLE1[0]) == 28_530
    assert _expected_params((32, 32, 3), TABLE1[9]) == 89_442
    for filters, model in zip(TABLE1, models, strict=True):
        # eval_shape traces model.init without compiling it (test_init_groups_... counts the
        # parameters of really initialized variables of Models 1 and 2 as well).
        variables = jax.eval_shape(model.init, jax.random.key(0))
        assert num_params(variables) == _expected_params(shape, filters), filters


def test_make_pool_models_copies_the_base_spec() -> None:
    base = _base((32, 32, 3), conv_impl="xla")
    models = make_pool_models(base, [(24, 40), (48, 56, 96)])
    assert [m.name for m in models] == ["cnn24-40", "cnn48-56-96"]
    for m in models:
        assert (m.input_shape, m.num_classes, m.mean, m.std) == ((32, 32, 3), K, (0.5,), (0.25,))
        assert m.input_kind == "image" and not m.has_batch_stats and not m.has_dropout
        assert isinstance(m.module, FilterCNN)
        assert m.module.conv_impl == "xla" and m.module.dropout == 0.0
    assert models[1].module.filters == (48, 56, 96)


def test_init_he_normal_convs_glorot_dense_zero_biases() -> None:
    (model,) = make_pool_models(_base((32, 32, 3)), [(48, 56)])
    params = jax.jit(model.init)(jax.random.key(1))["params"]
    for i, cin in enumerate([3, 48]):
        conv = params[f"Conv_{i}"]
        assert not np.any(conv["bias"])
        # He-normal: std sqrt(2 / fan_in), fan_in = 9 * cin (1296+ samples: within 10 %).
        assert np.std(conv["kernel"]) == pytest.approx(math.sqrt(2 / (9 * cin)), rel=0.1)
    dense = params["Dense_0"]
    assert not np.any(dense["bias"])
    fan_in, fan_out = dense["kernel"].shape
    bound = math.sqrt(6 / (fan_in + fan_out))  # Glorot-uniform on [-bound, bound]
    assert np.max(np.abs(dense["kernel"])) <= bound
    assert np.std(dense["kernel"]) == pytest.approx(bound / math.sqrt(3), rel=0.1)


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_output_shape_and_im2col_equals_xla(shape: tuple[int, ...]) -> None:
    filters = (20, 32, 80)
    (im2col,) = make_pool_models(_base(shape, "im2col"), [filters])
    (xla,) = make_pool_models(_base(shape, "xla"), [filters])
    variables = _random_variables(im2col, 2)
    x = _images(shape, 3)
    got, state = jax.jit(im2col.apply)(variables, x)
    want, _ = jax.jit(xla.apply)(variables, x)
    assert got.shape == (3, K) and got.dtype == jnp.float32 and state == {}
    # Same math, different float32 summation order (one matmul over 9 * cin vs XLA's conv).
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    # mc (MC dropout) changes nothing at dropout 0.
    mc = jax.jit(lambda v, x: im2col.apply(v, x, mc=True)[0])(variables, x)
    np.testing.assert_allclose(mc, got, atol=1e-6, rtol=1e-6)


def test_grouped_execution_equals_per_client_execution() -> None:
    shape, num_clients = (28, 28, 1), 12
    groups, assign = pool_filters("table1", num_clients, seed=0)
    members = group_members(assign, len(groups))
    assert [len(ids) for ids in members] == [2, 2] + [1] * 8
    models = make_pool_models(_base(shape), groups)
    x = _images(shape, 4, seed=1)
    # Each client's own variables (seeded by its id); model.init's per-key draws are checked
    # in test_init_groups_draws_each_client_from_its_own_key (init programs compile slowly).
    own = [_random_variables(models[assign[i]], seed=i) for i in range(num_clients)]

    # Grouped: per group one stacked tree [Cg, ...] and one vmapped apply, jitted (one
    # compile per program beats op-by-op dispatch).
    per_group = []
    for m, ids in zip(models, members, strict=True):
        stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *[own[i] for i in ids])
        per_group.append(jax.jit(jax.vmap(lambda v, m=m: m.apply(v, x)[0]))(stacked))
    grouped = scatter_rows(per_group, members)  # [C, B, K]
    assert grouped.shape == (num_clients, 4, K)

    alone_fns = [jax.jit(lambda v, m=m: m.apply(v, x)[0]) for m in models]  # nothing vmapped
    for i in range(num_clients):
        logits = alone_fns[assign[i]](own[i])
        # vmap batches the matmuls; float32 sums may be ordered differently, hence atol.
        np.testing.assert_allclose(grouped[i], logits, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(np.argmax(grouped[i], -1), np.argmax(logits, -1))


def test_init_groups_draws_each_client_from_its_own_key() -> None:
    shape = (28, 28, 1)
    groups, assign = pool_filters("table1", 12, seed=0)
    members = group_members(assign, len(groups))[:2]  # the two groups of two clients
    models = make_pool_models(_base(shape), groups[:2])
    keys = jax.random.split(jax.random.key(3), 12)
    stacked = init_groups(models, keys, members)
    for m, ids, variables in zip(models, members, stacked, strict=True):
        init = jax.jit(m.init)
        for row, i in enumerate(ids):
            alone = init(keys[i])
            assert num_params(alone) == _expected_params(shape, m.module.filters)
            # The same draws from the client's own key, up to float32 rounding of the
            # truncated normal (the vmapped and plain init programs are compiled apart).
            jax.tree_util.tree_map(
                lambda a, b, r=row: np.testing.assert_allclose(a[r], b, rtol=1e-6, atol=1e-7),
                variables,
                alone,
            )


def test_random_filters_deterministic_and_in_range() -> None:
    drawn = random_filters(7, 200)
    assert drawn == random_filters(7, 200)
    assert drawn != random_filters(8, 200)
    assert random_filters(7, 50) == drawn[:50]
    assert {len(f) for f in drawn} == {2, 3}
    for f in drawn:
        assert f[0] in (20, 24, 32, 40, 48)
        assert f[1] in (32, 40, 48, 56) and f[1] >= f[0]
        if len(f) == 3:
            assert f[2] in (56, 64, 80, 96)
    assert all(isinstance(c, int) for f in drawn for c in f)


def test_pool_filters_table1_round_robin() -> None:
    groups, assign = pool_filters("table1", 25, seed=0)
    assert groups == TABLE1
    assert assign.dtype == np.int32
    np.testing.assert_array_equal(assign, np.arange(25) % 10)
    few, assign = pool_filters("table1", 4, seed=0)
    assert few == TABLE1[:4]
    np.testing.assert_array_equal(assign, [0, 1, 2, 3])


def test_pool_filters_random_cnn_deduplicates() -> None:
    drawn = random_filters(5, 100)
    groups, assign = pool_filters("random_cnn", 100, seed=5)
    assert assign.shape == (100,) and assign.dtype == np.int32
    assert len(set(groups)) == len(groups) < 100  # distinct, and some clients share
    for i, f in enumerate(drawn):
        assert groups[assign[i]] == f
    members = group_members(assign, len(groups))
    assert sorted(np.concatenate(members).tolist()) == list(range(100))
    assert all(len(ids) > 0 and np.all(np.diff(ids) > 0) for ids in members)


def test_pool_filters_single_and_unknown() -> None:
    groups, assign = pool_filters("single", 6, seed=0)
    assert groups == ((24, 40, 56),) == (TABLE1[3],)
    np.testing.assert_array_equal(assign, np.zeros(6))
    assert pool_filters("single", 3, 0, single=(32, 32))[0] == ((32, 32),)
    assert "table1" in POOLS
    with pytest.raises(ConfigError, match="algorithm.model_pool"):
        pool_filters("resnet_zoo", 6, seed=0)


def test_scatter_rows_restores_client_order() -> None:
    assign = np.array([2, 0, 1, 0, 2, 2], np.int32)
    members = group_members(assign, 3)
    assert [ids.tolist() for ids in members] == [[1, 3], [2], [0, 4, 5]]
    full = np.arange(6 * 2).reshape(6, 2) * 10
    per_group = gather_rows(full, members)
    back = scatter_rows(per_group, members)
    assert isinstance(back, np.ndarray)
    np.testing.assert_array_equal(back, full)
    back_jax = scatter_rows([jnp.asarray(p) for p in per_group], members)
    assert isinstance(back_jax, jax.Array)
    np.testing.assert_array_equal(back_jax, full)
    with pytest.raises(ValueError, match="once each"):
        scatter_rows(per_group[:2], members[:2])
