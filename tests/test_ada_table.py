"""fedjax-semi-ada-table (results/ada_table.py) on run directories written in the real format
(a replicas run's seed_<s>/ with metrics.jsonl, summary.json and .hydra/{config,overrides}.yaml):
Tables 1-3 cells, Tables 4-6 from them and from the paper's cells (acceptance check 16), the
Figs. 6-8 weighted cost with misses charged the budgets (check 17), and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedjax_semi.results import ada_runs, ada_table
from test_ada_cost import OPTIMA, P_COLS, TABLES

ALG = {
    "adaptive_p": False,
    "adaptive_c": False,
    "alpha": 0.5,
    "time_budget_min": 100.0,
    "traffic_budget_gb": None,
    "target_acc": 75.0,
}


def write_run(
    job: Path,
    seed: int,
    algorithm: dict,
    acc: list[float],
    minutes: float,
    gb: float,
    overrides: list[str],
    paper=None,
    done_at: int | None = None,
) -> None:
    """seed_<seed>/ of a replicas run: round k ends at k * minutes and k * gb, its test
    accuracy acc[k - 1] (a fraction); rows from done_at on are frozen, as the algorithm
    leaves them once a budget is spent."""
    d = job / f"seed_{seed}"
    (d / ".hydra").mkdir(parents=True)
    cfg = {"algorithm": {**ALG, **algorithm}, "seed": seed, "paper": paper}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"seed={seed}"]))
    rows, frozen = [], None
    for k, a in enumerate(acc, start=1):
        row = {
            "round": k,
            "accuracy": a,
            "cum_time_min": k * minutes,
            "cum_traffic_gb": k * gb,
            "P": algorithm.get("fixed_p", 0.5),
            "C": algorithm.get("fixed_c", 0.9),
            "done": done_at is not None and k >= done_at,
            "sim_time": 60 * k * minutes,
        }
        if frozen is not None:
            row.update({key: frozen[key] for key in ("accuracy", "cum_time_min", "cum_traffic_gb")})
        elif row["done"]:
            frozen = row
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"algorithm": algorithm["name"], "final": rows[-1]}))
    (job / "replicas.json").write_text(json.dumps({"seeds": [seed]}))


def fixed(p: float, c: float) -> dict:
    return {"name": "fedavg_p" if c == 1.0 else "fedsemi", "fixed_p": p, "fixed_c": c}


def ramp(first: int, top: float, n: int = 12) -> list[float]:
    """Test accuracy 0.5 until round first - 1, then 0.75 from round first, then top."""
    return [0.5 if k < first else (0.75 if k == first else top) for k in range(1, n + 1)]


# ----------------------------------------------------------------------------- grid


@pytest.fixture
def grid_dir(tmp_path):
    """A 2 x 2 grid + FedAvg row, 3 seeds a cell: 10 min and 1 GB a round per participant
    share; the cells reach 75% at known rounds."""
    paper = [
        {
            "where": {"algorithm.fixed_p": 0.5, "algorithm.fixed_c": 0.9},
            "best_acc": 83.3,
            "best_acc_std": 0.0,
            "time_75": 199,
            "traffic_75": 98,
        }
    ]
    job = 0
    for p in (0.2, 0.5):
        for c in (0.9, 0.95, 1.0):
            for s in range(3):
                first = {
                    (0.2, 0.9): 4,
                    (0.2, 0.95): 3,
                    (0.5, 0.9): 2,
                    (0.5, 0.95): 6,
                    (0.2, 1.0): 8,
                    (0.5, 1.0): 99,
                }[(p, c)]
                if (p, c) == (0.5, 0.95) and s == 2:
                    first = 99  # one seed of this cell never reaches 75%
                top = 0.80 + 0.01 * s
                write_run(
                    tmp_path / str(job),
                    s,
                    fixed(p, c),
                    ramp(first, top),
                    10.0,
                    p,
                    [f"algorithm.fixed_p={p}", f"algorithm.fixed_c={c}"],
                    paper,
                )
            job += 1
    return tmp_path


def test_grid_cells(grid_dir):
    text = ada_table.grid(grid_dir)
    assert (grid_dir / "ada_grid.md").read_text() == text
    lines = text.splitlines()

    def row(table: str, c: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith(table))
        line = next(x for x in lines[start:] if x.startswith(f"| {c} |"))
        return [cell.strip() for cell in line.strip("|").split("|")]

    # (a) best accuracy within 100 min: rounds 1-10 (round 11 ends at 110 min).
    assert row("(a)", "0.9")[1] == "81.0 ± 1.0 [-]"  # seeds 80, 81, 82 (P = 0.2); no paper cell
    assert row("(a)", "0.9")[2] == "81.0 ± 1.0 [83.3 ± 0]"  # the paper's cell beside ours
    assert row("(a)", "1")[2] == "50.0 ± 0.0 [-]"  # FedAvg-0.5 never leaves 50%
    # (b) time to 75% (three significant digits): P = 0.2, C = 0.9 at round 4 -> 40 min;
    # C = 0.95 (P = 0.5): 2 of 3 seeds.
    assert row("(b)", "0.9")[1] == "40.0 ± 0.0 [-]"
    assert row("(b)", "0.9")[2] == "20.0 ± 0.0 [199]"
    assert row("(b)", "0.95")[2] == "60.0 ± 0.0 (2/3) [-]"
    assert row("(b)", "1")[1:] == ["80.0 ± 0.0 [-]", "- [-]"]
    # (c) traffic: round k brings P GB in this fixture.
    assert row("(c)", "0.9")[1] == "0.800 ± 0.000 [-]"
    assert row("(c)", "0.9")[2] == "1.00 ± 0.00 [98]"
    assert "seeds per cell: 3" in text


def test_grid_tables_4_to_6_from_our_cells(grid_dir):
    """Cells every seed of which reached 75%: (0.2, 0.9) 40 min / 0.8 GB, (0.2, 0.95) 30 / 0.6,
    (0.5, 0.9) 20 / 1.0, (0.2, 1.0) 80 / 1.6. alpha t + (1 - alpha) b: (0.2, 0.95) wins for
    alpha < 0.4 / 10.4 = 0.03846 (where it meets (0.5, 0.9)), (0.5, 0.9) above."""
    text = ada_table.grid(grid_dir)
    part = text[text.index("Optimal (P, C)") :].splitlines()
    assert part[2] == "| α | [0, 0.03846) | [0.03846, 1] |"
    assert part[4] == "| optimal (P, C) | (0.2, 0.95) | (0.5, 0.9) |"


@pytest.mark.parametrize("dataset", sorted(TABLES))
def test_alpha_intervals_reproduce_tables_4_to_6(dataset):
    """Check 16 through the tool: the paper's Tables 1-3 time and traffic cells give its
    Tables 4-6, optimum and breakpoints, exactly."""
    rows, times, traffic = TABLES[dataset]
    cells = [(p, c) for c in rows for p in P_COLS]
    t = np.asarray(times, np.float64).ravel()
    b = np.asarray(traffic, np.float64).ravel()
    got = ada_table.alpha_intervals(t, b)
    optima, breaks = OPTIMA[dataset]
    assert [cells[i] for _, _, i in got] == optima
    np.testing.assert_allclose([lo for lo, _, _ in got[1:]], breaks, rtol=1e-12)
    assert got[0][0] == 0.0 and got[-1][1] == 1.0
    assert ada_table.alpha_intervals([np.nan], [np.nan]) == []
    assert [ada_runs._paper(v, 0) for v in (200, 199.0, None)] == ["200", "199", "-"]
    assert [ada_runs._paper(v, 2) for v in (0.7, 2.0, [2.5, 2.6])] == ["0.7", "2", "2.50–2.60"]


def test_grid_with_paper_cells_prints_the_papers_tables_4_to_6(tmp_path):
    rows, times, traffic = TABLES["cifar10"]
    paper = [
        {
            "where": {"algorithm.fixed_p": p, "algorithm.fixed_c": c},
            "time_75": times[i][j],
            "traffic_75": traffic[i][j],
        }
        for i, c in enumerate(rows)
        for j, p in enumerate(P_COLS)
    ]
    for j, (p, c) in enumerate([(p, c) for c in rows for p in P_COLS]):
        write_run(
            tmp_path / str(j),
            0,
            fixed(p, c),
            ramp(3, 0.8),
            10.0,
            1.0,
            [f"algorithm.fixed_p={p}", f"algorithm.fixed_c={c}"],
            paper,
        )
    text = ada_table.grid(tmp_path)
    tail = text[text.index("The paper's, from its own cells of this grid") :].splitlines()
    assert tail[2] == "| α | [0, 0.1066) | [0.1066, 0.5052) | [0.5052, 0.8673) | [0.8673, 1] |"
    assert tail[4] == "| optimal (P, C) | (0.1, 0.98) | (0.2, 0.95) | (0.5, 0.9) | (1, 0.9) |"


def test_reach_past_the_budget_is_marked_and_done_rows_end_the_run(tmp_path):
    # Reaches 75% at round 5 (50 min); a 40-min budget: best accuracy counts rounds 1-4 only.
    write_run(tmp_path / "0", 0, fixed(0.5, 0.9), ramp(5, 0.9), 10.0, 1.0, [])
    text = ada_table.grid(tmp_path, time_budget=40)
    assert "| 0.9 | 50.0 |" in text  # (a): 0.5 until round 4
    assert "| 0.9 | 50.0 † |" in text  # (b): reached at 50 min, past the 40-min budget
    # The same curve in a run whose budget was spent in round 3 (done): 75% is never reached.
    write_run(
        tmp_path / "1",
        0,
        fixed(0.2, 0.9),
        ramp(5, 0.9),
        10.0,
        1.0,
        ["algorithm.fixed_p=0.2"],
        done_at=3,
    )
    stats = ada_runs.run_stats({"dir": tmp_path / "1" / "seed_0"}, [75.0], 100.0, math.inf)
    assert stats["reach"][75.0] is None and stats["best"] == 50.0


# ----------------------------------------------------------------------------- cost


@pytest.fixture
def cost_dir(tmp_path):
    """Ada reaches 75% at round 3 and 80% at round 6 (10 min, 2 GB a round); FedAvg-0.2 reaches
    75% at round 8 (10 min, 0.5 GB) and never 80%; budgets 100 min, 20 GB, alpha = 0.5."""
    alg = {"traffic_budget_gb": 20.0}
    paper = [
        {
            "where": {"algorithm.name": "fedavg_p", "algorithm.fixed_p": 0.2},
            "cost_75": 209.0,
            "saving_75": 0.35,
        },
        {"where": {"algorithm.name": "ada_fedsemi"}, "cost_75": [128.7, 135.9], "best_acc": 83.0},
    ]
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True, **alg}
    for s in range(3):
        acc = [0.5, 0.7, 0.75, 0.77, 0.78, 0.8, 0.8, 0.81, 0.81, 0.81]
        write_run(tmp_path / "ada", s, ada, acc, 10.0, 2.0, ["+experiment=x"], paper)
        write_run(
            tmp_path / "fedavg",
            s,
            {**fixed(0.2, 1.0), **alg},
            ramp(8, 0.76, 10),
            10.0,
            0.5,
            ["+experiment=x", "algorithm=fedavg_p"],
            paper,
        )
    return tmp_path


def test_cost_comparison(cost_dir):
    text = ada_table.cost(cost_dir, targets=[75, 80])
    assert (cost_dir / "ada_cost.md").read_text() == text
    assert (cost_dir / "ada_cost.png").stat().st_size > 1000
    lines = text.splitlines()
    ada75 = next(
        x
        for x in lines[lines.index("Target 75% test accuracy") :]
        if x.startswith("| Ada-FedSemi |")
    )
    fed75 = next(
        x
        for x in lines[lines.index("Target 75% test accuracy") :]
        if x.startswith("| FedAvg-0.2 |")
    )
    # Ada: 30 min, 6 GB -> 0.5 * 30 + 0.5 * 6 = 18; FedAvg-0.2: 80 min, 4 GB -> 42.
    assert ada75 == "| Ada-FedSemi | 30.0 ± 0.0 | 6.00 ± 0.00 | 18.0 ± 0.0 |  | 128.70–135.90 | - |"
    assert fed75 == "| FedAvg-0.2 | 80.0 ± 0.0 | 4.00 ± 0.00 | 42.0 ± 0.0 | 57% | 209 | 35% |"
    # 80%: FedAvg never: charged 0.5 * 100 + 0.5 * 20 = 60; Ada at 60 min, 12 GB -> 36.
    fed80 = next(
        x
        for x in lines[lines.index("Target 80% test accuracy") :]
        if x.startswith("| FedAvg-0.2 |")
    )
    assert fed80.startswith("| FedAvg-0.2 | - | - | 60.0 ± 0.0 (3 charged) | 40% |")
    # The per-method table: best accuracy within the budgets, the P drawn, the paper's.
    assert "| Ada-FedSemi | 3 | 81.0 ± 0.0 | 0.50 / 0.5 | 0.900 | 83 |" in text
    # A traffic budget that Ada's 80% run exceeds (12 GB > 10): charged too.
    text = ada_table.cost(cost_dir, targets=[80], traffic_budget=10.0, plot=False)
    assert "| Ada-FedSemi | 60.0 ± 0.0 | 12.0 ± 0.0 † | 55.0 ± 0.0 (3 charged) |" in text


def test_cost_with_two_ada_rows_saves_against_the_named_one(cost_dir):
    # A second Ada-FedSemi (q0 = 300): 15 min, 3 GB a round, so 75% at round 3 costs 27.
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True, "q0": 300.0,
           "traffic_budget_gb": 20.0}  # fmt: skip
    for s in range(3):
        acc = [0.5, 0.7, 0.75, 0.77, 0.78, 0.8, 0.8, 0.81, 0.81, 0.81]
        write_run(cost_dir / "ada300", s, ada, acc, 15.0, 3.0, ["+experiment=x", "q0=300"])
    text = ada_table.cost(cost_dir, targets=[75], plot=False)
    assert "Ada's saving" not in text  # two Ada rows, none named: no reference row
    text = ada_table.cost(cost_dir, targets=[75], plot=False, ada_name="Ada-FedSemi (q0=300)")
    rows = {r.split(" | ")[0].strip("| "): r for r in text.splitlines() if r.startswith("| ")}
    assert rows["Ada-FedSemi (q0=300)"].startswith("| Ada-FedSemi (q0=300) | 45.0 ± 0.0 | 9.00")
    # The other Ada (no q0 in its config; cost 18) and FedAvg-0.2 (42) against 27.
    assert rows["Ada-FedSemi (q0=None)"].split(" | ")[4] == "-50%"
    assert rows["FedAvg-0.2"].split(" | ")[4] == "36%"
    with pytest.raises(ValueError, match="--ada='Ada' is not allowed: a method of the table"):
        ada_table.cost(cost_dir, targets=[75], plot=False, ada_name="Ada")


def test_method_names():
    assert (
        ada_runs.method_name(
            {"algorithm": {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True}}
        )
        == "Ada-FedSemi"
    )
    zero_pool = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": False, "fixed_c": 1.0}
    assert ada_runs.method_name({"algorithm": zero_pool}) == "Ada-FedSemi (C = 1)"
    assert ada_runs.method_name({"algorithm": fixed(0.5, 0.9)}) == "FedSemi-0.5-0.9"
    assert ada_runs.method_name({"algorithm": fixed(0.2, 1.0)}) == "FedAvg-0.2"
    same = {"name": "fedsemi", "fixed_p": 1.0, "fixed_c": 1.0}
    assert ada_runs.method_name({"algorithm": same}) == "FedAvg-1"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cost", "{d}", "--alpha", "1.5"], "--alpha=1.5 is not allowed: a number in [0, 1]"),
        (["cost", "{d}", "--time-budget", "0"], "--time-budget=0.0 is not allowed: a budget > 0"),
        (["cost", "{d}", "--traffic-budget", "-2"], "--traffic-budget=-2.0 is not allowed"),
        (["cost", "{d}", "--targets", "75,120"], "--targets=120.0 is not allowed"),
        (["cost", "{d}", "--targets", "high"], "--targets='high' is not allowed"),
        (["grid", "{d}/none"], "sweep_dir="),
    ],
)
def test_bad_input_is_one_line(cost_dir, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        ada_table.main([a.format(d=cost_dir) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("fedjax-semi-ada-table: error: ") and message in err


def test_grid_needs_fixed_cells_and_the_clock_columns(cost_dir, tmp_path):
    with pytest.raises(ValueError, match="a folder of fedsemi / fedavg_p runs"):
        ada_table.grid(cost_dir / "ada")
    d = tmp_path / "plain" / "seed_0"
    write_run(tmp_path / "plain", 0, fixed(0.5, 0.9), [0.8], 10.0, 1.0, [])
    (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": 0.8}) + "\n")
    with pytest.raises(ValueError, match="lacks cum_time_min"):
        ada_table.grid(tmp_path / "plain")
    # Two runs that disagree on the budget need one on the command line.
    write_run(tmp_path / "two" / "a", 0, fixed(0.5, 0.9), [0.8], 10.0, 1.0, ["a=1"])
    write_run(
        tmp_path / "two" / "b",
        0,
        {**fixed(0.2, 0.9), "time_budget_min": 50.0},
        [0.8],
        10.0,
        1.0,
        ["a=2"],
    )
    with pytest.raises(ValueError, match="--time-budget=None .*disagree"):
        ada_table.grid(tmp_path / "two")
    assert "| 0.9 | 80.0 | 80.0 |" in ada_table.grid(tmp_path / "two", time_budget=60)


def test_a_miss_without_a_traffic_budget_costs_infinity(tmp_path):
    """alpha < 1 and no traffic budget: ada_cost.run_cost charges alpha T + (1 - alpha) inf."""
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True}
    for s in range(2):
        write_run(tmp_path / "ada", s, ada, [0.5, 0.75], 10.0, 2.0, ["+experiment=x"])
        write_run(
            tmp_path / "fa",
            s,
            fixed(0.2, 1.0),
            [0.5, 0.6],
            10.0,
            0.5,
            ["+experiment=x", "algorithm=fedavg_p"],
        )
    text = ada_table.cost(tmp_path, targets=[75])
    assert "| FedAvg-0.2 | - | - | ∞ (2 charged) |  |" in text
    assert "| Ada-FedSemi | 20.0 ± 0.0 | 4.00 ± 0.00 | 12.0 ± 0.0 |  |" in text
