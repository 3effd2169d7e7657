"""The round loop: one compiled round per iteration, metrics, checkpoints, stop rules.

state = runner.init()               (warm-up included), or the newest intact checkpoint (resume)
for r in rounds:
    state, m = runner.round(state)  ONE jitted program (or the reference loop)
    NaN guard; evaluate every eval_every rounds
    metrics.jsonl += m; checkpoint every checkpoint_every rounds; early stopping
summary.json, plots/accuracy.png"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_semi.algorithms.base import Algorithm, FLState, seeded
from fedjax_semi.config import StopConfig
from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine.clients import LoopMapper, jit_forwarding_inputs, map_clients
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
        seeds: Sequence[int] | None = None,
        replica_chunk: int | str = "all",
    ) -> None:
        self.alg, self.fed, self.backend = alg, fed, backend
        self.seeds = tuple(int(s) for s in seeds) if seeds is not None else None
        self.replica_chunk = replica_chunk
        self.data = fed.train_view(oracle=alg.oracle)
        self._flags = getattr(alg, "round_flags", lambda rnd: ())
        self._update_for = getattr(alg, "client_update_for", lambda flags: alg.client_update)
        self._warmup_fn = getattr(alg, "warmup", None)
        self.chunk, self.autotune = chunk, None
        self._keep = jax.jit(keep_replicas)
        if backend == "jit":
            emap = functools.partial(map_clients, chunk=eval_chunk)
            self._place = client_sharding(devices) if devices > 1 else (lambda tree: tree)
            self._eval = jax.jit(self._replicated(lambda s, f: alg.evaluate(s, f, emap)))
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
            loop = LoopMapper()
            prepare, finish = jit_forwarding_inputs(alg.prepare), jit_forwarding_inputs(alg.finish)
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
            jax.jit(self._replicated(round_fn), static_argnums=2),
            warmup and jax.jit(self._replicated(lambda s, d: warmup(s, d, cmap))),
        )

    def _replicated(self, fn: Callable) -> Callable:
        """fn(state, *args) for one run -> the same over a leading replica axis of states, run r
        drawing its randomness from seed r (`algorithms.base.seeded`). The replicas share the
        data and the static arguments, and are mapped like clients (`map_clients`):
        replica_chunk="all" is one vmap (GPU), 1 a loop inside the program (CPU)."""
        if self.seeds is None:
            return fn
        alg, keys = self.alg, jnp.stack([jax.random.PRNGKey(s) for s in self.seeds])

        def replicated(states, *args):
            def one(key_state):
                key, state = key_state
                with seeded(alg, key=key):
                    return fn(state, *args)

            return map_clients(one, (keys, states), chunk=self.replica_chunk)

        return replicated

    def _compile(self, chunk: int | str) -> None:
        self.chunk = chunk
        self._round, self._warmup = self._programs(chunk)

    def _tune(self, state: FLState) -> None:
        """hardware.chunk=auto: time one round from `state` at each candidate chunk size (the
        result is thrown away; rounds are pure) and keep the fastest. A candidate that runs
        out of device memory is skipped. The timings are kept in `self.autotune`."""
        one = state if self.seeds is None else jax.tree.map(lambda a: a[0], state)
        _, inputs, _ = jax.eval_shape(self.alg.prepare, one, self.data)
        cohort = jax.tree.leaves(inputs)[0].shape[0]
        flags = self._flags(rounds_done(state) + 1)
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

    def template(self) -> FLState:
        """The algorithm's initial state before any warm-up (stacked over the replicas' seeds
        when there are replicas): the structure a checkpoint restores into."""
        if self.seeds is None:
            return self.alg.init(self.fed)
        states = []
        for s in self.seeds:
            with seeded(self.alg, seed=s):
                states.append(self.alg.init(self.fed))
        return jax.tree.map(lambda *a: jnp.stack(a), *states)

    def init(self) -> FLState:
        """The initial state, after the algorithm's warm-up when it has one (with
        hardware.chunk=auto the chunk size is chosen first, on the state before warm-up)."""
        state = self.template()
        if self.chunk == "auto":
            self._tune(state)
        return self._warmup(state, self.data) if self._warmup else state

    def round(self, state: FLState) -> tuple[FLState, dict]:
        if self.chunk == "auto":  # resumed from a checkpoint: init() was not called
            self._tune(state)
        return self._round(state, self.data, self._flags(rounds_done(state) + 1))

    def evaluate(self, state: FLState) -> dict:
        return self._eval(state, self.fed)

    def keep(self, new: FLState, old: FLState, active: Sequence[bool]) -> FLState:
        """Replica r's new state where active[r], its old one where it has stopped."""
        return self._keep(new, old, jnp.asarray(active))


def rounds_done(state: FLState) -> int:
    """Rounds completed (the most over the replicas: a stopped replica's state stays behind)."""
    return int(np.max(np.asarray(state.round)))


def keep_replicas(new: FLState, old: FLState, active: jax.Array) -> FLState:
    """Per leaf, new[r] where active[r] (bool [R]), else old[r]."""

    def pick(n, o):
        return jnp.where(active.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)

    return jax.tree.map(pick, new, old)


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


