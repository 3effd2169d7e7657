"""Ada-FedSemi's run directories as the tables read them (`fedjax-semi-ada-table`,
`python -m fedjax_semi.results.ada_arms`): each run's method name and (P, C) cell, its rows up to
its first `done`, per-seed statistics against targets and budgets, the settings the runs agree
on, and the Markdown cells the tables share."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedjax_semi.results.report import eval_rows, mean_std
from fedjax_semi.results.sweep_runs import grouped_runs

TIME, TRAFFIC = "cum_time_min", "cum_traffic_gb"


def _bad(flag: str, value, allowed: str) -> ValueError:
    return ValueError(f"{flag}={value!r} is not allowed: {allowed}")


# ----------------------------------------------------------------------------- one run


def method_name(cfg: dict) -> str:
    """Ada-FedSemi, HeteroAda-FedSemi, Semi-HFL, FedSemi-P-C or FedAvg-P (fedavg_p, or fedsemi
    at C = 1.0: the same run)."""
    a = cfg.get("algorithm", {})
    p, c = a.get("fixed_p"), a.get("fixed_c")
    if a.get("name") == "semi_hfl":
        return "Semi-HFL"
    if a.get("name") in ("ada_fedsemi", "hetero_ada"):
        knobs = (("P", p, a.get("adaptive_p", True)), ("C", c, a.get("adaptive_c", True)))
        fixed = [f"{k} = {v:g}" for k, v, adaptive in knobs if not adaptive]
        name = "Ada-FedSemi" if a["name"] == "ada_fedsemi" else "HeteroAda-FedSemi"
        return name + (f" ({', '.join(fixed)})" if fixed else "")
    if a.get("name") == "fedavg_p" or (a.get("name") == "fedsemi" and c == 1.0):
        return f"FedAvg-{p:g}"
    if a.get("name") == "fedsemi":
        return f"FedSemi-{p:g}-{c:g}"
    return str(a.get("name"))


def method_names(configs: list[dict]) -> list[str]:
    """Each run group's method name; groups of one method are told apart by the algorithm
    knobs whose values differ between them (e.g. "Ada-FedSemi (psi=1, q0=300)")."""
    names = [method_name(c) for c in configs]
    out = []
    for n, c in zip(names, configs, strict=True):
        same = [d.get("algorithm", {}) for m, d in zip(names, configs, strict=True) if m == n]
        if len(same) > 1:
            alg = c.get("algorithm", {})
            keys = sorted({k for a in same for k in a if len({repr(b.get(k)) for b in same}) > 1})
            n += " (" + ", ".join(f"{k}={alg.get(k):g}" if isinstance(alg.get(k), float) else
                                  f"{k}={alg.get(k)}" for k in keys) + ")"  # fmt: skip
        out.append(n)
    return out


def cell_of(cfg: dict) -> tuple[float, float] | None:
    """(P, C) of a run with both fixed (FedSemi-P-C, FedAvg-P: C = 1.0), else None."""
    a = cfg.get("algorithm", {})
    if a.get("name") in ("fedsemi", "fedavg_p"):
        return float(a["fixed_p"]), float(a["fixed_c"])
    return None


def run_rows(run: dict) -> list[dict]:
    """One seed's rows of rounds 1 .. its first `done` (after it the state is frozen and the
    rows repeat the last one)."""
    rows = [r for r in eval_rows(run["dir"]) if r.get("round", 0) >= 1]
    if not rows or any(TIME not in r or TRAFFIC not in r for r in rows):
        raise ValueError(
            f"run {str(run['dir'])!r}: metrics.jsonl lacks {TIME} / {TRAFFIC} (the rows of "
            "ada_fedsemi, fedsemi, fedavg_p, hetero_ada and semi_hfl)"
        )
    end = next((i for i, r in enumerate(rows) if r.get("done")), len(rows) - 1)
    return rows[: end + 1]


def run_stats(
    run: dict, targets: list[float], time_budget: float, traffic_budget: float,
    rows: list[dict] | None = None,
) -> dict:  # fmt: skip
    """One seed: best test accuracy (%) within the budgets, and per target the (time [min],
    traffic [GB]) at the first round at test accuracy >= target (None if never), the P and C
    drawn each round. `rows`: the run's `run_rows`, when the caller has read them already."""
    rows = run_rows(run) if rows is None else rows
    evals = [r for r in rows if r.get("accuracy") is not None]
    within = [r for r in evals if r[TIME] <= time_budget and r[TRAFFIC] <= traffic_budget]
    reach = {}
    for t in targets:
        hit = next((r for r in evals if 100 * r["accuracy"] >= t), None)
        reach[t] = None if hit is None else (float(hit[TIME]), float(hit[TRAFFIC]))
    return {
        "best": max((100 * r["accuracy"] for r in within), default=math.nan),
        "reach": reach,
        "P": [r["P"] for r in rows if "P" in r],
        "C": [r["C"] for r in rows if "C" in r],
    }


