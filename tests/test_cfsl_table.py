"""CFSL's scenario table on generated run directories in the simulator's on-disk format
(`<setting>/seed_<s>/metrics.jsonl`): last-k means, the paired energy saving, the claims."""

from __future__ import annotations

import json

import pytest

from fedjax_semi.results import cfsl_table


def write_run(d, acc: float, energy: float, labeling: float | None, rounds: int = 10):
    d.mkdir(parents=True)
    rows = []
    for t in range(1, rounds + 1):
        row = {
            "round": t,
            "round_energy": energy,
            "worker_energy": energy - 1,
            "avg_energy": energy,
        }
        if t % 5 == 0:  # an evaluation every 5 rounds: the last one is `acc`, the first acc - 0.1
            row.update(accuracy=acc - 0.1 * (t < rounds), min_acc=0.0, max_acc=1.0,
                       labeling_acc=labeling, coverage=0.5)  # fmt: skip
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def root(tmp_path):
    for seed, e in ((0, 100.0), (1, 200.0)):
        write_run(tmp_path / "hfsl_sp" / f"seed_{seed}", 0.4, e, 0.3)
        write_run(tmp_path / "hfsl_st" / f"seed_{seed}", 0.5, e, None)
        write_run(tmp_path / "bmspgs" / f"seed_{seed}", 0.6, e / 2, 0.7)  # saves 50% each seed
        write_run(tmp_path / "emspgs" / f"seed_{seed}", 0.3, 0.75 * e, 0.2)  # saves 25%
        write_run(tmp_path / "bmstgs" / f"seed_{seed}", 0.55, e, 0.8)
        write_run(tmp_path / "bmspgs_random" / f"seed_{seed}", 0.6, 0.8 * e, 0.7)
    return tmp_path


def test_last_k_mean_and_paired_saving(root):
    stats = cfsl_table.collect(root, last=2)
    # Evaluations at rounds 5 and 10: (acc - 0.1 + acc) / 2.
    assert stats["bmspgs"][0]["accuracy"] == pytest.approx(0.55)
    assert stats["bmspgs"][1]["avg_energy"] == pytest.approx(100.0)
    assert cfsl_table.savings(stats, "bmspgs") == pytest.approx([50.0, 50.0])
    assert cfsl_table.savings(stats, "bmstgs") == pytest.approx([0.0, 0.0])  # against hfsl_st
    text = cfsl_table.table(stats)
    line = next(ln for ln in text.splitlines() if ln.startswith("| bmspgs |"))
    assert "| 2 | 55.0 ± 0.0 |" in line and "| 50.0 ± 0.0 | 56.01 |" in line


def test_claims_say_yes_no_and_not_applicable(root):
    claims = cfsl_table.claims(cfsl_table.collect(root, last=1))
    assert "bmspgs above hfsl_sp in mean test accuracy: yes (60.0 vs 40.0)" in claims
    assert "emspgs above hfsl_sp in mean test accuracy: NO (30.0 vs 40.0)" in claims
    assert any(c.startswith("bmstgs above hfsl_st in labeling accuracy: n/a") for c in claims)
    want = "greedy below random selection in energy (bmspgs vs bmspgs_random): yes (37.50% less"
    assert any(c.startswith(want) for c in claims)
    assert "energy saving BM > EM (bmspgs vs emspgs): yes (50.00% vs 25.00%)" in claims


def test_cli_writes_table_and_plot(root, capsys):
    out, fig = root / "table.md", root / "fig.png"
    cfsl_table.main([str(root), "--last", "1", "--out", str(out), "--plot", str(fig)])
    assert "| hfsl_sp | 2 |" in out.read_text() and "| hfsl_sp |" in capsys.readouterr().out
    assert fig.stat().st_size > 10_000


def test_empty_root_is_one_clear_line(tmp_path):
    with pytest.raises(SystemExit, match="holds no run"):
        cfsl_table.main([str(tmp_path)])
    assert cfsl_table._cell([float("nan")]) == "–"  # a metric no seed has


