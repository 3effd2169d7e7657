"""VGG-9 of FedMA (Wang et al. 2020), Ada-FedSemi's CIFAR-10 / STL-10 model (its Sec. 5.1:
"6 conv + 3 FC, 3.49 M parameters"): 3,491,530 parameters for 10 classes on 32x32x3; and its
multi-exit form for HeteroAda-FedSemi (Sec. 4.1, Eqs. 19-20; Sec. 5.8: auxiliary classifiers
after the 2nd and the 4th convolution, so three sub-models H^1, H^2, H^3).

Same call signature as `models.architectures`: ``module(x, train, mc)`` on ``[B, H, W, C]``
float images -> logits ``[B, num_classes]``; dropout is on with ``train`` or ``mc``. No
BatchNorm. FedMA's dropout rates are 0.05 after conv4 and 0.1 before FC7 and after FC8: here
``dropout`` is the FC rate (0.1 in `conf/model/vgg9.yaml`) and conv4's is half of it.

Both modules build their layers with the same two functions (`_conv`, `_classifier`), so the
multi-exit model holds the plain VGG-9's parameters under the same names (Conv_0..Conv_5,
Dense_0..Dense_2) plus its two auxiliary classifiers (exit1, exit2).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_semi.models.architectures import _flatten, scaled
from fedjax_semi.models.layers import Conv, Dropout, adaptive_avg_pool, max_pool

Array = jax.Array

# (output channels, max-pool after it, dropout after it as a fraction of the FC rate), conv1..6
VGG9_CONVS: tuple[tuple[int, bool, float], ...] = (
    (32, False, 0.0),
    (64, True, 0.0),
    (128, False, 0.0),
    (128, True, 0.5),
    (256, False, 0.0),
    (256, True, 0.0),
)
# Sec. 5.8: exits after conv2 and conv4 (part b ends with conv EXIT_AFTER[b - 1]); each
# auxiliary classifier c^b is an adaptive average pool to EXIT_POOL[b - 1]^2 cells, flatten,
# one dense layer (the paper gives no design; these match Table 9's 0.11 / 1.00 MB sizes).
EXIT_AFTER: tuple[int, ...] = (2, 4)
EXIT_POOL: tuple[int, ...] = (4, 2)
NUM_PARTS = len(EXIT_AFTER) + 1  # L (the paper's B): H^1 .. H^L, H^L the full model
EXIT_OUTPUTS = ("final", "all")


def _conv(x: Array, i: int, width: float, dropout: float, impl: str, active: bool) -> Array:
    """Conv i (0-based) of VGG9_CONVS with its ReLU, pool and dropout, built in the calling
    module (flax binds layers made in a compact method's call to that module)."""
    c, pool, rate = VGG9_CONVS[i]
    x = nn.relu(Conv(scaled(c, width), (3, 3), "SAME", impl=impl)(x))
    if pool:
        x = max_pool(x, 2)
    return Dropout(rate * dropout)(x, active=active)


def _classifier(x: Array, num_classes: int, width: float, dropout: float, active: bool):
    """flatten -> dropout -> FC 512 -> FC 512 -> dropout -> FC num_classes."""
    x = Dropout(dropout)(_flatten(x), active=active)
    x = nn.relu(nn.Dense(scaled(512, width))(x))
    x = nn.relu(nn.Dense(scaled(512, width))(x))
    x = Dropout(dropout)(x, active=active)
    return nn.Dense(num_classes)(x)


class VGG9(nn.Module):
    """conv3x3 32, 64 (pool), 128, 128 (pool, dropout/2), 256, 256 (pool) -> flatten ->
    dropout -> FC 512 -> FC 512 -> dropout -> FC num_classes (ReLU after every conv and FC
    but the last)."""

    num_classes: int
    width: float = 1.0
    dropout: float = 0.1
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, 32, 32, C]`` float -> logits ``[B, num_classes]``."""
        active = train or mc
        for i in range(len(VGG9_CONVS)):
            x = _conv(x, i, self.width, self.dropout, self.conv_impl, active)
        return _classifier(x, self.num_classes, self.width, self.dropout, active)


class VGG9Exits(nn.Module):
    """Multi-exit VGG-9 (Eqs. 19-20): part 1 = conv1-2 and c^1, part 2 = conv3-4 and c^2,
    part 3 = conv5-6 and the FC stack (c^3 = c). Exit b reads z^b = h^b(z^{b-1}).

    output: "final" gives the last computed exit ``[B, Q]`` (a drop-in VGG-9 for evaluation
        and for every other method); "all" gives every computed exit ``[depth, B, Q]``.
    depth: the parts computed (the sub-model H^depth); parts > depth are neither run nor
        read, so H^b's forward needs only the parameters of parts <= b.
    detach: stop the gradient at each part's input (Eq. 21's decoupled reading: exit b's
        loss trains part b only); False is joint backprop (Eq. 22 over all parameters).
    """

    num_classes: int
    width: float = 1.0
    dropout: float = 0.1
    conv_impl: str = "im2col"
    output: str = "final"
    depth: int = NUM_PARTS
    detach: bool = False

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        if self.output not in EXIT_OUTPUTS or not 1 <= self.depth <= NUM_PARTS:
            raise ValueError(f"VGG9Exits: output={self.output!r}, depth={self.depth} not allowed")
        active = train or mc
        ends = (*EXIT_AFTER, len(VGG9_CONVS))
        logits, start = [], 0
        for b in range(self.depth):
            if self.detach and b > 0:
                x = jax.lax.stop_gradient(x)
            for i in range(start, ends[b]):
                x = _conv(x, i, self.width, self.dropout, self.conv_impl, active)
            start = ends[b]
            if b < NUM_PARTS - 1:
                pooled = _flatten(adaptive_avg_pool(x, EXIT_POOL[b]))
                logits.append(nn.Dense(self.num_classes, name=f"exit{b + 1}")(pooled))
            else:
                logits.append(_classifier(x, self.num_classes, self.width, self.dropout, active))
        return jnp.stack(logits) if self.output == "all" else logits[-1]


def exit_part(name: str) -> int:
    """The part b (1-based) of a top-level parameter of VGG9Exits: exit<b> is c^b, conv i
    (Conv_i, 0-based) belongs to the part it feeds, the FC stack (Dense_*) to part L."""
    if name.startswith("exit"):
        return int(name[len("exit") :])
    if name.startswith("Conv_"):
        i = int(name[len("Conv_") :])
        return 1 + sum(i >= e for e in EXIT_AFTER)
    if name.startswith("Dense_"):
        return NUM_PARTS
    raise ValueError(f"not a VGG9Exits parameter: {name!r}")


def exit_parts(params: Any) -> Any:
    """A tree like ``params`` (the ``params`` collection) whose leaves are their part b (int)."""
    return {k: jax.tree.map(lambda _, b=exit_part(k): b, v) for k, v in params.items()}
