"""fedjax-semi-tune: one tuning protocol for every method and baseline of a table.

    fedjax-semi-tune +experiment=<table preset> [--grid algorithm.lr=0.003,0.01,0.03,0.1]
        [--seeds 0] [--holdout 0.2] [--rows 'algorithm=a,b'] [--knobs] [--metric M]
        [--last-k K] [--budget-time T] [--dir D] [--launcher joblib --jobs 2] [--dry-run]
        [overrides]

The table's rows are the preset's ``hydra.sweeper.params`` minus ``seed``. Every row is
searched over the same grid (the lr grid always) and the same tuning seeds, on the validation
split ``partition.holdout=H`` carved from the clients' training rows (never the test split), as
real Hydra multiruns of ``fedjax-semi -m`` with deterministic trial directories
(``hydra.sweep.subdir=${hydra.job.override_dirname}``) and ``resume=true``, so a rerun redoes
no finished trial. Per row the grid point with the best mean over the seeds wins (ties to the
smaller lr); the choice goes to ``tuned.md``/``tuned.json`` in the sweep directory and to
``conf/tuned/<preset>.yaml``, which the preset loads (``- optional /tuned: <preset>``) and the
app applies (fedjax_semi/tuned.py). docs/tuning.md has the protocol.
"""

from __future__ import annotations

import argparse
import itertools
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from fedjax_semi.errors import ConfigError, bad
from fedjax_semi.results.tune_launch import check_dir, launches, run_multirun, scan, value_text
from fedjax_semi.results.tune_plan import LR, Plan, added_by_row, key_of, row_label
from fedjax_semi.results.tune_select import Cut, collect, next_values, select, write_outputs

__all__ = ["DEFAULT_LR_GRID", "SENSITIVE_KNOBS", "main"]

DEFAULT_LR_GRID = ("0.003", "0.01", "0.03", "0.1")
LAUNCHERS = ("basic", "joblib", "vectorized", "submitit_local", "submitit_slurm")
_ABSENT = object()
MINIMIZED_SUFFIXES = ("loss", "cost")


def _each(key: str, *values: Any) -> tuple[dict[str, Any], ...]:
    return tuple({key: v} for v in values)


_FIXMATCH = _each("algorithm.pl_threshold", 0.8, 0.95)
# Per method (algorithm.name): the knob settings its paper names as sensitive, searched with
# --knobs on top of the lr grid. Every method has exactly TWO settings, so any mix of these
# methods gets the same number of trials per row; docs/tuning.md quotes where each comes from.
SENSITIVE_KNOBS: dict[str, tuple[dict[str, Any], ...]] = {
    # FixMatch (Sohn et al. 2020, Sec. 5 ablations): the confidence threshold tau.
    "fixavg": _FIXMATCH,
    "fixprox": _FIXMATCH,
    "fixbn": _FIXMATCH,
    "fedavg_pl": _FIXMATCH,
    # UM-pFSSL: the form of Corr(k|j) (Eq. 13's reciprocal entropy, or 1 - H).
    "um_pfssl": _each("algorithm.corr_form", "inverse", "complement"),
    # CoFED (Sec. 5.6, Figs. 7-8): the agreement threshold alpha.
    "cofed": _each("algorithm.alpha", 0.1, 0.3),
    # CFSL: the split thresholds eps1, eps2 on update norms (Eqs. 5-6), their 1:4 ratio kept.
    "cfsl": (
        {"algorithm.eps1": 0.4, "algorithm.eps2": 1.6},
        {"algorithm.eps1": 0.2, "algorithm.eps2": 0.8},
    ),
    # Ada-FedSemi (Eq. 18): the bandits' inverse temperature psi.
    "ada_fedsemi": _each("algorithm.psi", 1.0, 3.0),
    "hetero_ada": _each("algorithm.psi", 1.0, 3.0),
    "semi_hfl": _each("algorithm.psi", 1.0, 3.0),  # its P-agent is HeteroAda's
    # DoFed-SPP (its Appendix B's sensitivity analysis): the warm-up length L.
    "dofed_spp": _each("algorithm.warmup_rounds", 5, 10),
}


