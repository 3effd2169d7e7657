"""The flax modules of the model registry (`models.zoo`): MLP (2NN), FedAvg CNN, pfl-research's
simple CNN, a bag-of-embeddings text classifier and ResNet-9 with MC dropout.

All modules share the call signature ``module(x, train, mc)`` on preprocessed input
(float ``[B, H, W, C]`` images, float ``[B, D]`` features or int32 ``[B, L]`` token ids)
and return logits ``[B, num_classes]``:

* ``train=True``: dropout on, BatchNorm uses batch statistics (``batch_stats`` mutable).
* ``mc=True`` (with ``train=False``): dropout on, BatchNorm uses running statistics.
* both False: deterministic inference.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_semi.models.layers import Conv, Dropout, global_max_pool, max_pool

Array = jax.Array


def scaled(channels: int, width: float) -> int:
    """Width-scaled channel count, at least 1."""
    return max(1, int(round(channels * width)))


def _flatten(x: Array) -> Array:
    """``[B, ...] -> [B, prod(...)]``."""
    return x.reshape((x.shape[0], -1))


class MLP(nn.Module):
    """Fully connected net: flatten -> [Dense(h) -> ReLU -> Dropout] per h -> Dense(classes)."""

    num_classes: int
    hidden: tuple[int, ...] = (200, 200)
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, H, W, C]`` float -> logits ``[B, num_classes]``."""
        x = _flatten(x)
        for h in self.hidden:
            x = nn.relu(nn.Dense(h)(x))
            x = Dropout(self.dropout)(x, active=train or mc)
        return nn.Dense(self.num_classes)(x)


class CNN(nn.Module):
    """FedAvg CNN (McMahan et al. 2017): two 5x5 conv + 2x2 max-pool blocks, Dense(512).
    `kernel` 3 and `dense` 128 give DoFed-SPP's 2-conv + 2-linear net (545,098 parameters on
    CIFAR-10; its paper, Sec. 6.1, gives only "two conv2d and two linear layers", "about 2.1MB")."""

    num_classes: int
    width: float = 1.0
    dropout: float = 0.0
    conv_impl: str = "im2col"
    kernel: int = 5
    dense: int = 512

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, H, W, C]`` float -> logits ``[B, num_classes]``."""
        for c in (32, 64):
            k = (self.kernel, self.kernel)
            x = Conv(scaled(c, self.width), k, "SAME", impl=self.conv_impl)(x)
            x = max_pool(nn.relu(x), 2)
        x = nn.relu(nn.Dense(scaled(self.dense, self.width))(_flatten(x)))
        x = Dropout(self.dropout)(x, active=train or mc)
        return nn.Dense(self.num_classes)(x)


class SimpleCNN(nn.Module):
    """pfl-research's `simple_cnn` (its CIFAR-10 speed benchmark): conv 3x3 VALID 32, ReLU,
    conv 3x3 VALID 64, ReLU, 2x2 max-pool, dropout(dropout / 2), Dense(128), ReLU,
    dropout(dropout), Dense(num_classes); pfl's rates are 0.25 and 0.5 (`dropout: 0.5`).
    1,626,442 parameters on 32x32x3."""

    num_classes: int
    width: float = 1.0
    dropout: float = 0.0
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``[B, H, W, C]`` float -> logits ``[B, num_classes]``."""
        for c in (32, 64):
            x = nn.relu(Conv(scaled(c, self.width), (3, 3), "VALID", impl=self.conv_impl)(x))
        x = Dropout(self.dropout / 2)(max_pool(x, 2), active=train or mc)
        x = nn.relu(nn.Dense(scaled(128, self.width))(_flatten(x)))
        x = Dropout(self.dropout)(x, active=train or mc)
        return nn.Dense(self.num_classes)(x)


