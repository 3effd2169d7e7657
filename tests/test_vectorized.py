"""A sweep as one program: traced hyperparameters (Method.with_hyperparameters), the grouping of
a multirun's jobs (fedjax_semi.vectorized) and hydra/launcher=vectorized through the real CLI.
Run r of a vectorized program must give the numbers of its job run alone (float32 tolerance:
the runs are vmapped, and XLA may fuse a vmapped program differently)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import test_golden
from conftest import CONF_DIR, SMALL, compose_config
from fedjax_semi import experiment, vectorized
from fedjax_semi.config import ConfigError
from fedjax_semi.engine.simulate import Runner

LRS = (0.05, 0.2)
# Float32 sums over a vmapped and a single program: equal to a few ulps of values of order 1.
TOL = dict(rtol=1e-5, atol=1e-6)


def rows_of(runner: Runner, rounds: int) -> list[dict]:
    state, out = runner.init(), []
    for _ in range(rounds):
        state, m = runner.round(state)
        out.append(jax.device_get({**m, **runner.evaluate(state)}))
    return out


def test_one_compiled_round_serves_every_learning_rate():
    """Two runs with their own lr in one program (compiled once) against the second run alone.
    Run 0 alone is not compiled too (7 CPU-s of the fast suite): a run that read the other's lr
    fails the comparison or the last line, and make test-slow compares every job of a
    vectorized sweep with the job run alone
    (test_vectorized_launcher_sweep_equals_the_jobs_run_one_by_one)."""
    cfg = compose_config("algorithm=fedavg_pl", "algorithm.pl_threshold=0.3")
    exp = experiment.build(cfg)
    runner = exp.runner(seeds=[4, 4], hparams={"lr": list(LRS)})
    together = rows_of(runner, 2)
    assert runner._round._cache_size() == 1  # one program for both values
    alone = experiment.build(compose_config("algorithm=fedavg_pl", "algorithm.pl_threshold=0.3",
                                            f"algorithm.lr={LRS[1]}"))  # fmt: skip
    for a, b in zip(together, rows_of(alone.runner(seed=4), 2), strict=True):
        np.testing.assert_allclose(a["train_loss"][1], b["train_loss"], **TOL)
        np.testing.assert_allclose(a["client_acc"][1], b["client_acc"], **TOL)
    assert together[-1]["train_loss"][0] != together[-1]["train_loss"][1]  # the lr acted


def test_a_key_that_cannot_be_traced_is_refused_in_one_line():
    alg = experiment.build(compose_config("algorithm=fedavg")).alg
    with pytest.raises(ValueError, match=r"algorithm\.local_epochs cannot vary .*traceable keys"):
        alg.with_hyperparameters({"local_epochs": 2})


def job(num: int, *overrides: str) -> vectorized.Job:
    return vectorized.Job(num, compose_config(*overrides), Path(f"/sweep/{num}"), list(overrides))


def test_jobs_group_by_shapes_and_data_and_trace_what_differs():
    jobs = [
        job(i, f"model.hidden=[{h}]", f"algorithm.lr={lr}", f"seed={s}", "data_seed=0")
        for i, (h, lr, s) in enumerate((h, lr, s) for h in (16, 32) for lr in LRS for s in (0, 1))
    ]
    groups = vectorized.make_groups(jobs)
    assert [[j.num for j in g.jobs] for g in groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups[0].traced == {"lr": [0.05, 0.05, 0.2, 0.2]}
    # Without data_seed each seed has its own data, so its own program; a group whose lr does
    # not vary traces nothing; max_group splits a group.
    by_seed = vectorized.make_groups([job(i, f"seed={s}") for i, s in enumerate((0, 1, 0))])
    assert [[j.num for j in g.jobs] for g in by_seed] == [[0, 2], [1]]
    assert by_seed[0].traced == {}
    split = vectorized.make_groups(jobs[:4], max_group=3)
    assert [len(g.jobs) for g in split] == [3, 1] and split[1].traced == {}


def test_bad_vectorized_settings_are_one_line():
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.max_group=0 .*integer >= 1"):
        vectorized.make_groups([job(0)], max_group=0)
    with pytest.raises(ConfigError, match=r"replicas=2 .*sweep the seeds"):
        vectorized.check_job(compose_config("replicas=2"))
    with pytest.raises(ConfigError, match=r"hardware\.backend='reference' .*'jit'"):
        vectorized.check_job(compose_config("hardware.backend=reference"))


def test_a_group_out_of_memory_names_its_size_and_the_setting(tmp_path, monkeypatch):
    """XLA reports running out of device memory as a runtime error; the launcher's line names
    the group's size and the max_group that halves it."""

    def oom(*args, **kw):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12 GiB")

    monkeypatch.setattr(experiment, "train", oom)
    jobs = [job(i, f"algorithm.lr={lr}", "data_seed=0") for i, lr in enumerate((0.1, 0.2, 0.3))]
    for j in jobs:
        j.out_dir = tmp_path / str(j.num)
    (group,) = vectorized.make_groups(jobs)
    with pytest.raises(ConfigError, match=r"a group of 3 jobs ran out of .*max_group=1"):
        vectorized.run_group(group, tmp_path)


