"""Ada-FedSemi's tables from its runs (Xu et al., Secs. 5.3-5.5), with the paper's numbers that
the preset carries (its `paper:` rows) beside ours.

    fedjax-semi-ada-table grid DIR [--target T] [--time-budget MIN] [--traffic-budget GB]
        Tables 1-3: per fixed (P, C) cell, the best test accuracy within the budget and the time
        (min) and traffic (GB) to the first round at test accuracy >= T; Tables 4-6 from them:
        the cell of least Eq. 10 cost per alpha interval, with the breakpoints. DIR/ada_grid.md.
    fedjax-semi-ada-table cost DIR [--targets T1,T2] [--alpha A] [--time-budget MIN] ...
        Figs. 6-8 and Table 7: per method (Ada-FedSemi and the fixed baselines), the best test
        accuracy within the budgets and, per target, time, traffic and the weighted cost
        alpha time + (1 - alpha) traffic to it, a run that misses it within the budgets charged
        alpha T + (1 - alpha) B (Sec. 5.4); Ada-FedSemi's saving against each method.
        DIR/ada_cost.md and DIR/ada_cost.png (bars of the weighted cost).
    fedjax-semi-ada-table hetero DIR --targets T1,T2 [--time-budget MIN]
        Figs. 16-17: HeteroAda-FedSemi against Ada-FedSemi, the mean round time, the waiting
        ratio, the minutes to each target and the paired speed-up (results/ada_hetero.py).
    fedjax-semi-ada-table teacher DIR [--time-budget MIN]
        Fig. 15: the teacher's test accuracy against the global model's, final, step to step
        and largest drop (results/ada_teacher.py).

Each seed's run directory (a seed_<s>/ of replicas, or a run) is read as `fedjax-semi-report`
finds and groups it (`sweep_runs.grouped_runs`: the seeds of one setting together). Its rows come
from metrics.jsonl: the test accuracy `accuracy` and the cumulative `cum_time_min`,
`cum_traffic_gb` after each round. A run ends with its first `done` row (the round that spent
an algorithm budget); "within the budget" means a round that ended at or before it.
Targets and budgets default to the runs' algorithm.target_acc, .time_budget_min and
.traffic_budget_gb (the target is compared with *test* accuracy, the tables' metric).

Cells: mean ± std (sample std) over seeds. Time and traffic to a target are averaged over the
seeds that reached it, with "(k/n)" when only k of the n seeds did and "-" when none did; a time
past the budget is marked "†" (Table 3 prints one: 549 min under a 480-min budget).
Tables 4-6 use the cells every seed of which reached the target.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from fedjax_semi.results.ada_hetero import hetero
from fedjax_semi.results.ada_runs import (
    _agreed,
    _bad,
    _groups,
    _md,
    _ms,
    _paper,
    _reach_cell,
    _settings,
    cell_of,
    method_names,
    run_stats,
)
from fedjax_semi.results.ada_teacher import teacher
from fedjax_semi.results.report import _paper_value
from fedjax_semi.systems.ada_cost import best_cell, run_cost

# ----------------------------------------------------------------------------- Tables 4-6


def alpha_intervals(
    time_min: npt.ArrayLike, traffic_gb: npt.ArrayLike
) -> list[tuple[float, float, int]]:
    """Tables 4-6: [(alpha_lo, alpha_hi, cell)] covering [0, 1], the cell of least
    alpha t + (1 - alpha) b (`ada_cost.best_cell`) on each interval, adjacent intervals with
    different cells. time_min, traffic_gb float [K], NaN where the target was not reached.

    The cells' costs are lines in alpha, so the optimum can change only where two of them
    cross: alpha = (b_j - b_i) / ((t_i - b_i) - (t_j - b_j)). Between consecutive crossings one
    cell is best throughout; best_cell picks it at the midpoint. The breakpoints are exact.
    """
    t, b = np.asarray(time_min, np.float64), np.asarray(traffic_gb, np.float64)
    ok = np.flatnonzero(~(np.isnan(t) | np.isnan(b)))
    if len(ok) == 0:
        return []
    edges = {0.0, 1.0}
    for n, i in enumerate(ok):
        for j in ok[n + 1 :]:
            slope = (t[i] - b[i]) - (t[j] - b[j])
            if slope != 0 and 0 < (a := (b[j] - b[i]) / slope) < 1:
                edges.add(float(a))
    edges = sorted(edges)
    mids = jnp.asarray([(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:], strict=True)])
    best = np.asarray(jax.vmap(best_cell, in_axes=(None, None, 0))(t, b, mids))
    out: list[tuple[float, float, int]] = []
    for lo, hi, cell in zip(edges[:-1], edges[1:], best.tolist(), strict=True):
        if out and out[-1][2] == cell:
            out[-1] = (out[-1][0], hi, cell)
        else:
            out.append((lo, hi, cell))
    return out


def _intervals_md(cells: list[tuple[float, float]], time_min, traffic_gb) -> list[str]:
    parts = alpha_intervals(time_min, traffic_gb)
    if not parts:
        return ["(no cell reached the target)"]
    ranges = [f"[{lo:.4g}, {hi:.4g}{']' if hi == 1 else ')'}" for lo, hi, _ in parts]
    best = [f"({cells[c][0]:g}, {cells[c][1]:g})" for _, _, c in parts]
    return _md(["α", *ranges], [["optimal (P, C)", *best]])


# ----------------------------------------------------------------------------- the grid


def grid(
    root: Path,
    target: float | None = None,
    time_budget: float | None = None,
    traffic_budget: float | None = None,
) -> str:
    """Tables 1-3 and 4-6 as Markdown (also written to root/ada_grid.md); see the module doc."""
    groups = _groups(root)
    runs = [r for _, rs in groups for r in rs]
    target, t_budget, b_budget, _ = _settings(runs, target, time_budget, traffic_budget)
    if target is None:
        raise _bad("--target", None, "a test accuracy in (0, 100] (the runs set no target_acc)")
    by_cell: dict[tuple[float, float], tuple[str, list[dict]]] = {}
    for label, rs in groups:
        cell = cell_of(rs[0]["config"])
        if cell is None:
            continue  # an Ada-FedSemi run in the folder: not a cell of the grid
        if cell in by_cell:
            raise ValueError(
                f"two settings give the cell (P, C) = {cell}: {by_cell[cell][0]!r} and {label!r}"
            )
        by_cell[cell] = (label, rs)
    if not by_cell:
        raise _bad("sweep_dir", str(root), "a folder of fedsemi / fedavg_p runs (fixed P and C)")
    stats = {
        c: [run_stats(r, [target], t_budget, b_budget) for r in rs]
        for c, (_, rs) in by_cell.items()
    }
    ps, cs = sorted({p for p, _ in by_cell}), sorted({c for _, c in by_cell})
    paper = next((r["config"].get("paper") for r in runs if r["config"].get("paper")), None)
    tg = f"{target:g}"

    def paper_of(cell, key):
        return _paper_value(paper, by_cell[cell][1][0]["config"], key) if paper else None

    def table(what: str, fmt) -> list[str]:
        rows = []
        for c in cs:
            row = [f"{c:g}"]
            for p in ps:
                row.append(fmt((p, c)) if (p, c) in by_cell else "")
            rows.append(row)
        return [what, "", *_md(["C \\ P", *(f"{p:g}" for p in ps)], rows), ""]

    def acc(cell):
        text = _ms([s["best"] for s in stats[cell]], 1)
        if paper:
            pv, ps_ = paper_of(cell, "best_acc"), paper_of(cell, "best_acc_std")
            text += f" [{_paper(pv)}{'' if ps_ is None else f' ± {_paper(ps_)}'}]"
        return text

    def reach(k: int, digits: int, key: str, budget: float):
        def fmt(cell):
            text = _reach_cell(stats[cell], target, k, budget)
            return text + (f" [{_paper(paper_of(cell, key), digits)}]" if paper else "")

        return fmt

    seeds = sorted({len(s) for s in stats.values()})
    head = [
        f"Budget {t_budget:g} min{'' if math.isinf(b_budget) else f', {b_budget:g} GB'}; target "
        f"{tg}% test accuracy; seeds per cell: {', '.join(map(str, seeds))}."
        + (" [The paper's number; - where it gives none.]" if paper else ""),
        "",
    ]
    out = head + table(f"(a) Best test accuracy (%) within {t_budget:g} min", acc)
    out += table(f"(b) Time (min) to {tg}%", reach(0, 0, f"time_{tg}", t_budget))
    out += table(f"(c) Traffic (GB) to {tg}%", reach(1, 2, f"traffic_{tg}", b_budget))
    cells = sorted(by_cell)
    mean = lambda cell, k: (  # noqa: E731
        np.mean([s["reach"][target][k] for s in stats[cell]])
        if all(s["reach"][target] is not None for s in stats[cell])
        else np.nan
    )
    out += [
        "Optimal (P, C) per cost preference α (Tables 4-6; cells every seed of which "
        "reached the target)",
        "",
        *_intervals_md(cells, [mean(c, 0) for c in cells], [mean(c, 1) for c in cells]),
        "",
    ]
    if paper:
        pt = [paper_of(c, f"time_{tg}") for c in cells]
        pb = [paper_of(c, f"traffic_{tg}") for c in cells]
        if any(v is not None for v in pt):
            f = lambda v: np.nan if v is None else float(v)  # noqa: E731
            out += [
                "The paper's, from its own cells of this grid:",
                "",
                *_intervals_md(cells, [f(v) for v in pt], [f(v) for v in pb]),
                "",
            ]
    text = "\n".join(out)
    (Path(root) / "ada_grid.md").write_text(text)
    return text


# ----------------------------------------------------------------------------- Figs. 6-8


def cost(
    root: Path,
    targets: list[float] | None = None,
    alpha: float | None = None,
    time_budget: float | None = None,
    traffic_budget: float | None = None,
    plot: bool = True,
    ada_name: str | None = None,
) -> str:
    """Figs. 6-8 / Table 7 as Markdown (root/ada_cost.md) and bars (root/ada_cost.png).
    "Ada's saving" is against ada_name's row (a name as the table prints it), or against the
    one Ada-FedSemi row when there is one."""
    groups = _groups(root)
    runs = [r for _, rs in groups for r in rs]
    alpha = _agreed(runs, "alpha", "--alpha", alpha)
    target, t_budget, b_budget, alpha = _settings(runs, None, time_budget, traffic_budget, alpha)
    targets = list(targets) if targets else ([target] if target is not None else [])
    if not targets:
        raise _bad("--targets", None, "test accuracies in (0, 100] (the runs set no target_acc)")
    for t in targets:
        if not (isinstance(t, int | float) and 0 < t <= 100):
            raise _bad("--targets", t, "test accuracies in (0, 100] (%)")
    names = method_names([rs[0]["config"] for _, rs in groups])
    ada = _ada_row(names, ada_name)
    stats = [[run_stats(r, targets, t_budget, b_budget) for r in rs] for _, rs in groups]
    paper = next((r["config"].get("paper") for r in runs if r["config"].get("paper")), None)
    pv = lambda i, key: (  # noqa: E731
        _paper_value(paper, groups[i][1][0]["config"], key) if paper else None
    )

    def within(st: dict, t: float) -> bool:
        hit = st["reach"][t]
        return hit is not None and hit[0] <= t_budget and hit[1] <= b_budget

    def charged(st: dict, t: float) -> float:  # Sec. 5.4: a miss costs the budgets
        ok = within(st, t)
        spent = st["reach"][t] if ok else (0.0, 0.0)
        return float(run_cost(ok, *spent, alpha, t_budget, b_budget))

    costs = {t: [[charged(s, t) for s in st] for st in stats] for t in targets}
    head = [
        "method",
        "seeds",
        f"best test acc (%) within {t_budget:g} min",
        "P mean / modal",
        "C mean",
    ] + (["paper best acc"] if paper else [])
    rows = []
    for i, (name, st) in enumerate(zip(names, stats, strict=True)):
        p_all = [p for s in st for p in s["P"]]
        modal = Counter(round(p, 2) for p in p_all).most_common(1)[0][0] if p_all else math.nan
        c_all = [c for s in st for c in s["C"]]
        row = [
            name,
            str(len(st)),
            _ms([s["best"] for s in st], 1),
            f"{np.mean(p_all):.2f} / {modal:g}" if p_all else "-",
            f"{np.mean(c_all):.3f}" if c_all else "-",
        ]
        if paper:
            a, s = pv(i, "best_acc"), pv(i, "best_acc_std")
            row.append("-" if a is None else _paper(a) + ("" if s is None else f" ± {_paper(s)}"))
        rows.append(row)
    budget = f"{t_budget:g} min" + ("" if math.isinf(b_budget) else f" and {b_budget:g} GB")
    out = [
        f"alpha = {alpha:g}; budgets {budget}; a run missing a target within them is charged "
        f"alpha T + (1 - alpha) B.",
        "",
        *_md(head, rows),
        "",
    ]
    for t in targets:
        tg = f"{t:g}"
        head = ["method", f"time (min) to {tg}%", f"traffic (GB) to {tg}%", "weighted cost"]
        head += ["Ada's saving"] if ada is not None else []
        head += ["paper cost", "paper saving"] if paper else []
        rows = []
        for i, (name, st) in enumerate(zip(names, stats, strict=True)):
            miss = sum(not within(s, t) for s in st)
            finite = np.isfinite(costs[t][i]).all()  # a miss without a traffic budget: inf
            row = [
                name,
                _reach_cell(st, t, 0, t_budget),
                _reach_cell(st, t, 1, b_budget),
                (_ms(costs[t][i]) if finite else "∞") + (f" ({miss} charged)" if miss else ""),
            ]
            if ada is not None:
                save = 1 - np.mean(costs[t][ada]) / np.mean(costs[t][i])
                row.append(
                    "" if i == ada or not (finite and np.isfinite(save)) else f"{100 * save:.0f}%"
                )
            if paper:
                sv = pv(i, f"saving_{tg}")
                row += [_paper(pv(i, f"cost_{tg}"), 2), "-" if sv is None else f"{100 * sv:.0f}%"]
            rows.append(row)
        out += [f"Target {tg}% test accuracy", "", *_md(head, rows), ""]
    text = "\n".join(out)
    (Path(root) / "ada_cost.md").write_text(text)
    if plot:
        _bars(Path(root) / "ada_cost.png", names, targets, costs, alpha)
    return text


def _ada_row(names: list[str], ada_name: str | None) -> int | None:
    """The row the savings are against: ada_name's, else the plain "Ada-FedSemi" (both knobs
    adaptive), else the only row of Ada-FedSemi's name, else None."""
    if ada_name is not None:
        if ada_name not in names:
            raise _bad("--ada", ada_name, f"a method of the table ({names})")
        return names.index(ada_name)
    if "Ada-FedSemi" in names:
        return names.index("Ada-FedSemi")
    ada = [i for i, n in enumerate(names) if n.startswith("Ada-FedSemi (")]
    return ada[0] if len(ada) == 1 else None