# Labels an algorithm reports for its unlabeled rows (beside pl_index) -> the metric they are
# scored into. pl_label: the pseudo-labels trained on; pl_self_label: the client's own model's
# prediction; pl_helper_label [S, M, N]: every helper's, scored as "some helper was right".
PSEUDO_LABEL_SCORES = {
    "pl_label": "pl_acc",
    "pl_self_label": "pl_self_acc",
    "pl_helper_label": "pl_any_helper_acc",
}


def pseudo_label_accuracy(index, label, eval_y) -> float | None:
    """Share of pseudo-labels that equal the hidden true labels (a diagnostic only: it runs on
    the host after the round, and training never sees eval_y). index [S, N]; label [S, N], or
    [S, M, N] where a row is right when any of its M labels is; label -1 marks padding."""
    label = np.asarray(label)
    truth = np.asarray(eval_y)[np.asarray(index)]
    if label.ndim == truth.ndim + 1:
        hit, valid = (label == truth[:, None]).any(1), (label >= 0).any(1)
    else:
        hit, valid = label == truth, label >= 0
    if not valid.any():
        return None
    return float(np.mean(hit[valid]))


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
    """Run `rounds` rounds and write the run directory. Returns the summary.

    With replicas (`runner.seeds`), the state and the metrics carry a leading replica axis and
    one compiled round advances every seed. Each seed gets the run directory it would have had
    on its own, as out_dir/seed_<s> (metrics.jsonl, summary.json, plot), stops on its own rule
    (its state is then kept as it was while the others go on), and out_dir holds the one
    checkpoint of all of them and replicas.json (mean and std over the seeds)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or StopConfig()
    seeds = runner.seeds
    dirs = [out_dir] if seeds is None else [out_dir / f"seed_{s}" for s in seeds]
    n = len(dirs)
    pick = (lambda tree, r: tree) if seeds is None else _replica
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    logs = [MetricsLog(d / "metrics.jsonl") for d in dirs]
    ckpt = Checkpointer(out_dir / "checkpoints")
    # The newest intact checkpoint (a damaged newer one is skipped with a warning).
    restored = ckpt.restore_latest(runner.template()) if resume else None
    start, rows = 0, [[] for _ in dirs]
    if restored is not None:
        start, state = restored
        rows = [log.truncate(start) for log in logs]  # rounds after it are redone
    else:
        state = runner.init()
        for log in logs:
            if log.path.exists():
                log.path.unlink()  # a fresh run starts a fresh log
        ckpt.clear()  # and drops the old run's checkpoints: a later resume must not find them
    stoppers = [EarlyStopper(stop) for _ in dirs]
    reasons: list[str | None] = [None] * n
    for r in range(n):
        for row in rows[r]:
            reasons[r] = reasons[r] or stoppers[r].update(
                row["round"], row.get(stop.metric), row.get("sim_time")
            )

    if eval_initial and start == 0:
        # Round 0: the state before any round (after warm-up), e.g. the start of a TTAP curve.
        ev = jax.device_get(runner.evaluate(state))
        for r in range(n):
            row = {"round": 0, "sim_time": float(pick(state.sim_time, r))}
            row.update(_scalars(pick(ev, r)))
            row = jsonable(row)
            logs[r].append(row)
            rows[r].append(row)

    from tqdm.auto import tqdm

    bar = tqdm(total=rounds, initial=start, desc=f"{alg.name}", unit="round", disable=not progress)
    wall0 = time.perf_counter()
    last_eval: list[dict] = [{} for _ in dirs]
    try:
        for rnd in range(start + 1, rounds + 1):
            active = [reason is None for reason in reasons]
            if not any(active):
                break
            t0 = time.perf_counter()
            new_state, m = runner.round(state)
            m = jax.device_get(m)
            bad = ~np.asarray(m["client_finite"]).reshape(n, -1) & np.asarray(active)[:, None]
            if bad.any():
                ckpt.save(rnd - 1, state)  # the last good state, to resume from or inspect
                cohort = np.asarray(m["cohort"]).reshape(n, -1)
                where = [
                    ("" if seeds is None else f"seed {seeds[r]}: ")
                    + f"clients {cohort[r][bad[r]].tolist()}"
                    for r in range(n)
                    if bad[r].any()
                ]
                reason = f"non-finite loss or model in round {rnd}, " + "; ".join(where)
                reasons = [reason if a else x for a, x in zip(active, reasons, strict=True)]
                raise NaNError(
                    f"{reason}; the state after round {rnd - 1} is checkpointed in {ckpt.directory}"
                )
            state = new_state if all(active) else runner.keep(new_state, state, active)
            evaluated = rnd % eval_every == 0 or rnd == rounds
            ev = jax.device_get(runner.evaluate(state)) if evaluated else None
            wall = time.perf_counter() - t0
            for r in (r for r in range(n) if active[r]):
                mr = pick(m, r)
                row = {"round": rnd}
                row.update(_scalars({k: v for k, v in mr.items() if k != "client_finite"}))
                row["cohort"] = np.asarray(mr["cohort"]).tolist()  # for per-client diagnostics
                for name, score in PSEUDO_LABEL_SCORES.items():
                    if name in mr:
                        row[score] = pseudo_label_accuracy(mr["pl_index"], mr[name], fed.eval_y)
                row["sim_time"] = float(pick(state.sim_time, r))
                if evaluated:
                    last_eval[r] = pick(ev, r)
                    row.update(_scalars(last_eval[r]))
                    acc = np.asarray(last_eval[r]["client_acc"])
                    row["client_acc_p10"], row["client_acc_p90"] = np.percentile(acc, [10, 90])
                row["wall_time"] = wall
                row = jsonable(row)
                logs[r].append(row)
                rows[r].append(row)
                reasons[r] = stoppers[r].update(rnd, row.get(stop.metric), row.get("sim_time"))
            stopped = any(a and x for a, x in zip(active, reasons, strict=True))
            if rnd % checkpoint_every == 0 or rnd == rounds or stopped:
                ckpt.save(rnd, state)
            shown = {}
            for k in ("accuracy", "train_loss"):
                vals = [rs[-1].get(k) for rs in rows if rs and rs[-1]["round"] == rnd]
                vals = [v for v in vals if v is not None]
                if vals:
                    shown[k] = f"{np.mean(vals):.4f}"
            bar.set_postfix(shown)
            bar.update(1)
    except KeyboardInterrupt:
        ckpt.save(rounds_done(state), state)
        reasons = [x or f"interrupted after round {rounds_done(state)}" for x in reasons]
        raise
    finally:
        bar.close()
        summaries = []
        for r in range(n):
            reason = reasons[r] or "rounds completed"
            summaries.append(
                _write_summary(
                    dirs[r], alg, rows[r], last_eval[r], stoppers[r], reason, wall0, runner
                )
            )
            if rows[r]:
                seed_title = "" if seeds is None else f", seed {seeds[r]}"
                plot_curves(
                    rows[r], dirs[r] / "plots" / "accuracy.png", (title or alg.name) + seed_title
                )
        if seeds is not None:
            summary = _write_replicas(out_dir, seeds, summaries, wall0)
            plot_curves(
                _mean_rows(rows),
                out_dir / "plots" / "accuracy.png",
                f"{title or alg.name} (mean of {n} seeds)",
            )
        ckpt.close()
    return summaries[0] if seeds is None else summary


def _replica(tree, r: int):
    """Replica r of every leaf (host arrays, after device_get)."""
    return jax.tree.map(lambda a: np.asarray(a)[r], tree)


def _mean_rows(rows: list[list[dict]]) -> list[dict]:
    """The mean curve over the seeds, at the rounds every seed reached."""
    by_round: dict[int, list[dict]] = {}
    for rs in rows:
        for row in rs:
            by_round.setdefault(row["round"], []).append(row)
    mean_rows = []
    for rnd, group in sorted(by_round.items()):
        if len(group) < len(rows):
            continue
        row = {"round": rnd}
        for k in ("accuracy", "global_acc", "personal_acc", "train_loss"):
            vals = [g.get(k) for g in group]
            if all(v is not None for v in vals):
                row[k] = float(np.mean(vals))
        mean_rows.append(row)
    return mean_rows


def _write_replicas(out_dir: Path, seeds, summaries, wall0) -> dict:
    """replicas.json: per seed its summary's headline, and mean and std over the seeds of every
    final scalar metric."""
    finals = [s["final"] for s in summaries]
    keys = sorted({k for f in finals for k, v in f.items() if isinstance(v, int | float)})
    final, final_std = {}, {}
    for k in keys:
        vals = [f[k] for f in finals if f.get(k) is not None]
        if len(vals) == len(finals):
            final[k], final_std[k] = float(np.mean(vals)), float(np.std(vals))
    summary = {
        "algorithm": summaries[0]["algorithm"],
        "seeds": list(seeds),
        "rounds_completed": max(s["rounds_completed"] for s in summaries),
        "stop_reason": "; ".join(
            f"seed {s}: {x['stop_reason']}" for s, x in zip(seeds, summaries, strict=True)
        ),
        "final": final,
        "final_std": final_std,
        "per_seed": [
            {"seed": s, "rounds_completed": x["rounds_completed"], "final": x["final"]}
            for s, x in zip(seeds, summaries, strict=True)
        ],
        "wall_time_s": time.perf_counter() - wall0,
        "hardware": summaries[0]["hardware"],
        "environment": summaries[0]["environment"],
    }
    (out_dir / "replicas.json").write_text(json.dumps(jsonable(summary), indent=2))
    return summary


def _write_summary(out_dir, alg, rows, last_eval, stopper, stop_reason, wall0, runner) -> dict:
    evals = [r for r in rows if r.get("accuracy") is not None]
    final = {k: v for k, v in evals[-1].items() if k != "cohort"} if evals else {}
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
        "hardware": {
            "backend": runner.backend,
            "chunk": runner.chunk,
            "autotune": runner.autotune,
            "replica_seeds": None if runner.seeds is None else list(runner.seeds),
        },
        "environment": environment(),
    }
    (out_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=2))
    return summary
