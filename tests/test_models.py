"""Tests for fedjax_semi.models: the conv lowerings (im2col, lax, auto), pooling, dropout, the
model registry and the image models' forward modes. The text model: test_text_model.py."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import client_of
from fedjax_semi.models import (
    MODELS,
    Conv,
    Dropout,
    avg_pool,
    make_model,
    max_pool,
    model_names,
    num_params,
)

SHAPE = (28, 28, 1)
# Small widths keep the whole file fast on a 2-core CPU.
SMALL = {
    "mlp": dict(width=0.1),
    "cnn": dict(width=0.125),
    "resnet9": dict(width=0.0625),
}


def _shapes(tree):
    return jax.tree_util.tree_map(lambda a: a.shape, tree)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("k", [3, 5])
def test_conv_matches_flax_conv(padding: str, k: int) -> None:
    x = jax.random.normal(jax.random.key(0), (2, 9, 8, 3))
    ref = nn.Conv(4, (k, k), padding=padding)
    variables = ref.init(jax.random.key(1), x)
    ours = Conv(4, (k, k), padding=padding)
    # Same param tree (names and shapes) as nn.Conv.
    assert _shapes(ours.init(jax.random.key(1), x)) == _shapes(variables)
    # Non-zero bias so the bias path is exercised too.
    variables = jax.tree_util.tree_map(lambda a: a + 0.1, variables)
    want = ref.apply(variables, x)
    for impl in ("auto", "im2col", "lax", "xla"):
        got = Conv(4, (k, k), padding=padding, impl=impl).apply(variables, x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=impl)


def _numpy_conv_and_grads(x, k, dy, pads):
    """float64 NumPy reference of a stride-1 conv and its gradients, by kernel offsets:
    y[b,h,w,f] = sum_{i,j,c} xpad[b,h+i,w+j,c] k[i,j,c,f]."""
    x, k, dy = (np.asarray(a, np.float64) for a in (x, k, dy))
    (plo, phi), (qlo, qhi) = pads
    xp = np.pad(x, ((0, 0), (plo, phi), (qlo, qhi), (0, 0)))
    kh, kw = k.shape[:2]
    ho, wo = xp.shape[1] - kh + 1, xp.shape[2] - kw + 1
    y = np.zeros((x.shape[0], ho, wo, k.shape[3]))
    dk, dxp = np.zeros_like(k), np.zeros_like(xp)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, i : i + ho, j : j + wo, :]
            y += np.einsum("bhwc,cf->bhwf", window, k[i, j])
            dk[i, j] = np.einsum("bhwc,bhwf->cf", window, dy)
            dxp[:, i : i + ho, j : j + wo, :] += np.einsum("bhwf,cf->bhwc", dy, k[i, j])
    dx = dxp[:, plo : plo + x.shape[1], qlo : qlo + x.shape[2], :]
    return y, dx, dk


@pytest.mark.parametrize(
    "k, padding", [(3, "SAME"), (4, "SAME"), (5, "SAME"), (3, "VALID"), (2, "VALID")]
)
def test_lax_conv_and_its_gradient_match_numpy_and_autodiff(k: int, padding: str) -> None:
    """`lax_conv`'s custom gradient (two canonical-layout forward convolutions) against a NumPy
    reference, and against XLA's autodiff of the same convolution (the old impl="xla")."""
    from fedjax_semi.models.layers import _conv_pads, lax_conv

    x = jax.random.normal(jax.random.key(0), (3, 9, 8, 5))
    kernel = jax.random.normal(jax.random.key(1), (k, k, 5, 6))

    def autodiff_conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=dn)

    y = lax_conv(x, kernel, padding)
    dy = jax.random.normal(jax.random.key(2), y.shape)
    dx, dk = jax.grad(lambda a, b: jnp.vdot(lax_conv(a, b, padding), dy), (0, 1))(x, kernel)
    ax, ak = jax.grad(lambda a, b: jnp.vdot(autodiff_conv(a, b), dy), (0, 1))(x, kernel)
    ny, ndx, ndk = _numpy_conv_and_grads(x, kernel, dy, _conv_pads(kernel.shape, padding))
    # float32 sums of up to k*k*5 (forward, dx) or 3*9*8 (dk) products of O(1) terms: errors
    # of order 1e-5 absolute, and entries can be near zero, hence atol.
    for got, want in ((y, ny), (dx, ndx), (dk, ndk)):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
    # The forward against XLA's own convolution too: its padding comes from the string, not from
    # _conv_pads (which the NumPy reference shares).
    np.testing.assert_allclose(y, autodiff_conv(x, kernel), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(dx, ax, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(dk, ak, atol=2e-5, rtol=1e-5)


def test_auto_conv_is_im2col_under_a_client_vmap_and_lax_otherwise() -> None:
    """impl="auto" lowers to XLA's convolution for one client (chunk=1, the reference loop) and
    to im2col matmuls when clients are vmapped (a batched kernel would be a grouped conv)."""
    from fedjax_semi.engine.clients import map_clients

    conv = Conv(4, (3, 3), impl="auto")
    x = jax.random.normal(jax.random.key(0), (3, 2, 6, 6, 2))
    params = jax.vmap(lambda k: conv.init(k, x[0]))(jax.random.split(jax.random.key(1), 3))

    def round_fn(chunk):
        def one(px):
            p, xi = px
            return jax.grad(lambda p: jnp.sum(conv.apply(p, xi) ** 2))(p)

        return lambda params, x: map_clients(one, (params, x), chunk=chunk)

    prims = {}
    for chunk in (1, "all"):
        jaxpr = str(jax.make_jaxpr(round_fn(chunk))(params, x))
        prims[chunk] = "conv_general_dilated" in jaxpr
        out = jax.jit(round_fn(chunk))(params, x)
        if chunk == 1:
            first = out
    assert prims == {1: True, "all": False}
    # The two lowerings agree to float32 summation order.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-5), first, out)


@pytest.mark.parametrize("impl", ["im2col", "lax"])
def test_conv_grad_inside_scan_matches_unrolled(impl: str) -> None:
    conv = Conv(4, (3, 3), impl=impl)
    xs = jax.random.normal(jax.random.key(0), (3, 2, 6, 6, 2))
    params = conv.init(jax.random.key(1), xs[0])

    def loss(p, x):
        return jnp.sum(conv.apply(p, x) ** 2)

    def step(p, x):
        g = jax.grad(loss)(p, x)
        return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g), g

    scanned, gs = jax.jit(lambda p: jax.lax.scan(step, p, xs))(params)
    p = params
    for t in range(xs.shape[0]):
        p, g = step(p, xs[t])
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4),
            jax.tree_util.tree_map(lambda a, t=t: a[t], gs),
            g,
        )
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), scanned, p
    )