# make test-slow (the fast suite must stay under 12 minutes): the fast suite checks the NaN guard
# in test_simulate.py and a diverged job of a multirun in test_tuned_apply.py.
@pytest.mark.slow
def test_a_diverging_job_stops_alone_and_the_others_run_on(tmp_path, capsys):
    """lr 1e12 diverges; the job beside it in the same program runs every round, with the
    numbers of its job run alone. (A NaN used to end the whole group, every job's summary
    saying it diverged, and the launcher's multirun with it.) A group whose every job
    diverges returns their summaries, each saying so, and raises nothing."""

    def jobs(root: Path, lrs) -> list[vectorized.Job]:
        over = ["rounds=3", "data_seed=0", "seed=0", "writers=[jsonl]"]
        return [
            vectorized.Job(i, compose_config(*over, f"algorithm.lr={lr}"), root / str(i), [])
            for i, lr in enumerate(lrs)
        ]

    (group,) = vectorized.make_groups(jobs(tmp_path / "a", (LRS[0], 1e12)))
    ran_on, diverged = vectorized.run_group(group, tmp_path / "a")
    assert "non-finite loss or model in round" in diverged["stop_reason"]
    assert diverged["rounds_completed"] < 3
    assert (ran_on["stop_reason"], ran_on["rounds_completed"]) == ("rounds completed", 3)
    assert "the other replicas go on" in capsys.readouterr().err
    (alone,) = vectorized.make_groups(jobs(tmp_path / "b", (LRS[0],)))
    vectorized.run_group(alone, tmp_path / "b")
    together = strip(test_golden._rows(tmp_path / "a" / "0"))
    by_itself = strip(test_golden._rows(tmp_path / "b" / "0"))
    assert [r["round"] for r in together] == [r["round"] for r in by_itself] == [1, 2, 3]
    for x, y in zip(together, by_itself, strict=True):
        for k in ("train_loss", "accuracy"):
            np.testing.assert_allclose(x[k], y[k], **TOL)
    (group,) = vectorized.make_groups(jobs(tmp_path / "c", (1e12, 1e13)))
    assert all("non-finite" in s["stop_reason"] for s in vectorized.run_group(group, tmp_path))


@pytest.mark.slow  # with the SIGKILL of a group through the CLI: fast-suite time
def test_a_group_resumed_from_its_checkpoint_ends_identical(tmp_path):
    """Two rounds, then resume=true to four, against four at once: every job's metrics.jsonl."""

    def jobs(root: Path, rounds: int, resume: bool, lrs=LRS) -> list[vectorized.Job]:
        over = [f"rounds={rounds}", "checkpoint_every=2", f"resume={str(resume).lower()}",
                "data_seed=0", "writers=[jsonl]"]  # fmt: skip
        return [
            vectorized.Job(
                i, compose_config(*over, f"algorithm.lr={lr}", f"seed={s}"), root / str(i), []
            )  # fmt: skip
            for i, (lr, s) in enumerate((lr, s) for lr in lrs for s in (0, 1))
        ]

    def group(root: Path, rounds: int, resume: bool) -> vectorized.Group:
        (g,) = vectorized.make_groups(jobs(root, rounds, resume))
        return g

    vectorized.run_group(group(tmp_path / "a", 2, False), tmp_path / "a")
    vectorized.run_group(group(tmp_path / "a", 4, True), tmp_path / "a")
    summaries = vectorized.run_group(group(tmp_path / "b", 4, False), tmp_path / "b")
    traced = [s["vectorized"]["traced"] for s in summaries]
    assert traced == [{"lr": lr} for lr in LRS for _ in "ab"]
    for i in range(4):
        a = test_golden._rows(tmp_path / "a" / str(i))
        b = test_golden._rows(tmp_path / "b" / str(i))
        assert [r["round"] for r in a] == [1, 2, 3, 4]
        assert strip(a) == strip(b)
    # resume=true on a finished group returns its results without training
    again = vectorized.run_group(group(tmp_path / "b", 4, True), tmp_path / "b")
    assert [s["final"] for s in again] == [s["final"] for s in summaries]
    # a grid point added to the finished sweep: only its jobs are grouped (the launcher trains
    # them alone), the finished ones come back with their summaries
    finished, pending = vectorized.split_finished(jobs(tmp_path / "b", 4, True, (*LRS, 0.1)))
    assert [j.num for j, _ in finished] == [0, 1, 2, 3]
    assert [s["final"] for _, s in finished] == [s["final"] for s in summaries]
    assert [j.num for j in pending] == [4, 5]
    assert vectorized.split_finished(jobs(tmp_path / "b", 4, False))[0] == []  # resume=false


