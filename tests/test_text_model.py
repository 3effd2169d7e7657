"""The bag-of-embeddings text model (DoFed-SPP's DBPedia preset, Ada-FedSemi's IMDB preset): its
spec and parameter count, padding that changes nothing, and clients mapped at once against one at
a time. The image models are in test_models.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import client_of
from fedjax_semi.models import make_model, num_params

VOCAB, SEQ = 50, 8


@functools.cache
def _text_setup():
    """Text model (dropout 0.5) and 3 clients' variables from a vmapped init."""
    model = make_model("text", (SEQ,), 4, vocab_size=VOCAB, embed_dim=16, hidden=(8,), dropout=0.5)
    stacked = jax.jit(jax.vmap(model.init))(jax.random.split(jax.random.key(0, impl="rbg"), 3))
    return model, stacked


def _tokens(n: int = 4, seed: int = 0) -> np.ndarray:
    """int32 [n, SEQ] ids in [2, VOCAB) with a random amount of right padding (>= 1 token)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(2, VOCAB, size=(n, SEQ), dtype=np.int32)
    lengths = rng.integers(1, SEQ + 1, size=n)
    x[np.arange(SEQ)[None, :] >= lengths[:, None]] = 0
    return x


def test_text_model_spec_and_param_count() -> None:
    model, stacked = _text_setup()
    assert model.input_kind == "tokens" and model.input_shape == (SEQ,)
    v = client_of(stacked, 0)
    assert num_params(v) == VOCAB * 16 + 16 * 8 + 8 + 8 * 4 + 4
    x = _tokens()
    # Token ids pass through preprocessing unchanged (int32, never / 255).
    p = model.preprocess(x)
    assert p.dtype == jnp.int32
    np.testing.assert_array_equal(p, x)
    # hidden=() is the EmbeddingBag + Linear model of the DoFed-SPP spec.
    bag = make_model("text", (SEQ,), 14, vocab_size=VOCAB, embed_dim=16, hidden=())
    assert num_params(jax.eval_shape(bag.init, jax.random.key(0))) == VOCAB * 16 + 16 * 14 + 14
    with pytest.raises(ValueError, match=r"model\.name='text'.*vocab"):
        make_model("text", (SEQ,), 4)
    with pytest.raises(ValueError, match=r"model\.name='cnn'.*kind 'tokens'.*text"):
        make_model("cnn", (SEQ,), 4, input_kind="tokens")
    with pytest.raises(ValueError, match=r"model\.embed_dim"):
        make_model("text", (SEQ,), 4, vocab_size=VOCAB, embed_dim=0)


def test_text_padding_does_not_change_output() -> None:
    model, stacked = _text_setup()
    v = client_of(stacked, 0)
    apply = jax.jit(lambda v, x: model.apply(v, x)[0])
    x = np.array([[5, 3, 7, 0, 0, 0, 0, 0]], np.int32)
    base = apply(v, x)
    # Longer or shorter padding, and the same tokens in another order (a mean is a bag).
    for other in ([[5, 3, 7]], [[5, 3, 7] + [0] * 13], [[7, 5, 3, 0, 0, 0, 0, 0]]):
        np.testing.assert_allclose(apply(v, np.array(other, np.int32)), base, atol=1e-6)
    # The padding row of the embedding is never read: changing it changes nothing.
    v2 = jax.tree_util.tree_map(lambda a: a, v)
    emb = v2["params"]["Embed_0"]["embedding"]
    v2["params"]["Embed_0"]["embedding"] = emb.at[0].set(100.0)
    np.testing.assert_allclose(apply(v2, x), base, atol=1e-6)
    # An all-padding text gives finite logits (the bias path), not NaN.
    assert np.all(np.isfinite(apply(v, np.zeros((1, SEQ), np.int32))))


def test_text_vmap_over_clients_matches_per_client() -> None:
    model, stacked = _text_setup()
    xs = jnp.stack([jnp.asarray(_tokens(seed=s)) for s in range(3)])
    rngs = jax.random.split(jax.random.key(9), 3)

    def both(v, x, r):
        return model.apply(v, x, train=True, rng=r)[0], model.apply(v, x)[0]

    train_logits, eval_logits = jax.jit(jax.vmap(both))(stacked, xs, rngs)
    one = jax.jit(both)
    for c in range(3):
        t, e = one(client_of(stacked, c), xs[c], rngs[c])
        np.testing.assert_allclose(train_logits[c], t, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(eval_logits[c], e, atol=1e-5, rtol=1e-5)
    assert not np.allclose(eval_logits[0], eval_logits[1])
    # Dropout is active in training.
    assert not np.allclose(train_logits, eval_logits)
