"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II): two rounds against an independent
NumPy Algorithm 1 on logistic regression, round 1 against FedAvg, chunk=1 = chunk=all = the
reference loop, hidden labels, and resume."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import compose_config, corrupt_hidden_labels, run_rounds, swapped_data
from fedjax_semi import experiment
from fedjax_semi.config import ConfigError
from fedjax_semi.engine.keys import SAMPLE, client_key
from fedjax_semi.engine.train import batch_positions
from fedjax_semi.results.rundir import Checkpointer

# Logistic regression (an MLP without hidden layers) on digits, every client mapped on its own:
# the same compiled round serves the tests below and the resumed runs.
TINY = ("model.hidden=[]", "hardware.chunk=1", "algorithm.lr=0.1")
ROUNDS = 2


def run(runner, rounds: int = ROUNDS, state=None):
    """(states after rounds 0..rounds, each round's metrics)."""
    return run_rounds(runner, rounds, state, evaluate=False)


@pytest.fixture(scope="module")
def exp():
    return experiment.build(compose_config("algorithm=scaffold", *TINY))


@pytest.fixture(scope="module")
def chunk1(exp):
    runner = exp.runner(chunk=1)
    return runner, *run(runner)


# ------------------------------------------------------------------------- NumPy Algorithm 1


def np_local(x, c, c_i, feats, labels, positions, valid, lr):
    """Lines 5-12 for one client of a softmax regression: K corrected SGD steps from x on the
    masked mean cross-entropy, then option II. -> (y_i, c_i+, K)."""
    w, b = x
    k = 0
    for pos, ok in zip(positions, valid, strict=True):
        if not ok.any():
            continue  # a step past the client's data is not taken
        xb, yb = feats[pos][ok], labels[pos][ok]
        logits = xb @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1.0
        gw, gb = xb.T @ p / len(yb), p.sum(0) / len(yb)
        w = w - lr * (gw - c_i[0] + c[0])
        b = b - lr * (gb - c_i[1] + c[1])
        k += 1
    c_plus = tuple(
        ci - cc + (xx - yy) / (k * lr) for ci, cc, xx, yy in zip(c_i, c, x, (w, b), strict=True)
    )
    return (w, b), c_plus, k


def test_two_rounds_match_numpy_algorithm_1(exp, chunk1):
    """Two rounds (the second with nonzero controls) against NumPy, from the same initial model
    and on the same cohorts and batch order (the engine's `select_cohort` and `batch_positions`
    draws, read, not reimplemented)."""
    runner, states, metrics = chunk1
    alg, fed, cfg = exp.alg, exp.fed, exp.cfg.algorithm
    feats = np.asarray(exp.model.preprocess(fed.x), np.float64).reshape(fed.x.shape[0], -1)
    labels = np.asarray(runner.data.y)
    table = fed.roles["labeled"]
    idx, count = np.asarray(table.idx), np.asarray(table.count)
    key = jax.random.PRNGKey(exp.cfg.seed)

    def leaves(tree):
        d = tree["Dense_0"]
        return (np.asarray(d["kernel"], np.float64), np.asarray(d["bias"], np.float64))

    x, c = leaves(states[0].x["params"]), (0.0, 0.0)
    c_i = {i: (0.0, 0.0) for i in range(alg.num_clients)}
    for t, m in enumerate(metrics):
        dy, dc = [], []
        for cid in m["cohort"].tolist():
            pos, valid = batch_positions(
                client_key(key, SAMPLE, t, cid), count[cid], idx.shape[1], alg.schedule
            )
            rows = idx[cid][np.asarray(pos)]
            y, c_plus, k = np_local(x, c, c_i[cid], feats, labels, rows, np.asarray(valid), cfg.lr)
            assert k > 0
            dy.append([a - b for a, b in zip(y, x, strict=True)])
            dc.append([a - b for a, b in zip(c_plus, c_i[cid], strict=True)])
            c_i[cid] = c_plus
        # Lines 16-17: x += η_g mean Δy (every cohort client holds data); c += |S|/N mean Δc.
        x = tuple(xx + cfg.server_lr * np.mean([d[j] for d in dy], 0) for j, xx in enumerate(x))
        c = tuple(cc + np.sum([d[j] for d in dc], 0) / alg.num_clients for j, cc in enumerate(c))
        got = states[t + 1]
        pairs = [("x", x, leaves(got.x["params"])), ("c", c, leaves(got.c))]
        for i, want in c_i.items():  # every client's control, the untouched ones still 0
            pairs.append((f"c_{i}", want, leaves(jax.tree.map(lambda a, i=i: a[i], got.c_i))))
        for name, want, have in pairs:
            for a, b in zip(have, want, strict=True):
                np.testing.assert_allclose(a, b + 0 * a, atol=2e-5, err_msg=f"round {t + 1} {name}")
    assert np.abs(c[0]).max() > 1e-3  # the controls moved: round 2 ran corrected steps