def test_a_value_sweep_composes_as_hydra_composes_each_job():
    """The launcher's JobComposer: a job that differs from an earlier one only in values gets
    the config Hydra's load_sweep_config gives it; a config-group change is composed by Hydra."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from hydra_plugins.fedjax_semi_vectorized.compose import JobComposer

    compose_config()  # registers the schemas, as the CLI does
    base = [o for o in SMALL if not o.startswith("algorithm.lr=")]
    jobs = [
        [*base, "algorithm=fedavg_pl", f"algorithm.lr={lr}", f"algorithm.pl_threshold={t}",
         f"seed={s}"]
        for lr in ("0.05", "0.2") for t in ("0.5", "0.9") for s in ("0", "1")
    ]  # fmt: skip
    jobs.insert(3, [*base, "algorithm=fedavg", "algorithm.lr=0.05", "seed=0"])  # a group change
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration(
            "config", ["hydra.job.config.override_dirname.exclude_keys=[seed]"], RunMode.MULTIRUN
        )
        composer = JobComposer(loader, master)
        for overrides in jobs:
            fast = composer.compose(overrides)
            hydra_own = loader.load_sweep_config(master, overrides)
            assert OmegaConf.to_container(fast) == OmegaConf.to_container(hydra_own), overrides
            assert OmegaConf.is_struct(fast) and not OmegaConf.is_readonly(fast.hydra)
            assert fast.algorithm.lr == float(overrides[len(base) + 1].split("=")[1])
    assert composer.fast == len(jobs) - 2  # the first job and the group change: composed anew


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in test_golden.UNTIMED} for r in rows]


def launch(tmp_path: Path, launcher: str) -> str:
    """2 lr x 2 seeds through `fedjax-semi -m hydra/launcher=<launcher>`: its output."""
    sweep = [*SMALL, "algorithm=fedavg", f"algorithm.lr={LRS[0]},{LRS[1]}", "seed=0,1",
             "data_seed=0", f"hardware.compile_cache={tmp_path / 'xla'}"]  # fmt: skip
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedjax_semi.cli",
            "-m",
            f"hydra/launcher={launcher}",
            *sweep,
            f"hydra.sweep.dir={tmp_path / launcher}",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def test_vectorized_launcher_writes_every_jobs_directory(tmp_path):
    """One program for the four jobs; each job's directory as it would be alone."""
    assert "4 jobs in 1 program(s): 4 jobs, traced ['lr']" in launch(tmp_path, "vectorized")
    for i in range(4):
        v = tmp_path / "vectorized" / str(i)
        for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "run_config.json",
                     "summary.json", "plots/accuracy.png"):  # fmt: skip
            assert (v / name).exists(), name
        assert list((v / "tensorboard").iterdir())
        assert [x["round"] for x in test_golden._rows(v)] == [1, 2, 3]
        summary = json.loads((v / "summary.json").read_text())
        assert summary["vectorized"]["jobs"] == 4
        assert summary["vectorized"]["traced"] == {"lr": LRS[i // 2]}
        assert summary["hardware"]["compile_cache"] == str(tmp_path / "xla")
    assert list((tmp_path / "xla").iterdir())  # the programs were cached there


@pytest.mark.slow
def test_vectorized_launcher_sweep_equals_the_jobs_run_one_by_one(tmp_path):
    """The same four jobs through Hydra's basic launcher, one by one: the same metrics (the
    fast suite compares a vectorized program with runs alone in process, above)."""
    launch(tmp_path, "vectorized")
    launch(tmp_path, "basic")
    for i in range(4):
        rv = strip(test_golden._rows(tmp_path / "vectorized" / str(i)))
        rb = strip(test_golden._rows(tmp_path / "basic" / str(i)))
        assert [x["round"] for x in rv] == [x["round"] for x in rb] == [1, 2, 3]
        for x, y in zip(rv, rb, strict=True):
            for k in ("train_loss", "accuracy", "personal_acc"):
                np.testing.assert_allclose(x[k], y[k], **TOL)


@pytest.mark.slow
def test_a_killed_vectorized_group_resumes_to_the_same_metrics(tmp_path):
    """SIGKILL the process of a 2-job group after its round-10 checkpoint, rerun the sweep
    with resume=true, and compare with the sweep run at once (both through the CLI)."""
    import os
    import signal
    import time

    def cmd(sweep: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "fedjax_semi.cli", "-m", "hydra/launcher=vectorized",
                *SMALL, "algorithm=fedavg", f"algorithm.lr={LRS[0]},{LRS[1]}", "seed=0",
                "data_seed=0", "rounds=30", "checkpoint_every=10",
                f"hardware.compile_cache={tmp_path / 'xla'}", f"hydra.sweep.dir={sweep}",
                *extra]  # fmt: skip

    killed, full = tmp_path / "killed", tmp_path / "full"
    proc = subprocess.Popen(cmd(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = killed / "1" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 13:  # checkpoint 10 written
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    assert 13 <= len(log.read_text().splitlines()) < 30
    for sweep, extra in ((killed, ["resume=true"]), (full, [])):
        r = subprocess.run(cmd(sweep, *extra), capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stderr[-3000:]
    for i in range(2):
        resumed = strip(test_golden._rows(killed / str(i)))
        assert [x["round"] for x in resumed] == list(range(1, 31))
        assert resumed == strip(test_golden._rows(full / str(i)))
    # a third lr added to the finished sweep trains alone; the finished jobs stay as they are
    before = [(full / str(i) / "metrics.jsonl").read_bytes() for i in range(2)]
    more = cmd(full, "resume=true")
    more[more.index(f"algorithm.lr={LRS[0]},{LRS[1]}")] = f"algorithm.lr={LRS[0]},{LRS[1]},0.1"
    r = subprocess.run(more, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 jobs already finished (resume=true); 1 jobs in 1 program(s)" in r.stdout + r.stderr
    assert [(full / str(i) / "metrics.jsonl").read_bytes() for i in range(2)] == before
    assert len(test_golden._rows(full / "2")) == 30


@pytest.mark.slow
def test_optuna_trials_run_as_one_program_per_batch(tmp_path):
    """Optuna's sweeper hands the launcher n_jobs trials at a time: each batch is one program
    (lr and pl_threshold traced), and the study reads each trial's objective back."""
    r = subprocess.run(
        [sys.executable, "-m", "fedjax_semi.cli", "-m", "+experiment=tune_fedavg_pl",
         "hydra/launcher=vectorized", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
         *(o for o in SMALL if not o.startswith(("algorithm.lr=", "rounds="))), "rounds=2",
         "data_seed=0", f"hardware.compile_cache={tmp_path / 'xla'}",
         f"hydra.sweep.dir={tmp_path / 'study'}"],
        capture_output=True, text=True, timeout=400, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert out.count("2 jobs in 1 program(s): 2 jobs, traced ['lr', 'pl_threshold']") == 2
    finals = []
    for i in range(4):
        summary = json.loads((tmp_path / "study" / str(i) / "summary.json").read_text())
        assert summary["vectorized"]["jobs"] == 2
        finals.append(summary["final"]["accuracy"])
    best = yaml.safe_load((tmp_path / "study" / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(finals))


# Every method family of the golden runs, and the two methods added after them.
TRACED_RUNS = {
    **{n: o for n, o in test_golden.RUNS.items() if n != "replicas"},
    "scaffold": ["algorithm=scaffold"],
    "fedadam": ["algorithm=fedadam"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", TRACED_RUNS)
def test_every_traceable_key_traces(name):
    """Each method's round, warm-up and evaluation lower with every key of its config's
    `traceable` as a traced value (no shape and no Python branch reads them)."""
    exp = experiment.build(compose_config(*TRACED_RUNS[name]))
    keys = type(exp.alg.cfg).traceable
    values = {k: [float(getattr(exp.alg.cfg, k))] * 2 for k in keys
              if getattr(exp.alg.cfg, k) is not None}  # fmt: skip
    r = Runner(exp.alg, exp.fed, chunk=2, eval_chunk=2, seeds=[0, 1], hparams=values)
    state = r.template()
    if r._warmup:
        r._warmup.lower(r._keys, r._hp, state, r.data)
    r._round.lower(r._keys, r._hp, state, r.data, r._flags(1))
    r._eval.lower(r._keys, r._hp, state, r.fed)
