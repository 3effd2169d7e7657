"""Command-line entry points.

fedjax-semi [overrides]          one run (Hydra); `-m` for a multirun sweep
fedjax-semi-report DIR           mean +- std over seeds per setting, as Markdown and CSV, with
                                 sanity gates that flag broken rows (docs/gates.md)
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fedjax_semi.tuned import diverged

if TYPE_CHECKING:  # the entry points import Hydra, and jax through Config, only where needed
    from omegaconf import DictConfig

    from fedjax_semi.config import Config
    from fedjax_semi.vectorized import Job

CONF_DIR = Path(os.environ.get("FEDJAX_SEMI_CONF", Path(__file__).resolve().parents[2] / "conf"))


def _fail(msg: str, code: int = 2) -> None:
    print(f"fedjax-semi: error: {msg}", file=sys.stderr)
    sys.exit(code)


def _reject(msg: str, hc) -> None:
    """Refuse a run before it did any work: one error line, and no run directory left behind."""
    _remove_hydra_run_dir(hc)
    _fail(msg)


def _remove_hydra_run_dir(hc) -> None:
    """Hydra makes a single run's directory, writing .hydra/ and the job's log there, before the
    task starts (`hydra.core.utils.run_job`); a run refused removes them again, so it creates
    nothing. Only Hydra's own files go, and only from a directory that holds nothing else (a run
    resumed in a directory with results keeps everything); then each directory left empty, up to
    the working directory."""
    from hydra.types import RunMode

    if hc is None or hc.mode != RunMode.RUN:  # a multirun's directory is its sweep's
        return
    run_dir = Path(hc.runtime.output_dir).resolve()
    log = run_dir / f"{hc.job.name}.log"
    ours = {log}
    if hc.output_subdir is not None:
        ours |= {
            run_dir / hc.output_subdir / f for f in ("config.yaml", "hydra.yaml", "overrides.yaml")
        }
    if not run_dir.is_dir() or any(p not in ours for p in run_dir.rglob("*") if not p.is_dir()):
        return
    root = logging.getLogger()
    for h in list(root.handlers):  # the job log's handler holds the file open
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == log:
            root.removeHandler(h)
            h.close()
    for p in ours:
        p.unlink(missing_ok=True)
    for d in sorted((p for p in run_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        d.rmdir()  # deepest first: empty now
    run_dir.rmdir()
    cwd = Path(hc.runtime.cwd).resolve()
    for d in run_dir.parents:  # those Hydra made for it (outputs/<date>/), up to the cwd
        if d == cwd or cwd not in d.parents or any(d.iterdir()):
            break
        d.rmdir()


@contextlib.contextmanager
def _one_line_warnings(category: type[Warning]) -> Iterator[None]:
    """Show warnings of `category` as one `fedjax-semi: warning: ...` line (others as usual)."""
    default = warnings.showwarning

    def show(message, cat, filename, lineno, file=None, line=None) -> None:
        if issubclass(cat, category):
            print(f"fedjax-semi: warning: {message}", file=sys.stderr)
        else:
            default(message, cat, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = default


def _task(cfg) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fedjax_semi import compile_cache, experiment
    from fedjax_semi.config import SettingReplaced
    from fedjax_semi.data.registry import DatasetNotFoundError
    from fedjax_semi.engine.loop import NaNError
    from fedjax_semi.errors import ConfigError
    from fedjax_semi.results.rundir import CheckpointError, CheckpointWarning
    from fedjax_semi.store import as_config, check_algorithm_options
    from fedjax_semi.tuned import apply_tuned, finished_summary, given_keys, record_tuned

    hc = HydraConfig.get() if HydraConfig.initialized() else None
    done = None
    try:  # tuned values first: the checks below see the values the run will use
        if hc is not None:  # the registry and the algorithm options on the search path agree
            check_algorithm_options(hc.runtime.config_sources)
        given = given_keys(hc.overrides.task) if hc is not None else set()
        applied = apply_tuned(cfg, hc.runtime.choices if hc is not None else {}, given)
        c = as_config(cfg)
        compile_cache.enable(c.hardware.compile_cache)
        # A multirun job (a tuning trial) with resume=true whose run is complete: its stored
        # result, without loading data; a single run resumes as ever (checkpoints checked).
        if hc is not None and hc.mode == RunMode.MULTIRUN and not c.hardware.distributed:
            done = finished_summary(c, c.out_dir or hc.runtime.output_dir)
        with _one_line_warnings(SettingReplaced):
            exp = experiment.build(c) if done is None else None
    except (ConfigError, DatasetNotFoundError, ValueError) as e:
        _reject(str(e), hc)
    if applied and hc is not None and hc.output_subdir is not None:
        _save_config(cfg, Path(hc.runtime.output_dir) / hc.output_subdir / "config.yaml")
    out_dir = c.out_dir or HydraConfig.get().runtime.output_dir
    if c.hardware.distributed:  # one run directory: process 0's (Hydra's is named by the clock)
        from fedjax_semi.engine.distributed import agree

        out_dir = agree(str(out_dir))
    if done is not None:
        summary = done
        print(f"{c.algorithm.name}: complete in {out_dir}; resume=true returns its result")
    else:
        try:
            with _one_line_warnings(CheckpointWarning):
                summary = experiment.run(exp, out_dir)
        except (ConfigError, CheckpointError) as e:  # resume=true on changed settings or damage
            _reject(str(e), hc)
        except NaNError as e:
            if hc is not None and hc.mode == RunMode.MULTIRUN:  # the sweep goes on
                print(f"fedjax-semi: error: {e}", file=sys.stderr)
                return float("nan")
            _fail(str(e), code=3)
        finally:
            if applied:  # summary.json says which tuned values the run used
                record_tuned(out_dir, applied)
    value = report_job(c, summary, out_dir, applied)
    if diverged(summary) and (hc is None or hc.mode != RunMode.MULTIRUN):
        sys.exit(3)  # a seed of the replicas diverged (the others ran on): as a NaN run exits
    return value


def report_job(c: Config, summary: dict, out_dir: str | Path, applied: dict) -> float:
    """The run's one line of results, and the value it returns to a sweeper (`objective`):
    NaN for a run that diverged, which a sweeper records as a failed trial."""
    if diverged(summary):
        print(f"fedjax-semi: error: {summary['stop_reason']}; outputs in {out_dir}",
              file=sys.stderr)  # fmt: skip
        return float("nan")
    final = summary["final"]
    shown = {k: final[k] for k in ("accuracy", "global_acc", "personal_acc") if k in final}
    print(
        f"{c.algorithm.name}: {summary['rounds_completed']} rounds, "
        + ", ".join(f"{k}={v:.4f}" for k, v in shown.items() if v is not None)
        + (f" (mean of seeds {summary['seeds']})" if "seeds" in summary else "")
        + (f" (tuned: {applied})" if applied else "")
        + f" ({summary['stop_reason']}); outputs in {out_dir}"
    )
    value = (
        summary.get("best_accuracy") if c.objective == "best_accuracy" else final.get(c.objective)
    )
    if value is None:  # a sweeper records the trial as failed, the sweep goes on
        print(f"fedjax-semi: warning: objective={c.objective!r} was not measured in this run")
        return float("nan")
    return float(value)


def prepare_job(cfg: DictConfig, num: int) -> Job:
    """A job of hydra/launcher=vectorized, composed and checked as `_task` checks a run (the
    registry, tuned values, every config check) before any job trains: a `vectorized.Job`."""
    from hydra.core.hydra_config import HydraConfig

    from fedjax_semi import compile_cache, vectorized
    from fedjax_semi.config import validate
    from fedjax_semi.store import as_config, check_algorithm_options
    from fedjax_semi.tuned import apply_tuned, given_keys

    hc = HydraConfig.get()
    check_algorithm_options(hc.runtime.config_sources)
    applied = apply_tuned(cfg, hc.runtime.choices, given_keys(hc.overrides.task))
    c = as_config(cfg)
    validate(c)
    vectorized.check_job(c)
    if applied and hc.output_subdir is not None:
        _save_config(cfg, Path(hc.runtime.output_dir) / hc.output_subdir / "config.yaml")
    compile_cache.enable(c.hardware.compile_cache)
    out_dir = Path(c.out_dir or hc.runtime.output_dir)
    return vectorized.Job(num, c, out_dir, list(hc.overrides.task), applied)


def _save_config(cfg, path: Path) -> None:
    """Rewrites Hydra's saved .hydra/config.yaml with the values the run uses (tuned ones)."""
    from omegaconf import OmegaConf

    if path.exists():
        OmegaConf.save(cfg, path)