@pytest.mark.parametrize("hw", [(7, 7), (8, 6), (5, 9)])
@pytest.mark.parametrize("window", [2, 3])
def test_pooling_matches_numpy(hw: tuple[int, int], window: int) -> None:
    h, w = hw
    x = np.random.default_rng(0).normal(size=(2, h, w, 3)).astype(np.float32)
    ho, wo = h // window, w // window
    want_max = np.empty((2, ho, wo, 3), np.float32)
    want_avg = np.empty((2, ho, wo, 3), np.float32)
    for i in range(ho):
        for j in range(wo):
            patch = x[:, i * window : (i + 1) * window, j * window : (j + 1) * window, :]
            want_max[:, i, j] = patch.max(axis=(1, 2))
            want_avg[:, i, j] = patch.mean(axis=(1, 2))
    np.testing.assert_allclose(max_pool(jnp.asarray(x), window), want_max, rtol=1e-6)
    # float32 means of <= 9 N(0, 1) values (summed in a different order than NumPy): atol for
    # averages near 0, rtol for the rest. Max pooling above picks an element: exact.
    np.testing.assert_allclose(avg_pool(jnp.asarray(x), window), want_avg, rtol=1e-5, atol=1e-6)
    # Same floor semantics as flax's VALID pooling.
    ref = nn.max_pool(jnp.asarray(x), (window, window), (window, window), "VALID")
    np.testing.assert_allclose(max_pool(jnp.asarray(x), window), ref)


def test_max_pool_7x7_gives_3x3() -> None:
    assert max_pool(jnp.zeros((1, 7, 7, 4))).shape == (1, 3, 3, 4)


def test_dropout_inverted_and_switchable() -> None:
    x = jnp.ones((1000,))
    d = Dropout(0.5)
    assert d.apply({}, x, active=False) is x
    y = d.apply({}, x, active=True, rngs={"dropout": jax.random.key(0)})
    assert set(np.unique(np.asarray(y)).tolist()) <= {0.0, 2.0}
    assert 0.4 < float(jnp.mean(y == 0)) < 0.6


