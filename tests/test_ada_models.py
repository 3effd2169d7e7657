"""Ada-FedSemi's SVHN CNN and IMDB sentence CNN (its Sec. 5.1;
docs/choices.md): parameter counts by the layer tables, dropout on only in training / MC passes,
deterministic evaluation, and a vmap over clients equal to one client at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_semi.models import make_model, num_params

VOCAB, SEQ = 50, 12


def _count(model) -> int:
    return num_params(jax.eval_shape(model.init, jax.random.key(0)))


def test_svhn_cnn_param_count_is_the_papers_0_54m() -> None:
    # conv 5*5*3*32+32 = 2,432; conv 5*5*32*64+64 = 51,264 (32 -> 28 -> 14 -> 10 -> 5);
    # FC 5*5*64*300+300 = 480,300; FC 300*10+10 = 3,010.
    model = make_model("svhn_cnn", (32, 32, 3), 10)
    assert _count(model) == 2_432 + 51_264 + 480_300 + 3_010 == 537_006
    # width scales the convolutions and the hidden FC: 8, 16 channels, 75 units.
    small = make_model("svhn_cnn", (32, 32, 3), 10, width=0.25)
    assert _count(small) == (5 * 5 * 3 * 8 + 8) + (5 * 5 * 8 * 16 + 16) + (400 * 75 + 75) + 760


def test_text_cnn_param_count() -> None:
    # Embedding V*E; region k: k*E*F + F; FC 3F*Q + Q.
    e, f = 300, 100
    model = make_model("text_cnn", (400,), 2, vocab_size=20_002, embed_dim=e)
    convs = sum(k * e * f + f for k in (3, 4, 5))
    assert _count(model) == 20_002 * e + convs + 3 * f * 2 + 2 == 6_361_502
    assert model.input_kind == "tokens"
    small = make_model("text_cnn", (SEQ,), 2, vocab_size=VOCAB, embed_dim=8, width=0.1)
    assert _count(small) == VOCAB * 8 + sum(k * 8 * 10 + 10 for k in (3, 4, 5)) + 30 * 2 + 2


def test_bad_text_cnn_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"model\.name='text_cnn' needs the vocabulary"):
        make_model("text_cnn", (SEQ,), 2)
    with pytest.raises(ValueError, match=r"dataset\.seq_len=4.*>= 5"):
        make_model("text_cnn", (4,), 2, vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"model\.name='svhn_cnn'.*kind 'tokens'"):
        make_model("svhn_cnn", (SEQ,), 2, input_kind="tokens")


def _tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (n, SEQ), dtype=np.int32)


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


CASES = {
    "svhn_cnn": (dict(width=0.25, dropout=0.5), (32, 32, 3), _images),
    "text_cnn": (dict(width=0.1, embed_dim=8, vocab_size=VOCAB, dropout=0.5), (SEQ,), _tokens),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dropout_only_in_training_and_deterministic_eval(name: str) -> None:
    kw, shape, data = CASES[name]
    model = make_model(name, shape, 2, **kw)
    v = model.init(jax.random.key(0))
    x = data(4, 1)
    apply = jax.jit(lambda v, x, r, train: model.apply(v, x, train=train, rng=r)[0],
                    static_argnums=3)  # fmt: skip
    e1, e2 = apply(v, x, jax.random.key(1), False), apply(v, x, jax.random.key(2), False)
    np.testing.assert_array_equal(e1, e2)  # dropout off at evaluation, whatever the key
    t1, t1b = apply(v, x, jax.random.key(1), True), apply(v, x, jax.random.key(1), True)
    t2 = apply(v, x, jax.random.key(2), True)
    np.testing.assert_array_equal(t1, t1b)  # one key, one mask
    assert not np.allclose(t1, t2) and not np.allclose(t1, e1)  # dropout is on in training
    mc, _ = model.apply(v, x, mc=True, rng=jax.random.key(3))
    assert not np.allclose(mc, e1)
    with pytest.raises(ValueError, match="rng is required"):
        model.apply(v, x, train=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vmap_over_clients_matches_one_client_at_a_time(name: str) -> None:
    kw, shape, data = CASES[name]
    model = make_model(name, shape, 2, **kw)
    stacked = jax.vmap(model.init)(jax.random.split(jax.random.key(0), 3))
    xs = jnp.stack([jnp.asarray(data(4, s)) for s in range(3)])

    def loss(v, x):
        return jnp.mean(model.apply(v, x)[0] ** 2)

    grads = jax.jit(jax.vmap(jax.grad(loss)))(stacked, xs)
    one = jax.jit(jax.grad(loss))
    for c in range(3):
        g = one(jax.tree.map(lambda a, c=c: a[c], stacked), xs[c])
        jax.tree.map(
            lambda a, b, c=c: np.testing.assert_allclose(a[c], b, rtol=1e-4, atol=1e-5), grads, g
        )


def test_text_cnn_scores_every_window() -> None:
    """A filter sees k consecutive tokens: reversing a phrase changes the logits (a bag of
    words would not); moving it along the text does not, as long as every window around it
    (up to k - 1 = 4 tokens of padding on each side) exists at both places."""
    model = make_model("text_cnn", (SEQ,), 2, vocab_size=VOCAB, embed_dim=8, width=0.1)
    v = model.init(jax.random.key(0))
    apply = jax.jit(lambda x: model.apply(v, x)[0])

    def text(start: int, phrase: list[int]) -> np.ndarray:
        x = np.zeros((1, SEQ), np.int32)
        x[0, start : start + len(phrase)] = phrase
        return x

    here = apply(text(4, [5, 7, 9]))
    assert not np.allclose(apply(text(4, [9, 7, 5])), here)
    np.testing.assert_allclose(apply(text(5, [5, 7, 9])), here, rtol=1e-5, atol=1e-6)
    assert not np.allclose(apply(text(0, [5, 7, 9])), here)  # no padded window before it