@pytest.mark.parametrize(
    "alg,label",
    [
        (dict(scenario="emstrr"), "emstrr"),
        (dict(scenario="bmspgs", prediction_model="ensemble"), "emspgs"),
        (dict(scenario="bmspgs", selection="random"), "bmspgs_random"),
        (dict(scenario="bmspgs", prediction_time="none"), "cfl_gs"),
        (dict(scenario="bmsprr", prediction_time="none"), "cfl_rr"),
        (dict(scenario="bmspgs", prediction_time="none", selection="random"), "cfl_random"),
        (dict(scenario="bmspgs", clustering=False, selection="all"), "hfsl_sp"),
        (dict(scenario="bmstgs", clustering=False, selection="all"), "hfsl_st"),
    ],
)
def test_setting_of_names_a_run_by_its_algorithm_config(alg, label):
    assert cfsl_table.setting_of(alg) == label


def test_a_multirun_sweep_dir_is_read_by_run_config(tmp_path):
    """Hydra's numbered job dirs: each run is named and seeded by its run_config.json."""
    jobs = [(dict(scenario="bmspgs"), 0), (dict(scenario="bmspgs"), 1),
            (dict(scenario="bmspgs", clustering=False, selection="all"), 0)]  # fmt: skip
    for i, (alg, seed) in enumerate(jobs):
        write_run(tmp_path / str(i), 0.5 + 0.1 * i, 100.0, 0.6)
        rows = (tmp_path / str(i) / "metrics.jsonl").read_text().splitlines()
        last = {**json.loads(rows[-1]), "num_clusters": 4 - 3 * (i == 2), "num_stopped": 1,
                "selected": 190}  # fmt: skip
        stop = {**json.loads(rows[6]), "num_stopped": 1}  # round 7: the first stopped cluster
        rows = [*rows[:6], json.dumps(stop), *rows[7:-1], json.dumps(last)]
        (tmp_path / str(i) / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        cfg = {"seed": seed, "algorithm": {"clustering": True, **alg}}
        (tmp_path / str(i) / "run_config.json").write_text(json.dumps(cfg))
    stats = cfsl_table.collect(tmp_path, last=1)
    assert sorted(stats) == ["bmspgs", "hfsl_sp"] and sorted(stats["bmspgs"]) == [0, 1]
    assert stats["hfsl_sp"][0]["accuracy"] == pytest.approx(0.7)
    text = cfsl_table.mechanism_table(stats)
    assert "| bmspgs | 2 | 10 ± 0 | 4.0 ± 0.0 | 1.0 ± 0.0 | 190.0 ± 0.0 | 7.0 ± 0.0 |" in text
    assert "| hfsl_sp | 1 | 10 ± 0 | 1.0 ± 0.0 |" in text
    per_run = cfsl_table.collect(tmp_path, last=1, per_run=True)  # a tuning sweep's trials
    assert sorted(per_run) == ["0", "1", "2"] and per_run["2"][0]["accuracy"] == pytest.approx(0.7)


def test_paired_differences_by_seed(root, tmp_path, capsys):
    """--paired A=B: a - b per seed, within root or from another directory (DIR:setting)."""
    stats = cfsl_table.collect(root, last=1)
    acc, energy = cfsl_table.paired(stats["bmspgs"], stats["hfsl_sp"])
    assert acc == pytest.approx([20.0, 20.0]) and energy == pytest.approx([-50.0, -50.0])
    other = tmp_path / "other"
    for seed, e in ((0, 100.0), (1, 200.0)):
        write_run(other / "bmspgs" / f"seed_{seed}", 0.5, e, 0.7)
    cfsl_table.main([str(root), "--paired", "bmspgs=hfsl_sp", "--paired", f"{other}:bmspgs=bmspgs"])
    out = capsys.readouterr().out
    want = "bmspgs - hfsl_sp over 2 seeds: accuracy +20.0 ± 0.0 points (2 above), energy -50.0"
    assert want in out
    assert f"{other}:bmspgs - bmspgs over 2 seeds: accuracy -10.0 ± 0.0 points (0 above)" in out
    with pytest.raises(SystemExit):
        cfsl_table.main([str(root), "--paired", "bmspgs=nothing"])