# ----------------------------------------------------------------------------- settings


def _agreed(runs: list[dict], key: str, flag: str, given):
    """A CLI value, else the one value of algorithm.<key> every run agrees on."""
    if given is not None:
        return given
    values = {r["config"].get("algorithm", {}).get(key) for r in runs}
    if len(values) > 1:
        raise _bad(flag, None, f"the runs disagree on algorithm.{key} ({sorted(map(str, values))})")
    return values.pop()


def _settings(runs, target, time_budget, traffic_budget, alpha=None) -> tuple:
    """Checked (target or None, time budget, traffic budget, alpha or None): the CLI's or the
    runs'. Budgets: > 0, time required, traffic infinite when none."""
    target = _agreed(runs, "target_acc", "--target", target)
    t_budget = _agreed(runs, "time_budget_min", "--time-budget", time_budget)
    b_budget = _agreed(runs, "traffic_budget_gb", "--traffic-budget", traffic_budget)
    if t_budget is None:
        raise _bad("--time-budget", None, "minutes > 0 (the runs set no algorithm.time_budget_min)")
    for flag, v in (("--time-budget", t_budget), ("--traffic-budget", b_budget)):
        if v is not None and not (isinstance(v, int | float) and v > 0):
            raise _bad(flag, v, "a budget > 0")
    if target is not None and not (isinstance(target, int | float) and 0 < target <= 100):
        raise _bad("--target", target, "a test accuracy in (0, 100] (%)")
    if alpha is not None and not (isinstance(alpha, int | float) and 0 <= alpha <= 1):
        raise _bad("--alpha", alpha, "a number in [0, 1] (Eq. 10)")
    return target, float(t_budget), math.inf if b_budget is None else float(b_budget), alpha


def _groups(root: Path) -> list[tuple[str, list[dict]]]:
    if not Path(root).is_dir():
        raise _bad("sweep_dir", str(root), "an existing directory of runs")
    return list(grouped_runs(root).items())


# ----------------------------------------------------------------------------- formatting


def _ms(values: list[float], digits: int | None = None) -> str:
    """Mean ± std; digits None: three significant digits of the mean (296, 30.5, 1.04, 0.020)."""
    mu, sd = mean_std(values)
    if digits is None:
        digits = 0 if mu == 0 else int(np.clip(2 - math.floor(math.log10(abs(mu))), 0, 3))
    return f"{mu:.{digits}f}" if len(values) == 1 else f"{mu:.{digits}f} ± {sd:.{digits}f}"


def _paper(value, digits: int = 1) -> str:
    if isinstance(value, list):
        return "–".join(f"{v:.{digits}f}" for v in value)
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 82.10 -> 82.1, 200 stays


def _reach_cell(stats: list[dict], t: float, k: int, budget: float) -> str:
    """Mean ± std over the seeds that reached target t (k: 0 time, 1 traffic); "(k/n)" when
    only k of the n seeds did, "†" when one of them did past the budget."""
    hits = [s["reach"][t][k] for s in stats if s["reach"][t] is not None]
    if not hits:
        return "-"
    text = _ms(hits) + ("" if len(hits) == len(stats) else f" ({len(hits)}/{len(stats)})")
    return text + (" †" if max(hits) > budget else "")


def _md(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]
