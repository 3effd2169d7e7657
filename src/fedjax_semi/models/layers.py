"""Vmap- and scan-friendly building blocks for per-client models.

Every client's parameters live on a leading array axis, so models are run under
``jax.vmap`` (and inside ``lax.scan``/``lax.map``). Under vmap, ``flax.linen.Conv``
with per-client kernels lowers to a grouped convolution that XLA:CPU runs ~6x
slower, and its weight-gradient inside ``lax.scan`` is ~30x slower. Expressing the
convolution as im2col + one matmul (a batched ``dot_general`` under vmap) avoids
both, so :class:`Conv` defaults to that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Initializer = Callable[..., Any]

_PADDINGS = ("SAME", "VALID")
_IMPLS = ("im2col", "xla")


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
        impl: ``"im2col"`` (shifted slices + one matmul; fast under vmap/scan on CPU) or
            ``"xla"`` (``lax.conv_general_dilated``; for comparison).
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
        if self.impl == "xla":
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
