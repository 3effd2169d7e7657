"""FixMatch augmentation in JAX: weak (flip + translate) and strong (weak + RandAugment + Cutout),
one key per sample, vmappable over batch and clients. FixMatch (Sohn et al., NeurIPS 2020) is
the pseudo-labeling of UM-pFSSL's baselines FixAvg, FixProx, FixBN, FedPer, LG-FedAvg and pFedMe
(UM-pFSSL paper, Sec. 6.1).

Images are float [H, W, C] in [0, 255]. RandAugment draws 2 ops uniformly from OPS, each with a
random magnitude in [0, 1]. Colour ops are identities on grayscale and are left out; equalize and
sharpness are left out too (see docs/deviations.md).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

FILL = 128.0  # grey fill for pixels moved in from outside the image


def _affine(x: jax.Array, matrix: jax.Array) -> jax.Array:
    """Nearest-neighbour warp about the image centre: out(p) = x(matrix @ (p - c) + c)."""
    h, w, _ = x.shape
    ys, xs = jnp.meshgrid(jnp.arange(h), jnp.arange(w), indexing="ij")
    c = jnp.array([(h - 1) / 2, (w - 1) / 2])
    p = jnp.stack([ys.ravel() - c[0], xs.ravel() - c[1]])
    src = jnp.round(matrix @ p + c[:, None]).astype(jnp.int32)
    inside = (src[0] >= 0) & (src[0] < h) & (src[1] >= 0) & (src[1] < w)
    vals = x[jnp.clip(src[0], 0, h - 1), jnp.clip(src[1], 0, w - 1)]
    return jnp.where(inside[:, None], vals, FILL).reshape(x.shape)


def _rotate(x, m):
    a = jnp.deg2rad(30.0 * (2 * m - 1))
    return _affine(x, jnp.array([[jnp.cos(a), -jnp.sin(a)], [jnp.sin(a), jnp.cos(a)]]))


def _shear_x(x, m):
    return _affine(x, jnp.array([[1.0, 0.0], [0.3 * (2 * m - 1), 1.0]]))


def _shear_y(x, m):
    return _affine(x, jnp.array([[1.0, 0.3 * (2 * m - 1)], [0.0, 1.0]]))


def _translate(x, m, axis):
    shift = jnp.round(0.3 * x.shape[axis] * (2 * m - 1)).astype(jnp.int32)
    idx = jnp.arange(x.shape[axis]) - shift
    ok = (idx >= 0) & (idx < x.shape[axis])
    moved = jnp.take(x, jnp.clip(idx, 0, x.shape[axis] - 1), axis=axis)
    shape = [1, 1, 1]
    shape[axis] = -1
    return jnp.where(ok.reshape(shape), moved, FILL)


def _autocontrast(x, m):
    lo, hi = x.min(), x.max()
    return jnp.where(hi > lo, (x - lo) * 255.0 / jnp.maximum(hi - lo, 1e-6), x)


def _brightness(x, m):
    return jnp.clip(x * (0.05 + 1.9 * m), 0, 255)


def _contrast(x, m):
    mean = x.mean()
    return jnp.clip(mean + (x - mean) * (0.05 + 1.9 * m), 0, 255)


def _posterize(x, m):
    bits = 4 + jnp.round(4 * m)  # keep 4..8 bits
    step = 2.0 ** (8 - bits)
    return jnp.floor(x / step) * step


def _solarize(x, m):
    threshold = 256.0 * (1 - m)
    return jnp.where(x >= threshold, 255.0 - x, x)


OPS = (
    lambda x, m: x,  # identity
    _autocontrast,
    _brightness,
    _contrast,
    _posterize,
    _rotate,
    _shear_x,
    _shear_y,
    _solarize,
    lambda x, m: _translate(x, m, 0),
    lambda x, m: _translate(x, m, 1),
)


def weak(x: jax.Array, key: jax.Array) -> jax.Array:
    """Random horizontal flip (p = 0.5) and translation by up to 12.5% with reflect padding."""
    kf, kt = jax.random.split(key)
    h, w, _ = x.shape
    x = jnp.where(jax.random.bernoulli(kf), x[:, ::-1], x)
    ph, pw = max(1, round(0.125 * h)), max(1, round(0.125 * w))
    padded = jnp.pad(x, ((ph, ph), (pw, pw), (0, 0)), mode="reflect")
    dy = jax.random.randint(kt, (), 0, 2 * ph + 1)
    dx = jax.random.randint(jax.random.fold_in(kt, 1), (), 0, 2 * pw + 1)
    return jax.lax.dynamic_slice(padded, (dy, dx, 0), x.shape)


def cutout(x: jax.Array, key: jax.Array) -> jax.Array:
    """A grey square of side up to half the image at a random centre."""
    h, w, _ = x.shape
    ks, kc = jax.random.split(key)
    side = jax.random.randint(ks, (), 1, max(2, h // 2) + 1)
    cy = jax.random.randint(kc, (), 0, h)
    cx = jax.random.randint(jax.random.fold_in(kc, 1), (), 0, w)
    ys, xs = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
    box = (jnp.abs(ys - cy) * 2 < side) & (jnp.abs(xs - cx) * 2 < side)
    return jnp.where(box[..., None], FILL, x)


def strong(x: jax.Array, key: jax.Array, num_ops: int = 2) -> jax.Array:
    """weak + RandAugment (num_ops random ops, random magnitudes) + Cutout."""
    kw, kc, *kops = jax.random.split(key, 2 + num_ops)
    x = weak(x, kw)
    for k in kops:
        op = jax.random.randint(k, (), 0, len(OPS))
        m = jax.random.uniform(jax.random.fold_in(k, 1))
        x = jax.lax.switch(op, OPS, x, m)
    return cutout(x, kc)


def augment_batch(
    fn: Callable[[jax.Array, jax.Array], jax.Array], x: jax.Array, key: jax.Array
) -> jax.Array:
    """Apply a per-image augmentation to uint8/float [B, H, W, C] with one key per sample.

    Returns float32 in [0, 255] (models preprocess float input with the same /255 formula).
    """
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(fn)(x.astype(jnp.float32), keys)
