"""Ada-FedSemi, FedSemi-P-C and FedAvg-P end to end on a tiny ada partition of digits (8x8):
M = 10 clients, a server unlabeled pool and validation set. Exact participant counts and one
compiled round for every P arm (spec acceptance 1, 5), the cost bookkeeping (15), C = 1.0
selects nothing and FedSemi-P-1.0 = FedAvg-P bit for bit (7, 8), the server epoch's step count
and its skip (9), chunk=1 = chunk=all = the reference loop, the validation set and the pool's
hidden labels never train anything, a spent budget stopping the run in the run loop (17), the
heterogeneous TX2 clock with its waiting ratio, the preference switch, and one-line errors for
bad input. The kernels: test_bandit.py, test_ada_cost.py; HeteroAda-FedSemi: test_hetero_ada.py and
test_hetero_ada_parts.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, corrupt_hidden_labels, corrupt_server_labels, swapped_data
from conftest import run_rounds as run
from fedjax_semi import experiment
from fedjax_semi.algorithms.ada_fedsemi_config import participant_counts
from fedjax_semi.algorithms.ada_run import PreferenceSwitch
from fedjax_semi.algorithms.ada_state import AdaState
from fedjax_semi.engine.loop import Run, pseudo_label_accuracy
from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels.bandit import P_ARMS, participants
from fedjax_semi.results.run import simulate
from fedjax_semi.systems import tx2

M = 10
BASE = [
    "partition=ada",
    f"num_clients={M}",
    f"clients_per_round={M}",
    "partition.labeled_fraction=0.3",
    "algorithm.local_steps=3",
    "algorithm.batch_size=16",
    "algorithm.server_batch=64",
    "algorithm.lr=0.1",
]


def build(*extra: str):
    return experiment.build(compose_config(*BASE, *extra))


@pytest.fixture(scope="module")
def ada():
    return build("algorithm=ada_fedsemi")


@pytest.fixture(scope="module")
def fixed():
    """FedSemi-0.5-0.2: a low threshold (10 classes), so pseudo-labels pass from round 1."""
    return build("algorithm=fedsemi", "algorithm.fixed_p=0.5", "algorithm.fixed_c=0.2")


def test_participant_counts_are_exact():
    want = tuple(range(2, 21, 2))  # ceil(P M) for M = 20: 0.3 -> 6, 0.7 -> 14
    assert participant_counts(P_ARMS, 20) == want
    assert tuple(int(n) for n in participants(jnp.arange(10), 20)) == want
    assert participant_counts([0.1 + 0.2], 20) == (7,)  # the float 0.30000000000000004 is > 0.3


def test_every_p_arm_selects_ceil_pm_clients_in_one_compiled_round(ada):
    """All ten P arms through the same compiled round (the arm is state, not a shape), with
    n_k = ceil(P_k M) distinct participants; the round's time, traffic and their sums."""
    runner = ada.runner(chunk=1, eval_chunk=1)
    state = runner.init()
    alg, c = ada.alg, ada.cfg.algorithm
    sim_time = traffic = 0.0
    for arm in range(10):
        state = state.replace(agent_p=state.agent_p.replace(arm=jnp.int32(arm)))
        state, m = runner.round(state)
        m = jax.device_get(m)
        n = math.ceil((arm + 1) * M / 10)
        assert int(m["n"]) == n == int(np.sum(m["selected"])), arm
        assert np.all(m["client_loss"][~m["selected"]] == 0)  # unselected: no step
        t = c.client_time_s + c.t_p * int(m["num_pseudo"])
        b = n * 2 * alg.model_bytes / 1e9
        np.testing.assert_allclose(m["round_time_s"], t, rtol=1e-6)
        np.testing.assert_allclose(m["round_traffic_gb"], b, rtol=1e-6)
        sim_time, traffic = sim_time + t, traffic + b
        np.testing.assert_allclose(m["cum_time_min"], sim_time / 60, rtol=1e-5)
        np.testing.assert_allclose(m["cum_traffic_gb"], traffic, rtol=1e-5)
        want_phi = c.alpha * t / 60 + (1 - c.alpha) * b
        np.testing.assert_allclose(m["round_cost"], want_phi, rtol=1e-5)
    assert runner._round._cache_size() == 1  # no recompilation across the arms
    np.testing.assert_allclose(float(state.sim_time), sim_time, rtol=1e-5)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_fedsemi_with_c_one_is_fedavg_p_bit_for_bit():
    """C = 1.0 selects nothing (strict >), so the server epoch is skipped (w_{k+1} = w_{k+1/2})
    and FedSemi-P-1.0, which still relabels the pool, equals FedAvg-P, which never does."""
    common = ["algorithm.fixed_p=0.4", "algorithm.fixed_c=1.0"]
    semi = build("algorithm=fedsemi", *common)
    avg = build("algorithm=fedavg_p", *common)
    sa, ra = run(semi.runner(chunk=1, eval_chunk=1), 3)
    sb, rb = run(avg.runner(chunk=1, eval_chunk=1), 3)
    for a, b in zip(ra, rb, strict=True):
        assert int(a["num_pseudo"]) == 0 and int(a["server_steps"]) == 0
        assert a["val_acc"] == a["val_acc_half"]  # nothing trained on the server
        for key in ("val_acc", "accuracy", "train_loss", "round_time_s", "cum_cost"):
            assert a[key] == b[key], key
    chex.assert_trees_all_equal(sa[-1].w, sb[-1].w)
    assert bool(sa[-1].labels.ready) and not bool(sb[-1].labels.ready)


