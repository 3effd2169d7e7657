"""Sanity gates of fedjax-semi-report: flag the rows of a table whose models look broken
(docs/gates.md).

A row is one setting over its seeds; each gate reads the row's values at the table's cut (the
final evaluation, or the budget / last-k / FA-rule cut) and fires or not:

    chance       the first metric's mean is within `chance_margin` of chance, 1/K (or below)
    collapse     the models put more than `collapse` of their test predictions in one class
                 (pred_top_share, averaged over clients) AND more than the true labels do
                 (label_top_share): a skewed test split is not a collapse
    below-local  the first metric's mean is below the same table's Local row (the setting that
                 differs only in algorithm=local) by more than `local_margin`

A gate whose inputs a run did not log (runs written before the sanity columns) says so in the
cell (`collapse: n/a`) instead of passing silently.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable

import numpy as np

# The evaluation columns the collapse gate reads (algorithms.base.sanity); a table whose first
# metric is personal_acc reads their personal_ versions where a run logs them.
COLUMNS = ("pred_top_share", "pred_top_share_max", "label_top_share", "pred_entropy", "max_logit")
LOCAL = "local"

ValueOf = Callable[[dict, str], float | None]  # (run, row key) -> its value at the cut


@dataclasses.dataclass(frozen=True)
class Gates:
    """The gates' thresholds (fedjax-semi-report's --gate-* flags), checked on construction."""

    chance_margin: float = 0.05
    collapse: float = 0.8
    local_margin: float = 0.01

    def __post_init__(self) -> None:
        for flag, v in zip(
            FLAGS, (self.chance_margin, self.collapse, self.local_margin), strict=True
        ):
            _check(flag, v, repr(v))

    @classmethod
    def from_flags(cls, chance_margin: str, collapse: str, local_margin: str) -> Gates:
        """The thresholds from the flags' text; ValueError naming the first bad one as typed."""
        values = []
        for flag, text in zip(FLAGS, (chance_margin, collapse, local_margin), strict=True):
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            _check(flag, value, text)
            values.append(value)
        return cls(*values)


FLAGS = ("--gate-chance-margin", "--gate-collapse", "--gate-local-margin")


def add_gate_flags(ap: argparse.ArgumentParser) -> None:
    """The gates' flags on an argparse parser (fedjax-semi-report, gates_rows); the values stay
    text until `gates_from_args` checks them."""
    ap.add_argument(
        "--gate-chance-margin",
        metavar="M",
        default=str(Gates.chance_margin),
        help="flag a row whose first metric is within M of chance, 1/K, or below "
        f"(default {Gates.chance_margin}; docs/gates.md)",
    )
    ap.add_argument(
        "--gate-collapse",
        metavar="S",
        default=str(Gates.collapse),
        help="flag a row whose models put more than S of their test predictions in one class "
        f"(pred_top_share), and more than the true labels do (default {Gates.collapse})",
    )
    ap.add_argument(
        "--gate-local-margin",
        metavar="M",
        default=str(Gates.local_margin),
        help="flag a row more than M below the same table's Local row (the setting that differs "
        f"only in algorithm=local) on the first metric (default {Gates.local_margin})",
    )
    ap.add_argument(
        "--no-gates",
        action="store_true",
        help="no sanity gates (no gates column, no list of flagged rows)",
    )


def gates_from_args(args: argparse.Namespace) -> Gates | None:
    """The checked thresholds of `add_gate_flags`' flags (None with --no-gates); ValueError
    naming the first bad flag as typed."""
    if args.no_gates:
        return None
    return Gates.from_flags(args.gate_chance_margin, args.gate_collapse, args.gate_local_margin)


def _check(flag: str, value, shown: str) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and 0.0 <= value <= 1.0):
        raise ValueError(f"{flag}={shown} is not allowed: a number in [0, 1]")


@dataclasses.dataclass
class Verdict:
    """One row's gates: `fired` (short texts for the table cell), `unknown` (gates it could not
    compute, `name: n/a (why)`) and `detail` (the diagnosis numbers for the line under it)."""

    fired: list[str] = dataclasses.field(default_factory=list)
    unknown: list[str] = dataclasses.field(default_factory=list)
    detail: list[str] = dataclasses.field(default_factory=list)

    @property
    def cell(self) -> str:
        return "; ".join(self.fired + self.unknown)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def _pct(v: float, percent: bool) -> str:
    return f"{100 * v:.1f}%" if percent else f"{v:.4g}"


def algorithm_of(run: dict) -> str | None:
    """The run's algorithm: its resolved config's algorithm.name, else summary.json's, else
    its `algorithm=` override."""
    name = (run["config"].get("algorithm") or {}).get("name") or run["summary"].get("algorithm")
    if name:
        return str(name)
    for o in run["overrides"]:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == "algorithm":
            return value
    return None


def _overrides(run: dict) -> dict[str, str]:
    out = {}
    for o in run["overrides"]:
        key, _, value = o.partition("=")
        out[key.lstrip("+~")] = value
    return out


def _is_algorithm_key(key: str) -> bool:
    return key == "algorithm" or key.startswith("algorithm.")


