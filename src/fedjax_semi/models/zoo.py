"""Model registry: the registered names, `make_model` (name + config -> `Model`) and `Model`.

The flax modules live in `models.architectures`; they share the call signature
``module(x, train, mc)`` on preprocessed input (see :data:`INPUT_KINDS`).
:class:`Model` wraps a module with its input spec and normalization so the engine can
``init``/``apply`` it under ``jax.vmap`` over a leading client axis of variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_semi.models.ada_models import SVHNCNN, TEXT_CNN_REGIONS, TextCNN
from fedjax_semi.models.architectures import CNN, MLP, ResNet9, SimpleCNN, TextClassifier, scaled
from fedjax_semi.models.vgg import VGG9, VGG9Exits

Array = jax.Array

CONV_IMPLS = ("auto", "im2col", "lax", "xla")
NORMS = ("batch", "none")
# Dataset input kinds (ArrayDataset.kind): uint8 images [H, W, C], int32 token ids [L]
# (0 = padding) and float features [D].
INPUT_KINDS = ("image", "tokens", "features")
# The input kinds each registered model accepts.
MODEL_INPUT_KINDS: dict[str, tuple[str, ...]] = {
    "mlp": ("image", "features"),
    "cnn": ("image",),
    "simple_cnn": ("image",),
    "resnet9": ("image",),
    "vgg9": ("image",),
    "vgg9_exits": ("image",),
    "text": ("tokens",),
    "svhn_cnn": ("image",),
    "text_cnn": ("tokens",),
}
# Models on token ids: they need the dataset's vocabulary size.
TOKEN_MODELS = ("text", "text_cnn")


@dataclasses.dataclass(frozen=True)
class Model:
    """A module plus its input spec and normalization.

    ``init``/``apply`` are pure functions of their array arguments, so they can be
    vmapped over a leading client axis of keys/variables. ``input_kind`` (one of
    :data:`INPUT_KINDS`) decides what :meth:`preprocess` does.
    """

    name: str
    module: nn.Module
    input_shape: tuple[int, ...]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    has_batch_stats: bool
    has_dropout: bool
    input_kind: str = "image"

    def init(self, key: Array) -> dict[str, Any]:
        """PRNG key -> variables ``{'params': ..., ['batch_stats': ...]}`` (dummy batch of 2)."""
        dtype = jnp.int32 if self.input_kind == "tokens" else jnp.float32
        dummy = jnp.zeros((2, *self.input_shape), dtype)
        variables = self.module.init({"params": key, "dropout": key}, dummy, False, False)
        return dict(variables)

    def with_conv(self, impl: str) -> Model:
        """The same model (same variables) with another convolution implementation.

        The engine evaluates the single global model with XLA's conv, which is faster than
        im2col when nothing is vmapped over clients and no gradient is taken.
        """
        if not hasattr(self.module, "conv_impl") or self.module.conv_impl == impl:
            return self
        return dataclasses.replace(self, module=self.module.clone(conv_impl=impl))

    def preprocess(self, x: Array) -> Array:
        """Raw batch -> module input, same shape.

        * ``"image"``: uint8/float ``[..., H, W, C]`` -> float32 ``((x / 255) - mean) / std``.
        * ``"tokens"``: ids ``[..., L]`` -> int32 unchanged (never normalized).
        * ``"features"``: ``[..., D]`` -> float32 unchanged (loaders standardize already).
        """
        if self.input_kind == "tokens":
            return jnp.asarray(x).astype(jnp.int32)
        if self.input_kind == "features":
            return jnp.asarray(x).astype(jnp.float32)
        mean = jnp.asarray(self.mean, jnp.float32)
        std = jnp.asarray(self.std, jnp.float32)
        return (jnp.asarray(x).astype(jnp.float32) / 255.0 - mean) / std

    def apply(
        self,
        variables: dict[str, Any],
        x: Array,
        *,
        train: bool = False,
        mc: bool = False,
        rng: Array | None = None,
        mask: Array | None = None,
    ) -> tuple[Array, dict[str, Any]]:
        """Forward pass.

        Args:
            variables: from :meth:`init` (unbatched; vmap this method for client stacks).
            x: raw batch ``[B, *input_shape]`` (uint8/float pixels, int32 token ids or
                float features); preprocessed here.
            train: dropout on, BatchNorm on batch stats; returns updated ``batch_stats``.
            mc: (with ``train=False``) dropout on, BatchNorm on running stats.
            rng: PRNG key for dropout; required when dropout is active and rate > 0.
            mask: bool ``[B]`` (training with BatchNorm): the rows whose statistics BatchNorm
                uses, so padded rows of a partial batch change nothing (tested).

        Returns:
            ``(logits [B, num_classes] float32, new_model_state)``; ``new_model_state`` is
            ``{'batch_stats': ...}`` when ``train`` and the model has BatchNorm, else ``{}``.
        """
        if (train or mc) and self.has_dropout and rng is None:
            raise ValueError(f"{self.name}: rng is required when dropout is active")
        rngs = {"dropout": rng} if rng is not None else {}
        x = self.preprocess(x)
        if train and self.has_batch_stats:
            logits, state = self.module.apply(
                variables, x, True, mc, mask, rngs=rngs, mutable=["batch_stats"]
            )
            return logits.astype(jnp.float32), dict(state)
        logits = self.module.apply(variables, x, train, mc, rngs=rngs)
        return logits.astype(jnp.float32), {}


ModuleBuilder = Callable[..., nn.Module]


def _build_mlp(
    num_classes: int, *, width: float, dropout: float, hidden: tuple[int, ...], **_: Any
) -> nn.Module:
    return MLP(num_classes, tuple(scaled(h, width) for h in hidden), dropout)


def _build_cnn(
    num_classes: int,
    *,
    width: float,
    dropout: float,
    conv_impl: str,
    conv_kernel: int = 5,
    dense: int = 512,
    **_: Any,
) -> nn.Module:
    return CNN(num_classes, width, dropout, conv_impl, conv_kernel, dense)


def _build_simple_cnn(
    num_classes: int, *, width: float, dropout: float, conv_impl: str, **_: Any
) -> nn.Module:
    return SimpleCNN(num_classes, width, dropout, conv_impl)


def _build_resnet9(
    num_classes: int,
    *,
    width: float,
    dropout: float,
    conv_impl: str,
    norm: str,
    output_scale: float,
    **_: Any,
) -> nn.Module:
    return ResNet9(num_classes, width, dropout, conv_impl, norm, output_scale)


def _build_vgg9(
    num_classes: int, *, width: float, dropout: float, conv_impl: str, **_: Any
) -> nn.Module:
    return VGG9(num_classes, width, dropout, conv_impl)


def _build_vgg9_exits(
    num_classes: int, *, width: float, dropout: float, conv_impl: str, **_: Any
) -> nn.Module:
    return VGG9Exits(num_classes, width, dropout, conv_impl)


def _build_text(
    num_classes: int,
    *,
    width: float,
    dropout: float,
    hidden: tuple[int, ...],
    embed_dim: int,
    vocab_size: int,
    **_: Any,
) -> nn.Module:
    hidden = tuple(scaled(h, width) for h in hidden)
    return TextClassifier(num_classes, vocab_size, embed_dim, hidden, dropout)


def _build_svhn_cnn(
    num_classes: int, *, width: float, dropout: float, conv_impl: str, **_: Any
) -> nn.Module:
    return SVHNCNN(num_classes, width, dropout, conv_impl)


def _build_text_cnn(
    num_classes: int,
    *,
    width: float,
    dropout: float,
    conv_impl: str,
    embed_dim: int,
    vocab_size: int,
    **_: Any,
) -> nn.Module:
    return TextCNN(
        num_classes, vocab_size, embed_dim, scaled(100, width), TEXT_CNN_REGIONS, dropout, conv_impl
    )


# name -> builder(num_classes, *, width, dropout, conv_impl, hidden, norm, embed_dim,
# vocab_size) -> nn.Module
MODELS: dict[str, ModuleBuilder] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
    "simple_cnn": _build_simple_cnn,
    "resnet9": _build_resnet9,
    "vgg9": _build_vgg9,
    "vgg9_exits": _build_vgg9_exits,  # HeteroAda-FedSemi's multi-exit VGG-9 (final exit)
    "text": _build_text,
    "svhn_cnn": _build_svhn_cnn,
    "text_cnn": _build_text_cnn,
}


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(MODELS)


def _invalid(key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"invalid {key}={value!r}; allowed: {allowed}")


def make_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    mean: Sequence[float] = (0.0,),
    std: Sequence[float] = (1.0,),
    width: float = 1.0,
    dropout: float = 0.0,
    conv_impl: str = "im2col",
    hidden: tuple[int, ...] = (200, 200),
    norm: str = "batch",
    embed_dim: int = 64,
    vocab_size: int | None = None,
    input_kind: str | None = None,
    conv_kernel: int = 5,
    dense: int = 512,
    output_scale: float = 1.0,
) -> Model:
    """Build a registered model.

    Args:
        name: one of :func:`model_names`.
        input_shape: per-example ``(H, W, C)`` images, ``(L,)`` tokens or ``(D,)`` features.
        num_classes: number of logits.
        mean, std: per-channel normalization of ``x / 255`` (length 1 or C); images only.
        width: channel/unit multiplier (> 0); scaled counts are at least 1.
        dropout: dropout rate in ``[0, 1)``; 0 disables dropout (and MC sampling).
        conv_impl: ``"im2col"`` (default), ``"auto"`` (im2col under a vmap over clients,
            else "lax"), ``"lax"`` or ``"xla"`` (`models.layers.Conv`).
        hidden: MLP / text-model hidden sizes (before width scaling).
        norm: ResNet-9 normalization, ``"batch"`` or ``"none"``.
        embed_dim: text model embedding width.
        vocab_size: text model vocabulary size (token ids ``< vocab_size``); required for
            :data:`TOKEN_MODELS` (``"text"``, ``"text_cnn"``), ignored otherwise.
        input_kind: the dataset's ``kind`` (one of :data:`INPUT_KINDS`); ``None`` infers
            ``"tokens"`` for :data:`TOKEN_MODELS` and ``"image"`` for the others.
        conv_kernel, dense: the CNN's square kernel size and dense width (before scaling).
        output_scale: resnet9's logit multiplier (the Myrtle ResNet-9's 0.125); 1.0 for the
            others.

    Raises:
        ValueError: naming the offending config key (``model.name``, ``model.width``,
            ``model.dropout``, ``model.conv``, ``model.norm``, ``model.embed_dim``,
            ``dataset.vocab_size``, ``dataset.seq_len``), or a model that does not accept
            ``input_kind``.
    """
    if name not in MODELS:
        raise _invalid("model.name", name, ", ".join(model_names()))
    if input_kind is None:
        input_kind = "tokens" if name in TOKEN_MODELS else "image"
    if input_kind not in INPUT_KINDS:
        raise _invalid("input_kind (dataset kind)", input_kind, ", ".join(INPUT_KINDS))
    if input_kind not in MODEL_INPUT_KINDS[name]:
        fits = [m for m, kinds in MODEL_INPUT_KINDS.items() if input_kind in kinds]
        raise _invalid(
            "model.name", name, f"for a dataset of kind {input_kind!r}: {', '.join(fits)}"
        )
    if name in TOKEN_MODELS:
        if vocab_size is None:
            raise ValueError(
                f"model.name={name!r} needs the vocabulary size of a token dataset "
                "(dataset.kind='tokens', e.g. dataset=dbpedia); got vocab_size=None"
            )
        if vocab_size < 3:
            raise _invalid("dataset.vocab_size", vocab_size, ">= 3 (padding, unknown, words)")
        if embed_dim < 1:
            raise _invalid("model.embed_dim", embed_dim, ">= 1")
    if name == "text_cnn" and int(input_shape[0]) < max(TEXT_CNN_REGIONS):
        allowed = f">= {max(TEXT_CNN_REGIONS)} for model text_cnn (its widest region)"
        raise _invalid("dataset.seq_len", int(input_shape[0]), allowed)
    if not width > 0:
        raise _invalid("model.width", width, "> 0")
    if not 0.0 <= dropout < 1.0:
        raise _invalid("model.dropout", dropout, "0 <= dropout < 1")
    if conv_impl not in CONV_IMPLS:
        raise _invalid("model.conv", conv_impl, ", ".join(CONV_IMPLS))
    if norm not in NORMS:
        raise _invalid("model.norm", norm, ", ".join(NORMS))
    if not (output_scale > 0 and (output_scale == 1.0 or name == "resnet9")):
        raise _invalid("model.output_scale", output_scale, "> 0, and 1.0 unless model resnet9")
    if conv_kernel < 1 or dense < 1:
        raise _invalid("model.conv_kernel / model.dense", (conv_kernel, dense), ">= 1 each")
    input_shape = tuple(int(d) for d in input_shape)
    mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if input_kind == "image":  # mean/std are unused for tokens and features
        channels = input_shape[-1]
        for key, vals in (("model.mean", mean), ("model.std", std)):
            if len(vals) not in (1, channels):
                raise _invalid(key, vals, f"length 1 or {channels} (input channels)")
    module = MODELS[name](
        num_classes,
        width=width,
        dropout=dropout,
        conv_impl=conv_impl,
        hidden=tuple(hidden),
        norm=norm,
        embed_dim=embed_dim,
        vocab_size=vocab_size,
        conv_kernel=conv_kernel,
        dense=dense,
        output_scale=output_scale,
    )
    return Model(
        name=name,
        module=module,
        input_shape=input_shape,
        num_classes=num_classes,
        mean=mean,
        std=std,
        has_batch_stats=name == "resnet9" and norm == "batch",
        has_dropout=dropout > 0.0,
        input_kind=input_kind,
    )


def num_params(variables: dict[str, Any]) -> int:
    """Number of trainable scalars in ``variables['params']`` (or in a bare param tree)."""
    params = variables.get("params", variables) if isinstance(variables, dict) else variables
    return int(sum(x.size for x in jax.tree_util.tree_leaves(params)))
