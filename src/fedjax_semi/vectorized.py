"""A sweep as one program: the jobs of a Hydra multirun that differ only in their seed and in
traced config keys (`AlgorithmConfig.traceable`: learning rates, thresholds, ...) run as one
compiled program with a leading run axis, the replica axis of `replicas` generalized: run r
draws from its own seed's key and reads its own values (`Method.with_hyperparameters`).

`hydra/launcher=vectorized` (hydra_plugins/fedjax_semi_vectorized) composes every job as Hydra's
basic launcher does, groups them here (`make_groups`) and runs each group (`run_group`). Each
job's directory is the one it would have had alone: .hydra/, run_config.json, metrics.jsonl,
TensorBoard events, summary.json and plots. The group's one checkpoint (of every job's state)
and its group.json live in <sweep dir>/groups/<id>/; the same sweep with resume=true resumes
each group from there.

Jobs share one program only where they share the data: the data seed (`data_seed`, else
`seed`) is part of a group's key, so a seed sweep forms one group with `data_seed` pinned (as
`replicas` pins it), one group per seed otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from fedjax_semi.config import Config
from fedjax_semi.errors import ConfigError, bad


@dataclasses.dataclass
class Job:
    """One job of a multirun, composed and checked: its config and its own run directory."""

    num: int  # Hydra's job number
    cfg: Config
    out_dir: Path
    overrides: list[str]
    applied: dict = dataclasses.field(default_factory=dict)  # tuned values it uses


@dataclasses.dataclass
class Group:
    """Jobs run as one program: `traced` maps each key that differs between them to its value
    per job, in job order."""

    jobs: list[Job]
    traced: dict[str, list[float]]

    @property
    def id(self) -> str:
        """Stable across a resume: the jobs' directories."""
        dirs = "\n".join(str(j.out_dir.resolve()) for j in self.jobs)
        digest = hashlib.sha1(dirs.encode()).hexdigest()[:8]
        return f"{self.jobs[0].num}-{self.jobs[-1].num}-{digest}"


def check_job(cfg: Config) -> None:
    """What a vectorized job cannot be, in one line each."""
    if cfg.replicas > 1:
        raise bad(
            "replicas",
            cfg.replicas,
            "1 with hydra/launcher=vectorized: sweep the seeds instead (seed=0,1,2), each job "
            "becomes one run of the program",
        )
    if cfg.hardware.backend != "jit":
        raise bad("hardware.backend", cfg.hardware.backend, "'jit' with hydra/launcher=vectorized")
    if cfg.hardware.distributed:
        raise bad("hardware.distributed", True, "false with hydra/launcher=vectorized")
    if cfg.hardware.chunk == "auto":
        raise bad("hardware.chunk", "auto", "a size or 'all' with hydra/launcher=vectorized")


def group_key(cfg: Config) -> str:
    """Every setting but the seed and the traced keys, with the data seed made explicit: jobs
    with equal keys can share one program (the same shapes, data and static switches)."""
    from fedjax_semi.run_config import config_json, data_seed, flat_keys

    flat = flat_keys(config_json(cfg))
    flat["data_seed"] = data_seed(cfg)
    traced = [f"algorithm.{t}" for t in cfg.algorithm.traceable]
    for k in ("seed", "out_dir", *traced):
        if k in traced and flat.get(k) is None:  # null (a nullable knob's "off") is a setting
            continue
        flat.pop(k, None)
    return json.dumps(flat, sort_keys=True)


def make_groups(jobs: Sequence[Job], max_group: int | None = None) -> list[Group]:
    """The jobs grouped by `group_key`, in order of first appearance, each group split into
    parts of at most `max_group` jobs; a traced key is one whose values differ in a group."""
    if max_group is not None and max_group < 1:
        raise bad("hydra.launcher.max_group", max_group, "an integer >= 1, or null")
    by_key: dict[str, list[Job]] = {}
    for job in jobs:
        by_key.setdefault(group_key(job.cfg), []).append(job)
    groups = []
    for members in by_key.values():
        size = max_group or len(members)
        for i in range(0, len(members), size):
            part = members[i : i + size]
            traced = {}
            for k in part[0].cfg.algorithm.traceable:
                values = [getattr(j.cfg.algorithm, k) for j in part]
                if len(set(values)) > 1:  # never null here: null is in the group's key
                    traced[k] = [float(v) for v in values]
            groups.append(Group(part, traced))
    return groups


def split_finished(jobs: Sequence[Job]) -> tuple[list[tuple[Job, dict]], list[Job]]:
    """With resume=true: the jobs whose run is complete (each with its summary) and the jobs
    still to train. Only the latter are grouped, so a grid point added to a finished sweep
    trains alone instead of retraining its finished neighbours in one program."""
    from fedjax_semi.tuned import finished_summary

    finished, pending = [], []
    for job in jobs:
        summary = finished_summary(job.cfg, job.out_dir)
        if summary is None:
            pending.append(job)
        else:
            finished.append((job, summary))
    return finished, pending


def run_group(group: Group, sweep_dir: Path) -> list[dict]:
    """Train the group's jobs as one program and write each job's run directory. Returns each
    job's summary (its summary.json)."""
    from fedjax_semi import experiment
    from fedjax_semi.engine.loop import NaNError

    first = group.jobs[0].cfg
    finished, pending = split_finished(group.jobs)
    if not pending:  # resume=true on a finished group: its results
        return [summary for _, summary in finished]
    exp = experiment.build(first)
    out = Path(sweep_dir) / "groups" / group.id
    out.mkdir(parents=True, exist_ok=True)
    for job in group.jobs:
        experiment.check_resume(job.cfg, job.out_dir)
    for job in group.jobs:
        job.out_dir.mkdir(parents=True, exist_ok=True)
        experiment.write_run_files(exp, job.cfg, job.out_dir)
    (out / "group.json").write_text(
        json.dumps(
            {
                "jobs": [
                    {"num": j.num, "dir": str(j.out_dir), "overrides": j.overrides}
                    for j in group.jobs
                ],
                "traced": group.traced,
            },
            indent=1,
        )
    )
    runner = exp.runner(seeds=[j.cfg.seed for j in group.jobs], hparams=group.traced)
    try:
        experiment.train(exp, out, runner, dirs=[j.out_dir for j in group.jobs])
    except NaNError:  # every job diverged: each summary.json says so, and the sweep goes on
        pass
    except Exception as e:  # noqa: BLE001 (XLA reports running out of memory as a runtime error)
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise ConfigError(
            f"hydra.launcher.max_group: a group of {len(group.jobs)} jobs ran out of device "
            f"memory; set hydra.launcher.max_group={max(1, len(group.jobs) // 2)} (or "
            "hardware.replica_chunk=1, one job at a time inside the program)"
        ) from None
    summaries = []
    for r, job in enumerate(group.jobs):
        path = job.out_dir / "summary.json"
        summary = json.loads(path.read_text())
        summary["vectorized"] = {
            "group": str(out),
            "jobs": len(group.jobs),
            "traced": {k: v[r] for k, v in group.traced.items()},
        }
        path.write_text(json.dumps(summary, indent=2))
        summaries.append(summary)
    return summaries
