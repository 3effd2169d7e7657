"""`hydra/launcher=vectorized`: composes every job of a multirun as Hydra's basic launcher does
(each job's directory, .hydra/ and log), checks them all before any work, then runs each group
of jobs that share shapes and data as one program (fedjax_semi.vectorized)."""

# No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
# where dataclasses cannot resolve string annotations.
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    run_job,
    setup_globals,
)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from hydra_plugins.fedjax_semi_vectorized.compose import JobComposer

log = logging.getLogger(__name__)


@dataclass
class VectorizedLauncherConf:
    _target_: str = "hydra_plugins.fedjax_semi_vectorized.vectorized_launcher.VectorizedLauncher"
    # At most this many jobs in one program (null: every job of a group); a group that does not
    # fit in device memory says which value to set.
    max_group: Any = None


ConfigStore.instance().store(
    group="hydra/launcher", name="vectorized", node=VectorizedLauncherConf, provider="fedjax_semi"
)


class VectorizedLauncher(Launcher):
    def __init__(self, max_group: Optional[int] = None) -> None:  # noqa: UP045
        super().__init__()
        self.max_group = max_group
        self.config: Optional[DictConfig] = None  # noqa: UP045
        self.hydra_context: Optional[HydraContext] = None  # noqa: UP045
        self.task_function: Optional[TaskFunction] = None  # noqa: UP045

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from fedjax_semi import vectorized
        from fedjax_semi.cli import prepare_job, report_job
        from fedjax_semi.errors import ConfigError
        from fedjax_semi.tuned import record_tuned

        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Composing {len(job_overrides)} jobs for one program per group")
        returns: list[JobReturn] = []
        # Jobs that differ from an earlier one only in values reuse its composition.
        composer = JobComposer(self.hydra_context.config_loader, self.config)
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_config = composer.compose(overrides)
            with open_dict(job_config):
                job_config.hydra.job.id = idx
                job_config.hydra.job.num = idx
            # The job's directory, .hydra/ and log as the basic launcher makes them; its "task"
            # composes and checks the run (no training yet).
            returns.append(
                run_job(
                    hydra_context=self.hydra_context,
                    task_function=lambda cfg, idx=idx: prepare_job(cfg, idx),
                    config=job_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            )
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        log.info(
            f"{composer.fast} of {len(job_overrides)} jobs composed from an earlier job's config "
            "(they differ from it only in values)"
        )
        for ret in returns:  # every job checked before any trains: one line for the first bad one
            if ret.status != JobStatus.COMPLETED:
                err = ret._return_value
                print(f"fedjax-semi: error: job {ret.overrides}: {err}", file=sys.stderr)
                sys.exit(2)
        jobs = [ret.return_value for ret in returns]
        try:
            finished, pending = vectorized.split_finished(jobs)
            groups = vectorized.make_groups(pending, self.max_group)
            log.info(
                (f"{len(finished)} jobs already finished (resume=true); " if finished else "")
                + f"{len(pending)} jobs in {len(groups)} program(s): "
                + "; ".join(f"{len(g.jobs)} jobs, traced {sorted(g.traced) or '-'}" for g in groups)
            )

            def report(job: vectorized.Job, summary: dict) -> None:
                if job.applied:  # summary.json says which tuned values the job used
                    record_tuned(job.out_dir, job.applied)
                ret = returns[job.num - initial_job_idx]
                ret.return_value = report_job(job.cfg, summary, job.out_dir, job.applied)

            for job, summary in finished:
                report(job, summary)
            for group in groups:
                for job, summary in zip(group.jobs, vectorized.run_group(group, sweep_dir),
                                        strict=True):  # fmt: skip
                    report(job, summary)
        except ConfigError as e:
            print(f"fedjax-semi: error: {e}", file=sys.stderr)
            sys.exit(2)
        return returns