def test_registry_and_validation() -> None:
    assert (
        model_names()
        == sorted(MODELS)
        == [
            "cnn",
            "mlp",
            "resnet9",
            "simple_cnn",
            "svhn_cnn",
            "text",
            "text_cnn",
            "vgg9",
            "vgg9_exits",
        ]
    )
    allowed = "cnn, mlp, resnet9, simple_cnn, svhn_cnn, text"
    with pytest.raises(ValueError, match=rf"model\.name.*'bogus'.*{allowed}"):
        make_model("bogus", SHAPE, 10)
    with pytest.raises(ValueError, match=r"model\.width"):
        make_model("cnn", SHAPE, 10, width=0.0)
    with pytest.raises(ValueError, match=r"model\.dropout"):
        make_model("cnn", SHAPE, 10, dropout=1.0)
    with pytest.raises(ValueError, match=r"model\.conv"):
        make_model("cnn", SHAPE, 10, conv_impl="fft")


def test_fedavg_cnn_param_count() -> None:
    # conv1 5*5*1*32+32 + conv2 5*5*32*64+64 + dense 7*7*64*512+512 + out 512*10+10.
    model = make_model("cnn", SHAPE, 10)
    variables = jax.eval_shape(model.init, jax.random.key(0))
    assert num_params(variables) == 1_663_370


def test_dofed_cnn_param_count() -> None:
    # Spec dofed_spp.md 3.3: 3x3 convs (896 + 18,496), dense 4096->128 (524,416), 128->Q.
    for q, want in ((10, 545_098), (100, 556_708)):
        model = make_model("cnn", (32, 32, 3), q, conv_kernel=3, dense=128)
        assert num_params(jax.eval_shape(model.init, jax.random.key(0))) == want
    with pytest.raises(ValueError, match=r"model\.conv_kernel"):
        make_model("cnn", SHAPE, 10, conv_kernel=0)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_vgg9_param_count_and_dropout() -> None:
    # FedMA's VGG-9, "3.49 M parameters" in Ada-FedSemi's Sec. 5.1: convs 896 + 18,496 +
    # 73,856 + 147,584 + 295,168 + 590,080, FC 2,097,664 + 262,656 + 5,130 = 3,491,530.
    model = make_model("vgg9", (32, 32, 3), 10, dropout=0.1)
    variables = model.init(jax.random.key(0))
    assert num_params(variables) == 3_491_530
    x = jax.random.uniform(jax.random.key(1), (2, 32, 32, 3), maxval=255.0)
    det1, _ = model.apply(variables, x)
    det2, _ = model.apply(variables, x)
    mc, _ = model.apply(variables, x, mc=True, rng=jax.random.key(2))
    assert det1.shape == (2, 10)
    np.testing.assert_array_equal(det1, det2)
    assert not np.allclose(det1, mc)  # dropout is on in MC passes


def test_benchmark_workload_models_param_counts() -> None:
    """pfl-research's simple_cnn (W1): 3x3 VALID convs 896 + 18,496, dense 14*14*64 -> 128
    (1,605,760), 128 -> 10; FLUTE/LEAF's FEMNIST CNN (W2): the FedAvg CNN with Dense(2048)."""
    model = make_model("simple_cnn", (32, 32, 3), 10, dropout=0.5)
    assert num_params(jax.eval_shape(model.init, jax.random.key(0))) == 1_626_442
    logits = model.apply(model.init(jax.random.key(0)), jnp.zeros((2, 32, 32, 3)))[0]
    assert logits.shape == (2, 10)
    femnist = make_model("cnn", SHAPE, 62, dense=2048)
    assert num_params(jax.eval_shape(femnist.init, jax.random.key(0))) == 6_603_710


def test_mlp_2nn_param_count() -> None:
    model = make_model("mlp", SHAPE, 10)
    variables = jax.eval_shape(model.init, jax.random.key(0))
    assert num_params(variables) == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def _images(n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *SHAPE), dtype=np.uint8)


@functools.cache
def _setup(name: str):
    """Model (dropout 0.5), 3 clients' variables from a vmapped init, and a jitted apply.

    Cached and jitted because XLA:CPU compiles dominate this file's runtime. Init keys use
    the "rbg" PRNG: threefry init compiles ~0.7 s per parameter tensor here, and the
    vmap-vs-per-client checks below only need the stacked variables, not init equality.
    """
    model = make_model(name, SHAPE, 10, mean=(0.13,), std=(0.31,), dropout=0.5, **SMALL[name])
    keys = jax.random.split(jax.random.key(0, impl="rbg"), 3)
    stacked = jax.jit(jax.vmap(model.init))(keys)
    # Always pass an rng so eval with/without it shares one compile (None is checked traced).
    jitted = jax.jit(model.apply, static_argnames=("train", "mc"))

    def apply(variables, x, *, train: bool = False, mc: bool = False, rng=None):
        return jitted(
            variables, x, train=train, mc=mc, rng=jax.random.key(0) if rng is None else rng
        )

    return model, stacked, apply


