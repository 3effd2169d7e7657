"""`simulate`: a Runner (engine/simulate.py) through the run loop (engine/loop.py) with the
hooks of a run directory: metric writers, stop rules, NaN guard, checkpoints, progress bar and
summaries. The engine knows no file format; this is where the run directory is assembled."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedjax_semi.algorithms.base import Algorithm
from fedjax_semi.config import StopConfig
from fedjax_semi.data.federated import FederatedData
from fedjax_semi.engine import distributed
from fedjax_semi.engine.loop import NaNGuard, Progress, Run, StopRules, train_and_evaluate
from fedjax_semi.engine.simulate import Runner
from fedjax_semi.results.rundir import Checkpoints
from fedjax_semi.results.writers import Summaries, make_writers


def simulate(
    alg: Algorithm,
    fed: FederatedData,
    *,
    rounds: int,
    out_dir: Path,
    runner: Runner,
    eval_every: int = 1,
    eval_initial: bool = False,
    eval_every_time: float | None = None,
    checkpoint_every: int = 5,
    resume: bool = False,
    stop: StopConfig | None = None,
    progress: bool = True,
    title: str = "",
    writers: Sequence[str] = ("jsonl", "tensorboard"),
    dirs: Sequence[Path] | None = None,
) -> dict:
    """Run `rounds` rounds and write the run directory. Returns the summary.

    With replicas (`runner.seeds`) each seed gets the run directory it would have had on its
    own, out_dir/seed_<s> (metrics, summary.json, plot), and out_dir holds the one checkpoint of
    all of them and replicas.json (mean and std over the seeds), whose content is returned.
    `dirs` names the replicas' directories instead (the vectorized launcher's jobs).

    The hooks run in this order: the metric writers (the JSON-lines one reads back the rows a
    resumed run keeps), the stop rules (which replay them, and ask the method's own rule), the
    NaN guard, the method's hooks (`alg.loop_hooks()`), the checkpointer (after the stop rules
    and the method's hooks: a replica that stops, and what they changed, is checkpointed), the
    progress bar, and the summaries (last: they read the stop rules' bests and every reason).

    With several processes (hardware.distributed) every process runs the loop and the
    checkpointer (Orbax coordinates them); only process 0 writes metrics, summaries, plots and
    the progress bar."""
    out_dir = Path(out_dir)
    primary = distributed.is_primary()
    if dirs is None:
        dirs = [out_dir] if runner.seeds is None else [out_dir / f"seed_{s}" for s in runner.seeds]
    dirs = [Path(d) for d in dirs]
    for d in (out_dir, *dirs):
        d.mkdir(parents=True, exist_ok=True)
    stop_rules = StopRules(stop or StopConfig(), alg.stop_reason)
    checkpoints = Checkpoints(out_dir / "checkpoints", checkpoint_every)
    summaries = Summaries(
        out_dir, alg.name, title or alg.name, runner, stop_rules, primary, alg.mechanism_metrics
    )
    hooks = [
        *make_writers(writers, primary),
        stop_rules,
        NaNGuard(checkpoints.directory),
        *alg.loop_hooks(),
        checkpoints,
        Progress(alg.name, progress and primary),
        summaries,
    ]
    train_and_evaluate(
        runner,
        fed,
        Run(dirs, runner.seeds, rounds),
        hooks,
        # the newest intact checkpoint (a damaged newer one is skipped with a warning)
        restore=checkpoints.restore if resume else None,
        eval_every=eval_every,
        eval_initial=eval_initial,
        eval_every_time=eval_every_time,
    )
    return summaries.summary
