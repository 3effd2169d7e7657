"""Tables from exported per-round rows (the `docs/results/*.jsonl` files that
`fedjax-semi-report --rows` writes: one JSON object per round with `setting` and `seed`), for
tables whose run directories are gone and for tables that join runs made at different times:

    python -m fedjax_semi.results.rows_table docs/results/um_pfssl_table1_record_alpha05_cpu.jsonl \
        NEW_ROWS.jsonl --metrics personal_acc,comm_cost --setting algorithm=um_pfssl_record \
        --setting algorithm.refresh_period=5 --paired-to algorithm=um_pfssl_record

Each setting's value per seed is cut as fedjax-semi-report cuts a run directory (`cut_rows`):
its final evaluation of each metric, or the mean of its last `--last-k` evaluations within
`--budget-time` simulated seconds / `--budget-rounds` rounds. Prints the mean ± std table, the
first metric per seed, and with `--paired-to` the differences seed by seed (`paired_lines`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from fedjax_semi.results.paired import paired_lines, reference_setting
from fedjax_semi.results.report import (
    _check_cut,
    cut_rows,
    cut_tag,
    fmt_mean_std,
    is_fraction,
    mean_std,
    metric_header,
)

Runs = dict[str, dict[int, list[dict]]]  # setting -> seed -> rows in round order


def load_runs(files: list[Path]) -> Runs:
    """The rows of every file, grouped by setting and seed (a round logged twice within one
    file: the later row wins, as for a resumed run). A (setting, seed) present in two files
    is an error: the table would not know which run it reads."""
    runs: Runs = defaultdict(dict)
    origin: dict[tuple[str, int], Path] = {}
    for f in files:
        by_run: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
        for n, line in enumerate(Path(f).read_text().splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "setting" not in row or "round" not in row:
                raise ValueError(f"{f}:{n}: a row without `setting` or `round` (not an export)")
            by_run[str(row["setting"]), int(row.get("seed", 0))][int(row["round"])] = row
        for key, rounds in by_run.items():
            if key in origin:
                raise ValueError(
                    f"setting {key[0]!r} seed {key[1]} is in both {origin[key]} and {f}: "
                    "each run may come from one file only"
                )
            origin[key] = Path(f)
            runs[key[0]][key[1]] = [rounds[t] for t in sorted(rounds)]
    return runs


def rows_table(
    runs: Runs,
    metrics: list[str],
    settings: list[str] | None = None,
    paired_to: str | None = None,
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
    decimals: int = 2,
) -> str:
    """Markdown: per setting (``settings`` in that order, default all), the seeds and each
    metric's mean ± std over seeds at the cut; the first metric per seed; with ``paired_to``
    (``key=value`` tokens that one setting holds, as for fedjax-semi-report) every other
    setting minus it, seed by seed. Percentages to ``decimals`` places: a document quotes the
    digits printed, never a rounding of them (13.9475 printed 13.95 would become 14.0)."""
    _check_cut(budget_time, budget_rounds, last_k)
    if not (isinstance(decimals, int) and 0 <= decimals <= 6):
        raise ValueError(f"--decimals={decimals!r} is not allowed: an integer in 0..6")
    labels = list(settings or runs)
    for label in labels:
        if label not in runs:
            raise ValueError(
                f"setting {label!r} is not allowed: the rows hold {' | '.join(sorted(runs))}"
            )
    if paired_to:  # key=value tokens, as fedjax-semi-report --paired-to reads them
        paired_to = reference_setting(list(runs), paired_to.split())
        labels += [] if paired_to in labels else [paired_to]

    def at_cut(rows: list[dict], m: str) -> float | None:
        got = cut_rows(rows, m, budget_time, budget_rounds, last_k, where=f"the rows of {m!r}")
        return None if got is None else got[0]

    values = {
        (label, m): {s: at_cut(rows, m) for s, rows in sorted(runs[label].items())}
        for label in labels
        for m in metrics
    }
    pct = {
        m: is_fraction([v for lab in labels for v in values[lab, m].values() if v is not None], m)
        for m in metrics
    }
    tag = cut_tag(budget_time, budget_rounds, last_k)
    header = ["setting", "seeds"] + [metric_header(m, tag, pct[m]) for m in metrics]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in labels:
        cells = [label, str(len(runs[label]))]
        for m in metrics:
            got = [v for v in values[label, m].values() if v is not None]
            n = "" if len(got) == len(runs[label]) else f" (n={len(got)})"
            cells.append(f"{fmt_mean_std(*mean_std(got), pct[m], decimals)}{n}" if got else "–")
        md.append("| " + " | ".join(cells) + " |")
    first = metrics[0]
    md += ["", f"{first} per seed:"]
    for label in labels:
        per_seed = ", ".join(
            "–" if v is None else f"{100 * v:.{decimals}f}" if pct[first] else f"{v:.6g}"
            for v in values[label, first].values()
        )
        md.append(f"* {label}: {per_seed}")
    if paired_to:
        seeded = {label: list(values[label, first].items()) for label in labels}
        md += ["", f"Reference: {paired_to}", ""] + paired_lines(seeded, paired_to, first, decimals)
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedjax_semi.results.rows_table")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--metrics", default="accuracy", help="comma-separated metrics")
    p.add_argument("--setting", action="append", help="a setting label to tabulate (repeat)")
    p.add_argument("--paired-to", default=None, help="KEY=VALUE tokens of the reference setting")
    p.add_argument("--budget-time", type=float, default=None)
    p.add_argument("--budget-rounds", type=int, default=None)
    p.add_argument("--last-k", type=int, default=None)
    p.add_argument("--decimals", type=int, default=2, help="places of a percentage (default 2)")
    a = p.parse_args(argv)
    metrics = [m for m in a.metrics.split(",") if m]
    if not metrics:
        p.error(f"--metrics={a.metrics!r} is not allowed: name at least one metric")
    try:
        runs = load_runs(a.files)
        text = rows_table(
            runs,
            metrics,
            a.setting,
            a.paired_to,
            a.budget_time,
            a.budget_rounds,
            a.last_k,
            a.decimals,
        )
    except (OSError, ValueError) as e:
        p.error(str(e))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
