"""The arm table of Ada-FedSemi's bandits (results/ada_arms.py) on run directories written in
the real layout (test_ada_table.write_run), against counts made by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from fedjax_semi.results import ada_arms
from test_ada_table import fixed, write_run


def _streak_reference(values: list[float]) -> int:
    """Longest run of equal neighbours, from the positions where the value changes."""
    if not values:
        return 0
    change = np.flatnonzero(np.diff(np.asarray(values)) != 0)
    edges = np.concatenate([[-1], change, [len(values) - 1]])
    return int(np.diff(edges).max())


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.sampled_from([0.1, 0.2, 0.5]), max_size=30))
def test_longest_streak_and_shares_match_a_reference(values):
    assert ada_arms.longest_streak(values) == _streak_reference(values)
    if values:
        shares = ada_arms.arm_shares(values)
        for a, s in shares.items():
            assert s == pytest.approx(np.mean(np.isclose(values, a)))
        assert sum(shares.values()) == pytest.approx(1.0)


def _set_arms(run_dir, p: list[float], c: list[float]) -> None:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, pv, cv in zip(rows, p, c, strict=True):
        row["P"], row["C"] = pv, cv
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_arm_table_counts_rounds_until_done(tmp_path):
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True}
    acc = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8]
    # Seed 0 ends at round 4 (its rows 5-6 repeat a frozen state and must not count).
    write_run(tmp_path / "ada", 0, ada, acc, 1.0, 0.1, ["+experiment=x"], done_at=4)
    _set_arms(
        tmp_path / "ada" / "seed_0", [0.2, 0.2, 0.5, 0.2, 0.9, 0.9], [0.9, 1.0, 1.0, 0.9, 0, 0]
    )
    write_run(tmp_path / "ada", 1, ada, acc, 1.0, 0.1, ["+experiment=x"])
    _set_arms(tmp_path / "ada" / "seed_1", [0.5] * 6, [0.82] * 6)
    fedavg = fixed(0.5, 1.0)
    write_run(
        tmp_path / "fedavg", 0, fedavg, acc, 1.0, 0.1, ["+experiment=x", "algorithm=fedavg_p"]
    )

    text = ada_arms.arms(tmp_path)
    assert (tmp_path / "ada_arms.md").read_text() == text
    assert (tmp_path / "ada_arms.png").stat().st_size > 0
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    # Ada: 4 + 6 rounds; P 0.2 in 3 of 10, 0.5 in 7 of 10; C 0.82 in 6, 0.9 in 2, 1.0 in 2.
    cells = rows["Ada-FedSemi"].split(" | ")
    assert cells[1:4] == ["2", "5.0", "0.2: 30%, 0.5: 70%"]
    assert cells[4] == "0.82: 60%, 0.9: 20%, 1: 20%"
    assert cells[5] == "1.5"  # 2 distinct P arms (seed 0), 1 (seed 1)
    assert cells[6].rstrip(" |") == "4.0"  # streaks 2 (seed 0) and 6 (seed 1)
    assert rows["FedAvg-0.5"].split(" | ")[3] == "0.5: 100%"


def test_not_a_directory_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ada_arms.main([str(tmp_path / "missing")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep_dir=" in err[0] and "an existing directory" in err[0]


def test_methods_of_one_name_are_told_apart_by_the_knobs_that_differ():
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True, "psi": 1.0}
    configs = [
        {"algorithm": {**ada, "q0": 0.0}},
        {"algorithm": {**ada, "q0": 300.0}},
        {"algorithm": fixed(0.5, 1.0)},
    ]
    assert ada_arms.method_names(configs) == [
        "Ada-FedSemi (q0=0)",
        "Ada-FedSemi (q0=300)",
        "FedAvg-0.5",
    ]


def _set_phases(run_dir, phase: list[int], p: list[float], sec: list[float], gb: list[float]):
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, *vals in zip(rows, phase, p, sec, gb, strict=True):
        row["phase"], row["P"], row["round_time_s"], row["round_traffic_gb"] = vals
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_phase_table_splits_rounds_at_the_switch_until_done(tmp_path, capsys):
    ada = {"name": "ada_fedsemi", "adaptive_p": True, "adaptive_c": True}
    acc = [0.5, 0.6, 0.7, 0.8, 0.8, 0.8]
    # Seed 0 switches after round 2 and ends at round 4 (rows 5-6 are frozen: not counted).
    write_run(tmp_path / "ada", 0, ada, acc, 1.0, 0.1, ["+experiment=x"], done_at=4)
    _set_phases(tmp_path / "ada" / "seed_0", [0, 0, 1, 1, 1, 1], [0.6, 0.6, 0.2, 0.5, 0.9, 0.9],
                [30, 40, 50, 60, 70, 80], [1.0, 1.0, 0.5, 0.25, 9, 9])  # fmt: skip
    # Seed 1 never switches: six rounds of phase 0.
    write_run(tmp_path / "ada", 1, ada, acc, 1.0, 0.1, ["+experiment=x"])
    _set_phases(tmp_path / "ada" / "seed_1", [0] * 6, [0.6, 0.2, 0.6, 0.6, 0.2, 0.6],
                [60] * 6, [2.0] * 6)  # fmt: skip

    ada_arms.main([str(tmp_path), "--by-phase"])
    text = capsys.readouterr().out
    assert (tmp_path / "ada_phases.md").read_text().strip() == text.strip()
    rows = [line.split(" | ") for line in text.strip().splitlines()[2:]]
    before, after = rows
    # Phase 0: seed 0's 2 rounds (P 0.6, 0.6; 70 s; 2 GB), seed 1's 6 (0.6 x4, 0.2 x2; 360 s;
    # 12 GB): P 0.6 in 6 of 8 rounds, mean P 4.0 / 8; (70 + 360) / 2 s = 3.58 min, 7 GB a seed.
    assert before[1:] == ["0", "2", "4.0", "0.2: 25%, 0.6: 75%", "0.6", "0.50", "3.58", "7.00 |"]
    # Phase 1: seed 0 only, rounds 3-4 (P 0.2, 0.5; 110 s; 0.75 GB).
    assert after[1:] == ["1", "1", "2.0", "0.2: 50%, 0.5: 50%", "0.2", "0.35", "1.83", "0.75 |"]