# ----------------------------------------------------------------------------- flags


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="fedjax-semi-tune",
        description="Tune every row of a table preset by the same search on a validation split.",
    )
    ap.add_argument("overrides", nargs="*", help="+experiment=<preset> and other Hydra overrides")
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                    help=f"a grid axis (repeatable); the lr axis always ({LR}="
                    f"{','.join(DEFAULT_LR_GRID)} unless given)")  # fmt: skip
    ap.add_argument("--seeds", default="0", help="tuning seeds, comma-separated (default 0)")
    ap.add_argument("--holdout", default="0.2", help="validation share of each client's rows")
    ap.add_argument("--rows", action="append", default=[], metavar="KEY=V1,V2",
                    help="only these values of a row key (repeatable)")  # fmt: skip
    ap.add_argument("--knobs", action="store_true",
                    help="also search the SENSITIVE_KNOBS of each method")  # fmt: skip
    ap.add_argument("--metric", default=None, help="what to maximise (default: stop.metric)")
    ap.add_argument("--last-k", default=None, help="mean of the last K evaluations, not the last")
    ap.add_argument("--budget-time", default=None,
                    help="read trials at sim_time <= T s (fedjax-semi-report's cut)")  # fmt: skip
    ap.add_argument("--dir", default=None, help="sweep directory (default tune/<preset>)")
    ap.add_argument("--conf-out", default=None, help="where conf/tuned/<preset>.yaml goes")
    ap.add_argument("--launcher", default="basic", help=f"Hydra launcher: {list(LAUNCHERS)}")
    ap.add_argument("--jobs", default="2", help="parallel trials with --launcher joblib")
    ap.add_argument("--extend-edges", default="0", metavar="N",
                    help="the edge rule, up to N times: add the value past a choice at a numeric "
                    "axis's edge (0.1 -> 0.3 -> 1.0) and run its trials (default 0)")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="print the plan and launch nothing")
    return ap.parse_intermixed_args(argv)


def _ints(flag: str, text: str, lo: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < lo for v in values) or len(set(values)) != len(values):
        raise bad(flag, text, f"distinct integers >= {lo}, comma-separated, e.g. 0,1,2")
    return values


def _axis(flag: str, text: str) -> tuple[str, list[str]]:
    key, eq, values = text.partition("=")
    items = [v.strip() for v in values.split(",")]
    if not eq or not key or not all(items) or len(set(items)) != len(items):
        raise bad(flag, text, "KEY=V1,V2,... with distinct non-empty values")
    return key.strip(), items


def parse_grid(texts: list[str]) -> dict[str, list[str]]:
    """The grid axes of --grid (the lr axis first, its default when not given)."""
    grid: dict[str, list[str]] = {}
    for text in texts:
        key, values = _axis("--grid", text)
        if key in grid:
            raise bad("--grid", text, f"each key once ({key} is given twice)")
        grid[key] = values
    lr = grid.pop(LR, list(DEFAULT_LR_GRID))
    for v in lr:
        try:
            ok = float(v) > 0 and math.isfinite(float(v))
        except ValueError:
            ok = False
        if not ok:
            raise bad("--grid", f"{LR}={','.join(lr)}", "learning rates that are numbers > 0")
    return {LR: lr, **grid}


