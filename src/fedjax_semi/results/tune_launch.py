"""fedjax-semi-tune's launching half: find the trials run before (`scan`), the multiruns that
cover the missing ones (`launches`), run one of them (`run_multirun`), and the sweep directory's
ownership (`check_dir`). The protocol is in results/tune.py and docs/tuning.md."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedjax_semi.errors import bad
from fedjax_semi.results.tune_plan import Plan, trial_id
from fedjax_semi.tuned import run_complete

__all__ = ["check_dir", "launches", "run_multirun", "scan", "value_text"]


def value_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def scan(plan: Plan) -> dict[frozenset, Path]:
    """Trial identity -> run directory, for every trial directory under the sweep dir.

    A trial run before a grid key joined the search (its overrides lack the key) also answers
    for the grid point where that key takes the value the trial ran at (its run_config.json),
    so adding an axis whose grid holds the current value reruns nothing. The same holds for
    --knobs: a trial run before them answers for the knob setting it ran at (each row's knob
    keys tried in turn). An explicit trial wins over such a stand-in."""
    import yaml

    knobs: dict[str, list[str]] = {}
    for row_settings in plan.settings:
        for setting in row_settings:
            for k, v in setting.items():
                knobs.setdefault(k, []).append(v)
    # One row's knob keys at a time: a run's config may hold another method's knob key too
    # (UM-pFSSL's pl_threshold: null), which must not enter its identity.
    knob_sets = {frozenset(s) for row_settings in plan.settings for s in row_settings}
    knob_sets = knob_sets or {frozenset()}
    found, implied = {}, {}
    for path in plan.sweep_dir.glob("*/.hydra/overrides.yaml"):
        overrides = yaml.safe_load(path.read_text()) or []
        run_dir = path.parent.parent
        tid = trial_id(overrides, plan.constant_keys())
        found[tid] = run_dir
        named = {k for k, _ in tid}
        grid = {k: vs for k, vs in plan.all_values().items() if k not in named}
        flat = None  # the run's config, read once and only when some key is absent
        for keys in knob_sets:
            absent = grid | {k: knobs[k] for k in keys if k not in named}
            if not absent:
                continue
            flat = _run_config(run_dir) if flat is None else flat
            if all(k in flat for k in absent):
                ran = {k: _grid_spelling(vs, value_text(flat[k])) for k, vs in absent.items()}
                implied.setdefault(tid | frozenset(ran.items()), run_dir)
    return {**implied, **found}


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's settings (run_config.json) as flat dotted keys; {} when the file is missing or
    unreadable. Values are spelled as the grid spells the same number by _grid_spelling."""
    from fedjax_semi.run_config import RUN_CONFIG, flat_keys

    try:
        return flat_keys(json.loads((run_dir / RUN_CONFIG).read_text()))
    except (OSError, ValueError):
        return {}


def _grid_spelling(values: list[str], ran: str) -> str:
    for v in values:
        try:
            if float(v) == float(ran):
                return v
        except ValueError:
            continue
    return ran


def _done(run_dir: Path | None, rounds: int) -> bool:
    path = None if run_dir is None else run_dir / "summary.json"
    if path is None or not path.exists():
        return False
    try:
        return run_complete(json.loads(path.read_text()), rounds, same_stop=True)
    except ValueError:
        return False


