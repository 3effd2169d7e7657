"""The run loop, in the shape of flax's `train_and_evaluate`, and the hooks that do the rest.

    restore the newest intact checkpoint, or init (warm-up included)
    for each round: state, m = runner.round(state); evaluate when due; make the rows; call hooks

Everything else a run does is a `Hook`: the metric writers (results/writers.py: metrics.jsonl,
TensorBoard, MLflow), the NaN guard, the stop rules, the checkpointer, the progress bar and the
summaries. `engine.simulate.simulate` puts them together from the settings.

With replicas (`runner.seeds`) the state and the metrics carry a leading replica axis and one
compiled round advances every seed; each replica has its own run directory, rows, stop rule and
stop reason (index r in the lists of `Run`), and a stopped replica's state is held while the
others go on (`runner.keep`)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np
import numpy.typing as npt

from fedjax_semi.config import StopConfig

if TYPE_CHECKING:
    from fedjax_semi.data.federated import FederatedData
    from fedjax_semi.engine.state import State

Rows = dict[int, dict]  # replica index -> its new row (only the replicas that ran the round)


class Runner(Protocol):
    """What the loop asks of a runner (engine.simulate.Runner)."""

    seeds: tuple[int, ...] | None
    label_scores: dict[str, str]  # the method's labels to score on the host (round_row)

    def template(self) -> State: ...  # the structure a checkpoint restores into
    def init(self) -> State: ...  # the initial state, after any warm-up
    def round(self, state: State) -> tuple[State, dict]: ...
    def evaluate(self, state: State) -> dict: ...
    def keep(self, new: State, old: State, active: Sequence[bool]) -> State: ...


class NaNError(RuntimeError):
    """A client produced a non-finite loss or model; the last good state is checkpointed."""


@dataclass
class Run:
    """What the loop and its hooks share. Per-replica lists have one entry without replicas."""

    dirs: list[Path]  # each replica's run directory (seed_<s>/, or the run's own)
    seeds: tuple[int, ...] | None  # the replicas' seeds, None for a single run
    rounds: int  # the last round to train
    state: Any = None  # State, with a leading replica axis when there are replicas
    start: int = 0  # rounds done before this call (those of the restored checkpoint)
    resumed: bool = False  # whether the state came from a checkpoint
    rows: list[list[dict]] = field(default_factory=list)  # each replica's rows so far
    reasons: list[str | None] = field(default_factory=list)  # why it stopped; None: running
    last_eval: list[dict] = field(default_factory=list)  # each replica's latest evaluation
    eval_keys: set[str] = field(default_factory=set)  # row keys that come from an evaluation
    t0: float = field(default_factory=time.perf_counter)  # when the first round started
    # Host seconds a user waits for, by phase (summary.json "timings"): startup_s (process start
    # to the first round: imports, data, compile of the warm-up), first_round_s (its compile
    # included), eval_s (each evaluation's seconds; the first compiles).
    timings: dict = field(default_factory=dict)
    # Each replica's participation counts [num_clients] over the cohorts of its first
    # `taken_rows` rows (`participation` adds the rows it has not seen, so a resume recounts
    # the rows the JSON-lines writer restored).
    taken: list = field(default_factory=list)
    taken_rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.dirs)
        self.rows = self.rows or [[] for _ in range(n)]
        self.reasons = self.reasons or [None] * n
        self.last_eval = self.last_eval or [{} for _ in range(n)]
        self.taken = self.taken or [None] * n
        self.taken_rows = self.taken_rows or [0] * n

    @property
    def active(self) -> list[bool]:
        return [reason is None for reason in self.reasons]

    def label(self, r: int) -> str:
        """'' for a single run, 'seed <s>: ' for replica r (prefixes messages), or its
        directory's name where several replicas share a seed (a vectorized sweep's jobs)."""
        if self.seeds is None:
            return ""
        if self.seeds.count(self.seeds[r]) > 1:
            return f"{self.dirs[r].name}: "
        return f"seed {self.seeds[r]}: "


class Hook:
    """Something the loop calls at fixed points, in the order of the hooks list; every method is
    optional (these do nothing).

    start(run)              once, after restore-or-init (run.state, run.start, run.resumed set)
    check(run, rnd, m)      round rnd's metrics (host arrays) before its state is kept: raise to
                            end the run with run.state still the state before the round
    write(run, rnd, rows)   every new row, the evaluation before round 1 (rnd=0) included
    round(run, rnd, rows)   after each trained round, once write has seen its rows
    end(run, error)         always, last; error is what ended the loop early (None: it did not)
    """

    def start(self, run: Run) -> None:
        pass

    def check(self, run: Run, rnd: int, metrics: dict) -> None:
        pass

    def write(self, run: Run, rnd: int, rows: Rows) -> None:
        pass

    def round(self, run: Run, rnd: int, rows: Rows) -> None:
        pass

    def end(self, run: Run, error: BaseException | None) -> None:
        pass


def train_and_evaluate(
    runner: Runner,
    fed: FederatedData,
    run: Run,
    hooks: Sequence[Hook],
    *,
    restore: Callable[[State], tuple[int, State] | None] | None = None,
    eval_every: int = 1,
    eval_initial: bool = False,
    eval_every_time: float | None = None,
) -> Run:
    """Train rounds run.start+1 .. run.rounds (fewer once every replica has stopped), evaluating
    every `eval_every` rounds, or with `eval_every_time` each time an active replica's simulated
    clock passes a multiple of that many seconds, and after the last round; `restore(template)`
    gives (round, state) of the checkpoint to resume from, or None to start afresh."""
    restored = restore(runner.template()) if restore else None
    run.resumed = restored is not None
    run.start, run.state = restored if restored is not None else (0, runner.init())
    for h in hooks:
        h.start(run)
    error = None
    try:
        if eval_initial and run.start == 0:  # round 0: the state before any round (after warm-up)
            ev = jax.device_get(runner.evaluate(run.state))
            _record(run, hooks, 0, {r: initial_row(run, ev, r) for r in range(len(run.dirs))})
        run.t0 = time.perf_counter()
        run.timings.update(startup_s=process_age_s(), eval_s=[])
        for rnd in range(run.start + 1, run.rounds + 1):
            active = run.active
            if not any(active):
                break
            t0 = time.perf_counter()
            new_state, m = runner.round(run.state)
            m = jax.device_get(m)
            for h in hooks:
                h.check(run, rnd, m)
            active = run.active  # less a replica the NaN guard stopped: it keeps its old state
            due = rnd == run.rounds or (
                rnd % eval_every == 0
                if eval_every_time is None
                else clock_passed(run.state.sim_time, new_state.sim_time, eval_every_time, active)
            )
            run.state = new_state if all(active) else runner.keep(new_state, run.state, active)
            t_eval = time.perf_counter()
            ev = jax.device_get(runner.evaluate(run.state)) if due else None
            wall = time.perf_counter() - t0
            if due:
                run.timings["eval_s"].append(wall - (t_eval - t0))
            if rnd == run.start + 1:
                run.timings["first_round_s"] = t_eval - t0
            scores = runner.label_scores
            rows = {r: round_row(run, fed, rnd, m, ev, wall, r, scores) for r in _where(active)}
            _record(run, hooks, rnd, rows)
            for h in hooks:
                h.round(run, rnd, rows)
    except BaseException as e:
        error = e
        if isinstance(e, KeyboardInterrupt):
            done = rounds_done(run.state)
            run.reasons = [x or f"interrupted after round {done}" for x in run.reasons]
        raise
    finally:
        for h in hooks:
            h.end(run, error)
    return run


def clock_passed(
    before: npt.ArrayLike, after: npt.ArrayLike, every: float, active: Sequence[bool]
) -> bool:
    """Whether an active replica's clock passed a multiple of `every` seconds in a round:
    `before`, `after` are the clocks around it, [] or [R] (replicas). Stateless, so a resumed
    run evaluates at the same rounds."""
    # float64, as the rows' clocks are written (float of the float32 clock)
    lo = np.floor(np.asarray(before, np.float64) / every)
    hi = np.floor(np.asarray(after, np.float64) / every)
    return bool(np.any(np.atleast_1d(hi > lo)[np.asarray(active, bool)]))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:  # field 22: start time, clock ticks after boot
            start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - start
    except (OSError, ValueError, IndexError):
        return None


def _where(flags: Sequence[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


def _record(run: Run, hooks: Sequence[Hook], rnd: int, rows: Rows) -> None:
    """Add the rows to run.rows and hand them to the hooks' `write` (the metric writers)."""
    for r, row in rows.items():
        run.rows[r].append(row)
    for h in hooks:
        h.write(run, rnd, rows)


