"""The client axis sharded over 4 (forced host) devices gives the same numbers as 1 device, and the
compiled round moves no client-axis data between devices except the aggregation's all-reduce (no
all-gather of the cohort)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedjax_semi.results.rundir import CPU_ISA, environment, host_cpu

SCRIPT = textwrap.dedent(
    """
    import json, re, sys
    from collections import Counter
    import jax
    sys.path.insert(0, {tests!r})
    from conftest import compose_config
    from fedjax_semi import experiment
    def two_rounds(runner):
        state = runner.init()
        for _ in range(2):
            state, m = runner.round(state)
        return state, m

    out, exps = {{}}, {{}}
    for devices in (1, 4):
        cfg = compose_config("algorithm=fedavg", "hardware.chunk=all",
                             f"hardware.devices={{devices}}")
        exp = exps[devices] = experiment.build(cfg)
        runner = exp.runner()
        state, m = two_rounds(runner)
        ev = runner.evaluate(state)
        out[devices] = {{"loss": float(m["train_loss"]), "acc": ev["client_acc"].tolist()}}
    # The replicas' seeds 0 and 1, each run alone on one device (one compiled program: the seed
    # is an argument), against two replicas with each cohort sharded over four devices.
    out["seeds_1"] = [float(two_rounds(exps[1].runner(seed=s))[1]["train_loss"]) for s in (0, 1)]
    cfg = compose_config("algorithm=fedavg", "hardware.chunk=all", "hardware.devices=4",
                         "seed=0", "replicas=2")
    out["replicas_4"] = two_rounds(experiment.build(cfg).runner())[1]["train_loss"].tolist()
    for devices in (1, 4):
        for alg in ("fedavg", "fedbn_sl"):  # all leaves shared; BatchNorm leaves personal
            cfg = compose_config(f"algorithm={{alg}}", "hardware.chunk=all",
                                 f"hardware.devices={{devices}}")
            runner = experiment.build(cfg).runner()
            args = (runner._keys, runner._hp, runner.init(), runner.data, ())
            hlo = runner._round.lower(*args).compile().as_text()
            ops = re.findall(r"\\s(all-gather|all-reduce|all-to-all|collective-permute|"
                             r"reduce-scatter)(?:-start)?\\(", hlo)
            out[f"{{alg}}_{{devices}}"] = Counter(ops)
    print(json.dumps({{"devices": jax.device_count(), **out}}))
    """
)


def test_four_devices_match_one():
    # The suite's own XLA flags (conftest.WORKER_XLA_FLAGS) stay; four host devices are added.
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4"
    env = {**os.environ, "XLA_FLAGS": flags.strip()}
    tests = str(Path(__file__).parent)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=tests)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert abs(out["1"]["loss"] - out["4"]["loss"]) < 1e-4
    assert max(abs(a - b) for a, b in zip(out["1"]["acc"], out["4"]["acc"], strict=True)) < 1e-4
    one, four = out["seeds_1"], out["replicas_4"]  # seeds 0, 1: alone on 1 device; replicas on 4
    assert len(one) == 2 and one[0] != one[1] and one[0] == out["1"]["loss"]
    assert max(abs(a - b) for a, b in zip(one, four, strict=True)) < 1e-4
    for alg in ("fedavg", "fedbn_sl"):
        assert out[f"{alg}_1"] == {}, out  # one device: no collectives at all
        sharded = out[f"{alg}_4"]
        assert sharded.get("all-reduce", 0) >= 1, out  # the cohort really is split
        assert set(sharded) == {"all-reduce"}, out  # and never gathered


def test_the_run_record_names_the_cpus_the_process_may_use():
    """XLA:CPU's thread pool, and with it the float order of some sums, follows the CPUs a process
    may run on, not the machine's count: a process pinned to one CPU records 1."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("the OS does not say (macOS): the record holds None")
    one = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{one}}}); "
        "from fedjax_semi.results.rundir import environment; "
        "e = environment(); print(e['cpu_affinity'], e['cpu_count'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    affinity, count = map(int, out.stdout.split())
    assert affinity == 1 and count == os.cpu_count()


def test_the_run_record_names_the_host_cpu():
    """The model name and the vector extensions XLA:CPU compiles for, read from /proc/cpuinfo:
    the float digits of a run are the same only on the same CPU."""
    info = (
        "processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: Example CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
    )
    want = {"cpu_model": "Example CPU 9000", "cpu_isa": ["sse4_2", "avx", "avx2", "fma"]}
    assert host_cpu(info) == want
    assert host_cpu("") == {"cpu_model": None, "cpu_isa": []}
    env = environment()
    if os.path.exists("/proc/cpuinfo"):
        assert env["cpu_model"] and set(env["cpu_isa"]) <= set(CPU_ISA)
