"""Sweeps on Hydra's own launchers and sweeper: submitit (SLURM's launcher, run here with its
local executor) and Optuna, whose trials return the run's `objective`.

Each starts a fresh interpreter per job or trial (10-20 s): both run in make test-slow. The fast
suite keeps one real multirun launcher end to end (test_cli.py's joblib sweep and report), and
below, in process, the value the task hands a sweeper and the refusal of an unknown objective."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import SMALL, compose_hydra
from test_cli import run_cli


@pytest.mark.slow
def test_submitit_local_launcher(tmp_path):
    """The SLURM launcher's code path with submitit's local executor: the job runs in a process
    submitit starts, and writes an ordinary run directory."""
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m", *SMALL, "rounds=2", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}"
    )
    assert r.returncode == 0, r.stderr
    assert (sweep / ".submitit").is_dir()  # submitit's own job folder: it ran the job
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2


@pytest.mark.slow
def test_optuna_sweep_optimises_the_objective(tmp_path):
    """Two Optuna trials of the tuning preset: the best value Optuna records is the best of the
    trials' final `objective` (here global_acc), so the task returns the metric it is asked for."""
    sweep = tmp_path / "sweep"
    small = [o for o in SMALL if not o.startswith("algorithm.lr=")]  # the sweeper draws lr
    r = run_cli(
        "-m",
        *small,
        "+experiment=tune_fedavg_pl",
        "rounds=2",
        "objective=global_acc",
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep}",
    )
    assert r.returncode == 0, r.stderr
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    finals = [json.loads(p.read_text())["final"] for p in sorted(sweep.glob("*/summary.json"))]
    assert len(finals) == 2
    assert result["best_value"] == max(f["global_acc"] for f in finals)
    assert set(result["best_params"]) == {"algorithm.lr", "algorithm.pl_threshold"}


def test_unknown_objective_is_refused(tmp_path):
    r = run_cli(*SMALL, f"out_dir={tmp_path}", "objective=f1")
    assert r.returncode == 2
    assert "objective='f1' is not allowed: one of ['accuracy'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_task_returns_the_objective_of_its_run(tmp_path):
    """What a sweeper (Optuna above) records for a trial: the run's final `objective`."""
    from fedjax_semi.cli import _task

    value = _task(compose_hydra("rounds=2", "objective=global_acc", f"out_dir={tmp_path}"))
    final = json.loads((tmp_path / "summary.json").read_text())["final"]
    assert isinstance(value, float) and value == final["global_acc"]
