"""Vmap- and scan-friendly building blocks for per-client models.

Every client's parameters live on a leading array axis, so models are run under
``jax.vmap`` (and inside ``lax.scan``/``lax.map``). Under vmap, ``flax.linen.Conv``
with per-client kernels lowers to a grouped convolution that XLA:CPU runs ~6x
slower, and its weight-gradient inside ``lax.scan`` is ~30x slower. Expressing the
convolution as im2col + one matmul (a batched ``dot_general`` under vmap) avoids
both. For one client at a time (no vmap: ``chunk=1``, the reference loop, the server), XLA's
own convolution is faster still, provided its gradient is written as two forward
convolutions in the canonical NHWC/HWIO layout (:func:`lax_conv`): XLA:CPU runs the
convolutions that autodiff emits 6-31x slower inside a loop body. :class:`Conv`'s
``impl="auto"`` picks im2col under a vmap over clients and :func:`lax_conv` otherwise. Which is
faster for one client depends on the model (measured in docs/benchmarks.md): im2col for the
FedAvg CNN and simple_cnn (training-bound), auto for ResNet-9 under UM-pFSSL (forward-heavy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_semi.batching import clients_batched

Array = jax.Array
Initializer = Callable[..., Any]

_PADDINGS = ("SAME", "VALID")
_IMPLS = ("auto", "im2col", "lax", "xla")


def _same_pads(k: int) -> tuple[int, int]:
    """(low, high) padding that XLA's "SAME" uses for stride 1 and kernel size ``k``."""
    lo = (k - 1) // 2
    return lo, k - 1 - lo


class Conv(nn.Module):
    """Stride-1 2-D convolution with the same parameters as ``nn.Conv``.

    Input ``x``: ``[B, H, W, Cin]`` (NHWC). Output: ``[B, H', W', features]`` where
    ``H' = H`` for ``"SAME"`` and ``H' = H - kh + 1`` for ``"VALID"`` (likewise ``W'``).
    Parameters: ``kernel [kh, kw, Cin, features]`` and ``bias [features]`` - identical
    names and shapes to ``nn.Conv`` so the two are interchangeable on one param tree.

    Attributes:
        features: number of output channels.
        kernel_size: ``(kh, kw)``.
        padding: ``"SAME"`` or ``"VALID"``.
        use_bias: whether to add a bias.
        impl: ``"im2col"`` (shifted slices + one matmul; fast under vmap/scan on CPU),
            ``"auto"`` (``"im2col"`` while traced under a vmap over clients, else ``"lax"``),
            ``"lax"`` (:func:`lax_conv`: XLA's convolution with canonical-layout gradient
            convolutions) or ``"xla"`` (``lax.conv_general_dilated`` with autodiff's
            gradient; slow inside loops on XLA:CPU, for comparison).
        kernel_init: kernel initializer (``lecun_normal`` like ``nn.Conv``).
        bias_init: bias initializer (zeros like ``nn.Conv``).
    """

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    padding: str = "SAME"
    use_bias: bool = True
    impl: str = "im2col"
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: Array) -> Array:
        if self.padding not in _PADDINGS:
            raise ValueError(f"Conv.padding must be one of {_PADDINGS}, got {self.padding!r}")
        if self.impl not in _IMPLS:
            raise ValueError(f"Conv.impl must be one of {_IMPLS}, got {self.impl!r}")
        kh, kw = self.kernel_size
        cin = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (kh, kw, cin, self.features), jnp.float32)
        x = x.astype(jnp.float32)
        impl = self.impl
        if impl == "auto":
            impl = "im2col" if clients_batched() else "lax"
        if impl == "lax":
            y = lax_conv(x, kernel, self.padding)
        elif impl == "xla":
            y = jax.lax.conv_general_dilated(
                x,
                kernel,
                window_strides=(1, 1),
                padding=self.padding,
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
        else:
            y = _im2col_conv(x, kernel, self.padding)
        if self.use_bias:
            bias = self.param("bias", self.bias_init, (self.features,), jnp.float32)
            y = y + bias
        return y


def _conv_pads(kernel_shape: tuple[int, ...], padding: str) -> tuple[tuple[int, int], ...]:
    """Explicit (low, high) padding of H and W for a stride-1 "SAME" or "VALID" convolution."""
    kh, kw = kernel_shape[:2]
    if padding == "SAME":
        return _same_pads(kh), _same_pads(kw)
    return (0, 0), (0, 0)


_NHWC = ("NHWC", "HWIO", "NHWC")


def _canonical_conv(x: Array, kernel: Array, pads) -> Array:
    """Stride-1 conv of x ``[N, H, W, C]`` with kernel ``[kh, kw, C, F]`` in NHWC/HWIO."""
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), pads, dimension_numbers=_NHWC)


# `pads` (a nested tuple of ints) is static, not differentiated.
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lax_conv(x: Array, kernel: Array, pads) -> Array:
    return _canonical_conv(x, kernel, pads)


def _lax_conv_fwd(x, kernel, pads):
    return _canonical_conv(x, kernel, pads), (x, kernel)