def same_but_algorithm(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two settings' overrides differ only in the algorithm: every other override
    equal, and the algorithm.* knobs they both set equal (a knob one method has and the other
    lacks does not count)."""
    other = {k for k in a.keys() | b.keys() if not _is_algorithm_key(k)}
    shared = {k for k in a.keys() & b.keys() if k.startswith("algorithm.")}
    return all(a.get(k) == b.get(k) for k in other | shared)


def _chance(v: Verdict, runs: list[dict], acc: float | None, value_of: ValueOf, g: Gates, pct):
    k = _mean([value_of(r, "num_classes") for r in runs])
    if acc is None:
        v.unknown.append("chance: n/a (no value of the first metric)")
    elif not pct:
        v.unknown.append("chance: n/a (the first metric is not a fraction)")
    elif k is None:
        v.unknown.append("chance: n/a (num_classes not logged)")
    elif acc <= 1.0 / k + g.chance_margin:
        v.fired.append(f"chance ({_pct(acc, True)} vs 1/K = {_pct(1.0 / k, True)})")
        v.detail.append(
            f"chance: mean {_pct(acc, True)}, chance 1/{k:g} = {_pct(1.0 / k, True)}, "
            f"margin {g.chance_margin:g}"
        )


def _collapse(v: Verdict, runs: list[dict], metric: str, value_of: ValueOf, g: Gates) -> None:
    prefix = ""
    if metric == "personal_acc" and any(
        value_of(r, "personal_pred_top_share") is not None for r in runs
    ):
        prefix = "personal_"
    col = {c: _mean([value_of(r, prefix + c) for r in runs]) for c in COLUMNS}
    top, labels = col["pred_top_share"], col["label_top_share"]
    if top is None:
        v.unknown.append("collapse: n/a (no pred_top_share logged)")
        return
    if top > g.collapse and (labels is None or top > labels):
        v.fired.append(f"collapse ({top:.2f} in one class)")
        nums = ", ".join(f"{prefix}{c} {x:.3g}" for c, x in col.items() if x is not None)
        v.detail.append(f"collapse: {nums} (threshold {g.collapse:g})")


def judge(
    groups: dict[str, list[dict]],
    metric: str,
    value_of: ValueOf,
    gates: Gates,
    percent: bool,
) -> dict[str, Verdict]:
    """Every setting's Verdict. `metric` is the table's first metric; `value_of(run, key)` a
    run's value of a row key at the table's cut; `percent`: whether the metric is a fraction."""
    acc = {s: _mean([value_of(r, metric) for r in rs]) for s, rs in groups.items()}
    algs = {s: algorithm_of(rs[0]) for s, rs in groups.items()}
    keys = {s: _overrides(rs[0]) for s, rs in groups.items()}
    locals_ = [s for s in groups if algs[s] == LOCAL]
    out = {}
    for s, rs in groups.items():
        v = Verdict()
        _chance(v, rs, acc[s], value_of, gates, percent)
        _collapse(v, rs, metric, value_of, gates)
        if locals_ and algs[s] != LOCAL:
            match = [loc for loc in locals_ if same_but_algorithm(keys[s], keys[loc])]
            if len(match) != 1:
                why = "no matching Local row" if not match else f"{len(match)} Local rows match"
                v.unknown.append(f"below-local: n/a ({why})")
            elif acc[s] is None or acc[match[0]] is None:
                v.unknown.append("below-local: n/a (no value of the first metric)")
            elif acc[s] < acc[match[0]] - gates.local_margin:
                ours, theirs = _pct(acc[s], percent), _pct(acc[match[0]], percent)
                v.fired.append(f"below-local ({ours} < {theirs})")
                v.detail.append(
                    f"below-local: {metric} {ours} against {theirs} of `{match[0]}` "
                    f"(margin {gates.local_margin:g})"
                )
        out[s] = v
    return out


def summary_line(verdicts: dict[str, Verdict], gates: Gates) -> str:
    """The lines under the table: which rows the gates flagged, with their diagnosis numbers,
    and how many could not be checked fully."""
    flagged = {s: v for s, v in verdicts.items() if v.fired}
    partial = sum(1 for v in verdicts.values() if v.unknown)
    knobs = (
        f"chance margin {gates.chance_margin:g}, collapse {gates.collapse:g}, "
        f"local margin {gates.local_margin:g}"
    )
    head = f"Gates ({knobs}; docs/gates.md): "
    head += f"{len(flagged)} of {len(verdicts)} rows flagged" if flagged else "no row flagged"
    if partial:
        head += f"; {partial} not checked fully (n/a in the gates column)"
    lines = [head + "."]
    lines += [f"- `{s}`: " + "; ".join(v.detail) for s, v in flagged.items()]
    return "\n".join(lines)


def mechanism_names(runs: list[dict]) -> list[str]:
    """The mechanism metrics the runs' summaries hold (summary.json "mechanism"), in order."""
    names: dict[str, None] = {}
    for r in runs:
        names.update(dict.fromkeys(r["summary"].get("mechanism") or {}))
    return list(names)


def mechanism_values(runs: list[dict], names: list[str]) -> dict[str, float]:
    """Each mechanism metric's mean over the seeds that logged a number (final values)."""
    out = {}
    for name in names:
        vals = [(r["summary"].get("mechanism") or {}).get(name) for r in runs]
        mean = _mean([float(x) for x in vals if isinstance(x, int | float)])
        if mean is not None:
            out[name] = mean
    return out