def test_server_control_is_the_mean_of_client_controls(exp, chunk1):
    """Line 17 keeps c = (1/N) Σ_i c_i over all N clients."""
    last = chunk1[1][-1]
    mean = jax.tree.map(lambda a: a.mean(0), last.c_i)
    for a, b in zip(jax.tree.leaves(last.c), jax.tree.leaves(mean), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_round_1_is_fedavg_when_controls_start_at_zero(exp, chunk1):
    """With c = c_i = 0 the corrected step is the plain one and option II does not feed back
    into round 1, so x_1 is FedAvg's (uniform weights, same seed, cohort and batches). FedAvg
    computes x + (mean y_i - x), SCAFFOLD x + mean (y_i - x): float32 rounding of the
    parameters' size (|x| < 1: ulp 6e-8, a few of them) is all that may differ."""
    fedavg = experiment.build(
        compose_config("algorithm=fedavg", "algorithm.weighting=uniform", *TINY)
    )
    runner = fedavg.runner(chunk=1)
    state, m = runner.round(runner.init())
    np.testing.assert_array_equal(m["cohort"], chunk1[2][0]["cohort"])
    ours = chunk1[1][1].x
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(state.w), strict=True):
        np.testing.assert_allclose(a, b, atol=5e-7, rtol=0)
    assert float(m["train_loss"]) == pytest.approx(float(chunk1[2][0]["train_loss"]), abs=1e-6)


def test_chunk_and_reference_agree(exp, chunk1):
    _, want, want_m = chunk1
    for label, runner in [
        ("chunk=all", exp.runner(chunk="all")),
        ("reference", exp.runner(backend="reference")),
    ]:
        states, metrics = run(runner)
        for a, b in zip(metrics, want_m, strict=True):
            np.testing.assert_array_equal(a["cohort"], b["cohort"])
            np.testing.assert_allclose(a["train_loss"], b["train_loss"], atol=1e-5)
        for a, b in zip(jax.tree.leaves(states[-1]), jax.tree.leaves(want[-1]), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, err_msg=label)


@pytest.mark.hidden_labels("scaffold")
def test_training_ignores_hidden_labels(exp, chunk1):
    runner, want, _ = chunk1
    with swapped_data(runner, corrupt_hidden_labels(exp.fed)):  # the same programs, other labels
        got, _ = run(runner)
    for a, b in zip(jax.tree.leaves(got[-1]), jax.tree.leaves(want[-1]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_resume_continues_as_one_run(exp, chunk1, tmp_path):
    """2 rounds, a checkpoint (the run loop's Orbax checkpointer), restored into the run's
    template and resumed to 4, give the state of 4 rounds run straight."""
    runner, states, _ = chunk1
    straight, _ = run(runner, 2, states[-1])
    saved = Checkpointer(tmp_path / "checkpoints")
    saved.save(ROUNDS, states[-1])
    step, restored = Checkpointer(tmp_path / "checkpoints").restore_latest(runner.template())
    assert step == ROUNDS and isinstance(restored, type(states[-1]))
    resumed, _ = run(runner, 2, restored)
    assert int(resumed[-1].round) == 4
    for a, b in zip(jax.tree.leaves(resumed[-1]), jax.tree.leaves(straight[-1]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "over, key",
    [
        (["algorithm.optimizer=adam"], "algorithm.optimizer='adam'"),
        (["algorithm.server_lr=0"], "algorithm.server_lr=0.0"),
        (["algorithm.weighting=size"], "algorithm.weighting='size'"),
    ],
)
def test_bad_knobs_are_one_line(over, key):
    with pytest.raises(ConfigError) as e:
        compose_config("algorithm=scaffold", *over)
    msg = str(e.value)
    assert msg.startswith(f"{key} is not allowed: ") and "\n" not in msg