def _lax_conv_bwd(pads, res, dy):
    # Both gradients as forward convolutions with explicit transposes, so every convolution XLA
    # sees is NHWC/HWIO (autodiff's own transposes are not, and XLA:CPU runs them far slower
    # inside loop bodies).
    x, kernel = res
    kh, kw = kernel.shape[:2]
    (plo, phi), (qlo, qhi) = pads
    # dx: the "full" correlation of dy with the flipped kernel, its in/out channels swapped.
    flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
    dx = _canonical_conv(dy, flipped, ((kh - 1 - plo, kh - 1 - phi), (kw - 1 - qlo, kw - 1 - qhi)))
    # dkernel[i, j, c, f] = sum_{b,h,w} xpad[b, h+i, w+j, c] dy[b, h, w, f]: a VALID conv of the
    # channels-as-batch input [C, Hp, Wp, B] with dy as a kernel [Ho, Wo, B, F].
    xpad = jnp.pad(x, ((0, 0), (plo, phi), (qlo, qhi), (0, 0)))
    dk = _canonical_conv(xpad.transpose(3, 1, 2, 0), dy.transpose(1, 2, 0, 3), ((0, 0), (0, 0)))
    return dx, dk.transpose(1, 2, 0, 3)


_lax_conv.defvjp(_lax_conv_fwd, _lax_conv_bwd)


def lax_conv(x: Array, kernel: Array, padding: str) -> Array:
    """Stride-1 conv, x ``[B, H, W, Cin]``, kernel ``[kh, kw, Cin, F]`` -> ``[B, H', W', F]``:
    XLA's convolution, with a custom gradient of two canonical-layout forward convolutions
    (equal to autodiff's up to float32 summation order)."""
    return _lax_conv(x, kernel, _conv_pads(kernel.shape, padding))


def _im2col_conv(x: Array, kernel: Array, padding: str) -> Array:
    """im2col conv: x ``[B, H, W, Cin]``, kernel ``[kh, kw, Cin, F]`` -> ``[B, H', W', F]``."""
    kh, kw, cin, feats = kernel.shape
    if padding == "SAME":
        x = jnp.pad(x, ((0, 0), _same_pads(kh), _same_pads(kw), (0, 0)))
    ho, wo = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    # Patch order (i, j, c) matches the row-major flattening of the HWIO kernel.
    cols = jnp.concatenate(
        [x[:, i : i + ho, j : j + wo, :] for i in range(kh) for j in range(kw)], axis=-1
    )
    return cols @ kernel.reshape(kh * kw * cin, feats)


class Dropout(nn.Module):
    """Inverted dropout controlled by an explicit ``active`` flag.

    Separate from BatchNorm's train/eval switch because MC dropout needs dropout ON
    with BatchNorm in inference mode. Uses the ``'dropout'`` rng stream when active.

    Attributes:
        rate: drop probability in ``[0, 1)``.
    """

    rate: float

    @nn.compact
    def __call__(self, x: Array, active: bool) -> Array:
        """x: any shape -> same shape; identity unless ``active`` and ``rate > 0``."""
        if not active or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        mask = jax.random.bernoulli(self.make_rng("dropout"), keep, x.shape)
        return jnp.where(mask, x / keep, jnp.zeros_like(x))


def _pool(x: Array, window: int, reduce: Callable[..., Array]) -> Array:
    """Non-overlapping pooling over axes (-3, -2) of ``[..., H, W, C]`` via reshape."""
    *lead, h, w, c = x.shape
    ho, wo = h // window, w // window
    # Floor semantics (VALID): drop the trailing rows/cols that do not fill a window.
    x = x[..., : ho * window, : wo * window, :]
    x = x.reshape(*lead, ho, window, wo, window, c)
    return reduce(x, axis=(-4, -2))


def max_pool(x: Array, window: int = 2) -> Array:
    """Max pool with stride = window, VALID. ``[..., H, W, C] -> [..., H//w, W//w, C]``."""
    return _pool(x, window, jnp.max)


def avg_pool(x: Array, window: int = 2) -> Array:
    """Average pool with stride = window, VALID. ``[..., H, W, C] -> [..., H//w, W//w, C]``."""
    return _pool(x, window, jnp.mean)


def global_max_pool(x: Array) -> Array:
    """Max over spatial axes. ``[..., H, W, C] -> [..., C]``."""
    return jnp.max(x, axis=(-3, -2))


def adaptive_avg_pool(x: Array, size: int) -> Array:
    """PyTorch's AdaptiveAvgPool2d to ``size x size``: ``[..., H, W, C] -> [..., size, size, C]``.

    Output cell i averages input rows floor(i H / size) .. ceil((i + 1) H / size) - 1 (and the
    same over W), so it works for any H, W >= 1 (28x28 inputs give overlapping cells). Written as
    two pooling matrices, so it is a pair of matmuls under vmap."""
    *_, h, w, _ = x.shape
    return jnp.einsum("ih,...hwc,jw->...ijc", _pool_matrix(h, size), x, _pool_matrix(w, size))


def _pool_matrix(n: int, size: int) -> Array:
    """[size, n]: row i holds 1 / len over the inputs of adaptive cell i, 0 elsewhere."""
    rows = []
    for i in range(size):
        lo, hi = (i * n) // size, -((-(i + 1) * n) // size)
        rows.append([1.0 / (hi - lo) if lo <= j < hi else 0.0 for j in range(n)])
    return jnp.asarray(rows, jnp.float32)
