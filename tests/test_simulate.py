"""The round loop: outputs, determinism, kill and resume, the NaN guard, early stopping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SMALL, compose_config
from fedjax_semi import experiment
from fedjax_semi.engine.simulate import NaNError, auto_chunk_candidates


def rows_without_wall_time(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r.pop("wall_time")
    return rows


def test_run_writes_metrics_summary_plot_checkpoints(tmp_path):
    cfg = compose_config("algorithm=fedavg", "rounds=4", "checkpoint_every=2")
    summary = experiment.run(experiment.build(cfg), tmp_path)
    rows = rows_without_wall_time(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert {"accuracy", "global_acc", "personal_acc", "train_loss"} <= set(rows[-1])
    assert summary["rounds_completed"] == 4 and summary["stop_reason"] == "rounds completed"
    assert json.loads((tmp_path / "summary.json").read_text())["final"]["round"] == 4
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 1000
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert len(counts["labeled"]) == 12


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_chunk_auto_times_each_candidate_and_keeps_the_fastest(tmp_path):
    """hardware.chunk=auto times one round per candidate (powers of 4 below the cohort, then the
    whole cohort), keeps the fastest, records the timings in summary.json, and then runs the
    same numbers as that chunk size fixed."""
    assert auto_chunk_candidates(4) == [1, "all"]
    assert auto_chunk_candidates(100) == [1, 4, 16, 64, "all"]
    over = ("algorithm=fedavg", "rounds=3", "clients_per_round=6")
    summary = experiment.run(
        experiment.build(compose_config(*over, "hardware.chunk=auto")), tmp_path / "auto"
    )
    tune = summary["hardware"]["autotune"]
    assert tune["cohort"] == 6 and list(tune["round_s"]) == ["1", "4", "all"]
    assert all(t > 0 for t in tune["round_s"].values())
    assert str(tune["chosen"]) == min(tune["round_s"], key=tune["round_s"].get)
    assert summary["hardware"]["chunk"] == tune["chosen"]
    fixed = f"hardware.chunk={tune['chosen']}"
    experiment.run(experiment.build(compose_config(*over, fixed)), tmp_path / "fixed")
    auto_rows = rows_without_wall_time(tmp_path / "auto" / "metrics.jsonl")
    assert auto_rows == rows_without_wall_time(tmp_path / "fixed" / "metrics.jsonl")
    assert len(auto_rows) == 3  # the timed rounds are thrown away, not counted


# make test-slow (the fast suite must stay under 12 minutes): there, a run equal to its seed's
# run alone (test_replicas.py, test_vectorized.py) already needs the same seed to repeat.
@pytest.mark.slow
def test_same_seed_same_metrics(tmp_path):
    for d in ("a", "b"):
        experiment.run(experiment.build(compose_config("algorithm=fedavg_pl")), tmp_path / d)
    a = rows_without_wall_time(tmp_path / "a" / "metrics.jsonl")
    assert a == rows_without_wall_time(tmp_path / "b" / "metrics.jsonl")
    # Another seed gives other metrics: test_replicas.py (each replica is its seed's run).


def cli(*args: str, **kw) -> list[str]:
    return [sys.executable, "-m", "fedjax_semi.cli", *args]


# Three CLI processes (about 50 CPU-seconds): in make test-slow. The fast suite resumes in
# process (test_faults.py, test_replicas.py, test_scaffold.py, test_vectorized.py).
@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(tmp_path):
    """SIGKILL a real run mid-way, resume it, and compare with an uninterrupted run."""
    over = ["algorithm=fedavg", "rounds=30", "checkpoint_every=10"]
    killed, full = tmp_path / "killed", tmp_path / "full"
    proc = subprocess.Popen(
        cli(*SMALL, *over, f"out_dir={killed}"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    log = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 13:  # checkpoint 10 is written
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done = len(log.read_text().splitlines())
    assert 13 <= done < 30
    r = subprocess.run(
        cli(*SMALL, *over, f"out_dir={killed}", "resume=true"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    # The uninterrupted run, also through the CLI, the same kind of process as the killed run:
    # in the full suite an in-process run differed from the CLI's in the last bit of a round's
    # train_loss (alone, the test passed either way), so both sides are compiled alike.
    r = subprocess.run(
        cli(*SMALL, *over, f"out_dir={full}"), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    resumed = rows_without_wall_time(log)
    assert [x["round"] for x in resumed] == list(range(1, 31))
    assert resumed == rows_without_wall_time(full / "metrics.jsonl")


def test_nan_guard_names_round_and_client_and_keeps_a_checkpoint(tmp_path):
    cfg = compose_config("algorithm=fedavg", "algorithm.lr=1e12", "rounds=5")
    with pytest.raises(NaNError, match=r"round \d+, clients \[\d+") as e:
        experiment.run(experiment.build(cfg), tmp_path)
    rnd = int(str(e.value).split("round ")[1].split(",")[0])
    assert (tmp_path / "checkpoints" / str(rnd - 1)).exists() or rnd == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "non-finite" in summary["stop_reason"]


def test_early_stopping_on_target(tmp_path):
    cfg = compose_config("algorithm=fedavg", "rounds=50", "stop.target=0.0")
    summary = experiment.run(experiment.build(cfg), tmp_path)
    assert summary["rounds_completed"] == 1 and "target" in summary["stop_reason"]


def test_early_stopping_on_patience(tmp_path):
    cfg = compose_config("algorithm=fedavg", "rounds=60", "algorithm.lr=1e-9", "stop.patience=2")
    summary = experiment.run(experiment.build(cfg), tmp_path)
    assert summary["rounds_completed"] < 60 and "no improvement" in summary["stop_reason"]


def test_fa_plateau_rule_and_sim_time_budget():
    """DoFed-SPP's FA rule: |m_r - m_{r-1}| < plateau for `patience` evaluations in a row, after
    min_rounds; the literal rule's round is recorded; the TTAP clock budget stops a run."""
    from fedjax_semi.config import StopConfig
    from fedjax_semi.engine.simulate import EarlyStopper

    accs = [0.10, 0.30, 0.305, 0.50, 0.502, 0.507, 0.509, 0.70]
    stop = EarlyStopper(StopConfig(plateau=0.01, patience=2, min_rounds=3))
    reasons = [stop.update(r, a) for r, a in enumerate(accs, start=1)]
    # Plateaued at rounds 3, 5, 6, 7: two in a row first at round 6.
    assert reasons[:5] == [None] * 5 and "in 2 evaluations in a row" in reasons[5]
    assert stop.literal_round == 3
    late = EarlyStopper(StopConfig(plateau=0.01, patience=2, min_rounds=7))
    assert [late.update(r, a) for r, a in enumerate(accs, start=1)][5] is None
    clock = EarlyStopper(StopConfig(sim_time=250.0))
    assert clock.update(1, 0.1, sim_time=249.0) is None
    assert "stop.sim_time=250.0" in clock.update(2, None, sim_time=250.5)