def launches(plan: Plan, jobs: int, launcher: str) -> list[tuple[list[str], int]]:
    """The multiruns that cover every trial not done yet: (command, missing trials). Rows with
    the same knob settings form one multirun when they are a product of their keys."""
    found = scan(plan)
    const = plan.constant_keys()
    groups: dict[str, list[int]] = {}
    for r in range(len(plan.rows)):  # one multirun per knob settings and grid
        groups.setdefault(json.dumps([plan.settings[r], plan.row_grid(r)]), []).append(r)
    out = []
    for members in groups.values():
        for rows in _products([plan.rows[r] for r in members], members):
            for setting in plan.settings[rows[0]]:
                missing = [
                    p
                    for r in rows
                    for p, s in plan.trials(r)
                    if all(p.get(k) == v for k, v in setting.items())
                    and not _done(found.get(trial_id({**plan.rows[r], **p, "seed": str(s)}, const)),
                                  plan.rounds[r])
                ]  # fmt: skip
                if missing:
                    # Only the grid values some missing trial needs: a point answered by an
                    # older trial (scan) is not launched again under a new directory name.
                    grid = {k: [v for v in vs if any(p[k] == v for p in missing)]
                            for k, vs in plan.row_grid(rows[0]).items()}  # fmt: skip
                    out.append((_command(plan, rows, setting, grid, jobs, launcher), len(missing)))
    return out


def _products(rows: list[dict[str, str]], ids: list[int]) -> list[list[int]]:
    """The rows as one product of their keys' values when they are one, else one per row."""
    keys = list(rows[0])
    values = [sorted({r[k] for r in rows}) for k in keys]
    if math.prod(len(v) for v in values) == len(rows):
        return [ids]
    return [[i] for i in ids]


def _command(
    plan: Plan,
    rows: list[int],
    setting: dict[str, str],
    grid: dict[str, list[str]],
    jobs: int,
    launcher: str,
) -> list[str]:
    first = plan.rows[rows[0]]
    axes = {k: list(dict.fromkeys(plan.rows[r][k] for r in rows)) for k in first}
    exclude = ",".join(plan.constant_keys())
    cmd = [
        sys.executable, "-m", "fedjax_semi.cli", "-m", f"+experiment={plan.preset}",
        *plan.hydra_extras, *plan.task_extras, f"partition.holdout={plan.holdout}", "resume=true",
        *(["tuned=[]"] if plan.tuned_group else []),
        f"hydra.sweep.dir={plan.sweep_dir}", "hydra.sweep.subdir=${hydra.job.override_dirname}",
        f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]",
        *(f"{k}={','.join(v)}" for k, v in axes.items()),
        *(f"{k}={v}" for k, v in setting.items()),
        *(f"{k}={','.join(v)}" for k, v in grid.items()),
        f"seed={','.join(map(str, plan.seeds))}",
    ]  # fmt: skip
    if launcher != "basic":
        cmd.append(f"hydra/launcher={launcher}")
    if launcher == "joblib":
        cmd.append(f"hydra.launcher.n_jobs={jobs}")
    return cmd


def run_multirun(cmd: list[str]) -> None:
    """Run one multirun as a child process and wait for it. A SIGTERM to the tuner (a scheduler's
    kill, `kill PID`) ends the child too, and the tuner exits 143: without this the child went on
    writing into the sweep directory after the tuner was gone, and a rerun of the tuner then ran
    the same trials twice at once. Ctrl-C reaches the child through the terminal; any other
    interruption of the wait ends it here. The child's checkpoints keep what it finished."""
    child = subprocess.Popen(cmd)
    signals: list[int] = []

    def end(signum: int, _frame: Any) -> None:
        # Only signal here: waiting inside the handler would deadlock on the wait it interrupted.
        signals.append(signum)
        child.terminate()

    previous = signal.signal(signal.SIGTERM, end)
    try:
        child.wait()
    except BaseException:
        child.terminate()
        child.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    if signals:
        sys.exit(128 + signals[0])


def check_dir(plan: Plan) -> None:
    """A sweep dir belongs to one tuning setup: the same preset, holdout and overrides."""
    path = plan.sweep_dir / "tune.json"
    mine = {"preset": plan.preset, "holdout": plan.holdout, "overrides": plan.task_extras}
    if path.exists():
        old = json.loads(path.read_text())
        if {k: old.get(k) for k in mine} != mine:
            raise bad(
                "--dir", str(plan.sweep_dir), f"a new directory: it holds a tuning of {old} (its "
                f"trials would not be this one's {mine})",
            )  # fmt: skip
    else:
        plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mine, indent=1))
