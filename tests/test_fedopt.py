"""FedOpt (Reddi et al. 2021, Algorithm 2): sgd with server_lr 1 is FedAvg bit for bit; the
FedAdam, FedYogi and FedAdagrad server steps against NumPy; which parts of optax's optimizers
agree with the paper's; hidden labels; one-line errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import compose_config, corrupt_hidden_labels, swapped_data
from fedjax_semi import experiment
from fedjax_semi.algorithms.fedopt import FedOptUpload
from fedjax_semi.config import ConfigError
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.aggregate import ServerMoments

# The logistic regression of test_scaffold.py (the same compiled FedAvg round).
TINY = ("model.hidden=[]", "hardware.chunk=1", "algorithm.lr=0.1")


def run(runner, rounds: int = 2):
    state = runner.init()
    for _ in range(rounds):
        state, m = runner.round(state)
    return state, jax.device_get(m)


@pytest.fixture(scope="module")
def sgd():
    over = ("algorithm=fedopt", "algorithm.server_optimizer=sgd", "algorithm.server_lr=1.0")
    exp = experiment.build(compose_config(*over, *TINY))
    runner = exp.runner(chunk=1)
    return exp, runner, run(runner)


def test_sgd_with_server_lr_1_is_fedavg(sgd):
    """x + 1 · (-(-Δ)) through optax.sgd is FedAvg's x + 1 · (mean y_i - x): equal bits."""
    fedavg = experiment.build(
        compose_config("algorithm=fedavg", "algorithm.weighting=uniform", *TINY)
    )
    want, m = run(fedavg.runner(chunk=1))
    got, m2 = sgd[2]
    np.testing.assert_array_equal(m["cohort"], m2["cohort"])
    for a, b in zip(jax.tree.leaves(got.x), jax.tree.leaves(want.w), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(got.round) == 2


# fedadam, fedyogi and fedadagrad are this method with another server step (which reads only the
# uploaded deltas): one client update, checked once.
@pytest.mark.hidden_labels("fedopt", "fedadam", "fedyogi", "fedadagrad")
def test_training_ignores_hidden_labels(sgd):
    exp, runner, (want, _) = sgd
    with swapped_data(runner, corrupt_hidden_labels(exp.fed)):  # the same programs, other labels
        got, _ = run(runner)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------- the server step


def np_fedopt(rule, x, deltas, lr, b1, b2, tau):
    """Algorithm 2's server steps from m = 0, v = τ², one per Δ_t: the list of x_t."""
    m, v, out = np.zeros_like(x), np.full_like(x, tau**2), []
    for d in deltas:
        m = b1 * m + (1 - b1) * d
        if rule == "adam":
            v = b2 * v + (1 - b2) * d**2
        elif rule == "yogi":
            v = v - (1 - b2) * d**2 * np.sign(v - d**2)
        else:
            v = v + d**2
        x = x + lr * m / (np.sqrt(v) + tau)
        out.append(x)
    return out


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_server_steps_match_numpy(name):
    """Two rounds of the method's own server update (the registered name, its YAML's β1, β2,
    τ; η = 0.05) on uploads y_i = x + noise of three clients, one of them without data; then a
    round in which none held data."""
    exp = experiment.build(compose_config(f"algorithm={name}", *TINY, "algorithm.server_lr=0.05"))
    alg, c = exp.alg, exp.cfg.algorithm
    state = alg.init(jax.random.PRNGKey(0), exp.fed)
    rng = np.random.default_rng(0)
    weight = jnp.array([1.0, 1.0, 0.0])  # uniform weights; the third client held no data
    stats = {"loss": jnp.ones(3), "steps": jnp.array([2, 2, 0]), "pl_rate": jnp.zeros(3)}
    update = jax.jit(alg.server_update)
    xs, deltas = [state.x], []
    for _ in range(2):
        noise = jax.tree.map(lambda a: rng.normal(0, 0.01, (3, *a.shape)), state.x)
        ups = jax.tree.map(lambda a, n: (a + n).astype(np.float32), state.x, noise)
        d = jax.tree.map(lambda u, a: np.float64(u[:2]).mean(0) - np.float64(a), ups, state.x)
        deltas.append(d)
        state, metrics = update(state, jnp.arange(3), FedOptUpload(ups, weight, stats))
        xs.append(state.x)
    assert float(metrics["train_loss"]) == 1.0
    leaf = lambda t: np.float64(t["params"]["Dense_0"]["kernel"])  # noqa: E731
    want = np_fedopt(
        c.server_optimizer, leaf(xs[0]), [leaf(d) for d in deltas],
        c.server_lr, c.server_beta1, c.server_beta2, c.server_tau,
    )  # fmt: skip
    for t, w in enumerate(want, 1):
        # The float32 Δ of the step differs from the float64 one by its rounding; each step
        # moves a coordinate by at most about η.
        np.testing.assert_allclose(leaf(xs[t]), w, atol=1e-5, rtol=0, err_msg=f"round {t}")
    assert np.abs(leaf(xs[2]) - leaf(xs[0])).max() > 0.01
    # A round in which no client held data leaves x and the moments as they were.
    new, _ = update(state, jnp.arange(3), FedOptUpload(ups, jnp.zeros(3), stats))
    for a, b in zip(
        jax.tree.leaves((new.x, new.opt)), jax.tree.leaves((state.x, state.opt)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert int(new.round) == int(state.round) + 1


def test_which_parts_of_optax_agree_with_the_paper():
    """The moment rules are optax's (Adam's EMAs; Yogi's sign rule, from optax's initial
    accumulator set to τ²; Adagrad's sum); the steps are not: optax corrects the bias (adam,
    yogi) and adagrad divides by √(v + eps) without momentum."""
    b1, b2, tau = 0.9, 0.99, 1e-3
    g = [jnp.array([0.3, -2e-3, 1e-4, 0.0]), jnp.array([-0.1, 5e-3, 0.2, 1e-3])]

    def moments(tx, state):
        steps = []
        for gt in g:
            step, state = tx.update(gt, state)
            steps.append(step)
        return steps, state

    # Adam from the same moments (ours start v at τ², optax's at 0: start ours at 0 here).
    ours = aggregate.scale_by_fedopt("adam", b1, b2, tau)
    start = ServerMoments(jnp.zeros(4), jnp.zeros(4))
    ours_steps, (m, v) = moments(ours, start)
    adam = optax.scale_by_adam(b1, b2, eps=tau)
    adam_steps, st = moments(adam, adam.init(jnp.zeros(4)))
    np.testing.assert_allclose(m, st.mu, rtol=1e-6)
    np.testing.assert_allclose(v, st.nu, rtol=1e-6)
    c1, c2 = 1 - b1**2, 1 - b2**2  # optax's bias correction after two steps
    np.testing.assert_allclose(adam_steps[1], (m / c1) / (jnp.sqrt(v / c2) + tau), rtol=1e-5)
    assert not np.allclose(adam_steps[1], ours_steps[1], rtol=1e-2)
    # Yogi's v, both from τ² (optax.yogi itself starts m and v at 1e-6).
    _, (_, v) = moments(aggregate.scale_by_fedopt("yogi", b1, b2, tau), ours.init(jnp.zeros(4)))
    yogi = optax.scale_by_yogi(b1, b2, eps=tau, initial_accumulator_value=tau**2)
    _, st = moments(yogi, yogi.init(jnp.zeros(4)))
    np.testing.assert_allclose(v, st.nu, rtol=1e-6)
    # Adagrad's sum of squares from τ²; optax's step is g / √(v + eps), no momentum.
    _, (_, v) = moments(aggregate.scale_by_fedopt("adagrad", b1, b2, tau), ours.init(jnp.zeros(4)))
    rss = optax.scale_by_rss(initial_accumulator_value=tau**2, eps=0.0)
    _, st = moments(rss, rss.init(jnp.zeros(4)))
    np.testing.assert_allclose(v, st.sum_of_squares, rtol=1e-6)


@pytest.mark.parametrize(
    "over, line",
    [
        (
            ["algorithm=fedopt", "algorithm.server_optimizer=nadam"],
            "algorithm.server_optimizer='nadam' is not allowed: one of "
            "['sgd', 'adam', 'yogi', 'adagrad']",
        ),
        (
            ["algorithm=fedyogi", "algorithm.server_optimizer=adam"],
            "algorithm.server_optimizer='adam' is not allowed: 'yogi' for algorithm fedyogi "
            "(algorithm=fedopt takes any)",
        ),
        (["algorithm=fedadam", "algorithm.server_tau=0"], "algorithm.server_tau=0.0 is not"),
        (["algorithm=fedadam", "algorithm.server_beta2=1"], "algorithm.server_beta2=1.0 is not"),
    ],
)
def test_bad_server_knobs_are_one_line(over, line):
    with pytest.raises(ConfigError) as e:
        compose_config(*over)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)
