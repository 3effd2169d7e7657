"""Tables from exported per-round rows (results/rows_table.py): the same cut and numbers as
fedjax-semi-report on the run directories the rows came from, files joined, bad input refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_semi.cli import report_main
from fedjax_semi.results.report import report
from fedjax_semi.results.rows_table import load_runs, main, rows_table
from test_report import _run


@pytest.fixture
def sweep(tmp_path):
    """Run directories of two settings x three seeds, random curves, and their exported rows."""
    rng = np.random.default_rng(3)
    acc = {}
    for alg in ("a", "ref"):
        for seed in range(3):
            acc[alg, seed] = rng.uniform(0, 1, 11)
            d = tmp_path / "sweep" / f"{alg}{seed}"
            _run(d, [f"algorithm={alg}", f"seed={seed}"], acc[alg, seed].__getitem__)
            (d / ".hydra" / "config.yaml").write_text(f"seed: {seed}\n")
    rows = tmp_path / "rows.jsonl"
    report_main([str(tmp_path / "sweep"), "--metrics", "personal_acc", "--rows", str(rows)])
    return tmp_path / "sweep", rows, acc


def table_cells(text: str) -> dict[str, list[str]]:
    return {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
        for ln in text.splitlines()
        if ln.startswith("| algorithm=")
    }


@pytest.mark.parametrize("cut", [{}, {"last_k": 2, "budget_rounds": 7}, {"budget_time": 9.0}])
def test_the_table_from_rows_is_the_reports_table(sweep, cut):
    """The mean ± std cells equal fedjax-semi-report's on the run directories themselves."""
    root, rows, _ = sweep
    from_runs = table_cells(report(root, ["personal_acc"], **cut))
    from_rows = table_cells(rows_table(load_runs([rows]), ["personal_acc"], **cut))
    assert set(from_rows) == {"algorithm=a", "algorithm=ref"}
    for label, cells in from_rows.items():
        assert cells == from_runs[label][: len(cells)]  # setting, seeds, value (no round column)


def test_per_seed_values_and_paired_differences(sweep):
    _, rows, acc = sweep
    text = rows_table(load_runs([rows]), ["personal_acc"], paired_to="algorithm=ref", last_k=3)
    a = np.array([acc["a", s][[6, 8, 10]].mean() for s in range(3)])
    ref = np.array([acc["ref", s][[6, 8, 10]].mean() for s in range(3)])
    assert "* algorithm=a: " + ", ".join(f"{100 * v:.2f}" for v in a) in text
    paired = table_cells(text.split("Reference: algorithm=ref")[1])
    d = a - ref
    assert paired == {
        "algorithm=a": [
            "3",
            f"{100 * a.mean():.2f}",
            f"{100 * ref.mean():.2f}",
            f"{100 * d.mean():+.2f} ± {100 * d.std(ddof=1):.2f}",
            f"{int((d > 0).sum())}/3",
        ]
    }


def test_files_join_and_a_run_in_two_files_is_refused(sweep, tmp_path):
    _, rows, acc = sweep
    lines = rows.read_text().splitlines()
    mine = tmp_path / "a.jsonl"
    other = tmp_path / "ref.jsonl"
    mine.write_text("\n".join(ln for ln in lines if '"algorithm=a"' in ln))
    # The reference file logs its last round twice (a resumed run): the later row wins.
    ref_lines = [ln for ln in lines if '"algorithm=ref"' in ln]
    last = json.loads(ref_lines[-1]) | {"personal_acc": 0.0}
    other.write_text("\n".join([*ref_lines, json.dumps(last)]))
    runs = load_runs([mine, other])
    assert runs["algorithm=ref"][2][-1]["personal_acc"] == 0.0
    assert [r["round"] for r in runs["algorithm=ref"][2]] == list(range(11))
    assert runs["algorithm=a"][0][-1]["personal_acc"] == acc["a", 0][10]
    with pytest.raises(ValueError, match="seed 0 is in both"):
        load_runs([mine, rows])


def test_decimals_round_the_values_once(sweep):
    """--decimals 1 prints each value rounded once from the full float (a document copies the
    digits; rounding the 2-place print again can move the last digit)."""
    _, rows, acc = sweep
    text = rows_table(load_runs([rows]), ["personal_acc"], paired_to="algorithm=ref", decimals=1)
    a = np.array([acc["a", s][-1] for s in range(3)])
    ref = np.array([acc["ref", s][-1] for s in range(3)])
    cells = table_cells(text.split("Reference:")[0])
    assert cells["algorithm=a"] == ["3", f"{100 * a.mean():.1f} ± {100 * a.std(ddof=1):.1f}"]
    assert "* algorithm=a: " + ", ".join(f"{100 * v:.1f}" for v in a) in text
    d = a - ref
    paired = table_cells(text.split("Reference: algorithm=ref")[1])["algorithm=a"]
    assert paired[3] == f"{100 * d.mean():+.1f} ± {100 * d.std(ddof=1):.1f}"


def test_bad_input_gets_one_line(sweep, capsys):
    _, rows, _ = sweep
    for argv in (
        ["--setting", "algorithm=zzz"],
        ["--paired-to", "algorithm=zzz"],
        ["--last-k", "0"],
        ["--metrics", ","],
        ["--decimals", "7"],
    ):
        with pytest.raises(SystemExit) as e:
            main([str(rows), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "not allowed" in err
        assert err.strip().splitlines()[-1].startswith("python -m fedjax_semi.results.rows_table")
    assert main([str(rows), "--metrics", "personal_acc", "--setting", "algorithm=a"]) == 0
    out = capsys.readouterr().out
    assert "| algorithm=a | 3 |" in out and "algorithm=ref" not in out


def test_paired_to_takes_the_reports_tokens(tmp_path):
    """--paired-to names key=value tokens that one setting holds, as fedjax-semi-report's does."""
    rows = [
        {"setting": f"a=1 b={b}", "seed": s, "round": 1, "accuracy": 0.5 + 0.1 * b + 0.01 * s}
        for b in (2, 3)
        for s in range(2)
    ]
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    text = rows_table(load_runs([f]), ["accuracy"], paired_to="b=3")
    assert (
        "Reference: a=1 b=3" in text
        and "| a=1 b=2 | 2 | 70.50 | 80.50 | -10.00 ± 0.00 | 0/2 |" in text
    )
    with pytest.raises(ValueError, match="exactly one setting"):
        rows_table(load_runs([f]), ["accuracy"], paired_to="a=1")
