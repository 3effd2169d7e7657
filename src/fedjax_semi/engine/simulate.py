"""The Runner: one compiled round and one evaluation, jit or the reference loop. The run loop
(engine/loop.py) drives it; `results.run.simulate` puts the loop and its hooks together."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine.aggregate import select_rows
from fedjax_semi.engine.clients import Clients, PyTree, map_clients

# Defined beside the loop; importable from here as before.
from fedjax_semi.engine.loop import EarlyStopper as EarlyStopper
from fedjax_semi.engine.loop import NaNError as NaNError
from fedjax_semi.engine.loop import pseudo_label_accuracy as pseudo_label_accuracy
from fedjax_semi.engine.loop import rounds_done
from fedjax_semi.engine.state import State

if TYPE_CHECKING:  # the engine imports no method; a method is anything with this interface
    from fedjax_semi.algorithms.base import Algorithm


class Runner:
    """Compiles one round and one evaluation, for the jit backend or the reference loop.

    The optional parts of a round (a warm-up, per-round switches) are the ones the algorithm
    declares (`algorithms.base.Capabilities`, which `algorithms.base.Method` extends).
    """

    def __init__(
        self,
        alg: Algorithm,
        fed: FederatedData,
        backend: str = "jit",
        chunk: int | str = "all",
        eval_chunk: int | str = "all",
        devices: int = 1,
        seed: int = 0,
        seeds: Sequence[int] | None = None,
        replica_chunk: int | str = "all",
        hparams: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        self.alg, self.fed, self.backend = alg, fed, backend
        self.seeds = tuple(int(s) for s in seeds) if seeds is not None else None
        # Replica r's own values of traced config keys (the vectorized launcher's jobs): an
        # argument of every program, like the keys, so one compiled round serves them all.
        self.hparams = {k: tuple(float(x) for x in v) for k, v in (hparams or {}).items()}
        if self.hparams and (self.seeds is None or backend != "jit"):
            raise ValueError("traced hyperparameters need a replica axis (seeds) and backend jit")
        for k, v in self.hparams.items():
            if len(v) != len(self.seeds):
                raise ValueError(f"{k}: {len(v)} values for {len(self.seeds)} replicas")
        self._hp = {k: jnp.asarray(v, jnp.float32) for k, v in self.hparams.items()}
        self.replica_chunk = replica_chunk
        self.data = fed.train_view(oracle=alg.oracle)
        self.label_scores = alg.label_scores
        self._flags = alg.round_flags
        self._warmup_fn = alg.warmup if alg.has_warmup else None
        self.chunk, self.autotune = chunk, None
        self._out = None  # the outputs' sharding with several processes (`replicated`)
        self._keep = jax.jit(keep_replicas)
        # The run's key (`seed`), or with replicas one key per seed: an argument of every
        # compiled program, never a constant, so one program serves every seed (and XLA's
        # compilation cache finds it again).
        self._keys = (
            jax.random.PRNGKey(seed)
            if self.seeds is None
            else jnp.stack([jax.random.PRNGKey(s) for s in self.seeds])
        )
        if backend == "jit":
            emap = Clients.jitted(eval_chunk)
            self._place = client_sharding(devices) if devices > 1 else (lambda tree: tree)
            # Several processes: every output (state, metrics) replicated on every device, so
            # each process reads it whole (the cohort's rows are gathered once, in the program).
            out = self._out = replicated(devices)
            self._jit = jax.jit if out is None else functools.partial(jax.jit, out_shardings=out)
            self._eval = self._jit(self._replicated(lambda a, key, s, f: a.evaluate(s, f, emap)))
            if chunk != "auto":
                self._compile(chunk)
        elif backend == "reference":
            if chunk == "auto":
                raise ValueError("hardware.chunk='auto' is not allowed with the reference backend")
            if self.seeds is not None:
                raise ValueError(
                    f"replicas={len(self.seeds)} is not allowed with hardware.backend='reference': "
                    "replicas are one compiled program (hardware.backend='jit')"
                )
            loop, warmup = Clients.reference(), self._warmup_fn
            self._round = lambda key, hp, s, data, flags: alg.round(s, data, key, loop, flags)
            self._eval = lambda key, hp, s, f: alg.evaluate(s, f, loop)
            self._warmup = warmup and (lambda key, hp, s, d: warmup(s, d, loop, key))
        else:
            raise ValueError(f"hardware.backend={backend!r} is not allowed: 'jit' or 'reference'")

    def _programs(self, chunk: int | str):
        """(jitted round, jitted warm-up or None) with the cohort mapped in chunks of `chunk`."""
        clients = Clients.jitted(chunk, self._place)
        cmap = Clients.jitted(chunk)  # the warm-up's clients, not placed on the mesh

        def round_fn(alg, key, state, data, flags):
            return alg.round(state, data, key, clients, flags)

        def warmup_fn(alg, key, state, data):
            return alg.warmup(state, data, cmap, key)

        return (
            self._jit(self._replicated(round_fn), static_argnums=4),
            self._warmup_fn and self._jit(self._replicated(warmup_fn)),
        )

    def _replicated(self, fn: Callable) -> Callable:
        """fn(alg, key, state, *args) as program(keys, hp, state, *args): for one run, or with
        replicas the same over a leading replica axis of keys, traced values and states (run r
        draws from seed r's key and reads its own values `hp`, through
        `alg.with_hyperparameters`). The replicas share the data and the static arguments, and
        are mapped like clients (`map_clients`): replica_chunk="all" is one vmap (GPU), 1 a
        loop inside the program (CPU)."""
        alg = self.alg
        if self.seeds is None:
            return lambda key, hp, state, *args: fn(alg, key, state, *args)

        def one(key, hp, state, *args):
            return fn(alg.with_hyperparameters(hp) if hp else alg, key, state, *args)

        def replicated(keys, hp, states, *args):
            return map_clients(
                lambda r: one(r[0], r[1], r[2], *args), (keys, hp, states), chunk=self.replica_chunk
            )

        return replicated

    def _compile(self, chunk: int | str) -> None:
        self.chunk = chunk
        self._round, self._warmup = self._programs(chunk)

    def _tune(self, state: State) -> None:
        """hardware.chunk=auto: time one round from `state` at each candidate chunk size (the
        result is thrown away; rounds are pure) and keep the fastest. A candidate that runs
        out of device memory is skipped. The timings are kept in `self.autotune`."""
        one = state if self.seeds is None else jax.tree.map(lambda a: a[0], state)
        key = self._keys if self.seeds is None else self._keys[0]
        flags = self._flags(rounds_done(state) + 1)
        mapped = []  # the leading size of each mapping of the round, in order

        def record(fn, rows, *shared):
            mapped.append(jax.tree.leaves(rows)[0].shape[0])
            return map_clients(fn, rows, *shared)

        jax.eval_shape(lambda s: self.alg.round(s, self.data, key, Clients(record), flags), one)
        cohort = mapped[0] if mapped else 1
        timings, programs = {}, {}
        for chunk in auto_chunk_candidates(cohort):
            programs[chunk] = self._programs(chunk)
            fn = programs[chunk][0]
            try:
                jax.block_until_ready(fn(self._keys, self._hp, state, self.data, flags))  # compile
                t0 = time.perf_counter()
                jax.block_until_ready(fn(self._keys, self._hp, state, self.data, flags))
                timings[str(chunk)] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 (XLA reports OOM as a runtime error)
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                timings[str(chunk)] = None
        ok = {c: t for c, t in timings.items() if t is not None}
        if not ok:
            raise RuntimeError(f"hardware.chunk=auto: every chunk size ran out of memory {timings}")
        best = min(ok, key=ok.get)
        chunk = best if best == "all" else int(best)
        self.chunk, (self._round, self._warmup) = chunk, programs[chunk]
        self.autotune = {"chosen": chunk, "cohort": cohort, "round_s": timings}

    def template(self) -> State:
        """The algorithm's initial state before any warm-up (stacked over the replicas' seeds
        when there are replicas): the structure a checkpoint restores into. With several
        processes it is placed like the rounds' outputs (replicated), so the round compiles
        once and a checkpoint restores onto every process's devices."""
        if self.seeds is None:
            state = self.alg.init(self._keys, self.fed)
        else:
            # Replica r's own values of the traced keys reach its init too (concrete here).
            algs = [
                self.alg.with_hyperparameters({k: v[r] for k, v in self.hparams.items()})
                if self.hparams
                else self.alg
                for r in range(len(self.seeds))
            ]
            states = [a.init(key, self.fed) for a, key in zip(algs, self._keys, strict=True)]
            state = jax.tree.map(lambda *a: jnp.stack(a), *states)
        return state if self._out is None else jax.device_put(state, self._out)

    def init(self) -> State:
        """The initial state, after the algorithm's warm-up when it has one (with
        hardware.chunk=auto the chunk size is chosen first, on the state before warm-up)."""
        state = self.template()
        if self.chunk == "auto":
            self._tune(state)
        return self._warmup(self._keys, self._hp, state, self.data) if self._warmup else state

    def round(self, state: State) -> tuple[State, dict]:
        if self.chunk == "auto":  # resumed from a checkpoint: init() was not called
            self._tune(state)
        flags = self._flags(rounds_done(state) + 1)
        return self._round(self._keys, self._hp, state, self.data, flags)

    def evaluate(self, state: State) -> dict:
        return self._eval(self._keys, self._hp, state, self.fed)

    def keep(self, new: State, old: State, active: Sequence[bool]) -> State:
        """Replica r's new state where active[r], its old one where it has stopped."""
        return self._keep(new, old, jnp.asarray(active))