@pytest.mark.parametrize(
    "partition", ["cfsl", "subset", "ada", "um_pfssl"], ids=lambda p: f"partition={p}"
)
def test_paper_partitions_run_end_to_end(partition, tmp_path):
    """Each paper's partition builds FederatedData (transforms applied) and trains a round."""
    cfg = compose_config(
        "algorithm=fedavg",
        f"partition={partition}",
        "rounds=1",
        "partition.min_client_size=5",
        *(["partition.dofed.train_per_class=20", "partition.dofed.target_per_class=10",
           "partition.dofed.test_per_class=5"] if partition == "subset" else []),
        *(["num_clients=6", "clients_per_round=2"] if partition == "cfsl" else []),
    )  # fmt: skip
    exp = experiment.build(cfg)
    summary = experiment.run(exp, tmp_path)
    final = summary["final"]
    assert summary["rounds_completed"] == 1 and 0.0 <= final["accuracy"] <= 1.0
    assert np.isfinite(final["train_loss"]) and final["local_steps"] > 0
    if partition == "cfsl":  # the second cluster sees permuted labels, in the data it trains on
        lm = np.asarray(exp.partition.assignments["label_map"])
        assert (lm != lm[0]).any()
        raw = np.concatenate([exp.dataset.y_train, exp.dataset.y_test])
        for role in ("train", "test"):
            t = exp.fed.roles[role]
            for c in range(exp.fed.num_clients):
                rows = np.asarray(t.idx[c])[: int(t.count[c])]
                np.testing.assert_array_equal(np.asarray(exp.fed.eval_y)[rows], lm[c][raw[rows]])