def test_server_epoch_runs_ceil_n_over_b_steps(fixed):
    _, rows = run(fixed.runner(chunk=1, eval_chunk=1), 2)
    for m in rows:
        n = int(m["num_pseudo"])
        assert 0 < n < len(fixed.fed.server["server_unlabeled"])
        assert int(m["server_steps"]) == -(-n // fixed.cfg.algorithm.server_batch)
        assert int(np.sum(m["pl_label"] >= 0)) == n


@pytest.mark.slow  # make test-slow: the fast suite must stay under 12 minutes
def test_chunk_and_reference_agree(ada):
    """chunk=1 (lax.map), chunk=all (one vmap) and the reference loop: the same decisions
    exactly, the same numbers to float32 rounding (atol 1e-4: a vmap batches the clients'
    matmuls, which changes the order of float32 sums; the arithmetic is otherwise the same)."""
    results = {
        "chunk=1": run(ada.runner(chunk=1, eval_chunk=1), 3),
        "chunk=all": run(ada.runner(chunk="all", eval_chunk="all"), 3),
        "reference": run(ada.runner(backend="reference"), 3),
    }
    ref_states, ref_rows = results["reference"]
    for label, (states, rows) in results.items():
        for r, (a, b) in enumerate(zip(rows, ref_rows, strict=True)):
            for key in ("P", "C", "n", "selected"):
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{label} {r} {key}")
            for key in ("val_acc", "val_acc_half", "accuracy", "client_acc", "train_loss",
                        "reward_p", "reward_c", "cum_cost"):  # fmt: skip
                np.testing.assert_allclose(
                    a[key], b[key], atol=1e-4, err_msg=f"{label} round {r} {key}"
                )
            assert abs(int(a["num_pseudo"]) - int(b["num_pseudo"])) <= 1  # a conf at C
        pairs = zip(
            jax.tree.leaves(states[-1].w),
            jax.tree.leaves(ref_states[-1].w),
            strict=True,
        )
        for x, y in pairs:
            np.testing.assert_allclose(x, y, atol=1e-4, err_msg=label)


def test_validation_set_never_trains(fixed, ada):
    """Bandits off: corrupted validation labels change the validation accuracies (the rewards'
    input) and nothing that was trained. Bandits on: round 1's draws come before any reward, so
    its trained model is the same too."""
    runner = fixed.runner(chunk=1, eval_chunk=1)
    states, rows = run(runner, 2)
    with swapped_data(runner, corrupt_server_labels(fixed.fed, "server_val", visible=True)) as r:
        bad_states, bad_rows = run(r, 2, r.alg.init(jax.random.PRNGKey(0), r.fed))
    chex.assert_trees_all_equal(states[-1].w, bad_states[-1].w)
    chex.assert_trees_all_equal(states[-1].w_tilde, bad_states[-1].w_tilde)
    assert rows[-1]["val_acc"] != bad_rows[-1]["val_acc"]
    assert rows[-1]["accuracy"] == bad_rows[-1]["accuracy"]

    runner = ada.runner(chunk=1, eval_chunk=1)
    states, _ = run(runner, 1)
    with swapped_data(runner, corrupt_server_labels(ada.fed, "server_val", visible=True)) as r:
        bad_states, _ = run(r, 1, r.alg.init(jax.random.PRNGKey(0), r.fed))
    chex.assert_trees_all_equal(states[1].w, bad_states[1].w)
    assert not np.array_equal(states[1].u_prev, bad_states[1].u_prev)


@pytest.fixture(scope="module")
def fedavg_p():
    return build("algorithm=fedavg_p", "algorithm.fixed_p=0.5")


# FedAvg-P compiles a program of its own (20 s on a shared core): make test-slow (the fast
# suite checks Ada-FedSemi's client round: test_equivalence.FAST_STAND_INS).
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("fixed", marks=pytest.mark.hidden_labels("fedsemi")),
        pytest.param("ada", marks=pytest.mark.hidden_labels("ada_fedsemi")),
        pytest.param("fedavg_p", marks=[pytest.mark.hidden_labels("fedavg_p"), pytest.mark.slow]),
    ],
)
def test_hidden_labels_change_only_the_pseudo_label_accuracy(name, request):
    """FedSemi, Ada-FedSemi (both agents on) and FedAvg-P (no server training) with every
    hidden label corrupted (the pool's, the clients' and the test splits'): the states and
    every round metric stay; only the pseudo-labels' hits, which read them, move."""
    exp = request.getfixturevalue(name)
    runner = exp.runner(chunk=1, eval_chunk=1)
    states, rows = run(runner, 2, evaluate=False)  # the test labels are corrupted too
    bad_fed = corrupt_hidden_labels(exp.fed)
    with swapped_data(runner, bad_fed) as r:
        bad_states, bad_rows = run(r, 2, evaluate=False)
    chex.assert_trees_all_equal(states, bad_states)
    chex.assert_trees_all_equal(rows, bad_rows)  # every metric of the round
    if name == "fixed":  # C = 0.2: pseudo-labels pass from round 1, and their hits read them
        index, label = np.asarray(rows[-1]["pl_index"]), np.asarray(rows[-1]["pl_label"])
        assert pseudo_label_accuracy(index, label, exp.fed.eval_y) is not None
        hits = [(label == np.asarray(f.eval_y)[index]) & (label >= 0) for f in (exp.fed, bad_fed)]
        assert not np.array_equal(*hits)
    # Ada-FedSemi's thresholds and FedAvg-P's C = 1 pass none in two rounds here: the identity
    # above is their check (the fixed case shows the corruption moves what reads it).