def main() -> None:
    import hydra

    from fedjax_semi.algorithms.registry import PluginError
    from fedjax_semi.store import register_configs

    if not (CONF_DIR / "config.yaml").exists():
        _fail(f"no Hydra configs at {CONF_DIR}; set FEDJAX_SEMI_CONF to the repo's conf/ folder")
    from fedjax_semi.config_groups import check_moved_override
    from fedjax_semi.errors import ConfigError

    try:  # a flat key of before the paper groups: where it moved, before Hydra makes a directory
        for arg in sys.argv[1:]:
            check_moved_override(arg)
    except ConfigError as e:
        _fail(str(e))
    try:  # reads the registry: the methods of other installed packages load here
        register_configs()
    except PluginError as e:
        _fail(str(e))
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_task)()


def report_main(argv: list[str] | None = None) -> None:
    import argparse

    from fedjax_semi.results.bins import (
        LABELED_RATIO_ALLOWED,
        PARTICIPATION_ALLOWED,
        export_clients,
        labeled_ratio_table,
        parse_edges,
        participation_table,
    )
    from fedjax_semi.results.curves import X_AXES, plot
    from fedjax_semi.results.gates import add_gate_flags, gates_from_args
    from fedjax_semi.results.paired import paired_table
    from fedjax_semi.results.report import export_rows, report
    from fedjax_semi.results.ttap import ttap

    ap = argparse.ArgumentParser(
        prog="fedjax-semi-report",
        description="Tables from a sweep: mean +- std over seeds per setting (Markdown + CSV).",
    )
    ap.add_argument("sweep_dir", type=Path, help="a multirun directory (or any folder of runs)")
    ap.add_argument(
        "--metrics",
        default="accuracy,global_acc,personal_acc",
        help="comma-separated final metrics to tabulate",
    )
    ap.add_argument("--csv", type=Path, default=None, help="CSV path (default: DIR/report.csv)")
    ap.add_argument(
        "--ttap",
        action="store_true",
        help="also write DIR/ttap.csv and DIR/ttap.png: accuracy against the simulated clock",
    )
    ap.add_argument(
        "--by-labeled-ratio",
        metavar="EDGES",
        default=None,
        help="also tabulate the mean personal accuracy of the clients in each labeled-ratio bin, "
        "e.g. 0,0.1,0.5,0.9,1 (semi-supervised partitions; DIR/report_by_labeled_ratio.md)",
    )
    ap.add_argument(
        "--by-participations",
        metavar="EDGES",
        default=None,
        help="also tabulate the mean personal accuracy of the clients by how many rounds they "
        "took part in, bins [a, b) and >= the last edge, e.g. 0,1,2,3,6 "
        "(DIR/report_by_participations.md)",
    )
    ap.add_argument(
        "--budget-time",
        metavar="S",
        type=float,
        default=None,
        help="tabulate each run's last evaluation at or before simulated time S (sim_time in "
        "metrics.jsonl) instead of its final one: an equal-budget cut",
    )
    ap.add_argument(
        "--budget-rounds",
        metavar="R",
        type=int,
        default=None,
        help="likewise, the last evaluation at or before round R",
    )
    ap.add_argument(
        "--last-k",
        metavar="K",
        type=int,
        default=None,
        help="the mean over each run's last K evaluations (within the budget, if one is given)",
    )
    ap.add_argument(
        "--rows",
        metavar="OUT.jsonl",
        type=Path,
        default=None,
        help="also write every run's per-round rows (scalars, tagged with setting and seed) to "
        "OUT.jsonl, for committing beside a results document",
    )
    ap.add_argument(
        "--clients",
        metavar="OUT.jsonl",
        type=Path,
        default=None,
        help="also write one record per client per run (final personal accuracy, labeled and "
        "unlabeled counts, participations) to OUT.jsonl: `python -m fedjax_semi.results.bins "
        "OUT.jsonl` makes the --by-* tables from it",
    )
    ap.add_argument(
        "--fa-rule",
        metavar="PLATEAU,PATIENCE,MIN_ROUNDS",
        default=None,
        help="cut each run where DoFed-SPP's FA rule would have stopped it (replayed on the "
        "first metric's curve), e.g. 0.01,3,10; a run it never stops is read at the budget",
    )
    ap.add_argument(
        "--paired-to",
        metavar="TOKENS",
        default=None,
        help="also tabulate every setting minus the one holding these space-separated key=value "
        "tokens, seed by seed, on the first metric at the same cut (DIR/report_paired.md)",
    )
    ap.add_argument(
        "--plot",
        metavar="METRICS",
        default=None,
        help="also write DIR/curves.png and DIR/curves.csv: these comma-separated metrics against "
        "--plot-x, one curve per setting (mean over seeds, shaded +- std)",
    )
    ap.add_argument("--plot-x", choices=list(X_AXES), default="round", help="the curves' x axis")
    add_gate_flags(ap)
    args = ap.parse_args(argv)
    try:  # checked before any work, one line per bad value
        gates = gates_from_args(args)
    except ValueError as e:
        _fail(str(e))
    if not args.sweep_dir.is_dir():
        _fail(f"sweep_dir={str(args.sweep_dir)!r} is not a directory")
    fa_rule = None
    if args.fa_rule is not None:
        try:
            p, k, m = args.fa_rule.split(",")
            fa_rule = (float(p), int(k), int(m))
        except ValueError:
            _fail(
                f"--fa-rule={args.fa_rule!r} is not allowed: PLATEAU,PATIENCE,MIN_ROUNDS, "
                "e.g. 0.01,3,10"
            )
    try:
        edges = parse_edges("--by-labeled-ratio", args.by_labeled_ratio, LABELED_RATIO_ALLOWED)
        part_edges = parse_edges(
            "--by-participations", args.by_participations, PARTICIPATION_ALLOWED
        )
        plotted = ()
        if args.plot is not None:
            plotted = plot(args.sweep_dir, args.plot.split(","), args.plot_x)
        md = report(
            args.sweep_dir,
            args.metrics.split(","),
            args.csv,
            budget_time=args.budget_time,
            budget_rounds=args.budget_rounds,
            last_k=args.last_k,
            fa_rule=fa_rule,
            gates=gates,
        )
        if edges is not None:
            md += "\n\nPersonal accuracy by labeled ratio:\n\n"
            md += labeled_ratio_table(args.sweep_dir, edges)
        if part_edges is not None:
            md += "\n\nPersonal accuracy by participations (rounds a client took part in):\n\n"
            md += participation_table(args.sweep_dir, part_edges)
        if args.paired_to is not None:
            md += "\n\nPaired against the reference on the same seeds:\n\n"
            md += paired_table(
                args.sweep_dir,
                args.metrics.split(",")[0],
                args.paired_to.split(),
                budget_time=args.budget_time,
                budget_rounds=args.budget_rounds,
                last_k=args.last_k,
            )
        if args.ttap:
            paths = ttap(args.sweep_dir)
        if args.rows is not None:
            md += f"\n\nwrote {export_rows(args.sweep_dir, args.rows)} rows to {args.rows}"
        if args.clients is not None:
            n = export_clients(args.sweep_dir, args.clients)
            md += f"\n\nwrote {n} per-client records to {args.clients}"
    except ValueError as e:
        _fail(str(e))
    print(md)
    if args.ttap:
        print("\n".join(f"wrote {p}" for p in paths))
    for path in plotted:  # nothing, not an empty line, without --plot
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