def rounds_done(state: State) -> int:
    """Rounds completed (the most over the replicas: a stopped replica's state stays behind)."""
    return int(np.max(np.asarray(state.round)))


# ---------------------------------------------------------------------------------- rows


def jsonable(v: Any) -> Any:
    """numpy/jax scalars and arrays -> JSON values (NaN -> null)."""
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    a = np.asarray(v)
    if a.ndim > 0:
        return [jsonable(x) for x in a.tolist()]
    x = a.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _pick(run: Run, tree, r: int):
    """Replica r of every leaf (host arrays); the tree itself for a single run."""
    return tree if run.seeds is None else jax.tree.map(lambda a: np.asarray(a)[r], tree)


def _scalars(m: dict) -> dict:
    return {k: v for k, v in m.items() if np.ndim(v) == 0}


def initial_row(run: Run, ev: dict, r: int) -> dict:
    """Replica r's row of round 0 (eval_initial): its clock and evaluation before any round."""
    row = {"round": 0, "sim_time": float(_pick(run, run.state.sim_time, r))}
    scores = _scalars(_pick(run, ev, r))
    run.eval_keys.update(scores)
    row.update(scores)
    return jsonable(row)


def round_row(
    run: Run,
    fed: FederatedData,
    rnd: int,
    m: dict,
    ev: dict | None,
    wall: float,
    r: int,
    label_scores: dict[str, str],
) -> dict:
    """Replica r's row of round rnd: the round's scalar metrics, its cohort and participation so
    far, the accuracies of the labels the method reports (`label_scores`: label key -> score
    key, beside `pl_index`), the clock, the evaluation when there was one (`ev`), and the host
    time."""
    mr = _pick(run, m, r)
    row = {"round": rnd}
    row.update(_scalars({k: v for k, v in mr.items() if k != "client_finite"}))
    row["cohort"] = np.asarray(mr["cohort"]).tolist()  # for per-client diagnostics
    for name, score in label_scores.items():
        if name in mr:
            row[score] = pseudo_label_accuracy(mr["pl_index"], mr[name], fed.eval_y)
    row.update(participation(run, r, fed.num_clients, row["cohort"]))
    row["sim_time"] = float(_pick(run, run.state.sim_time, r))
    if ev is not None:
        run.last_eval[r] = _pick(run, ev, r)
        scores = _scalars(run.last_eval[r])
        acc = np.asarray(run.last_eval[r]["client_acc"])
        scores["client_acc_p10"], scores["client_acc_p90"] = np.percentile(acc, [10, 90])
        run.eval_keys.update(scores)
        row.update(scores)
    row["wall_time"] = wall
    return jsonable(row)


