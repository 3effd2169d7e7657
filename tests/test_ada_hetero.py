"""fedjax-semi-ada-table hetero (results/ada_hetero.py) on run directories in the real format:
Fig. 17's round time and waiting ratio, Fig. 16's minutes to targets and the paired speed-up,
computed by hand here, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedjax_semi.results import ada_table


def write_run(job: Path, seed: int, name: str, round_s: list[float], acc: list[float],
              wait: list[float], done_at: int) -> None:  # fmt: skip
    """seed_<seed>/ of a replicas run: round k takes round_s[k-1] seconds at test accuracy
    acc[k-1], 0.1 GB a round; rows from done_at on are frozen (the budget was spent)."""
    d = job / f"seed_{seed}"
    (d / ".hydra").mkdir(parents=True)
    cfg = {"algorithm": {"name": name, "time_budget_min": 18.0}, "seed": seed}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"algorithm={name}"]))
    rows, t = [], 0.0
    for k in range(1, len(acc) + 1):
        i = min(k, done_at) - 1  # frozen after done_at
        t = sum(round_s[: i + 1]) / 60
        rows.append({"round": k, "accuracy": acc[i], "cum_time_min": t,
                     "cum_traffic_gb": 0.1 * (i + 1), "round_time_s": round_s[i],
                     "wait_ratio_cum": wait[i], "done": k >= done_at})  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"algorithm": name, "final": rows[-1]}))


def test_hetero_table_reads_round_time_waiting_and_the_paired_speed_up(tmp_path, capsys):
    h, a = tmp_path / "hetero", tmp_path / "ada"
    # HeteroAda: 30 s rounds; seed 0 reaches 60% at round 4 (2 min), seed 1 at round 6 (3 min).
    write_run(h, 0, "hetero_ada", [30] * 8, [0.3, 0.4, 0.5, 0.6, 0.6, 0.7, 0.7, 0.7],
              [10, 20, 30, 30, 30, 30, 30, 30], done_at=6)  # fmt: skip
    write_run(h, 1, "hetero_ada", [30] * 8, [0.3, 0.4, 0.5, 0.5, 0.5, 0.65, 0.7, 0.7],
              [10, 20, 40, 40, 40, 40, 40, 40], done_at=8)  # fmt: skip
    # Ada: 60 s rounds; seed 0 reaches 60% at round 3 (3 min), seed 1 at round 2 (2 min).
    write_run(a, 0, "ada_fedsemi", [60] * 4, [0.5, 0.55, 0.6, 0.7], [35, 36, 37, 38], done_at=4)
    write_run(a, 1, "ada_fedsemi", [60] * 4, [0.5, 0.62, 0.6, 0.7], [35, 35, 35, 35], done_at=4)
    ada_table.main(["hetero", str(tmp_path), "--targets", "60"])
    out = capsys.readouterr().out
    cells = [ln.strip("| ").split(" | ") for ln in out.splitlines() if ln.startswith("| ")]
    lines = {c[0]: c[1:] for c in cells}
    assert "HeteroAda-FedSemi (2 seeds)" in out and "Ada-FedSemi (2 seeds)" in out
    # Column order follows the directories: ada (Ada-FedSemi) first, then hetero.
    assert lines["rounds"][:2] == ["4.0 ± 0.0", "7.0 ± 1.4"]  # Ada 4 and 4; HeteroAda 6 and 8
    assert lines["mean round time (s)"][:2] == ["60.0 ± 0.0", "30.0 ± 0.0"]
    assert lines["mean round time (s)"][2] == "67 / 45"  # the paper's, in the columns' order
    assert lines["waiting ratio (%, Eq. 34)"][:2] == ["36.5 ± 2.1", "35.0 ± 7.1"]
    assert lines["minutes to 60%"][:2] == ["2.50 ± 0.71", "2.50 ± 0.71"]  # 3, 2 and 2, 3
    # Paired speed-ups: seed 0 3/2 = 1.5, seed 1 2/3; mean 1.083, sample std 0.589.
    r = np.array([1.5, 2 / 3])
    assert f"* 60%: {r.mean():.2f} ± {r.std(ddof=1):.2f}x, HeteroAda faster in 1/2 seeds" in out


def test_hetero_table_reads_semi_hfl_as_a_second_baseline(tmp_path, capsys):
    """Semi-HFL (Fig. 16's other baseline) gets its column, the paper's round time and waiting
    ratio (52 s, 10.4%) and its own paired speed-up (the paper: 1.3x)."""
    write_run(tmp_path / "hetero", 0, "hetero_ada", [30] * 6, [0.3, 0.4, 0.5, 0.6, 0.6, 0.7],
              [10] * 6, done_at=6)  # fmt: skip  # 60% at round 4: 2 min
    write_run(tmp_path / "hetero", 1, "hetero_ada", [30] * 6, [0.3, 0.6, 0.6, 0.6, 0.6, 0.7],
              [10] * 6, done_at=6)  # fmt: skip  # round 2: 1 min
    # Semi-HFL: 45 s rounds; seed 0 reaches 60% at round 4 (3 min), seed 1 at round 2 (1.5 min).
    write_run(tmp_path / "semi", 0, "semi_hfl", [45] * 4, [0.3, 0.5, 0.5, 0.6], [12] * 4, 4)
    write_run(tmp_path / "semi", 1, "semi_hfl", [45] * 4, [0.3, 0.6, 0.6, 0.6], [14] * 4, 4)
    ada_table.main(["hetero", str(tmp_path), "--targets", "60"])
    out = capsys.readouterr().out
    cells = {c[0]: c[1:] for c in (ln.strip("| ").split(" | ") for ln in out.splitlines()
                                   if ln.startswith("| "))}  # fmt: skip
    assert "Semi-HFL (2 seeds)" in out and " Ada-FedSemi (" not in out
    assert cells["mean round time (s)"] == ["30.0 ± 0.0", "45.0 ± 0.0", "45 / 52"]
    assert cells["waiting ratio (%, Eq. 34)"][1:] == ["13.0 ± 1.4", "6.7 / 10.4"]
    assert "Semi-HFL's minutes / HeteroAda's, paired by seed; the paper: 1.3x" in out
    r = np.array([3 / 2, 1.5 / 1])  # seed 0: 3 min / 2 min; seed 1: 1.5 min / 1 min
    assert f"* 60%: {r.mean():.2f} ± {r.std(ddof=1):.2f}x, HeteroAda faster in 2/2 seeds" in out


def test_hetero_table_bad_input_is_one_line(tmp_path, capsys):
    write_run(tmp_path / "a", 0, "ada_fedsemi", [60] * 2, [0.5, 0.6], [1, 2], done_at=2)
    for argv, needle in [
        (["hetero", str(tmp_path)], "--targets=None is not allowed: test accuracies (%)"),
        (["hetero", str(tmp_path), "--targets", "6x"], "--targets='6x' is not allowed"),
        (["hetero", str(tmp_path / "none"), "--targets", "60"], "an existing directory of runs"),
    ]:
        with pytest.raises(SystemExit):
            ada_table.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    rows = (tmp_path / "a" / "seed_0" / "metrics.jsonl").read_text().splitlines()
    stripped = [{k: v for k, v in json.loads(r).items() if k != "round_time_s"} for r in rows]
    (tmp_path / "a" / "seed_0" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in stripped)
    )
    with pytest.raises(SystemExit):
        ada_table.main(["hetero", str(tmp_path), "--targets", "60"])
    assert "lacks round_time_s / wait_ratio_cum" in capsys.readouterr().err
