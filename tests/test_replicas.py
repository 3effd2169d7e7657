"""Replicas: several seeds of one experiment as one compiled program (a leading replica axis).
Replica r must give exactly the numbers of the same experiment run alone with seed s_r (the data
partition, from `seed`, is shared), through rounds, evaluations, early stopping and resume."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import yaml

import test_dofed_spp
import um_pfssl_tiny
from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.config import ConfigError
from fedjax_semi.engine.simulate import Runner
from fedjax_semi.results.report import report

SEEDS = (3, 8)
CASES = {
    # pseudo-labels after round 1: the thresholded branch draws on the key too
    "fedavg_pl": [
        "algorithm=fedavg_pl",
        "algorithm.pl_threshold=0.3",
        "algorithm.pl_warmup_rounds=1",
    ],
    # round flags (search and refresh rounds: several compiled variants) and a warm-up
    "um_pfssl": um_pfssl_tiny.TINY,
    # a warm-up program, the SR kernel and the simulated clock (random channel rates)
    "dofed_spp": test_dofed_spp.TINY,
}


def rows_of(runner: Runner, rounds: int) -> tuple[list[dict], object]:
    state, out = runner.init(), []
    for _ in range(rounds):
        state, m = runner.round(state)
        out.append(jax.device_get({**m, **runner.evaluate(state)}))
    return out, state


# Each case compiles its rounds three times (replicas, replicas looped or each seed alone), on
# FedAvg-PL (the thresholded pseudo-label branch draws on the key), UM-pFSSL (its round flags)
# and DoFed-SPP (a warm-up, the clock): make test-slow (the fast suite must stay under 12
# minutes). The fast suite checks replicas against each seed run alone in test_devices.py
# (seeds 0, 1 alone on one device, as replicas on four) and test_vectorized.py (two lrs in one
# program against each alone).
@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_replica_r_is_the_run_of_seed_r_alone(name):
    exp = experiment.build(compose_config(*CASES[name]))
    stacked, stacked_state = rows_of(exp.runner(seeds=SEEDS, replica_chunk="all"), 3)
    assert np.asarray(stacked_state.round).tolist() == [3, 3]
    if name == "fedavg_pl":  # replicas looped inside the program (the CPU setting) agree too
        looped, _ = rows_of(exp.runner(seeds=SEEDS, replica_chunk=1), 3)
        for a, b in zip(looped, stacked, strict=True):
            np.testing.assert_allclose(a["client_acc"], b["client_acc"], atol=1e-5)
            np.testing.assert_allclose(a["train_loss"], b["train_loss"], atol=1e-5)
    # The last replica against its seed run alone (replica 0 would agree with a runner that
    # ignored the replica axis and drew from the first key only).
    alone = {}
    for r, seed in list(enumerate(SEEDS))[-1:]:
        alone[seed], state = rows_of(exp.runner(seed=seed), 3)
        for t, (a, b) in enumerate(zip(stacked, alone[seed], strict=True)):
            np.testing.assert_array_equal(a["cohort"][r], b["cohort"], err_msg=f"round {t}")
            for key in ("train_loss", "accuracy", "client_acc"):
                np.testing.assert_allclose(
                    a[key][r], b[key], atol=1e-5, err_msg=f"{name} seed {seed} round {t} {key}"
                )
        for x, y in zip(jax.tree.leaves(stacked_state), jax.tree.leaves(state), strict=True):
            np.testing.assert_allclose(np.asarray(x)[r], y, atol=1e-5, err_msg=f"{name} state")
    # the seeds differ: a replica axis that ignored its key would fail here
    a, b = (np.asarray(stacked[-1][k]) for k in ("client_acc", "cohort"))
    assert not np.allclose(a[0], a[-1]) or not np.array_equal(b[0], b[-1])


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_run_writes_one_directory_per_seed_and_the_report_groups_them(tmp_path):
    over = ("algorithm=fedavg", "rounds=4", "checkpoint_every=2")
    summary = experiment.run(
        experiment.build(compose_config(*over, "seed=3", "replicas=2")), tmp_path / "rep"
    )
    assert summary["seeds"] == [3, 4]
    rep = tmp_path / "rep"
    assert sorted(p.name for p in (rep / "checkpoints").iterdir()) == ["2", "4"]
    assert (rep / "plots" / "accuracy.png").stat().st_size > 1000
    finals = []
    for seed in (3, 4):
        alone = tmp_path / f"alone_{seed}"
        cfg = compose_config(*over, f"seed={seed}", "data_seed=3")  # the replicas' data
        experiment.run(experiment.build(cfg), alone)
        a = [json.loads(x) for x in (rep / f"seed_{seed}" / "metrics.jsonl").open()]
        b = [json.loads(x) for x in (alone / "metrics.jsonl").open()]
        assert [x["round"] for x in a] == [1, 2, 3, 4]
        for x, y in zip(a, b, strict=True):
            for key in ("accuracy", "train_loss", "personal_acc"):
                assert x[key] == pytest.approx(y[key], abs=1e-5), (seed, x["round"], key)
        cfg = yaml.safe_load((rep / f"seed_{seed}" / ".hydra" / "config.yaml").read_text())
        assert cfg["seed"] == seed and cfg["data_seed"] == 3 and cfg["replicas"] == 1
        finals.append(json.loads((rep / f"seed_{seed}" / "summary.json").read_text())["final"])
    saved = json.loads((rep / "replicas.json").read_text())
    acc = [f["accuracy"] for f in finals]
    assert saved["final"]["accuracy"] == pytest.approx(np.mean(acc))
    assert saved["final_std"]["accuracy"] == pytest.approx(np.std(acc))
    table = report(rep, ["accuracy"])
    assert "| 2 |" in table  # one setting, two seeds
    assert f"{100 * np.mean(acc):.2f}" in table


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_each_replica_stops_on_its_own_rule_and_resume_continues(tmp_path):
    """stop.target=0.3: the seeds reach it in different rounds (seed 4 in round 2, seed 3 in
    round 3); a stopped replica keeps its state and writes no more rows while the other goes on.
    A run killed after its checkpoint and resumed writes the same rows."""
    over = ("algorithm=fedavg", "rounds=8", "checkpoint_every=1", "seed=3", "replicas=2")
    stop = ("stop.target=0.3", "stop.metric=accuracy")
    full = experiment.run(experiment.build(compose_config(*over, *stop)), tmp_path / "full")
    done = {p["seed"]: p["rounds_completed"] for p in full["per_seed"]}
    assert len(set(done.values())) > 1, done  # they stop at different rounds
    for seed, rounds in done.items():
        alone = experiment.run(
            experiment.build(
                compose_config(*over, *stop, f"seed={seed}", "data_seed=3", "replicas=1")
            ),
            tmp_path / f"alone_{seed}",
        )
        assert alone["rounds_completed"] == rounds
        assert alone["final"]["accuracy"] == pytest.approx(
            json.loads((tmp_path / "full" / f"seed_{seed}" / "summary.json").read_text())["final"][
                "accuracy"
            ],
            abs=1e-5,
        )
    # resume: the first 2 rounds, then the rest from the checkpoint
    part = tmp_path / "part"
    experiment.run(experiment.build(compose_config(*over, *stop, "rounds=2")), part)
    experiment.run(experiment.build(compose_config(*over, *stop, "resume=true")), part)
    for seed in done:
        a = (part / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()
        b = (tmp_path / "full" / f"seed_{seed}" / "metrics.jsonl").read_text().splitlines()
        strip = [{k: v for k, v in json.loads(x).items() if k != "wall_time"} for x in a]
        ref = [{k: v for k, v in json.loads(x).items() if k != "wall_time"} for x in b]
        assert strip == ref


@pytest.mark.parametrize(
    "over, match",
    [
        (["replicas=0"], "replicas"),
        (["replicas=2", "hardware.backend=reference"], "replicas"),
        (["replicas=2", "hardware.replica_chunk=0"], "hardware.replica_chunk"),
    ],
)
def test_bad_replicas_are_refused_before_any_work(over, match):
    with pytest.raises(ConfigError, match=match):
        experiment.build(compose_config(*over))