class TextClassifier(nn.Module):
    """Bag-of-embeddings text classifier on token ids (0 = padding).

    Embed(vocab_size, embed_dim) -> mean over non-padding tokens -> [Dense(h) -> ReLU ->
    Dropout] per h -> Dense(num_classes). With ``hidden=()`` this is exactly the
    ``EmbeddingBag(V, 64, mode="mean") -> Linear`` model of the PyTorch text tutorial that
    DoFed-SPP uses for DBPedia (its Sec. 6.1, about 51 MB); the ``text`` config adds one hidden
    layer (``hidden: [64]``). Ada-FedSemi's IMDB model is a sentence CNN instead (its Sec. 5.2,
    after Zhang and Wallace 2015), not this one. Differences from the tutorial: embeddings are
    initialized N(0, 1) (flax's default) rather than U(-0.5, 0.5), and padding is masked
    explicitly instead of using offsets into a flat token list.
    """

    num_classes: int
    vocab_size: int
    embed_dim: int = 64
    hidden: tuple[int, ...] = (64,)
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: Array, train: bool = False, mc: bool = False) -> Array:
        """x ``int32 [B, L]`` token ids -> logits ``[B, num_classes]``."""
        emb = nn.Embed(self.vocab_size, self.embed_dim)(x)  # [B, L, E]
        mask = (x != 0).astype(emb.dtype)[..., None]  # [B, L, 1]; padding contributes nothing
        # An all-padding text pools to zeros instead of 0/0.
        pooled = jnp.sum(emb * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        h = pooled
        for units in self.hidden:
            h = nn.relu(nn.Dense(units)(h))
            h = Dropout(self.dropout)(h, active=train or mc)
        if not self.hidden:  # keep MC dropout available in the tutorial's linear model
            h = Dropout(self.dropout)(h, active=train or mc)
        return nn.Dense(self.num_classes)(h)


class ConvBN(nn.Module):
    """3x3 SAME conv without bias, then BatchNorm (or identity for ``norm="none"``); no ReLU."""

    features: int
    norm: str = "batch"
    conv_impl: str = "im2col"

    @nn.compact
    def __call__(self, x: Array, train: bool, mask: Array | None = None) -> Array:
        """x ``[B, H, W, Cin]`` -> ``[B, H, W, features]``."""
        x = Conv(self.features, (3, 3), "SAME", use_bias=False, impl=self.conv_impl)(x)
        if self.norm == "batch":
            # flax momentum 0.9 == PyTorch momentum 0.1 (the Myrtle/DAWNBench setting).
            # mask [B, 1, 1, 1]: padded rows of a batch stay out of the batch statistics.
            bn = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)
            x = bn(x, mask=mask if train else None)
        return x


class ResNet9(nn.Module):
    """DAWNBench/Myrtle ResNet-9 with MC dropout in the last residual block: after the
    BatchNorm of its two convolutions, UM-pFSSL's "after the last two batch normalization
    layers" (its Sec. 6.1; ResNet-9 has no hidden dense layer for the rest of that sentence).

    Split at the first dropout so the deterministic prefix can be computed once and the
    stochastic suffix re-sampled: ``__call__ == suffix(*prefix(x, train), train, mc)``.
    """

    num_classes: int
    width: float = 1.0
    dropout: float = 0.0
    conv_impl: str = "im2col"
    norm: str = "batch"
    # The Myrtle/DAWNBench ResNet-9 multiplies its logits by 0.125 (its final Mul layer), which
    # keeps the initial loss near log(num_classes); 1.0 leaves the logits as the head gives them.
    output_scale: float = 1.0

    def setup(self) -> None:
        def block(c: int) -> ConvBN:
            return ConvBN(scaled(c, self.width), self.norm, self.conv_impl)

        self.prep = block(64)
        self.layer1 = block(128)
        self.res1a = block(128)
        self.res1b = block(128)
        self.layer2 = block(256)
        self.layer3 = block(512)
        self.res2a = block(512)
        self.res2b = block(512)
        self.drop_a = Dropout(self.dropout)
        self.drop_b = Dropout(self.dropout)
        self.head = nn.Dense(self.num_classes)

    def prefix(
        self, x: Array, train: bool = False, mask: Array | None = None
    ) -> tuple[Array, Array]:
        """x ``[B, H, W, C]`` -> ``(skip, a)``: layer3 output and BN(res2a conv), both
        ``[B, H/8, W/8, 512*width]`` (floor division at each pool)."""
        m = None if mask is None else mask.reshape(-1, 1, 1, 1)
        h = nn.relu(self.prep(x, train, m))
        h = max_pool(nn.relu(self.layer1(h, train, m)), 2)
        r = nn.relu(self.res1a(h, train, m))
        h = h + nn.relu(self.res1b(r, train, m))
        h = max_pool(nn.relu(self.layer2(h, train, m)), 2)
        h = max_pool(nn.relu(self.layer3(h, train, m)), 2)
        return h, self.res2a(h, train, m)

    def suffix(
        self,
        skip: Array,
        a: Array,
        train: bool = False,
        mc: bool = False,
        mask: Array | None = None,
    ) -> Array:
        """``(skip, a)`` from :meth:`prefix` -> logits ``[B, num_classes]``."""
        active = train or mc
        m = None if mask is None else mask.reshape(-1, 1, 1, 1)
        r = nn.relu(self.drop_a(a, active))
        r = nn.relu(self.drop_b(self.res2b(r, train, m), active))
        return self.output_scale * self.head(global_max_pool(skip + r))

    def __call__(
        self, x: Array, train: bool = False, mc: bool = False, mask: Array | None = None
    ) -> Array:
        """x ``[B, H, W, C]`` float -> logits ``[B, num_classes]``. ``mask`` [B] (training
        only): rows that enter the BatchNorm batch statistics."""
        skip, a = self.prefix(x, train, mask)
        return self.suffix(skip, a, train, mc, mask)
