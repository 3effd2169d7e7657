"""What one fedjax-semi-tune runs (`Plan`) and a trial's identity, shared by the search
(results/tune.py) and the selection (results/tune_select.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

LR = "algorithm.lr"


@dataclass
class Plan:
    """What one tuning runs: rows x settings x grid points x seeds, and where."""

    preset: str
    rows: list[dict[str, str]]  # row key -> value (the sweep's strings)
    settings: list[list[dict[str, str]]]  # per row: its knob settings ([{}] without --knobs)
    grid: dict[str, list[str]]
    seeds: list[int]
    holdout: float
    task_extras: list[str]  # the user's overrides of the task (constant over the trials)
    hydra_extras: list[str]  # the user's hydra.* overrides
    sweep_dir: Path
    tuned_group: bool  # the preset loads conf/tuned/<preset>.yaml
    default_metric: str  # the preset's stop.metric
    rounds: list[int] = field(default_factory=list)  # per row
    # Per row: the values --extend-edges added past that row's choice (its grid only).
    added: list[dict[str, list[str]]] = field(default_factory=list)

    def row_grid(self, r: int) -> dict[str, list[str]]:
        """Row r's grid: the command's, with the values added past its own edges (sorted)."""
        extra = self.added[r] if r < len(self.added) else {}
        return {k: _merged(vs, extra.get(k, [])) for k, vs in self.grid.items()}

    def all_values(self) -> dict[str, list[str]]:
        """Every value some row's grid holds, per axis (sorted where values were added)."""
        out = dict(self.grid)
        for extra in self.added:
            out = {k: _merged(vs, extra.get(k, [])) for k, vs in out.items()}
        return out

    def points(self, r: int) -> list[dict[str, str]]:
        """Row r's grid points: each knob setting with each value combination of its grid."""
        grid = self.row_grid(r)
        keys = list(grid)
        combos = itertools.product(*(grid[k] for k in keys))
        points = [dict(zip(keys, c, strict=True)) for c in combos]
        return [{**s, **g} for s in self.settings[r] for g in points]

    def trials(self, r: int) -> list[tuple[dict[str, str], int]]:
        return [(p, s) for p in self.points(r) for s in self.seeds]

    def constant_keys(self) -> list[str]:
        """Task keys that are the same in every trial: left out of the trial directory names."""
        keys = ["experiment", "resume", "tuned", "partition.holdout"]
        return keys + [key_of(o) for o in self.task_extras]


def _merged(values: list[str], extra: list[str]) -> list[str]:
    """An axis's values with added ones, numerically sorted so tables read in order (only
    numeric axes get values added)."""
    new = [v for v in extra if v not in values]
    return sorted(values + new, key=float) if new else values


def row_label(row: dict[str, str]) -> str:
    """A row as its overrides: `algorithm=fixavg partition.alpha=5.0`."""
    return " ".join(f"{k}={v}" for k, v in row.items())


def added_by_row(rows: list[dict[str, str]], added: list[dict[str, list[str]]]) -> str:
    """Values added past rows' edges, per row: `algorithm=a: algorithm.lr=1.0; ...` ("" if none)."""
    return "; ".join(
        f"{row_label(rows[r])}: " + ", ".join(f"{k}={v}" for k, vs in extra.items() for v in vs)
        for r, extra in enumerate(added)
        if extra
    )


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def trial_id(overrides: dict[str, str] | list[str], constant: list[str]) -> frozenset:
    """A trial's identity: its varying overrides (what its directory name holds)."""
    items = (
        overrides.items() if isinstance(overrides, dict) else (o.split("=", 1) for o in overrides)
    )
    return frozenset((k.lstrip("+~"), v) for k, v in items if k.lstrip("+~") not in constant)