def _took_part(counts: np.ndarray, cohort) -> None:
    """Add one to each client of a round's cohort (once per round; ids outside the population,
    such as padding, are left out)."""
    ids = np.unique(np.asarray(cohort, dtype=np.int64))
    counts[ids[(ids >= 0) & (ids < counts.size)]] += 1


def participation(run: Run, r: int, num_clients: int, cohort: Sequence[int]) -> dict:
    """Replica r's participation so far, this round's `cohort` included: the mean and least
    number of rounds a client of the population took part in, and the share never selected.
    Counted from the cohorts of run.rows (restored on resume), each row once."""
    counts = run.taken[r]
    if counts is None or counts.size != num_clients:
        counts, run.taken_rows[r] = np.zeros(num_clients, np.int64), 0
    for row in run.rows[r][run.taken_rows[r] :]:
        if row.get("cohort") is not None:
            _took_part(counts, row["cohort"])
    run.taken[r], run.taken_rows[r] = counts, len(run.rows[r])
    now = counts.copy()
    _took_part(now, cohort)
    return {
        "participation_mean": float(now.mean()),
        "participation_min": int(now.min()),
        "never_selected": float(np.mean(now == 0)),
    }


def pseudo_label_accuracy(
    index: npt.ArrayLike, label: npt.ArrayLike, eval_y: npt.ArrayLike
) -> float | None:
    """Share of pseudo-labels that equal the hidden true labels (a diagnostic only: it runs on
    the host after the round, and training never sees eval_y). index [S, N]; label [S, N], or
    [S, M, N] where a row is right when any of its M labels is; label -1 marks padding."""
    label = np.asarray(label)
    truth = np.asarray(eval_y)[np.asarray(index)]
    if label.ndim == truth.ndim + 1:
        hit, valid = (label == truth[:, None]).any(1), (label >= 0).any(1)
    else:
        hit, valid = label == truth, label >= 0
    valid = valid & (truth >= 0)  # rows of unknown truth (a second dataset's pool) do not count
    if not valid.any():
        return None
    return float(np.mean(hit[valid]))