def test_evaluation_does_not_read_the_pool_labels(fixed):
    """With only the pool's hidden labels corrupted, the evaluation's numbers stay too."""
    runner = fixed.runner(chunk=1, eval_chunk=1)
    _, rows = run(runner, 2)
    with swapped_data(runner, corrupt_server_labels(fixed.fed, "server_unlabeled", False)) as r:
        _, bad_rows = run(r, 2)
    chex.assert_trees_all_equal(rows, bad_rows)  # every metric of the round and the evaluation


# The traffic budget (the same stop path as time) in make test-slow: fast-suite time.
@pytest.mark.parametrize("budget", ["time", pytest.param("traffic", marks=pytest.mark.slow)])
def test_spent_budget_stops_the_run_in_the_loop(tmp_path, budget):
    """Acceptance 17 through the run loop: the run stops after the first round whose
    cumulative simulated time (31 s a round) or traffic (4 x 2 x 0.1 GB a round) reaches the
    budget, with the reason; rounds = 10 are not run out. The same run switches its
    preference on the test accuracy (the loop's hook): alpha 0.5 in round 1, alpha_after
    from round 2 on, each round's Phi with its own alpha."""
    limit = ["algorithm.time_budget_min=1.5"] if budget == "time" else [
        "algorithm.traffic_budget_gb=2.0"]  # fmt: skip
    exp = build("algorithm=fedavg_p", "algorithm.fixed_p=0.4", "algorithm.model_bytes=1e8",
                "algorithm.alpha_switch_at=0.01", "algorithm.alpha_after=0.1", *limit)  # fmt: skip
    summary = simulate(exp.alg, exp.fed, rounds=10, out_dir=tmp_path, progress=False,
                       runner=exp.runner(chunk=1, eval_chunk=1), writers=("jsonl",))  # fmt: skip
    assert summary["rounds_completed"] == 3
    assert summary["stop_reason"].startswith(f"{budget} budget spent")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    cum = "cum_time_min" if budget == "time" else "cum_traffic_gb"
    assert rows[1][cum] < (1.5 if budget == "time" else 2.0) <= rows[2][cum]
    assert [r["phase"] for r in rows] == [0, 1, 1]
    for r in rows:
        np.testing.assert_allclose(r["alpha"], 0.5 if r["phase"] == 0 else 0.1, rtol=1e-6)
        phi = r["alpha"] * r["round_time_s"] / 60 + (1 - r["alpha"]) * r["round_traffic_gb"]
        np.testing.assert_allclose(r["round_cost"], phi, rtol=1e-5)


