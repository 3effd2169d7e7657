"""Tables from a sweep: group runs by their overrides (seed excluded), mean +- std over seeds.

By default a run's value is its final evaluation (summary.json). For tables of record that
compare methods at an equal budget, ``report(budget_time=S)`` / ``budget_rounds=R`` take each
run's last evaluation at or before simulated time S (``sim_time``) / round R from its
metrics.jsonl, and ``last_k=K`` the mean over the last K evaluations within the budget (for
methods whose accuracy oscillates). ``fa_rule=(plateau, patience, min_rounds)`` replays
DoFed-SPP's FA stopping rule (the engine's own `EarlyStopper`) on the first metric's recorded
curve and cuts each run where the rule would have stopped it, so one set of budget runs also
gives the paper's stop-on-plateau table. The std over seeds is the sample std (ddof=1).

With ``gates`` (on in fedjax-semi-report unless --no-gates) a `gates` column flags rows whose
models look broken: at chance, collapsed onto one class, below the table's Local row
(results/gates.py, docs/gates.md); a `mechanism` column shows the methods' mechanism metrics.

An experiment config may carry the paper's numbers as
    paper: [{where: {algorithm.name: fedavg, partition.alpha: 0.5}, accuracy: 0.71}, ...]
and the report prints them beside ours.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from fedjax_semi.results.gates import Gates, judge, mechanism_names, mechanism_values, summary_line
from fedjax_semi.results.sweep_runs import _get, default_values, grouped_runs, unfinished_runs


def export_rows(root: Path, out: Path) -> int:
    """Every evaluated or trained round of every run under root as one JSON line, tagged with
    its setting and seed, scalars only (per-client lists such as cohorts are dropped): the
    per-round rows a results document commits beside its tables. Returns the row count."""
    n = 0
    with open(out, "w") as f:
        for setting, runs in grouped_runs(root).items():
            for r in runs:
                seed = _get(r["config"], "seed")
                for row in eval_rows(r["dir"]):
                    keep = {k: v for k, v in row.items() if isinstance(v, int | float | str | bool)}
                    f.write(json.dumps({"setting": setting, "seed": seed, **keep}) + "\n")
                    n += 1
    return n


def _paper_value(paper, cfg: dict, metric: str):
    for row in paper or []:
        where = row.get("where", {})
        if all(str(_get(cfg, k)) == str(v) for k, v in where.items()) and metric in row:
            return row[metric]
    return None


def mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


NOT_SHARES = frozenset({"loss", "lr"})  # name parts of metrics in [0, 1] that are not shares


def is_fraction(values: list[float], metric: str = "") -> bool:
    """Whether a metric's values are all in [0, 1] (accuracies, rates): the tables print those
    in percent and anything else (counts, costs, Corr) as logged. A loss or a learning rate (a
    name with a `_`-separated part in NOT_SHARES) is printed as logged even below 1."""
    if NOT_SHARES & set(metric.split("_")):
        return False
    return all(0.0 <= v <= 1.0 for v in values)


def fmt_mean_std(mu: float, sd: float, percent: bool, decimals: int = 2) -> str:
    d = decimals
    return f"{100 * mu:.{d}f} ± {100 * sd:.{d}f}" if percent else f"{mu:.6g} ± {sd:.3g}"


def _check_cut(
    budget_time: float | None,
    budget_rounds: int | None,
    last_k: int | None,
    fa_rule: tuple[float, int, int] | None = None,
) -> None:
    def bad(flag: str, value, allowed: str) -> ValueError:
        return ValueError(f"{flag}={value!r} is not allowed: {allowed}")

    if fa_rule is not None:
        ok = len(fa_rule) == 3 and fa_rule[0] > 0 and int(fa_rule[1]) >= 1 and int(fa_rule[2]) >= 0
        if not ok:
            raise bad(
                "--fa-rule",
                fa_rule,
                "PLATEAU,PATIENCE,MIN_ROUNDS with plateau > 0, "
                "patience >= 1 and min_rounds >= 0, e.g. 0.01,3,10",
            )

    if budget_time is not None and not (
        isinstance(budget_time, int | float) and np.isfinite(budget_time) and budget_time >= 0
    ):
        raise bad("--budget-time", budget_time, "a number of simulated seconds >= 0")
    for flag, v, lo in (("--budget-rounds", budget_rounds, 0), ("--last-k", last_k, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise bad(flag, v, f"an integer >= {lo}")


def cut_tag(
    budget_time: float | None,
    budget_rounds: int | None,
    last_k: int | None,
    fa_rule: tuple[float, int, int] | None = None,
) -> str:
    """The cut as the table headers name it (", last 3 evals, sim_time ≤ 100 s"; "" for none)."""
    what = []
    if last_k is not None:
        what.append(f"last {last_k} evals")
    if budget_time is not None:
        what.append(f"sim_time ≤ {budget_time:g} s")
    if budget_rounds is not None:
        what.append(f"round ≤ {budget_rounds}")
    if fa_rule is not None:
        what.append(f"FA rule ({fa_rule[0]:g}, {int(fa_rule[1]):d}, {int(fa_rule[2]):d})")
    return f", {', '.join(what)}" if what else ""


def metric_header(metric: str, tag: str, percent: bool) -> str:
    return f"{metric} (mean ± std{tag}{'' if percent else ', as logged'})"


def eval_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl, one per round (a resumed run's later row wins),
    in round order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise ValueError(
            f"run {str(run_dir)!r} has no metrics.jsonl: budget cuts, --last-k and the "
            "Ada-FedSemi tables read the evaluations from it"
        )
    by_round = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_round[row["round"]] = row
    return [by_round[t] for t in sorted(by_round)]


def cut_rows(
    rows: list[dict],
    metric: str,
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
    where: str = "the rows",
) -> tuple[float, int] | None:
    """One run's per-round rows (round order) -> ``metric`` at an equal budget: the mean over
    its last ``last_k`` (default 1) evaluations with ``sim_time <= budget_time`` and
    ``round <= budget_rounds`` (either cut optional). Returns (value, round of the last
    evaluation used), or None when no evaluation of the metric falls within the budget."""
    rows = [r for r in rows if r.get(metric) is not None]
    if budget_time is not None:
        if any(r.get("sim_time") is None for r in rows):
            raise ValueError(
                f"{where}: an evaluation without sim_time (--budget-time needs the simulated clock)"
            )
        rows = [r for r in rows if r["sim_time"] <= budget_time]
    if budget_rounds is not None:
        rows = [r for r in rows if r["round"] <= budget_rounds]
    if not rows:
        return None
    last = rows[-(last_k or 1) :]
    return float(np.mean([float(r[metric]) for r in last])), int(last[-1]["round"])


def cut_value(
    run_dir: Path,
    metric: str,
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
) -> tuple[float, int] | None:
    """`cut_rows` on a run directory's metrics.jsonl."""
    where = f"run {str(run_dir)!r}'s metrics.jsonl"
    return cut_rows(eval_rows(run_dir), metric, budget_time, budget_rounds, last_k, where)