def keep_replicas(new: State, old: State, active: jax.Array) -> State:
    """Per leaf, new[r] where active[r] (bool [R]), else old[r]."""
    return select_rows(active, new, old)


AUTO_CHUNKS = (1, 4, 16, 64, 256)


def auto_chunk_candidates(cohort: int) -> list[int | str]:
    """The chunk sizes hardware.chunk=auto tries for a cohort of `cohort` clients: powers of 4
    below it, then the whole cohort in one vmap."""
    return [c for c in AUTO_CHUNKS if c < cohort] + ["all"]


def client_sharding(devices: int) -> Callable[[PyTree], PyTree]:
    """A function that shards the leading (client) axis of every leaf over `devices` devices."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if devices > jax.device_count():
        raise ValueError(
            f"hardware.devices={devices} is not allowed: this process sees "
            f"{jax.device_count()} device(s)"
        )
    mesh = Mesh(np.array(jax.devices()[:devices]), ("clients",))
    spec = NamedSharding(mesh, PartitionSpec("clients"))
    return lambda tree: jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, spec), tree)


def replicated(devices: int) -> jax.sharding.NamedSharding | None:
    """With several processes (jax.distributed), the sharding that replicates an output on
    every device of the client mesh; None (the compiler's choice) within one process."""
    if jax.process_count() == 1:
        return None
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.array(jax.devices()[:devices]), ("clients",)), PartitionSpec())