def _bars(path: Path, names: list[str], targets: list[float], costs: dict, alpha: float) -> None:
    """One panel per target: the mean weighted cost per method, the seeds' std as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(4.5, 1.2 + 0.5 * len(names))  # one panel a row: a 20-cell grid stays legible
    fig, axes = plt.subplots(len(targets), 1, figsize=(width, 3.8 * len(targets)), squeeze=False)
    for ax, t in zip(axes[:, 0], targets, strict=True):
        vals = [np.asarray(v) for v in costs[t]]
        x = np.arange(len(names))
        finite = [bool(np.isfinite(v).all()) for v in vals]  # an infinite charge draws no bar
        pairs = list(zip(vals, finite, strict=True))
        height = [v.mean() if f else 0.0 for v, f in pairs]
        err = [v.std(ddof=1) if f and len(v) > 1 else 0.0 for v, f in pairs]
        color = ["tab:red" if n.startswith("Ada-FedSemi") else "tab:gray" for n in names]
        ax.bar(x, height, yerr=err, color=color, capsize=3)
        for xi, f in zip(x, finite, strict=True):
            if not f:
                ax.annotate("∞", (xi, 0), ha="center", va="bottom")
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"to {t:g}% test accuracy")
        ax.set_ylabel(f"weighted cost (α = {alpha:g}; min, GB)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- CLI


def _floats(flag: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise _bad(flag, text, "comma-separated numbers, e.g. 75,80") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="fedjax-semi-ada-table",
        description="Ada-FedSemi's tables: the (P, C) grid (Tables 1-6), the weighted-cost "
        "comparison (Figs. 6-8, Table 7), HeteroAda against Ada (Figs. 16-17) or the teacher "
        "against the global model (Fig. 15), with the paper's numbers beside ours.",
    )
    ap.add_argument("table", choices=("grid", "cost", "hetero", "teacher"))
    ap.add_argument("sweep_dir", type=Path, help="a multirun directory (or any folder of runs)")
    ap.add_argument("--target", type=float, default=None, help="grid: test accuracy (%%)")
    ap.add_argument("--targets", default=None, help="cost, hetero: accuracies (%%), e.g. 75,80")
    ap.add_argument("--alpha", type=float, default=None, help="cost: Eq. 10's alpha")
    ap.add_argument("--time-budget", type=float, default=None, help="minutes")
    ap.add_argument("--traffic-budget", type=float, default=None, help="GB")
    ap.add_argument("--ada", default=None, help="cost: the row Ada's saving is against")
    args = ap.parse_args(argv)
    try:
        if args.table == "grid":
            text = grid(args.sweep_dir, args.target, args.time_budget, args.traffic_budget)
        elif args.table == "teacher":
            text = teacher(args.sweep_dir, args.time_budget)
        elif args.table == "hetero":
            text = hetero(args.sweep_dir, _floats("--targets", args.targets), args.time_budget)
        else:
            targets = _floats("--targets", args.targets)
            text = cost(
                args.sweep_dir, targets, args.alpha, args.time_budget, args.traffic_budget,
                ada_name=args.ada,
            )  # fmt: skip
    except ValueError as e:
        print(f"fedjax-semi-ada-table: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(text)


if __name__ == "__main__":
    main()
