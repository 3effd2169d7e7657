"""What a run writes as it goes, as hooks of the run loop (engine/loop.py `Hook`).

Metric writers, chosen by the config's `writers` list (`make_writers`), each in every replica's
run directory:
  jsonl        metrics.jsonl: one JSON object per row (what resume and fedjax-semi-report read)
  tensorboard  tensorboard/: every scalar of a row as a TensorBoard scalar at step=round
  mlflow       mlruns/: the same scalars as MLflow metrics in a local store (needs mlflow)
and `Summaries`, at the end: summary.json and plots/accuracy.png per replica, replicas.json and
the mean curve with replicas."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedjax_semi import compile_cache
from fedjax_semi.engine import distributed
from fedjax_semi.engine.loop import Hook, Rows, Run, StopRules
from fedjax_semi.results.rundir import MetricsLog, environment, jsonable, plot_curves

if TYPE_CHECKING:  # for the annotation only: the hooks take any runner (engine/loop.py)
    from fedjax_semi.engine.simulate import Runner


class JsonLines(Hook):
    """metrics.jsonl. A resumed run keeps the rows up to its checkpoint (they become run.rows;
    the rounds after it are redone); a fresh run starts a fresh file.

    With several processes (hardware.distributed) only process 0 (`primary`) writes; every
    process reads the kept rows back on resume (its stop rules replay them), before process 0
    rewrites the file."""

    def __init__(self, primary: bool = True) -> None:
        self.primary = primary

    def start(self, run: Run) -> None:
        self.logs = [MetricsLog(d / "metrics.jsonl") for d in run.dirs]
        if run.resumed:
            for r, log in enumerate(self.logs):
                run.rows[r] = [row for row in log.read() if row["round"] <= run.start]
        distributed.barrier("fedjax_semi: metrics.jsonl read")
        if not self.primary:
            return
        for log in self.logs:
            if run.resumed:
                log.truncate(run.start)
            elif log.path.exists():
                log.path.unlink()

    def write(self, run: Run, rnd: int, rows: Rows) -> None:
        if not self.primary:
            return
        for r, row in rows.items():
            self.logs[r].append(row)


# Row keys shown in TensorBoard's and MLflow's "time" group; the evaluation's keys go to "eval",
# the round's own metrics (losses, pseudo-label rates and accuracies, costs) to "train".
TIME_KEYS = ("sim_time", "wall_time")


def scalar_tags(row: dict, eval_keys: set[str]) -> list[tuple[str, float]]:
    """(tag, value) of every number in a row but the round: `group/name`, e.g. train/loss,
    eval/accuracy, time/sim_time (a `group_` prefix of the key is dropped). Lists (the cohort)
    and missing values (null) are left out."""
    out = []
    for k, v in row.items():
        if k == "round" or not isinstance(v, int | float):
            continue
        group = "time" if k in TIME_KEYS else "eval" if k in eval_keys else "train"
        out.append((f"{group}/{k.removeprefix(group + '_')}", float(v)))
    return out


class TensorBoard(Hook):
    """Event files in <run dir>/tensorboard/ (tensorboardX): `scalar_tags` of every row at
    step=round. A fresh run replaces the folder; a resumed one appends, with the rounds after
    its checkpoint purged from view (they are redone)."""

    def start(self, run: Run) -> None:
        from tensorboardX import SummaryWriter

        self.writers = []
        for d in run.dirs:
            path = d / "tensorboard"
            if not run.resumed:
                shutil.rmtree(path, ignore_errors=True)
            purge = run.start + 1 if run.resumed else None
            # tensorboardX names a file by the second and the host only: a run resumed within
            # the second its directory's last writer started would truncate that file. A
            # nanosecond suffix keeps names apart and in the order TensorBoard reads them in.
            suffix = f".{time.time_ns():020d}"
            self.writers.append(
                SummaryWriter(str(path), purge_step=purge, flush_secs=10, filename_suffix=suffix)
            )

    def write(self, run: Run, rnd: int, rows: Rows) -> None:
        for r, row in rows.items():
            for tag, value in scalar_tags(row, run.eval_keys):
                self.writers[r].add_scalar(tag, value, rnd)

    def end(self, run: Run, error: BaseException | None) -> None:
        for w in self.writers:
            w.close()


class MLflow(Hook):
    """MLflow's local store in <run dir>/mlruns/, a SQLite file (mlflow.db; MLflow 3 refuses its
    older folder-per-run store by default): `scalar_tags` of every row at step=round, in
    experiment "fedjax-semi", one MLflow run per call named after the run directory. Open with
    `mlflow ui --backend-store-uri sqlite:///<run dir>/mlruns/mlflow.db`."""

    EXPERIMENT = "fedjax-semi"

    def start(self, run: Run) -> None:
        from mlflow.tracking import MlflowClient

        self.runs = []
        for d in run.dirs:
            store = d.absolute() / "mlruns"
            if not run.resumed:
                shutil.rmtree(store, ignore_errors=True)
            store.mkdir(parents=True, exist_ok=True)
            client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
            exp = client.get_experiment_by_name(self.EXPERIMENT)
            if exp is None:
                artifacts = (store / "artifacts").as_uri()
                exp_id = client.create_experiment(self.EXPERIMENT, artifact_location=artifacts)
            else:
                exp_id = exp.experiment_id
            name = d.name + (f" (resumed after round {run.start})" if run.resumed else "")
            self.runs.append((client, client.create_run(exp_id, run_name=name).info.run_id))

    def write(self, run: Run, rnd: int, rows: Rows) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for r, row in rows.items():
            client, run_id = self.runs[r]
            tags = scalar_tags(row, run.eval_keys)
            client.log_batch(run_id, metrics=[Metric(t, v, now, rnd) for t, v in tags])

    def end(self, run: Run, error: BaseException | None) -> None:
        status = "FINISHED" if error is None else "FAILED"
        if isinstance(error, KeyboardInterrupt):
            status = "KILLED"
        for client, run_id in self.runs:
            client.set_terminated(run_id, status)


WRITERS = {"jsonl": JsonLines, "tensorboard": TensorBoard, "mlflow": MLflow}


def make_writers(names: list[str] | tuple[str, ...], primary: bool = True) -> list[Hook]:
    """The metric writers of the config's `writers` list (checked by config.validate). In a
    process other than the primary one (hardware.distributed), only the JSON-lines reader of a
    resumed run's rows."""
    if not primary:
        return [JsonLines(primary=False)] if "jsonl" in names else []
    return [WRITERS[n]() for n in names]


