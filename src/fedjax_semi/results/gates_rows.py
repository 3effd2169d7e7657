"""The sanity gates on exported per-round rows (the `docs/results/*.jsonl` files that
`fedjax-semi-report --rows` writes: one JSON object per round with `setting` and `seed`), for
tables whose run directories are gone:

    python -m fedjax_semi.results.gates_rows docs/results/um_pfssl_table1_record_cpu.jsonl \
        --metric personal_acc --num-classes 10 [--budget-time 100 --last-k 3]

Each setting's value per seed is its final evaluation of the metric (or the mean of its last
`--last-k` evaluations within `--budget-time` simulated seconds), as fedjax-semi-report cuts it;
the gates are `results.gates.judge`'s. Rows written before the sanity columns get `collapse: n/a`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedjax_semi.results.gates import Gates, add_gate_flags, gates_from_args, judge, summary_line


def cut(rows: list[dict], metric: str, budget_time: float | None, last_k: int) -> dict | None:
    """One seed's rows (round order) -> the row keys at the cut: the mean of every numeric
    key over the last `last_k` evaluations of `metric` within the budget; None when none."""
    evals = [r for r in rows if r.get(metric) is not None]
    if budget_time is not None:
        evals = [r for r in evals if r.get("sim_time", 0.0) <= budget_time]
    if not evals:
        return None
    last = evals[-last_k:]
    keys = {k for r in last for k, v in r.items() if isinstance(v, int | float)}
    return {
        k: float(np.mean([r[k] for r in last if isinstance(r.get(k), int | float)])) for k in keys
    }


def flagged(
    rows: list[dict],
    metric: str,
    num_classes: int,
    gates: Gates,
    budget_time: float | None = None,
    last_k: int = 1,
) -> tuple[dict, str]:
    """(verdicts by setting, the summary line) of the exported rows."""
    by_run: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in rows:
        by_run[str(r["setting"]), int(r.get("seed", 0))].append(r)
    groups: dict[str, list[dict]] = defaultdict(list)
    for (setting, _), rs in sorted(by_run.items()):
        values = cut(sorted(rs, key=lambda r: r["round"]), metric, budget_time, last_k)
        if values is None:
            continue
        values.setdefault("num_classes", float(num_classes))  # old rows do not log K
        overrides = setting.split()
        alg = next((o.split("=", 1)[1] for o in overrides if o.startswith("algorithm=")), None)
        groups[setting].append(
            {
                "config": {"algorithm": {"name": alg}},
                "summary": {},
                "overrides": overrides,
                "values": values,
            }  # fmt: skip
        )
    verdicts = judge(groups, metric, lambda run, key: run["values"].get(key), gates, True)
    return verdicts, summary_line(verdicts, gates)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedjax_semi.results.gates_rows")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--metric", default="accuracy")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--budget-time", type=float, default=None)
    p.add_argument("--last-k", type=int, default=1)
    add_gate_flags(p)
    a = p.parse_args(argv)
    if a.num_classes < 2 or a.last_k < 1:
        p.error(f"--num-classes={a.num_classes} / --last-k={a.last_k}: need >= 2 / >= 1")
    try:
        gates = gates_from_args(a)
    except ValueError as e:
        p.error(str(e))
    if gates is None:
        p.error("--no-gates is not allowed: this command only applies the gates")
    for f in a.files:
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        verdicts, line = flagged(rows, a.metric, a.num_classes, gates, a.budget_time, a.last_k)
        print(f"## {f}")
        print(line)  # the flagged rows with their numbers; n/a gates are counted
    return 0


if __name__ == "__main__":
    sys.exit(main())