# ResNet-9 (not a default model; its forward modes are the CNN's plus BatchNorm, which the masked
# BatchNorm tests cover) in make test-slow.
@pytest.mark.parametrize("name", ["mlp", "cnn", pytest.param("resnet9", marks=pytest.mark.slow)])
def test_model_forward_modes(name: str) -> None:
    model, stacked, apply = _setup(name)
    variables = client_of(stacked, 0)
    assert set(variables) == ({"params", "batch_stats"} if model.has_batch_stats else {"params"})
    # Model.init also works un-vmapped (traced only, to keep the test fast).
    assert _shapes(jax.eval_shape(model.init, jax.random.key(0))) == _shapes(variables)
    x = _images()
    # uint8 and the equivalent raw float input normalize identically.
    np.testing.assert_allclose(model.preprocess(x), model.preprocess(x.astype(np.float32)))
    # float32 (x / 255 - mean) / std of O(1) vs float64; near 0 for x ~ 33: atol too.
    np.testing.assert_allclose(
        model.preprocess(x)[0, 0, 0, 0], (x[0, 0, 0, 0] / 255 - 0.13) / 0.31, rtol=1e-5, atol=1e-6
    )

    logits, state = apply(variables, x)
    assert logits.shape == (4, 10) and logits.dtype == jnp.float32
    assert state == {}
    traced = jax.eval_shape(lambda v: model.apply(v, x), variables)  # no rng needed in eval
    assert traced[0].shape == (4, 10) and traced[1] == {}
    # Eval ignores dropout even when an rng is passed.
    e1, _ = apply(variables, x, rng=jax.random.key(1))
    e2, _ = apply(variables, x, rng=jax.random.key(2))
    np.testing.assert_array_equal(e1, e2)
    np.testing.assert_allclose(e1, logits, atol=1e-6)

    # MC dropout: stochastic across rngs, BN on running stats, no state returned.
    mc1, s1 = apply(variables, x, mc=True, rng=jax.random.key(1))
    mc2, s2 = apply(variables, x, mc=True, rng=jax.random.key(2))
    assert s1 == {} and s2 == {}
    assert not np.allclose(mc1, mc2)
    with pytest.raises(ValueError, match="rng"):
        model.apply(variables, x, mc=True)

    # Training mode.
    tr, new_state = apply(variables, x, train=True, rng=jax.random.key(3))
    assert tr.shape == (4, 10)
    if model.has_batch_stats:
        assert set(new_state) == {"batch_stats"}
        assert _shapes(new_state["batch_stats"]) == _shapes(variables["batch_stats"])
        changed = jax.tree_util.tree_map(
            lambda a, b: not np.allclose(a, b), new_state["batch_stats"], variables["batch_stats"]
        )
        assert all(jax.tree_util.tree_leaves(changed))
    else:
        assert new_state == {}


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet9"])
def test_mc_without_dropout_is_deterministic(name: str) -> None:
    _, stacked, _ = _setup(name)
    model = make_model(name, SHAPE, 10, dropout=0.0, **SMALL[name])
    assert not model.has_dropout
    variables = client_of(stacked, 0)
    x = _images()
    mc = jax.jit(lambda v, x, r: model.apply(v, x, mc=True, rng=r)[0])
    np.testing.assert_array_equal(
        mc(variables, x, jax.random.key(1)), mc(variables, x, jax.random.key(2))
    )
    # rng is optional when dropout is off (traced only).
    out = jax.eval_shape(lambda v: model.apply(v, x, mc=True), variables)
    assert out[0].shape == (4, 10) and out[1] == {}


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet9"])
def test_vmap_over_clients_matches_per_client(name: str) -> None:
    model, stacked, apply = _setup(name)
    xs = jnp.stack([jnp.asarray(_images(seed=s)) for s in range(3)])
    rngs = jax.random.split(jax.random.key(9), 3)

    def both(v, x, r):
        # Train mode exercises dropout rngs and mutable batch_stats under vmap; one jit
        # for both modes halves compile time.
        logits, state = model.apply(v, x, train=True, rng=r)
        return logits, state, model.apply(v, x)[0]

    logits, states, eval_logits = jax.jit(jax.vmap(both))(stacked, xs, rngs)
    assert logits.shape == eval_logits.shape == (3, 4, 10)
    for c in range(3):
        v = client_of(stacked, c)
        one_logits, one_state = apply(v, xs[c], train=True, rng=rngs[c])
        np.testing.assert_allclose(logits[c], one_logits, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(eval_logits[c], apply(v, xs[c])[0], atol=1e-5, rtol=1e-5)
        jax.tree_util.tree_map(
            lambda a, b, c=c: np.testing.assert_allclose(a[c], b, atol=1e-5, rtol=1e-5),
            states,
            one_state,
        )
    # Clients really differ (independent inits).
    assert not np.allclose(eval_logits[0], eval_logits[1])


def test_resnet9_prefix_suffix_and_norm_none() -> None:
    model, stacked, apply = _setup("resnet9")
    variables = client_of(stacked, 0)
    x = _images()
    rng = jax.random.key(5)

    @jax.jit
    def split(v, x, r):
        skip, a = model.module.apply(v, x, False, method="prefix")
        out = model.module.apply(v, skip, a, False, True, method="suffix", rngs={"dropout": r})
        return skip, a, out

    skip, a, out = split(variables, model.preprocess(x), rng)
    assert skip.shape == a.shape == (4, 3, 3, 32)  # 28 -> 14 -> 7 -> 3; 512 / 16 channels
    whole, _ = apply(variables, x, mc=True, rng=rng)
    np.testing.assert_allclose(out, whole, atol=1e-5)

    plain = make_model("resnet9", SHAPE, 10, width=0.0625, norm="none")
    pv = jax.eval_shape(plain.init, jax.random.key(0))
    assert not plain.has_batch_stats and set(pv) == {"params"}
    logits, state = jax.eval_shape(lambda v: plain.apply(v, x, train=True), pv)
    assert logits.shape == (4, 10) and state == {}


def test_conv_impl_xla_same_params_same_logits() -> None:
    m_i, stacked, apply = _setup("cnn")
    m_x = make_model(
        "cnn", SHAPE, 10, mean=(0.13,), std=(0.31,), dropout=0.5, conv_impl="xla", **SMALL["cnn"]
    )
    v = client_of(stacked, 0)
    assert _shapes(v) == _shapes(jax.eval_shape(m_x.init, jax.random.key(0)))
    np.testing.assert_allclose(
        apply(v, _images())[0], jax.jit(m_x.apply)(v, _images())[0], atol=1e-4, rtol=1e-5
    )


def _blob_images(n: int, seed: int) -> np.ndarray:
    """Fashion-MNIST-like uint8 images: a zero background and one bright rectangle each."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, *SHAPE), np.uint8)
    for i in range(n):
        a, b = rng.integers(2, 12, 2)
        h, w = rng.integers(8, 16, 2)
        x[i, a : a + h, b : b + w, 0] = rng.integers(100, 256)
    return x


def test_resnet9_output_scale_is_the_myrtle_models_and_keeps_the_first_loss_near_log_k() -> None:
    x = _blob_images(32, 0)
    y = jnp.asarray(np.random.default_rng(1).integers(0, 10, len(x)))
    kw = dict(width=0.0625, mean=(72.9,), std=(90.0,))
    plain = make_model("resnet9", SHAPE, 10, **kw)
    myrtle = make_model("resnet9", SHAPE, 10, output_scale=0.125, **kw)
    init = jax.jit(myrtle.init)  # the scale is no parameter: one init serves both models

    @jax.jit
    def both(v):
        return plain.apply(v, x, train=True)[0], myrtle.apply(v, x, train=True)[0]

    losses = {"plain": [], "myrtle": []}
    for k in range(3):
        ref, logits = both(init(jax.random.key(k, impl="rbg")))  # rbg: threefry compiles slowly
        # The same parameters, logits x 0.125 (atol: logits near 0).
        np.testing.assert_allclose(logits, 0.125 * np.asarray(ref), rtol=1e-5, atol=1e-6)
        for name, z in (("plain", ref), ("myrtle", logits)):
            losses[name].append(float(optax.softmax_cross_entropy_with_integer_labels(z, y).mean()))
    # log(10) = 2.303: the scaled model starts there (2.31-2.38); the plain one 1.5-4.1 nats above
    # on images with a background.
    assert max(abs(v - np.log(10)) for v in losses["myrtle"]) < 0.15, losses
    assert min(losses["plain"]) > np.log(10) + 0.5, losses


def test_output_scale_of_another_model_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"model.output_scale=0.5.*1.0 unless model resnet9"):
        make_model("mlp", SHAPE, 10, output_scale=0.5)
    with pytest.raises(ValueError, match=r"model.output_scale=0.0.*> 0"):
        make_model("resnet9", SHAPE, 10, width=0.0625, output_scale=0.0)
