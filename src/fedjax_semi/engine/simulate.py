"""The round loop: one compiled round per iteration, metrics, checkpoints, stop rules.

state = runner.init()               (warm-up included), or the latest checkpoint (resume=true)
for r in rounds:
    state, m = runner.round(state)  ONE jitted program (or the reference loop)
    NaN guard; evaluate every eval_every rounds
    metrics.jsonl += m; checkpoint every checkpoint_every rounds; early stopping
summary.json, plots/accuracy.png"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from fedjax_semi.algorithms.base import Algorithm, FLState
from fedjax_semi.config import StopConfig
from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine.clients import LoopMapper, map_clients
from fedjax_semi.results.rundir import (
    Checkpointer,
    MetricsLog,
    environment,
    jsonable,
    plot_curves,
)


class NaNError(RuntimeError):
    """A client produced a non-finite loss or model; the last good state is checkpointed."""


class Runner:
    """Compiles one round and one evaluation, for the jit backend or the reference loop.

    Optional algorithm hooks: `warmup(state, data, mapper)` runs once before round 1;
    `round_flags(rnd)` gives hashable per-round switches (compiled as static arguments) and
    `client_update_for(flags)` the client function for them.
    """

    def __init__(
        self,
        alg: Algorithm,
        fed: FederatedData,
        backend: str = "jit",
        chunk: int | str = "all",
        eval_chunk: int | str = "all",
        devices: int = 1,
    ) -> None:
        self.alg, self.fed, self.backend = alg, fed, backend
        self.data = fed.train_view(oracle=alg.oracle)
        self._flags = getattr(alg, "round_flags", lambda rnd: ())
        self._update_for = getattr(alg, "client_update_for", lambda flags: alg.client_update)
        self._warmup_fn = getattr(alg, "warmup", None)
        self.chunk, self.autotune = chunk, None
        if backend == "jit":
            emap = functools.partial(map_clients, chunk=eval_chunk)
            self._place = client_sharding(devices) if devices > 1 else (lambda tree: tree)
            self._eval = jax.jit(lambda s, f: alg.evaluate(s, f, emap))
            if chunk != "auto":
                self._compile(chunk)
        elif backend == "reference":
            if chunk == "auto":
                raise ValueError("hardware.chunk='auto' is not allowed with the reference backend")
            loop = LoopMapper()
            prepare, finish = jax.jit(alg.prepare), jax.jit(alg.finish)
            update_for, warmup = self._update_for, self._warmup_fn

            def round_fn(state, data, flags):
                cohort, inputs, shared = prepare(state, data)
                return finish(state, cohort, loop(update_for(flags), inputs, shared))

            self._round = round_fn
            self._eval = lambda s, f: alg.evaluate(s, f, loop)
            self._warmup = warmup and (lambda s, d: warmup(s, d, loop))
        else:
            raise ValueError(f"hardware.backend={backend!r} is not allowed: 'jit' or 'reference'")

    def _programs(self, chunk: int | str):
        """(jitted round, jitted warm-up or None) with the cohort mapped in chunks of `chunk`."""
        alg, place, update_for = self.alg, self._place, self._update_for
        cmap = functools.partial(map_clients, chunk=chunk)

        def round_fn(state, data, flags):
            cohort, inputs, shared = alg.prepare(state, data)
            outputs = place(cmap(update_for(flags), place(inputs), shared))
            return alg.finish(state, cohort, outputs)

        warmup = self._warmup_fn
        return (
            jax.jit(round_fn, static_argnums=2),
            warmup and jax.jit(lambda s, d: warmup(s, d, cmap)),
        )

    def _compile(self, chunk: int | str) -> None:
        self.chunk = chunk
        self._round, self._warmup = self._programs(chunk)

    def _tune(self, state: FLState) -> None:
        """hardware.chunk=auto: time one round from `state` at each candidate chunk size (the
        result is thrown away; rounds are pure) and keep the fastest. A candidate that runs
        out of device memory is skipped. The timings are kept in `self.autotune`."""
        _, inputs, _ = jax.eval_shape(self.alg.prepare, state, self.data)
        cohort = jax.tree.leaves(inputs)[0].shape[0]
        flags = self._flags(int(state.round) + 1)
        timings, programs = {}, {}
        for chunk in auto_chunk_candidates(cohort):
            programs[chunk] = self._programs(chunk)
            fn = programs[chunk][0]
            try:
                jax.block_until_ready(fn(state, self.data, flags))  # compile
                t0 = time.perf_counter()
                jax.block_until_ready(fn(state, self.data, flags))
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

    def init(self) -> FLState:
        """The initial state, after the algorithm's warm-up when it has one (with
        hardware.chunk=auto the chunk size is chosen first, on the state before warm-up)."""
        state = self.alg.init(self.fed)
        if self.chunk == "auto":
            self._tune(state)
        return self._warmup(state, self.data) if self._warmup else state

    def round(self, state: FLState) -> tuple[FLState, dict]:
        if self.chunk == "auto":  # resumed from a checkpoint: init() was not called
            self._tune(state)
        return self._round(state, self.data, self._flags(int(state.round) + 1))

    def evaluate(self, state: FLState) -> dict:
        return self._eval(state, self.fed)


AUTO_CHUNKS = (1, 4, 16, 64, 256)


def auto_chunk_candidates(cohort: int) -> list[int | str]:
    """The chunk sizes hardware.chunk=auto tries for a cohort of `cohort` clients: powers of 4
    below it, then the whole cohort in one vmap."""
    return [c for c in AUTO_CHUNKS if c < cohort] + ["all"]


def client_sharding(devices: int):
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


@dataclass
class EarlyStopper:
    """Stops on a target value, after `patience` evaluations without improvement, on the FA
    plateau rule (`plateau`: |m_r - m_{r-1}| below it for `patience` evaluations in a row), or
    once the simulated clock reaches `sim_time`. `literal_round` is where the paper's literal FA
    rule (one plateaued evaluation, no minimum) would have stopped."""

    cfg: StopConfig
    best: float = -np.inf
    best_round: int = 0
    since_best: int = 0
    plateaued: int = 0
    literal_round: int | None = None
    last: float | None = None
    history: list = field(default_factory=list)

    def update(self, rnd: int, value: float | None, sim_time: float | None = None) -> str | None:
        c = self.cfg
        if c.sim_time is not None and sim_time is not None and sim_time >= c.sim_time:
            return f"simulated clock {sim_time:.1f} s >= stop.sim_time={c.sim_time}"
        if value is None:
            return None
        if value > self.best:
            self.best, self.best_round, self.since_best = value, rnd, 0
        else:
            self.since_best += 1
        flat = c.plateau is not None and self.last is not None
        flat = flat and abs(value - self.last) < c.plateau
        self.plateaued = self.plateaued + 1 if flat else 0
        if flat and self.literal_round is None:
            self.literal_round = rnd
        self.last = value
        if c.target is not None and value >= c.target:
            return f"target {c.metric} >= {c.target} reached"
        if c.patience and rnd >= c.min_rounds:
            if c.plateau is not None and self.plateaued >= c.patience:
                return f"{c.metric} changed by < {c.plateau} in {c.patience} evaluations in a row"
            if c.plateau is None and self.since_best >= c.patience:
                return f"no improvement of {c.metric} in {c.patience} evaluations"
        return None


def pseudo_label_accuracy(index, label, eval_y) -> float | None:
    """Share of pseudo-labels that equal the hidden true labels (a diagnostic only: it runs on
    the host after the round, and training never sees eval_y). index, label [S, N]; label -1
    marks padding."""
    label = np.asarray(label)
    valid = label >= 0
    if not valid.any():
        return None
    truth = np.asarray(eval_y)[np.asarray(index)]
    return float(np.mean(truth[valid] == label[valid]))


def _scalars(m: dict) -> dict:
    return {k: v for k, v in m.items() if np.ndim(v) == 0}


def simulate(
    alg: Algorithm,
    fed: FederatedData,
    *,
    rounds: int,
    out_dir: Path,
    runner: Runner,
    eval_every: int = 1,
    eval_initial: bool = False,
    checkpoint_every: int = 5,
    resume: bool = False,
    stop: StopConfig | None = None,
    progress: bool = True,
    title: str = "",
) -> dict:
    """Run `rounds` rounds and write the run directory. Returns the summary."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or StopConfig()
    log = MetricsLog(out_dir / "metrics.jsonl")
    ckpt = Checkpointer(out_dir / "checkpoints")
    state = runner.init() if not (resume and ckpt.latest() is not None) else alg.init(fed)
    start, rows = 0, []
    if resume and ckpt.latest() is not None:
        start = int(ckpt.latest())
        state = ckpt.restore(start, state)
        rows = log.truncate(start)
    elif log.path.exists():
        log.path.unlink()  # a fresh run starts a fresh log
    stopper = EarlyStopper(stop)
    for r in rows:
        stopper.update(r["round"], r.get(stop.metric), r.get("sim_time"))

    if eval_initial and start == 0:
        # Round 0: the state before any round (after warm-up), e.g. the start of a TTAP curve.
        row = {"round": 0, "sim_time": float(state.sim_time)}
        row.update(_scalars(jax.device_get(runner.evaluate(state))))
        row = jsonable(row)
        log.append(row)
        rows.append(row)

    from tqdm.auto import tqdm

    bar = tqdm(total=rounds, initial=start, desc=f"{alg.name}", unit="round", disable=not progress)
    wall0 = time.perf_counter()
    stop_reason, last_eval = "rounds completed", {}
    try:
        for rnd in range(start + 1, rounds + 1):
            t0 = time.perf_counter()
            new_state, m = runner.round(state)
            m = jax.device_get(m)
            bad = ~np.asarray(m["client_finite"])
            if bad.any():
                ckpt.save(rnd - 1, state)  # the last good state, to resume from or inspect
                clients = np.asarray(m["cohort"])[bad].tolist()
                stop_reason = f"non-finite loss or model in round {rnd}, clients {clients}"
                raise NaNError(
                    f"{stop_reason}; the state after round {rnd - 1} is checkpointed in "
                    f"{ckpt.directory}"
                )
            state = new_state
            row = {"round": rnd, **_scalars({k: v for k, v in m.items() if k != "client_finite"})}
            if "pl_label" in m:
                row["pl_acc"] = pseudo_label_accuracy(m["pl_index"], m["pl_label"], fed.eval_y)
            row["sim_time"] = float(state.sim_time)
            if rnd % eval_every == 0 or rnd == rounds:
                ev = jax.device_get(runner.evaluate(state))
                last_eval = ev
                row.update(_scalars(ev))
                acc = np.asarray(ev["client_acc"])
                row["client_acc_p10"], row["client_acc_p90"] = np.percentile(acc, [10, 90])
            row["wall_time"] = time.perf_counter() - t0
            row = jsonable(row)
            log.append(row)
            rows.append(row)
            reason = stopper.update(rnd, row.get(stop.metric), row.get("sim_time"))
            if rnd % checkpoint_every == 0 or rnd == rounds or reason:
                ckpt.save(rnd, state)
            bar.set_postfix(
                {k: f"{row[k]:.4f}" for k in ("accuracy", "train_loss") if row.get(k) is not None}
            )
            bar.update(1)
            if reason:
                stop_reason = reason
                break
    except KeyboardInterrupt:
        ckpt.save(int(state.round), state)
        stop_reason = f"interrupted after round {int(state.round)}"
        raise
    finally:
        bar.close()
        summary = _write_summary(out_dir, alg, rows, last_eval, stopper, stop_reason, wall0, runner)
        if rows:
            plot_curves(rows, out_dir / "plots" / "accuracy.png", title or alg.name)
        ckpt.close()
    return summary


def _write_summary(out_dir, alg, rows, last_eval, stopper, stop_reason, wall0, runner) -> dict:
    evals = [r for r in rows if r.get("accuracy") is not None]
    final = evals[-1] if evals else {}
    summary = {
        "algorithm": alg.name,
        "rounds_completed": rows[-1]["round"] if rows else 0,
        "stop_reason": stop_reason,
        "final": final,
        "best_accuracy": None if not np.isfinite(stopper.best) else stopper.best,
        "best_round": stopper.best_round,
        "fa_literal_round": stopper.literal_round,
        "client_acc": jsonable(last_eval.get("client_acc", [])),
        "wall_time_s": time.perf_counter() - wall0,
        "hardware": {"backend": runner.backend, "chunk": runner.chunk, "autotune": runner.autotune},
        "environment": environment(),
    }
    (out_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=2))
    return summary