def run_value(
    run: dict,
    metric: str,
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
) -> tuple[float, int | None] | None:
    """One run's value of ``metric`` (a `find_runs` entry): summary.json's final value, or with
    any cut given the `cut_value` (value, round at the cut); None when the run has none."""
    if budget_time is None and budget_rounds is None and last_k is None:
        v = run["summary"].get("final", {}).get(metric)
        return None if v is None else (float(v), None)
    return cut_value(run["dir"], metric, budget_time, budget_rounds, last_k)


def fa_stop_round(
    run_dir: Path,
    metric: str,
    fa_rule: tuple[float, int, int],
    budget_time: float | None = None,
) -> int | None:
    """The round at which the FA rule (|m_r - m_(r-1)| < plateau for `patience` evaluations in
    a row, after `min_rounds`) stops a run, replayed on its metrics.jsonl with the engine's
    EarlyStopper; None when it never fires (within the time budget, if one is given)."""
    from fedjax_semi.config import StopConfig
    from fedjax_semi.engine.loop import EarlyStopper

    plateau, patience, min_rounds = fa_rule
    stopper = EarlyStopper(
        StopConfig(
            metric=metric,
            plateau=float(plateau),
            patience=int(patience),
            min_rounds=int(min_rounds),
        )
    )
    for row in eval_rows(run_dir):
        if budget_time is not None and row.get("sim_time", 0.0) > budget_time:
            return None
        if row.get(metric) is not None and stopper.update(row["round"], float(row[metric])):
            return int(row["round"])
    return None


