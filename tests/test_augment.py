"""FixMatch augmentations: shapes, ranges, determinism, and what each op does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.engine import augment


def image(seed=0, shape=(12, 12, 1)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, shape), jnp.float32)


@pytest.mark.parametrize("fn", [augment.weak, augment.strong, augment.cutout])
def test_shape_range_and_determinism(fn):
    x = image()
    a = fn(x, jax.random.PRNGKey(1))
    assert a.shape == x.shape and a.dtype == jnp.float32
    assert float(a.min()) >= 0 and float(a.max()) <= 255
    np.testing.assert_array_equal(a, fn(x, jax.random.PRNGKey(1)))
    outs = {np.asarray(fn(x, jax.random.PRNGKey(s))).tobytes() for s in range(8)}
    assert len(outs) > 1  # random


def test_weak_is_a_flip_and_shift_of_the_input():
    x = image(shape=(16, 16, 1))
    pad = np.pad(np.asarray(x), ((2, 2), (2, 2), (0, 0)), mode="reflect")
    for s in range(10):
        out = np.asarray(augment.weak(x, jax.random.PRNGKey(s)))
        crops = [
            src[dy : dy + 16, dx : dx + 16]
            for src in (pad, pad[:, ::-1])
            for dy in range(5)
            for dx in range(5)
        ]
        assert any(np.array_equal(out, c) for c in crops)


def test_each_op_keeps_shape_and_identity_is_identity():
    x = image()
    for op in augment.OPS:
        y = op(x, jnp.float32(0.7))
        assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y)))
    np.testing.assert_array_equal(augment.OPS[0](x, 0.3), x)
    np.testing.assert_allclose(augment._rotate(x, jnp.float32(0.5)), x)  # 0 degrees
    np.testing.assert_array_equal(augment._solarize(x, jnp.float32(0.0)), x)


def test_cutout_greys_a_square():
    x = jnp.zeros((14, 14, 1))
    out = np.asarray(augment.cutout(x, jax.random.PRNGKey(3)))
    grey = out[..., 0] == augment.FILL
    assert 0 < grey.sum() <= 7 * 7
    rows, cols = np.where(grey)
    assert grey[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()  # a rectangle


def test_batch_uses_one_key_per_sample():
    x = jnp.stack([image(0)] * 4)
    # Jitted, as in training (op by op the vmapped switch runs every op's primitives one by one).
    batch = jax.jit(augment.augment_batch, static_argnums=0)
    out = batch(augment.strong, x.astype(jnp.uint8), jax.random.PRNGKey(0))
    assert out.shape == x.shape
    assert len({np.asarray(o).tobytes() for o in out}) > 1