def test_cross_dataset_server_pool(tmp_path):
    """Ada-FedSemi's cross-dataset variant: a second dataset (here MNIST in IDX files, resized
    from 28x28 to digits' 8x8) replaces the server's unlabeled pool; its labels stay unknown."""
    from fedjax_semi.data.formats import write_idx

    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        write_idx(
            tmp_path / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8)
        )
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n).astype(np.uint8))
    cfg = compose_config(
        "algorithm=fedavg", "partition=ada", "dataset.server_pool=mnist",
        f"dataset.server_pool_dir={tmp_path}", "dataset.server_pool_size=20",
    )  # fmt: skip
    exp = experiment.build(cfg)
    pool = np.asarray(exp.fed.server["server_unlabeled"])
    assert len(pool) == 20 and pool.min() >= len(exp.dataset.x_train) + len(exp.dataset.x_test)
    assert exp.fed.x.shape[1:] == (8, 8, 1)
    assert (np.asarray(exp.fed.eval_y)[pool] == -1).all()
    bad = compose_config("algorithm=fedavg", "dataset.server_pool=mnist")
    with pytest.raises(ValueError, match="dataset.server_pool"):
        experiment.build(bad)


def test_clock_passed_against_a_loop():
    """clock_passed: an active replica's clock crossed a multiple of `every` in the round."""
    from fedjax_semi.engine.loop import clock_passed

    rng = np.random.default_rng(0)
    before = rng.uniform(0, 10, (50, 3)).astype(np.float32)
    after = before + rng.uniform(0, 1.5, (50, 3)).astype(np.float32)
    active = rng.random((50, 3)) < 0.7
    for b, a, act in zip(before, after, active, strict=True):
        want = any(int(a[i] // 1.0) > int(b[i] // 1.0) for i in range(3) if act[i])
        assert clock_passed(b, a, 1.0, act) == want
    assert clock_passed(np.float32(0.9), np.float32(1.1), 1.0, [True])  # one run: a scalar clock
    assert not clock_passed(np.float32(1.1), np.float32(1.9), 1.0, [True])


def test_eval_every_time_evaluates_where_the_clock_passes_a_multiple(tmp_path):
    """eval_every_time=T: a round's row carries the evaluation iff the simulated clock passed a
    multiple of T in it, or it is the last round (DoFed-SPP's clock; Local's rounds are short)."""
    cfg = compose_config(
        "algorithm=local",
        "partition=subset",
        "rounds=12",
        "partition.dofed.train_per_class=20",
        "partition.dofed.target_per_class=10",
        "partition.dofed.test_per_class=5",
        "eval_every_time=0.02",
    )
    experiment.run(experiment.build(cfg), tmp_path)
    rows = rows_without_wall_time(tmp_path / "metrics.jsonl")
    clock = [0.0] + [r["sim_time"] for r in rows]
    want = [c1 // 0.02 > c0 // 0.02 for c0, c1 in zip(clock, clock[1:], strict=False)]
    want[-1] = True
    assert ["accuracy" in r for r in rows] == want
    assert 1 < sum(want) < len(rows)  # some rounds evaluated, some not
