"""A tuning search's two-axis grid as one table, from `fedjax-semi-tune`'s ``tuned.json``:

    python -m fedjax_semi.results.tune_grid DIR/tuned.json --rows algorithm.psi \
        --cols algorithm.beta --row algorithm=ada_fedsemi

The tuner's own table (``tuned.md``) has one column per grid point; a joint search over two
knobs (ψ × β, lr × q0) reads better laid out with one knob down and one across. Each cell is
the mean ± std over the tuning seeds and, with ``--per-seed``, the seed values in brackets;
the tuner's choice is marked ``**[...]**``. The other axes must hold one value among the points
shown (fix them with ``--at KEY=VALUE``): a cell reads exactly one grid point. A diverged seed
reads ``diverged (NaN / ...)`` as in the tuner's table. Knobs searched with ``--knobs`` are not
grid axes here (they live in each point, not in the row's grid), so they cannot be laid out.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_semi.results.tune_plan import row_label


def _num(text: str) -> tuple[float, str]:
    """Sort key: numbers by value, other values after them by their text."""
    try:
        return float(text), ""
    except ValueError:
        return math.inf, text


def cell_text(values: list[float | None], chosen: bool, digits: int, per_seed: bool) -> str:
    """A grid point's cell: mean ± std over the seeds, the seeds with ``per_seed``, the choice
    as ``**[...]**``; a missing seed as `– (k/n seeds)`, a diverged one as `diverged (NaN /
    ...)`. The tuner's own table uses it too (4 digits, its diverged cell shorter)."""
    if any(v is None for v in values):
        done = sum(v is not None for v in values)
        return f"– ({done}/{len(values)} seeds)"
    vals = np.asarray(values, dtype=float)
    if not np.isfinite(vals).all():  # as the tuner's table: never a candidate
        return (
            "diverged ("
            + " / ".join("NaN" if not np.isfinite(v) else f"{v:.{digits}f}" for v in vals)
            + ")"
        )
    text = f"{vals.mean():.{digits}f}"
    if len(vals) > 1:
        text += f" ± {vals.std(ddof=1):.{digits}f}"
    if per_seed:
        text += " (" + " / ".join(f"{v:.{digits}f}" for v in vals) + ")"
    return f"**[{text}]**" if chosen else text


def _matches(labels: dict[str, Any], wanted: dict[str, str]) -> bool:
    return all(str(labels.get(k)) == v for k, v in wanted.items())


def grid_table(
    tuned: dict,
    rows: str,
    cols: str,
    row: dict[str, str] | None = None,
    at: dict[str, str] | None = None,
    digits: int = 3,
    per_seed: bool = False,
) -> str:
    """Markdown tables, one per tuned row matching ``row``: ``rows`` values down, ``cols``
    values across (numeric order), over the points whose other keys match ``at``. Raises
    ValueError naming the key when an axis is not in the grid, no row matches, or two shown
    points fall in one cell."""
    at = at or {}
    if rows == cols:
        raise ValueError(f"--rows and --cols are both {rows!r}: name two grid keys")
    out = []
    for entry in tuned["rows"]:
        if row and not _matches(entry["row"], row):
            continue
        for key in (rows, cols):
            if key not in entry["grid"]:
                have = list(entry["grid"])
                raise ValueError(f"--rows/--cols key {key!r} is not in the grid: {have}")
        for key, value in at.items():
            if key in (rows, cols) or value not in entry["grid"].get(key, []):
                allowed = [k for k in entry["grid"] if k not in (rows, cols)]
                raise ValueError(
                    f"--at {key}={value} is not allowed: name another grid key and one of its "
                    f"values as the grid writes it ({ {k: entry['grid'][k] for k in allowed} })"
                )
        points = [p for p in entry["points"] if _matches(p["point"], at)]
        cells: dict[tuple[str, str], dict] = {}
        for p in points:
            where = (p["point"][rows], p["point"][cols])
            if where in cells:
                first = cells[where]["point"]
                other = sorted(
                    k for k in {*p["point"], *first} if p["point"].get(k) != first.get(k)
                )
                raise ValueError(
                    f"two points in the cell {rows}={where[0]}, {cols}={where[1]}: they differ in "
                    f"{other}; fix it with --at KEY=VALUE"
                )
            cells[where] = p
        down = sorted({r for r, _ in cells}, key=_num)
        across = sorted({c for _, c in cells}, key=_num)
        others = [(k, v) for p in points for k, v in p["point"].items() if k not in (rows, cols)]
        fixed = sorted(set(others))  # the tuner's grids are products: one value each here
        head = row_label(entry["row"]) + "".join(f", {k}={v}" for k, v in fixed)
        short = lambda k: k.split(".")[-1]  # noqa: E731
        lines = [
            head,
            "",
            f"| {short(rows)} \\ {short(cols)} | " + " | ".join(across) + " |",
            "|---" * (len(across) + 1) + "|",
        ]
        for r in down:
            found = [cells.get((r, c)) for c in across]
            chosen = [p is not None and p["point"] == entry["chosen"] for p in found]
            text = [
                "" if p is None else cell_text(p["values"], c, digits, per_seed)
                for p, c in zip(found, chosen, strict=True)
            ]
            lines.append(f"| {r} | " + " | ".join(text) + " |")
        out.append("\n".join(lines))
    if not out:
        raise ValueError(f"--row {row} matches no tuned row: {[e['row'] for e in tuned['rows']]}")
    return "\n\n".join(out)


def _pairs(flag: str, texts: list[str]) -> dict[str, str]:
    pairs = {}
    for t in texts:
        key, eq, value = t.partition("=")
        if not eq or not key:
            raise ValueError(f"{flag}={t!r} is not allowed: write KEY=VALUE")
        pairs[key] = value
    return pairs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedjax_semi.results.tune_grid")
    p.add_argument("tuned", type=Path, help="a tuned.json that fedjax-semi-tune wrote")
    p.add_argument("--rows", required=True, help="the grid key laid down the table")
    p.add_argument("--cols", required=True, help="the grid key laid across")
    p.add_argument(
        "--row",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only the tuned rows with this label (repeat)",
    )
    p.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only the points with this value of another grid key (repeat)",
    )
    p.add_argument("--digits", type=int, default=3, help="decimals (default 3)")
    p.add_argument("--per-seed", action="store_true", help="each seed's value in brackets")
    a = p.parse_args(argv)
    try:
        tuned = json.loads(a.tuned.read_text())
        if not isinstance(tuned, dict) or "rows" not in tuned:
            raise ValueError(f"{a.tuned} is not a tuned.json (no 'rows'): the tuner writes one")
        row, at = _pairs("--row", a.row), _pairs("--at", a.at)
        text = grid_table(tuned, a.rows, a.cols, row, at, a.digits, a.per_seed)
    except (OSError, ValueError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
