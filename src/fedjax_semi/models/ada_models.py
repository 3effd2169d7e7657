"""Ada-FedSemi's SVHN and IMDB models (Xu et al., Sec. 5.2), which the paper gives only by size
or by reference (docs/choices.md: Ada-FedSemi, the SVHN and IMDB models).

* :class:`SVHNCNN`: "a lightweight CNN with 0.54 million parameters": conv 5x5 VALID 32, ReLU,
  max-pool 2, conv 5x5 VALID 64, ReLU, max-pool 2, FC 300, ReLU, FC num_classes; 537,006
  parameters on 32x32x3 with 10 classes.
* :class:`TextCNN`: the sentence CNN of its ref. [59] (Kim 2014, as tuned by Zhang and Wallace
  2015): embedding 300, 1-D convolutions of region sizes 3, 4 and 5 with 100 filters each,
  ReLU, max over time, concatenation (300), dropout 0.5, FC num_classes.

Same call signature as `models.architectures`: ``module(x, train, mc)``; dropout is on with
``train`` or ``mc``. Convolutions use the project's :class:`~.layers.Conv` lowering (im2col by
default: XLA:CPU runs ``nn.Conv`` slowly under a vmap over clients).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_semi.models.architectures import _flatten, scaled
from fedjax_semi.models.layers import Conv, Dropout, max_pool

Array = jax.Array

# Zhang and Wallace's baseline configuration of the sentence CNN.
TEXT_CNN_REGIONS = (3, 4, 5)
TEXT_CNN_FILTERS = 100


class SVHNCNN(nn.Module):
    """conv5x5 VALID 32 -> pool -> conv5x5 VALID 64 -> pool -> flatten -> FC 300 -> dropout ->
    FC num_classes (ReLU after every conv and the hidden FC). ``dropout`` is 0 by default (the
    paper names none)."""

    num_classes: int
    width: float = 1.0
    dropout: float = 0.0
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, 32, 32, C]`` float -> logits ``[B, num_classes]`` (any H, W >= 16 works:
        the flattened size follows the input)."""
        for c in (32, 64):
            x = Conv(scaled(c, self.width), (5, 5), "VALID", impl=self.conv_impl)(x)
            x = max_pool(nn.relu(x), 2)
        x = nn.relu(nn.Dense(scaled(300, self.width))(_flatten(x)))
        x = Dropout(self.dropout)(x, active=train or mc)
        return nn.Dense(self.num_classes)(x)


class TextCNN(nn.Module):
    """Embed(vocab_size, embed_dim) -> per region size k: conv over k consecutive tokens with
    ``filters`` maps, ReLU, max over time -> concat -> dropout -> FC num_classes.

    Every window is scored, padded ones included (as in Kim's code, which pads sentences); a
    window of padding adds one constant per filter. No l2-norm constraint on the last layer
    (Kim's s = 3; Zhang and Wallace found it changes little).
    """

    num_classes: int
    vocab_size: int
    embed_dim: int = 300
    filters: int = TEXT_CNN_FILTERS
    regions: tuple[int, ...] = TEXT_CNN_REGIONS
    dropout: float = 0.5
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``int32 [B, L]`` token ids (L >= max(regions)) -> logits ``[B, num_classes]``."""
        emb = nn.Embed(self.vocab_size, self.embed_dim)(x)[:, :, None, :]  # [B, L, 1, E]
        pooled = []
        for k in self.regions:
            # A 1-D convolution over time as a (k, 1) 2-D one with the embedding as channels.
            h = Conv(self.filters, (k, 1), "VALID", impl=self.conv_impl)(emb)  # [B, L-k+1, 1, F]
            pooled.append(jnp.max(nn.relu(h), axis=(1, 2)))  # [B, F]
        h = Dropout(self.dropout)(jnp.concatenate(pooled, axis=-1), active=train or mc)
        return nn.Dense(self.num_classes)(h)