def test_preference_switch_hook_sets_each_replicas_flag(ada):
    """The test-accuracy switch runs between rounds: a replica whose evaluated accuracy reached
    the threshold gets its flag, the others (and rows without an evaluation) do not; nothing
    else of the state changes."""
    one = ada.alg.init(jax.random.PRNGKey(0), ada.fed)
    assert isinstance(one, AdaState) and not bool(one.switched)
    state = jax.tree.map(lambda a: jnp.stack([a, a]), one)  # two replicas: leaves [2, ...]
    run_ = Run(dirs=[Path("a"), Path("b")], seeds=(0, 1), rounds=3, state=state)
    hook = PreferenceSwitch(0.6)
    hook.round(run_, 1, {0: {"accuracy": 0.59}, 1: {"accuracy": 0.6}})
    assert run_.state.switched.tolist() == [False, True]
    hook.round(run_, 2, {0: {"round": 2}, 1: {"round": 2}})  # no evaluation this round
    assert run_.state.switched.tolist() == [False, True]
    chex.assert_trees_all_equal(run_.state.replace(switched=state.switched), state)
    single = Run(dirs=[Path("a")], seeds=None, rounds=3, state=one)
    hook.round(single, 1, {0: {"accuracy": 0.7}})
    assert isinstance(single.state, AdaState) and bool(single.state.switched)