def check_flags(args: argparse.Namespace) -> dict[str, Any]:
    """Every flag's value, checked before any work (ConfigError naming flag and value)."""
    try:
        holdout = float(args.holdout)
    except ValueError:
        holdout = math.nan
    if not 0 < holdout <= 0.5:
        raise bad("--holdout", args.holdout, "a share in (0, 0.5] (0 would tune on the test split)")
    last_k = None if args.last_k is None else _ints("--last-k", args.last_k, 1)[0]
    budget_time = None
    if args.budget_time is not None:
        try:
            budget_time = float(args.budget_time)
        except ValueError:
            budget_time = math.nan
        if not (budget_time > 0 and math.isfinite(budget_time)):
            raise bad("--budget-time", args.budget_time, "seconds of simulated clock, a number > 0")
    if args.launcher not in LAUNCHERS:
        raise bad("--launcher", args.launcher, f"one of {list(LAUNCHERS)}")
    presets = [o for o in args.overrides if key_of(o) == "experiment" and "=" in o]
    if len(presets) != 1:
        raise bad("+experiment", presets or None, "exactly one table preset, e.g. +experiment=X")
    rows = dict(_axis("--rows", t) for t in args.rows)
    return {
        "grid": parse_grid(args.grid),
        "seeds": _ints("--seeds", args.seeds, 0),
        "holdout": holdout,
        "cut": Cut(last_k, budget_time),
        "jobs": _ints("--jobs", args.jobs, 1)[0],
        "extend": _ints("--extend-edges", args.extend_edges, 0)[0],
        "preset": presets[0].split("=", 1)[1],
        "rows": rows,
    }


