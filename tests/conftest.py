"""Shared helpers: tiny real data (sklearn digits), configs composed by real Hydra, no network."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import shutil
import sys
import tempfile

# The fast suite's XLA settings, for its xdist workers (make test runs two on two cores):
# - one thread per worker: Eigen's pool would start a thread per core in each worker, and the
#   two pools would contend for the cores;
# - LLVM's optimisation level 0: the suite's programs are tiny and compiled once, so compiling
#   is most of its time (make test on 2 cores: 32.4 -> 21.4 CPU-minutes). Results keep IEEE float
#   semantics; every comparison in the suite is between programs compiled alike, or against
#   NumPy with a float32 tolerance. The golden check (slow, no workers) keeps the default level;
# - XLA:CPU's older fusion code generator: the suite compiles about a quarter faster with it
#   (UM-pFSSL's and HeteroAda's equivalence checks: 200 -> 148 s on one core).
# (Only XLA's own --flags belong here: XLA stops reading XLA_FLAGS at the first token that is
# not one, silently.)
WORKER_XLA_FLAGS = (
    "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0"
    " --xla_cpu_use_fusion_emitters=false"
)


def _xla_backend_started() -> bool:
    """Whether this process's XLA backend exists already (it read XLA_FLAGS when it started)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # private, hence the getattr: no backend known = none

    return bool(getattr(xla_bridge, "_backends", None))


# Set before anything below imports fedjax_semi: importing it starts JAX's CPU backend (a
# module-level PRNGKey), and XLA reads XLA_FLAGS once, then. Set later (as pytest_configure
# once did), the flags reached only the CLI subprocesses, and every worker compiled at the
# default level (a round: 15 s instead of 9 s).
if os.environ.get("PYTEST_XDIST_WORKER") and "XLA_FLAGS" not in os.environ:  # a user's win
    if _xla_backend_started():  # too late: fail loudly rather than compile slowly unnoticed
        raise RuntimeError("tests/conftest.py: XLA started before the workers' XLA_FLAGS were set")
    os.environ["XLA_FLAGS"] = WORKER_XLA_FLAGS

import pytest  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from fedjax_semi.cli import CONF_DIR  # noqa: E402
from fedjax_semi.config import Config  # noqa: E402
from fedjax_semi.store import as_config, register_configs  # noqa: E402

# XLA's persistent compilation cache, shared by every process of one test session (the xdist
# workers and the CLI subprocesses inherit the variables): many tests compile the very same
# round (same algorithm, same shapes), and XLA:CPU compiles dominate the suite's time. A fresh
# directory per session, so no result depends on a cache left by an earlier run; a user may
# point JAX_COMPILATION_CACHE_DIR elsewhere to keep one.
CACHE_VARS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
_OWN_CACHE: list[str] = []


def pytest_configure(config) -> None:
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the controller, before workers start
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="fedjax-semi-xla-cache-"))
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE[0]
    for k, v in CACHE_VARS.items():
        os.environ.setdefault(k, v)
    import jax  # already imported by now in some processes: set the options directly too

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# The hidden-label ledger (test_equivalence.py::test_every_method_has_a_hidden_label_check):
# each test marked `hidden_labels(*methods)` checks that those methods' training reads no hidden
# label. Filled at collection, before `-m` deselects: method -> [(node id, runs in make test)]
# (not marked slow, skip, xfail, or skipif with a true condition; a skip from inside the test is
# not seen here).
HIDDEN_LABEL_CHECKS: dict[str, list[tuple[str, bool]]] = {}
COLLECTED_FILES: set[str] = set()


def pytest_collectstart(collector) -> None:
    if isinstance(collector, pytest.Module):  # also a module that skips itself at import
        COLLECTED_FILES.add(collector.path.name)


def pytest_collection_modifyitems(config, items) -> None:
    """The kernels' NumPy-reference properties run jitted in the fast suite and op by op too in
    make test-slow (chex's `without_jit` variant): op by op, each Hypothesis example of a new
    shape dispatches and compiles every primitive anew, about 60 CPU-seconds of the fast suite
    for a second path through the same kernels; the fixed-example ones about 25 more."""
    for item in items:
        if item.name.endswith("__without_jit"):
            item.add_marker(pytest.mark.slow)
        skipped = any(item.get_closest_marker(m) for m in ("slow", "skip", "xfail")) or any(
            any(bool(c) for c in m.args) for m in item.iter_markers("skipif")
        )
        for mark in item.iter_markers("hidden_labels"):
            for method in mark.args:
                HIDDEN_LABEL_CHECKS.setdefault(method, []).append((item.nodeid, not skipped))


def pytest_unconfigure(config) -> None:
    for d in _OWN_CACHE:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def swapped_data(runner, fed):
    """The compiled `runner` pointed at other data of the same shapes (no recompilation), as
    its algorithm sees it (the oracle's view for an oracle); its own data back on exit."""
    old = runner.fed
    runner.fed, runner.data = fed, fed.train_view(oracle=runner.alg.oracle)
    try:
        yield runner
    finally:
        runner.fed, runner.data = old, old.train_view(oracle=runner.alg.oracle)


