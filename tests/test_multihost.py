"""hardware=multi_host: two CPU processes on this machine (jax.distributed, gloo collectives), the
cohort sharded over their devices, give the metrics of one process; process 0 alone writes the
run directory (metrics, summary, one Orbax checkpoint), and a resumed two-process run goes on
from it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.engine.distributed import ENV, settings
from fedjax_semi.errors import ConfigError

RUN = [
    "algorithm=fedavg_sl",
    "num_clients=8",
    "clients_per_round=4",
    "hardware.chunk=all",
    "hardware.eval_chunk=all",
    "writers=[jsonl]",
]

# One process of the run: round 1, then resumed to round 2 (both through the CLI's task
# function), then the collectives of the compiled round (the resumed run's: jit's cache has it)
# and the shapes of what it all-gathers.
SCRIPT = textwrap.dedent(
    """
    import json, re, sys
    from collections import Counter
    sys.path.insert(0, {tests!r})
    from conftest import compose_hydra
    from fedjax_semi.cli import _task
    import jax
    from fedjax_semi import experiment
    runners = []  # the runs' runners, kept to read the compiled round's collectives
    make_runner = experiment.Experiment.runner
    experiment.Experiment.runner = lambda exp: runners.append(make_runner(exp)) or runners[-1]
    args = [*{run!r}, "hardware=multi_host", "out_dir=" + sys.argv[1]]
    _task(compose_hydra(*args, "rounds=1"))
    _task(compose_hydra(*args, "rounds=2", "resume=true"))
    r = runners[-1]
    hlo = r._round.lower(r._keys, r._hp, r.template(), r.data, r._flags(2)).compile().as_text()
    ops = re.findall(r"\\s(all-gather|all-reduce|all-to-all|collective-permute|"
                     r"reduce-scatter)(?:-start)?\\(", hlo)
    gathered = re.findall(r"= \\w+\\[([\\d,]*)\\]\\S* all-gather(?:-start)?\\(", hlo)
    print(json.dumps({{"process": jax.process_index(), "devices": jax.device_count(),
                      "local": jax.local_device_count(), "ops": Counter(ops),
                      "gathered": gathered}}))
    """
)

# Cluster variables JAX's detection reads: left out, so a suite run under srun or mpirun still
# starts exactly the two processes of the test.
CLUSTER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "JAX_COORDINATOR", "FEDJAX_SEMI_")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_PREFIXES)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_two_processes_match_one(tmp_path):
    tests = str(Path(__file__).parent)
    coordinator = f"localhost:{free_port()}"
    procs = []
    for pid in (0, 1):  # each names its own out_dir: process 0's is the one used
        env = {
            **clean_env(),
            "FEDJAX_SEMI_COORDINATOR": coordinator,
            "FEDJAX_SEMI_NUM_PROCESSES": "2",
            "FEDJAX_SEMI_PROCESS_ID": str(pid),
        }
        cmd = [sys.executable, "-c", SCRIPT.format(tests=tests, run=RUN), str(tmp_path / f"p{pid}")]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        # Meanwhile, here: the same two rounds in one process, on its one device.
        one = tmp_path / "one"
        experiment.run(experiment.build(compose_config(*RUN, "rounds=2", "hardware=gpu")), one)
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert [r["process"] for r in reports] == [0, 1]
    assert all(r["devices"] == 2 and r["local"] == 1 for r in reports), reports
    for r in reports:
        # Each process trains its half of the cohort: the aggregation all-reduces partial
        # sums, and only per-client metrics ([clients_per_round]) are gathered to every
        # process (the outputs are replicated), never the cohort's models or data.
        assert r["ops"].get("all-reduce", 0) >= 1, reports
        assert set(r["ops"]) <= {"all-reduce", "all-gather"}, reports
        assert len(r["gathered"]) == r["ops"].get("all-gather", 0), reports
        assert set(r["gathered"]) <= {"4"}, reports

    # Process 0 alone wrote the run directory, with one checkpoint per saved round.
    assert not (tmp_path / "p1").exists()
    p0 = tmp_path / "p0"
    assert (p0 / "summary.json").exists() and (p0 / "run_config.json").exists()
    assert sorted(d.name for d in (p0 / "checkpoints").iterdir() if d.name.isdigit()) == ["1", "2"]

    rows = [json.loads(line) for line in (p0 / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] == [r["round"] for r in ref]
    # float32 tolerance: the aggregation's sum over the cohort is two partial sums (one per
    # process) joined by an all-reduce, another summation order than one device's; two rounds
    # of that rounding (~1e-7 relative per operation) stay far below 1e-5 on values of order 1.
    for row, want in zip(rows, ref, strict=True):
        assert row.keys() == want.keys()
        for k, v in want.items():
            if k == "wall_time":
                continue
            if isinstance(v, float):
                assert row[k] == pytest.approx(v, abs=1e-5), (row["round"], k)
            else:
                assert row[k] == v, (row["round"], k)


def test_environment_settings():
    good = {"FEDJAX_SEMI_COORDINATOR": "node1:1234", "FEDJAX_SEMI_NUM_PROCESSES": "4"}
    assert settings({}) == {}  # none set: JAX's own cluster detection (SLURM under srun)
    assert settings({**good, "FEDJAX_SEMI_PROCESS_ID": "3"}) == {
        "coordinator_address": "node1:1234",
        "num_processes": 4,
        "process_id": 3,
    }
    for env, needle in [
        (good, "missing ['FEDJAX_SEMI_PROCESS_ID']"),
        ({**good, "FEDJAX_SEMI_PROCESS_ID": "4"}, "must lie in [0, FEDJAX_SEMI_NUM_PROCESSES=4)"),
        ({**good, "FEDJAX_SEMI_PROCESS_ID": "one"}, "must be integers"),
        ({**good, "FEDJAX_SEMI_PROCESS_ID": "0", ENV[0]: "node1"}, "must be host:port"),
    ]:
        with pytest.raises(ConfigError) as e:
            settings(env)
        assert str(e.value).startswith("hardware.distributed=True is not allowed: ")
        assert needle in str(e.value)


def test_no_cluster_fails_with_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "fedjax_semi.cli", "hardware=multi_host", f"out_dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert r.returncode == 2
    err = r.stderr.strip()
    assert err.startswith("fedjax-semi: error: hardware.distributed=True is not allowed: "), err
    assert "FEDJAX_SEMI_COORDINATOR" in err and "srun" in err and len(err.splitlines()) == 1