# ----------------------------------------------------------------------------- the plan


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from fedjax_semi.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def _sweep_values(key: str, value: str) -> list[str]:
    """The values of one sweeper param (``a,b``, ``range(..)``, ``choice(..)``) as strings."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = OverridesParser.create().parse_overrides([f"{key}={value}"])[0]
    if override.is_sweep_override():
        return [str(v) for v in override.sweep_string_iterator()]
    return [override.get_value_element_as_str()]


def make_plan(flags: dict[str, Any], args: argparse.Namespace) -> Plan:
    """Reads the preset's rows (Hydra's compose API) and checks every key against them."""
    from omegaconf import OmegaConf

    from fedjax_semi.cli import CONF_DIR
    from fedjax_semi.store import register_configs

    register_configs()
    preset = flags["preset"]
    extras = [o for o in args.overrides if key_of(o) != "experiment"]
    hydra_extras = [o for o in extras if key_of(o).startswith(("hydra.", "hydra/"))]
    task_extras = [o for o in extras if o not in hydra_extras]
    base = [f"+experiment={preset}", *hydra_extras]
    try:
        cfg = _compose(base)
    except Exception as e:  # noqa: BLE001 (Hydra's many composition errors)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if f"Could not find 'experiment/{preset}'" not in first:
            raise ConfigError(f"+experiment={preset} does not compose: {first}") from None
        known = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
        raise bad("+experiment", preset, f"a preset of conf/experiment: {known}") from None
    sweep = cfg.hydra.sweeper.get("params")  # None where the preset names no rows
    params = dict(OmegaConf.to_container(sweep) if sweep is not None else {})
    params.pop("seed", None)
    if not params:
        raise bad("+experiment", preset, "a table preset (its hydra.sweeper.params name the rows)")
    axes = {k: _sweep_values(k, str(v)) for k, v in params.items()}
    for key, values in flags["rows"].items():
        if key not in axes:
            raise bad("--rows", f"{key}=...", f"a row key of {preset}: {list(axes)}")
        if not set(values) <= set(axes[key]):
            raise bad("--rows", f"{key}={','.join(values)}", f"values among {axes[key]}")
        axes[key] = [v for v in axes[key] if v in values]
    fixed = {"seed", "resume", "out_dir", "partition.holdout", "tuned", *axes, *flags["grid"]}
    for o in task_extras:
        if key_of(o) in fixed:
            raise bad(
                o, "", f"{key_of(o)} is set by the tuner (--rows, --grid, --seeds, --holdout)"
            )
    tuned_group = "tuned" in cfg.hydra.runtime.choices
    plan = Plan(
        preset, [dict(zip(axes, c, strict=True)) for c in itertools.product(*axes.values())],
        [], flags["grid"], flags["seeds"], flags["holdout"], task_extras, hydra_extras,
        Path(args.dir) if args.dir else Path.cwd() / "tune" / preset, tuned_group,
        str(cfg.stop.metric),
    )  # fmt: skip
    names = []
    for row in plan.rows:
        ov = [*base, *task_extras, *(f"{k}={v}" for k, v in row.items())]
        try:
            rc = _compose(ov + (["tuned=[]"] if tuned_group else []))
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0]
            msg = f"row {row_label(row)} of {preset} does not compose: {first}"
            raise ConfigError(msg) from None
        name = str(rc.algorithm.name)
        # A method without sensitive knobs has one setting: the preset's values.
        settings = [dict(s) for s in SENSITIVE_KNOBS.get(name, ())] if args.knobs else []
        settings = settings or [{}]
        for key in [*plan.grid, *(k for s in settings for k in s)]:
            if OmegaConf.select(rc, key, default=_ABSENT, throw_on_missing=False) is _ABSENT:
                flag = "--grid" if key in plan.grid else "--knobs"
                raise bad(flag, key, f"a config key of row {row_label(row)} ({name})")
        if int(rc.get("replicas", 1)) != 1:
            raise bad("replicas", rc.replicas, "1 for tuning (its seeds are --seeds)")
        plan.settings.append([{k: value_text(v) for k, v in s.items()} for s in settings])
        plan.rounds.append(int(rc.rounds))
        names.append(name)
    if args.knobs:
        sizes = {row_label(r): len(s) for r, s in zip(plan.rows, plan.settings, strict=True)}
        if len(set(sizes.values())) > 1:
            raise bad(
                "--knobs", True, "rows whose knob grids have equal sizes (every row the same "
                f"number of trials); here {sizes}: narrow them with --rows",
            )  # fmt: skip
    return plan


# ----------------------------------------------------------------------------- main


def _fail(msg: str) -> None:
    print(f"fedjax-semi-tune: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    from fedjax_semi.cli import CONF_DIR

    args = parse_args(argv)
    try:
        flags = check_flags(args)
        plan = make_plan(flags, args)
        if not args.dry_run:
            check_dir(plan)
    except ConfigError as e:
        _fail(str(e))
    metric = args.metric or plan.default_metric
    for extensions_left in range(flags["extend"], -1, -1):
        todo = launches(plan, flags["jobs"], args.launcher)
        points = [len(plan.points(r)) for r in range(len(plan.rows))]
        shape = (
            f"{len(plan.rows)} rows x {points[0]} grid points"
            if len(set(points)) == 1
            else f"{len(plan.rows)} rows, {sum(points)} grid points in all"
        )
        print(
            f"fedjax-semi-tune: {shape} x {len(plan.seeds)} seeds = "
            f"{sum(points) * len(plan.seeds)} trials on partition.holdout={plan.holdout}; "
            f"{sum(m for _, m in todo)} to run, in {plan.sweep_dir}"
        )
        for cmd, _ in todo:
            print("  " + shlex.join(cmd[2:]).replace("fedjax_semi.cli", "fedjax-semi", 1))
            if not args.dry_run:
                run_multirun(cmd)
        if args.dry_run:
            return
        try:
            results = collect(plan, scan(plan), metric, flags["cut"])
        except ValueError as e:
            _fail(str(e))
        # Losses and costs (Ada-FedSemi's cum_cost, Eq. 10) are minimised, the rest maximised.
        choices = select(plan, results, minimize=metric.endswith(MINIMIZED_SUFFIXES))
        finished = all(v is not None for points in results for p in points for v in p.values)
        added = next_values(plan, choices) if extensions_left and finished else []
        if not any(added):
            break
        plan.added += [{} for _ in range(len(plan.rows) - len(plan.added))]
        for r, extra in enumerate(added):  # for that row only (Plan.row_grid)
            for key, values in extra.items():
                plan.added[r].setdefault(key, []).extend(values)
        what = added_by_row(plan.rows, added)
        print(f"fedjax-semi-tune: a choice at its grid's edge; adding, for that row only, {what} "
              f"(--extend-edges: {extensions_left - 1} more after this)")  # fmt: skip
    conf_out = Path(args.conf_out) if args.conf_out else CONF_DIR / "tuned"
    command = shlex.join(["fedjax-semi-tune", *(sys.argv[1:] if argv is None else argv)])
    sys.exit(write_outputs(plan, results, choices, conf_out, metric, flags["cut"], command))


if __name__ == "__main__":
    main()