def examples(n: int) -> int:
    """Hypothesis examples for a property test that would draw n: a third of them (at least 5)
    in the fast suite, whose examples of new shapes each compile the kernels again; all n with
    HYPOTHESIS_FULL=1 (e.g. `HYPOTHESIS_FULL=1 make test`)."""
    return n if os.environ.get("HYPOTHESIS_FULL") else max(5, n // 3)


# A run on digits that compiles and trains in seconds.
SMALL = [
    "dataset=digits",
    "model=mlp",
    "model.hidden=[32]",
    "num_clients=12",
    "clients_per_round=4",
    "rounds=3",
    "partition.min_client_size=5",
    "partition.labeled_fraction=0.3",
    "algorithm.lr=0.1",
    "algorithm.batch_size=16",
    "hardware.chunk=3",
    "hardware.eval_chunk=5",
    "hardware.eval_batch=128",
    "progress=false",
    "save_partition=false",
]


@functools.cache
def _register_configs_once() -> None:
    """The schemas go into Hydra's (process-wide) ConfigStore once: storing them again is the
    same store, and took a third of each compose (0.27 s)."""
    register_configs()


def compose_hydra(*overrides: str, small: bool = True) -> DictConfig:
    """The Hydra config `fedjax-semi` would hand its task with these overrides on top of SMALL
    (before any of our own checks). A copy of the process's first composition of the same
    overrides: conf/ does not change during a session, and a compose takes about 0.5 s."""
    key = (overrides, small)
    if key not in _COMPOSED:
        _register_configs_once()
        mine = {o.split("=")[0] for o in overrides}
        base = [o for o in (SMALL if small else []) if o.split("=")[0] not in mine]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            _COMPOSED[key] = compose("config", overrides=base + list(overrides))
    return copy.deepcopy(_COMPOSED[key])


_COMPOSED: dict[tuple, DictConfig] = {}


def compose_config(*overrides: str, small: bool = True) -> Config:
    """The config `fedjax-semi` would run with these overrides on top of SMALL."""
    return as_config(compose_hydra(*overrides, small=small))


def one_round(exp, backend: str = "jit", chunk="all", fed=None):
    """One round of `exp`'s method from its initial state on `fed` (default: its own data):
    (state, new state, metrics, evaluation of the new state)."""
    from fedjax_semi.engine.simulate import Runner

    fed = exp.fed if fed is None else fed
    runner = Runner(exp.alg, fed, backend=backend, chunk=chunk, eval_chunk=chunk)
    state = runner.init()
    new, metrics = runner.round(state)
    return state, new, metrics, runner.evaluate(new)


@pytest.fixture
def isolated_data_env(monkeypatch, tmp_path):
    """Keep the user's real data and cache out of dataset lookups; start with a cold cache."""
    from fedjax_semi.data import registry

    monkeypatch.delenv("FEDJAX_SEMI_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    registry.clear_cache()
    yield
    registry.clear_cache()


def corrupt_server_labels(fed, name: str, visible: bool):
    """Shift the labels of the server set `name` by one class (the visible ones too when
    `visible`: the validation set's labels are the server's)."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    idx = np.asarray(fed.server[name])
    new = lambda y: jnp.asarray(y).at[idx].set((jnp.asarray(y)[idx] + 1) % fed.num_classes)
    return dataclasses.replace(fed, y=new(fed.y) if visible else fed.y, eval_y=new(fed.eval_y))


def corrupt_hidden_labels(fed):
    """Shift every label training must not see by one class: every row whose visible label is
    -1 (the clients' unlabeled data, the test splits, server pools, rows of no role) and whose
    true label is known (eval_y -1, e.g. a second dataset's pool, stays unknown)."""
    import jax.numpy as jnp
    import numpy as np

    y = np.asarray(fed.eval_y).copy()
    hidden = (np.asarray(fed.y) < 0) & (y >= 0)
    test_rows = np.zeros_like(hidden)  # a corrupted row outside the test splits, or no check
    if "test" in fed.roles:
        t = fed.roles["test"]
        test_rows[np.asarray(t.idx)[np.asarray(t.mask)]] = True
    assert (hidden & ~test_rows).any(), "no hidden label training could read: no check"
    y[hidden] = (y[hidden] + 1) % fed.num_classes
    return fed.with_hidden_labels(jnp.asarray(y))


def client_of(tree, c: int):
    """Client c's slice of a pytree stacked over clients (leading axis)."""
    import jax

    return jax.tree_util.tree_map(lambda a: a[c], tree)


def run_rounds(runner, rounds: int, state=None, evaluate: bool = True):
    """(states after rounds 0..rounds, each round's metrics and, with evaluate, its
    evaluation) of a runner."""
    import jax

    state = runner.init() if state is None else state
    states, rows = [state], []
    for _ in range(rounds):
        state, m = runner.round(state)
        rows.append(jax.device_get({**m, **runner.evaluate(state)} if evaluate else m))
        states.append(state)
    return states, rows


@pytest.fixture(scope="module")
def fmnist():
    """Debian's Fashion-MNIST (the partition tests' real-data cases), skipped where absent."""
    from fedjax_semi.data.registry import load_dataset

    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist) is not installed")
    return load_dataset("fashion_mnist")