# --------------------------------------------------------------------------------- hooks


class NaNGuard(Hook):
    """Stops a replica whose client reports a non-finite loss or model (`client_finite`): its
    reason names the round and the clients, and it keeps the state before that round. The other
    replicas go on, as they would have run alone (a vectorized sweep's other grid points, a
    run's other seeds). When none is left running, the run ends with NaNError, and the
    checkpointer keeps the state before that round in `checkpoint_dir`."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.checkpoint_dir = checkpoint_dir

    def check(self, run: Run, rnd: int, metrics: dict) -> None:
        n, active = len(run.dirs), np.asarray(run.active)
        bad = ~np.asarray(metrics["client_finite"]).reshape(n, -1) & active[:, None]
        if not bad.any():
            return
        cohort = np.asarray(metrics["cohort"]).reshape(n, -1)
        stopped = [r for r in range(n) if bad[r].any()]
        for r in stopped:
            run.reasons[r] = (
                f"non-finite loss or model in round {rnd}, {run.label(r)}"
                f"clients {cohort[r][bad[r]].tolist()}"
            )
        where = "; ".join(run.reasons[r] for r in stopped)
        if any(run.active):
            print(f"fedjax-semi: error: {where}; the other replicas go on", file=sys.stderr)
            return
        raise NaNError(
            f"{where}; the state after round {rnd - 1} is checkpointed in {self.checkpoint_dir}"
        )


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


class StopRules(Hook):
    """One EarlyStopper per replica: sets run.reasons[r] when replica r's rule fires, or when
    the method's own rule (`method_rule(row)`, e.g. Ada-FedSemi's spent budget) gives a
    reason, which comes first. A resumed run replays the rows it kept (so it must come after
    the JSON-lines writer, which reads them back)."""

    def __init__(
        self, cfg: StopConfig, method_rule: Callable[[dict], str | None] | None = None
    ) -> None:
        self.cfg, self.method_rule = cfg, method_rule
        self.stoppers: list[EarlyStopper] = []

    def _update(self, r: int, row: dict) -> str | None:
        own = self.method_rule(row) if self.method_rule is not None else None
        rule = self.stoppers[r].update(row["round"], row.get(self.cfg.metric), row.get("sim_time"))
        return own or rule

    def start(self, run: Run) -> None:
        self.stoppers = [EarlyStopper(self.cfg) for _ in run.dirs]
        for r, rows in enumerate(run.rows):
            for row in rows:
                run.reasons[r] = run.reasons[r] or self._update(r, row)

    def round(self, run: Run, rnd: int, rows: Rows) -> None:
        for r, row in rows.items():
            run.reasons[r] = self._update(r, row)


class Progress(Hook):
    """A tqdm bar over the rounds, showing the mean accuracy and training loss of the round's
    rows."""

    def __init__(self, desc: str, enabled: bool = True) -> None:
        self.desc, self.enabled, self.bar = desc, enabled, None

    def start(self, run: Run) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=run.rounds,
            initial=run.start,
            desc=self.desc,
            unit="round",
            disable=not self.enabled,
        )

    def round(self, run: Run, rnd: int, rows: Rows) -> None:
        shown = {}
        for k in ("accuracy", "train_loss"):
            vals = [row[k] for row in rows.values() if row.get(k) is not None]
            if vals:
                shown[k] = f"{np.mean(vals):.4f}"
        self.bar.set_postfix(shown)
        self.bar.update(1)

    def end(self, run: Run, error: BaseException | None) -> None:
        self.bar.close()