def report(
    root: Path,
    metrics: list[str],
    csv_path: Path | None = None,
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
    fa_rule: tuple[float, int, int] | None = None,
    gates: Gates | None = None,
) -> str:
    """The table: one row per setting, the seed count and mean ± std over seeds per metric
    (final evaluation, or the budget cut / last-k mean / FA-rule cut; see the module
    docstring). With ``fa_rule`` a run the rule never stops is read at the budget. With
    ``gates`` a `gates` column flags broken rows (results/gates.py), listed under the table;
    a `mechanism` column shows the methods' mechanism metrics where the summaries hold any."""
    _check_cut(budget_time, budget_rounds, last_k, fa_rule)
    cut = budget_time is not None or budget_rounds is not None or last_k is not None
    cut = cut or fa_rule is not None
    groups = grouped_runs(root)
    runs = [r for rs in groups.values() for r in rs]
    values: dict[tuple[int, str], tuple[float, int] | None] = {}
    stop_rounds: dict[int, int | None] = {}

    def value(r: dict, m: str) -> tuple[float, int] | None:  # (value, round at cut), cached
        if (id(r), m) not in values:
            values[id(r), m] = (
                cut_value(r["dir"], m, budget_time, stop_rounds[id(r)], last_k)
                if cut
                else run_value(r, m)
            )
        return values[id(r), m]

    for r in runs:
        stop_rounds[id(r)] = budget_rounds
        if fa_rule is not None:
            fa = fa_stop_round(r["dir"], metrics[0], fa_rule, budget_time)
            if fa is not None:
                stop_rounds[id(r)] = fa if budget_rounds is None else min(fa, budget_rounds)
        for m in metrics:
            value(r, m)
    metrics = [m for m in metrics if any(values[id(r), m] is not None for r in runs)]
    # A paper column only for the metrics the preset's paper rows give.
    paper_metrics = [
        m
        for m in metrics
        if any(_paper_value(r["config"].get("paper"), r["config"], m) is not None for r in runs)
    ]
    pct = {
        m: is_fraction([values[id(r), m][0] for r in runs if values[id(r), m]], m) for m in metrics
    }
    tag = cut_tag(budget_time, budget_rounds, last_k, fa_rule)
    header = ["setting", "seeds"] + [metric_header(m, tag, pct[m]) for m in metrics]
    if cut and metrics:
        header.append("round at cut (mean)")
    header += [f"paper {m}" for m in paper_metrics]
    mech = mechanism_names(runs)
    header += ["mechanism (final, mean)"] if mech else []
    verdicts = {}
    if gates is not None and metrics:
        verdicts = judge(
            groups, metrics[0], lambda r, k: (value(r, k) or (None,))[0], gates, pct[metrics[0]]
        )
        header.append("gates")
    rows, csv_rows = [], []
    for setting, rs in groups.items():
        cells, csv_row = [setting, str(len(rs))], {"setting": setting, "seeds": len(rs)}
        cut_rounds = []
        for m in metrics:
            got = [values[id(r), m] for r in rs]
            vals = [g[0] for g in got if g is not None]
            if m == metrics[0]:
                cut_rounds = [g[1] for g in got if g is not None]
            if vals:
                mu, sd = mean_std(vals)
                n = "" if len(vals) == len(rs) else f" (n={len(vals)})"
                cells.append(f"{fmt_mean_std(mu, sd, pct[m])}{n}")
                csv_row.update({f"{m}_mean": mu, f"{m}_std": sd, f"{m}_n": len(vals)})
            else:
                cells.append("–")
        if cut and metrics:
            cells.append(f"{np.mean(cut_rounds):.1f}" if cut_rounds else "–")
            if cut_rounds:
                csv_row["round_at_cut"] = float(np.mean(cut_rounds))
        for m in paper_metrics:
            pv = _paper_value(rs[0]["config"].get("paper"), rs[0]["config"], m)
            cells.append("–" if pv is None else f"{100 * pv:.2f}" if pct[m] else f"{pv:.6g}")
            csv_row[f"paper_{m}"] = pv
        if mech:
            got = mechanism_values(rs, mech)
            cells.append(", ".join(f"{k} {v:.4g}" for k, v in got.items()) or "–")
            csv_row.update({f"mechanism_{k}": v for k, v in got.items()})
        if verdicts:
            cells.append(verdicts[setting].cell)
            csv_row["gates"] = verdicts[setting].cell
        rows.append(cells)
        csv_rows.append(csv_row)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c) + " |" for c in rows]
    text = "\n".join(md)
    if verdicts:
        text += "\n\n" + summary_line(verdicts, gates)
    behind = default_values(groups)
    if behind:
        text += "\n\nBehind `default` (the preset and its tuned file, from run_config.json):\n"
        text += "\n".join(behind)
    left = unfinished_runs(root)
    text += f"\n\n{left}" if left else ""
    csv_path = csv_path or Path(root) / "report.csv"
    fields = sorted(
        {k for r in csv_rows for k in r}, key=lambda k: (k != "setting", k != "seeds", k)
    )
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(csv_rows)
    (Path(root) / "report.md").write_text(text + "\n")
    return text