def test_heterogeneous_tx2_clock_and_the_validation_switch():
    """systems=tx2: each client's full-model time is Sec. 5.8's t_ovh + t_full / speed[mode] +
    2 W / bw (written out here in NumPy), t_k the selected straggler's, Eq. 34's waiting ratio
    over the selected; alpha_switch_metric=val switches inside the round on u_C."""
    exp = build("algorithm=fedavg_p", "algorithm.fixed_p=0.6", "systems=tx2",
                "algorithm.model_bytes=13.4e6", "algorithm.alpha=0.9", "algorithm.alpha_after=0.1",
                "algorithm.alpha_switch_at=0.01", "algorithm.alpha_switch_metric=val")  # fmt: skip
    _, rows = run(exp.runner(chunk=1, eval_chunk=1), 2)
    s, key = exp.cfg.systems, jax.random.PRNGKey(exp.cfg.seed)
    waits = []
    for k, m in enumerate(rows, start=1):
        speed = np.asarray(s.tx2.speeds)[np.asarray(tx2.modes(exp.alg.tx2, key, k, M))]
        bw = np.asarray(tx2.bandwidth_mbps(exp.alg.tx2, key, k, M))
        t = (s.tx2.overhead_s + s.tx2.compute_full_s / speed + 2 * 13.4 / bw)[m["selected"]]
        np.testing.assert_allclose(m["round_time_s"], t.max(), rtol=1e-5)
        np.testing.assert_allclose(m["wait_ratio"], 100 * np.mean(1 - t / t.max()), rtol=1e-4)
        waits += list(1 - t / t.max())
        np.testing.assert_allclose(m["wait_ratio_cum"], 100 * np.mean(waits), rtol=1e-4)
    assert [int(m["phase"]) for m in rows] == [0, 1]
    np.testing.assert_allclose([m["alpha"] for m in rows], [0.9, 0.1], rtol=1e-6)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_fixed_p_baseline_replays_adas_p_trace(tmp_path):
    """Table 7's baselines: FedSemi replays P_1, P_2, ... from an Ada run's metrics.jsonl (the
    last P holds after the trace), with ceil(P_k M) participants each round."""
    trace = [0.3, 0.7, 0.3, 1.0]
    rows = [{"round": k + 1, "P": p, "accuracy": 0.5} for k, p in enumerate(trace)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))  # any row order
    exp = build("algorithm=fedsemi", f"algorithm.p_trace_from={path}")
    _, got = run(exp.runner(chunk=1, eval_chunk=1), 6)
    want = trace + [1.0, 1.0]
    np.testing.assert_allclose([float(m["P"]) for m in got], want, rtol=1e-6)
    assert [int(m["n"]) for m in got] == [math.ceil(round(p * M, 6)) for p in want]
    (tmp_path / "no_p.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.5}) + "\n")
    for bad_path, allowed in ((tmp_path / "missing.jsonl", "no such file"),
                              (tmp_path / "no_p.jsonl", "carry P")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            build("algorithm=fedsemi", f"algorithm.p_trace_from={bad_path}")
        msg = str(e.value)
        assert msg.startswith("algorithm.p_trace_from=") and allowed in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="adaptive_p=true"):
        build("algorithm=ada_fedsemi", f"algorithm.p_trace_from={path}")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algorithm.alpha_switch_at=60"], "algorithm.alpha_switch_at"),
        (["algorithm.alpha_after=1.5"], "algorithm.alpha_after"),
        (["algorithm.alpha_switch_metric=train"], "algorithm.alpha_switch_metric"),
        (["algorithm.p_arms=[0.5,1.2]"], "algorithm.p_arms"),
        (["algorithm.p_arms=[0.0,0.5]"], "algorithm.p_arms"),
        (["algorithm.c_arms=[-0.1,0.9]"], "algorithm.c_arms"),
        (["algorithm.fixed_c=1.5"], "algorithm.fixed_c"),
        (["algorithm.alpha=1.5"], "algorithm.alpha"),
        (["algorithm.alpha=-0.1"], "algorithm.alpha"),
        (["algorithm.time_budget_min=0"], "algorithm.time_budget_min"),
        (["algorithm.traffic_budget_gb=-1"], "algorithm.traffic_budget_gb"),
        (["algorithm.beta=0"], "algorithm.beta"),
        (["algorithm.gamma=0"], "algorithm.gamma"),
        (["algorithm.relabel_every=0"], "algorithm.relabel_every"),
        (["algorithm=fedsemi", "algorithm.adaptive_p=true"], "algorithm.adaptive_p"),
        (["algorithm=fedavg_p", "algorithm.fixed_c=0.9"], "algorithm.fixed_c"),
    ],
)
def test_bad_config_is_one_line(overrides, key):
    with pytest.raises(ConfigError) as e:
        experiment.build(compose_config(*BASE, *(["algorithm=ada_fedsemi"] + overrides)))
    assert str(e.value).startswith(key + "=") and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["partition.labeled_fraction=1.0"], "partition.labeled_fraction"),  # no pool left
        (["partition.val_fraction=0.0"], "partition.val_fraction"),  # no validation set
        (["partition=dirichlet"], "partition.scheme"),  # no server sets at all
    ],
)
def test_empty_pool_or_validation_set_fails_before_training(overrides, key):
    with pytest.raises(ValueError) as e:  # ConfigError, or the partition's own ValueError
        exp = experiment.build(compose_config(*BASE, "algorithm=ada_fedsemi", *overrides))
        exp.runner().init()  # the initial state: before any round
    assert str(e.value).startswith(key + "=") and "\n" not in str(e.value)
