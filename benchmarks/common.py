"""Shared pieces of the benchmarks: configs, timing, JSON lines with device and versions."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def compose(*overrides: str):
    """The config `fedjax-semi` would run with these overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from fedjax_semi.cli import CONF_DIR
    from fedjax_semi.store import as_config, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return as_config(hydra_compose("config", overrides=list(overrides)))


def synthetic(name: str = "fashion_mnist", n_train: int = 60000, n_test: int = 10000):
    """Random 28 x 28 x 1 uint8 images with 10 uniform labels, Fashion-MNIST's shapes (speed
    only), n_train + n_test of them."""
    from fedjax_semi.data.registry import ArrayDataset

    n = n_train + n_test
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, 28, 28, 1), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype(np.int32)
    return ArrayDataset(
        name, x[:n_train], y[:n_train], x[n_train:], y[n_train:], 10, (0.5,), (0.25,)
    )


def dataset_or_synthetic(name: str = "fashion_mnist"):
    """The real dataset when it is found, else random data of the same shapes (speed only)."""
    from fedjax_semi.data.registry import DatasetNotFoundError, load_dataset

    try:
        return load_dataset(name), "real"
    except DatasetNotFoundError:
        return synthetic(name), "synthetic"


def runner_for(exp, chunk: str):
    """The experiment's runner for a --chunks entry: 'reference' (the per-client loop), 'all',
    'auto' or a chunk size."""
    if chunk == "reference":
        return exp.runner(backend="reference")
    return exp.runner(chunk=chunk if chunk in ("all", "auto") else int(chunk))


def timed(fn, repeats: int) -> tuple[float, float, list[float]]:
    """(first call incl. compile, median of the next `repeats`, all of them) in seconds."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, float(np.median(times)), times


def time_rounds(runner, state, repeats: int) -> tuple[float, list[float], object]:
    """(compile+first round seconds, steady-state round times, final state)."""
    t0 = time.perf_counter()
    state, _ = runner.round(state)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, _ = runner.round(state)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
    return first, times, state


def environment() -> dict:
    from fedjax_semi.results.rundir import environment as env

    # The 1-minute load average, so a number measured beside other jobs says so.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {**env(), "date": datetime.datetime.now().isoformat(timespec="seconds"), "load_1m": load}


def emit(record: dict, path: Path) -> None:
    """Print one JSON line and append it to the results file."""
    line = json.dumps(record)
    print(line, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(line + "\n")
    sys.stdout.flush()


# Runs a command and prints, last, a JSON line with its wall time and peak RSS (the only child).
_WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:]).returncode
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": rc, "total_s": time.perf_counter() - t0, "peak_rss_bytes": rss}))
"""


def timed_process(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run cmd as the only child of a wrapper process: its exit code, wall time and peak RSS."""
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *cmd],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=cwd,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {res['rc']}):\n{out.stderr[-3000:]}")
    return res


def git(*args: str) -> str:
    """`git -C ROOT ARGS...`'s output, stripped (raises on failure)."""
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def revision(rev: str | None) -> str:
    """The commit of rev, or for None the working tree's: HEAD, "+dirty" with tracked changes."""
    if rev is not None:
        return git("rev-parse", f"{rev}^{{commit}}")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
