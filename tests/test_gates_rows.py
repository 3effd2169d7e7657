"""The gates on exported per-round rows (results/gates_rows.py)."""

from __future__ import annotations

import json

import pytest

from fedjax_semi.results.gates import Gates
from fedjax_semi.results.gates_rows import flagged, main


def rows_of(setting: str, finals: list[float], **extra) -> list[dict]:
    """Two rounds per seed; the final round carries `finals[seed]`."""
    out = []
    for seed, acc in enumerate(finals):
        out.append({"setting": setting, "seed": seed, "round": 1, "accuracy": 0.5, "sim_time": 1})
        out.append(
            {"setting": setting, "seed": seed, "round": 2, "accuracy": acc, "sim_time": 2, **extra}
        )
    return out


@pytest.fixture
def rows():
    return (
        rows_of("algorithm=local", [0.60, 0.62])
        + rows_of("algorithm=healthy", [0.70, 0.72])
        + rows_of("algorithm=atchance", [0.12, 0.13])
        + rows_of("algorithm=behind", [0.50, 0.52])
        + rows_of("algorithm=collapsed", [0.65, 0.66], pred_top_share=0.95, label_top_share=0.1)
    )


def test_flags_exactly_the_broken_rows(rows):
    verdicts, line = flagged(rows, "accuracy", 10, Gates())
    fired = {s: [f.split(" ")[0] for f in v.fired] for s, v in verdicts.items()}
    assert fired == {
        "algorithm=local": [],
        "algorithm=healthy": [],
        "algorithm=atchance": ["chance", "below-local"],
        "algorithm=behind": ["below-local"],
        "algorithm=collapsed": ["collapse"],
    }
    assert "3 of 5 rows flagged" in line


def test_budget_cut_reads_the_evaluations_within_it(rows):
    # At sim_time <= 1 every row holds 0.5: below Local's 0.5? equal, so nothing is below it.
    verdicts, _ = flagged(rows, "accuracy", 10, Gates(), budget_time=1.0)
    assert not any(f.startswith("below-local") for v in verdicts.values() for f in v.fired)


def test_cli_prints_the_flagged_rows_and_checks_flags(rows, tmp_path, capsys):
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    assert main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "`algorithm=behind`: below-local" in out and "`algorithm=healthy`" not in out
    with pytest.raises(SystemExit):
        main([str(f), "--gate-collapse", "2"])
    assert "--gate-collapse=2 is not allowed: a number in [0, 1]" in capsys.readouterr().err
