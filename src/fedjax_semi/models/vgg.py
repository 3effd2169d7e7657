"""VGG-9 of FedMA (Wang et al. 2020), Ada-FedSemi's CIFAR-10 / STL-10 model (its Sec. 5.1:
"6 conv + 3 FC, 3.49 M parameters"): 3,491,530 parameters for 10 classes on 32x32x3.

Same call signature as `models.architectures`: ``module(x, train, mc)`` on ``[B, H, W, C]``
float images -> logits ``[B, num_classes]``; dropout is on with ``train`` or ``mc``. No
BatchNorm. FedMA's dropout rates are 0.05 after conv4 and 0.1 before FC7 and after FC8: here
``dropout`` is the FC rate (0.1 in `conf/model/vgg9.yaml`) and conv4's is half of it.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_semi.models.architectures import _flatten, scaled
from fedjax_semi.models.layers import Conv, Dropout, max_pool

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
        for c, pool, rate in VGG9_CONVS:
            x = nn.relu(Conv(scaled(c, self.width), (3, 3), "SAME", impl=self.conv_impl)(x))
            if pool:
                x = max_pool(x, 2)
            x = Dropout(rate * self.dropout)(x, active=active)
        x = Dropout(self.dropout)(_flatten(x), active=active)
        x = nn.relu(nn.Dense(scaled(512, self.width))(x))
        x = nn.relu(nn.Dense(scaled(512, self.width))(x))
        x = Dropout(self.dropout)(x, active=active)
        return nn.Dense(self.num_classes)(x)