def mechanism_block(rows: list[dict], names: Sequence[str]) -> dict:
    """The final value of each of a method's mechanism metrics (`mechanism_metrics`): its value
    in the last row that has one, None where no row has."""
    out: dict[str, Any] = {}
    for name in names:
        vals = [row[name] for row in rows if row.get(name) is not None]
        out[name] = vals[-1] if vals else None
    return out


class Summaries(Hook):
    """At the end: summary.json and plots/accuracy.png in each replica's directory and, with
    replicas, replicas.json (mean and std over the seeds) and the mean curve in `out_dir`.
    `summary` is then the run's summary (replicas.json's content with replicas). Without
    `primary` (a process other than 0 of hardware.distributed) it writes no file. `mechanism`:
    the method's mechanism metrics (`Capabilities.mechanism_metrics`), whose final values go to
    the summary's "mechanism" block."""

    def __init__(
        self,
        out_dir: Path,
        alg_name: str,
        title: str,
        runner: Runner,
        stop: StopRules,
        primary: bool = True,
        mechanism: Sequence[str] = (),
    ) -> None:
        self.out_dir, self.alg_name, self.title = Path(out_dir), alg_name, title
        self.runner, self.stop, self.primary = runner, stop, primary
        self.mechanism = tuple(mechanism)
        self.summary: dict = {}

    def end(self, run: Run, error: BaseException | None) -> None:
        summaries = []
        for r, d in enumerate(run.dirs):
            summaries.append(self._write_summary(d, run, r))
            if run.rows[r] and self.primary:
                seed = "" if run.seeds is None else f", seed {run.seeds[r]}"
                plot_curves(run.rows[r], d / "plots" / "accuracy.png", self.title + seed)
        if run.seeds is None:
            self.summary = summaries[0]
            return
        self.summary = self._write_replicas(run, summaries)
        if self.primary:
            plot_curves(
                mean_rows(run.rows),
                self.out_dir / "plots" / "accuracy.png",
                f"{self.title} (mean of {len(run.dirs)} seeds)",
            )

    def _write_summary(self, out_dir: Path, run: Run, r: int) -> dict:
        rows, stopper, runner = run.rows[r], self.stop.stoppers[r], self.runner
        evals = [row for row in rows if row.get("accuracy") is not None]
        final = {k: v for k, v in evals[-1].items() if k != "cohort"} if evals else {}
        summary = {
            "algorithm": self.alg_name,
            "rounds_completed": rows[-1]["round"] if rows else 0,
            "stop_reason": run.reasons[r] or "rounds completed",
            "final": final,
            "mechanism": mechanism_block(rows, self.mechanism),
            "best_accuracy": None if not np.isfinite(stopper.best) else stopper.best,
            "best_round": stopper.best_round,
            "fa_literal_round": stopper.literal_round,
            "client_acc": jsonable(run.last_eval[r].get("client_acc", [])),
            "wall_time_s": time.perf_counter() - run.t0,
            "timings": jsonable(run.timings),
            "hardware": {
                "backend": runner.backend,
                "chunk": runner.chunk,
                "autotune": runner.autotune,
                "replica_seeds": None if runner.seeds is None else list(runner.seeds),
                "compile_cache": compile_cache.current(),
            },
            "environment": environment(),
        }
        if self.primary:
            (out_dir / "summary.json").write_text(json.dumps(jsonable(summary), indent=2))
        return summary

    def _write_replicas(self, run: Run, summaries: list[dict]) -> dict:
        """replicas.json: per seed its summary's headline, and mean and std over the seeds of
        every final scalar metric."""
        seeds = run.seeds
        finals = [s["final"] for s in summaries]
        keys = sorted({k for f in finals for k, v in f.items() if isinstance(v, int | float)})
        final, final_std = {}, {}
        for k in keys:
            vals = [f[k] for f in finals if f.get(k) is not None]
            if len(vals) == len(finals):
                final[k], final_std[k] = float(np.mean(vals)), float(np.std(vals))
        mechanism = {}  # the mean over the seeds, where every seed has a value
        for k in self.mechanism:
            vals = [s["mechanism"][k] for s in summaries if s["mechanism"][k] is not None]
            mechanism[k] = float(np.mean(vals)) if len(vals) == len(summaries) else None
        summary: dict[str, Any] = {
            "algorithm": summaries[0]["algorithm"],
            "seeds": list(seeds),
            "rounds_completed": max(s["rounds_completed"] for s in summaries),
            "stop_reason": "; ".join(
                f"seed {s}: {x['stop_reason']}" for s, x in zip(seeds, summaries, strict=True)
            ),
            "final": final,
            "final_std": final_std,
            "mechanism": mechanism,
            "per_seed": [
                {"seed": s, "rounds_completed": x["rounds_completed"], "final": x["final"]}
                for s, x in zip(seeds, summaries, strict=True)
            ],
            "wall_time_s": time.perf_counter() - run.t0,
            "hardware": summaries[0]["hardware"],
            "environment": summaries[0]["environment"],
        }
        if self.primary:
            (self.out_dir / "replicas.json").write_text(json.dumps(jsonable(summary), indent=2))
        return summary


def mean_rows(rows: list[list[dict]]) -> list[dict]:
    """The mean curve over the seeds, at the rounds every seed reached."""
    by_round: dict[int, list[dict]] = {}
    for rs in rows:
        for row in rs:
            by_round.setdefault(row["round"], []).append(row)
    out = []
    for rnd, group in sorted(by_round.items()):
        if len(group) < len(rows):
            continue
        row = {"round": rnd}
        for k in ("accuracy", "global_acc", "personal_acc", "train_loss"):
            vals = [g.get(k) for g in group]
            if all(v is not None for v in vals):
                row[k] = float(np.mean(vals))
        out.append(row)
    return out
