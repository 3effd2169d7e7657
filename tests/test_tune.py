"""fedjax-semi-tune and what the app does for it: tuned values applied, finished runs skipped.

The tuner's choice, its files and its refusals run on trial directories written here (a sweep
whose every trial is complete launches nothing), so they take seconds; one slow test runs the
real Hydra multirun end to end, and its resume."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from conftest import SMALL
from fedjax_semi.data.partitions import Partition
from fedjax_semi.errors import ConfigError
from fedjax_semi.results.tune import SENSITIVE_KNOBS, main

PRESET = """# @package _global_
defaults:
  - optional /tuned: tiny_table
rounds: 2
hydra:
  sweeper:
    params:
      algorithm: {rows}
      seed: 0,1
"""
# SMALL without the keys the tuner sets (lr: the grid) or the preset sets (rounds).
EXTRAS = [o for o in SMALL if o.split("=")[0] not in ("algorithm.lr", "rounds")]
# SMALL's data overrides: the tuner scopes the values it writes to them (`where`).
DATA = {"dataset": "digits", "partition.min_client_size": 5, "partition.labeled_fraction": 0.3}


@pytest.fixture
def conf(tmp_path):
    """A test-only table preset on Hydra's search path (tmp/conf/experiment/tiny_table.yaml);
    returns (conf dir, the overrides that select it)."""
    d = tmp_path / "conf"
    (d / "experiment").mkdir(parents=True)
    (d / "experiment" / "tiny_table.yaml").write_text(PRESET.format(rows="fedavg,local"))
    return d, [f"hydra.searchpath=[file://{d}]", "+experiment=tiny_table", *EXTRAS]


def tune(conf, tmp_path, *flags: str) -> int:
    """fedjax-semi-tune's exit code (0 when it returns: a dry run)."""
    d, overrides = conf
    argv = [*overrides, "--dir", str(tmp_path / "sweep"), "--conf-out", str(d / "tuned"), *flags]
    try:
        main(argv)
    except SystemExit as e:
        return e.code or 0
    return 0


def fake_trial(sweep, name: str, overrides: list[str], value: float | None, **summary):
    """A finished trial directory as the app leaves it (what the tuner reads)."""
    d = sweep / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    s = {"rounds_completed": 2, "stop_reason": "rounds completed", "final": {"accuracy": value}}
    (d / "summary.json").write_text(json.dumps({**s, **summary}))
    return d


VALUES = {  # (algorithm, lr) -> final accuracy of seed 0
    ("fedavg", "0.03"): 0.5,
    ("fedavg", "0.3"): 0.7,
    ("local", "0.03"): 0.6,
    ("local", "0.3"): 0.6 + 6e-8,  # a tie at float32 resolution (one ulp): the smaller lr wins
}


def fake_sweep(tmp_path, changes: dict | None = None) -> None:
    """The four trials of VALUES; `changes` replaces summary fields of some."""
    for (alg, lr), v in VALUES.items():
        ov = [f"algorithm={alg}", "seed=0", "partition.holdout=0.2", f"algorithm.lr={lr}"]
        fake_trial(tmp_path / "sweep", f"{alg}-{lr}", ov, v, **(changes or {}).get((alg, lr), {}))


def test_chooses_the_best_point_per_row_and_writes_the_tuned_file(conf, tmp_path, capsys):
    fake_sweep(tmp_path)
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3") == 0
    out = capsys.readouterr().out
    assert "0 to run" in out  # every trial is complete: nothing launched
    assert "| algorithm=fedavg | 0.5000 | **[0.7000]** |" in out
    assert "| algorithm=local | **[0.6000]** | 0.6000 |" in out
    written = yaml.safe_load((conf[0] / "tuned" / "tiny_table.yaml").read_text())
    assert written["tuned"] == [
        {"where": {"algorithm": "fedavg", **DATA}, "set": {"algorithm.lr": 0.3}},
        {"where": {"algorithm": "local", **DATA}, "set": {"algorithm.lr": 0.03}},
    ]
    record = json.loads((tmp_path / "sweep" / "tuned.json").read_text())
    assert [r["chosen"] for r in record["rows"]] == [
        {"algorithm.lr": "0.3"},
        {"algorithm.lr": "0.03"},
    ]
    assert "holdout=0.2" in (tmp_path / "sweep" / "tuned.md").read_text()


def test_a_choice_at_the_grids_edge_is_reported_and_one_inside_is_not(conf, tmp_path, capsys):
    fake_sweep(tmp_path)
    for alg, v in [("fedavg", 0.6), ("local", 0.65)]:  # lr 3.0: fedavg falls, local still rises
        ov = [f"algorithm={alg}", "seed=0", "partition.holdout=0.2", "algorithm.lr=3.0"]
        fake_trial(tmp_path / "sweep", f"{alg}-3.0", ov, v)
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3,3.0") == 0
    out = capsys.readouterr().out
    assert (
        "chosen at the grid's edge" in out
        and "- algorithm=local: algorithm.lr=3.0 (largest)" in out
    )
    assert "algorithm=fedavg:" not in out  # 0.3 has a lower value on each side
    record = json.loads((tmp_path / "sweep" / "tuned.json").read_text())
    assert [r["at_edge"] for r in record["rows"]] == [[], ["algorithm.lr=3.0 (largest)"]]
    assert (
        "- algorithm=local: algorithm.lr=3.0 (largest)"
        in (tmp_path / "sweep" / "tuned.md").read_text()
    )
    # The smallest value is an edge too: local's best on 0.03, 0.3 is the tie's smaller lr.
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--rows", "algorithm=local") == 0
    assert "- algorithm=local: algorithm.lr=0.03 (smallest)" in capsys.readouterr().out


def test_extend_edges_adds_the_value_past_each_edge_until_every_choice_is_inside(
    conf, tmp_path, capsys
):
    # Pass 1 on 0.03, 0.3: fedavg at the largest, local at the smallest (the tie's smaller lr);
    # pass 2 adds 1.0 for fedavg only and 0.01 for local only (the log ladder), where both
    # choices are inside: no third pass. The trials of the other row's added value are there
    # (fedavg at 0.01, local at 1.0) but not part of the search: a row runs its own values.
    fake_sweep(tmp_path)
    for alg, lr, v in [("fedavg", "1.0", 0.65), ("fedavg", "0.01", 0.9),
                       ("local", "1.0", 0.9), ("local", "0.01", 0.55)]:  # fmt: skip
        ov = [f"algorithm={alg}", "seed=0", "partition.holdout=0.2", f"algorithm.lr={lr}"]
        fake_trial(tmp_path / "sweep", f"{alg}-{lr}", ov, v)
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--extend-edges", "3") == 0
    out = capsys.readouterr().out
    assert out.count("adding") == 1
    assert "for that row only, algorithm=fedavg: algorithm.lr=1.0; algorithm=local: " \
        "algorithm.lr=0.01 (" in out  # fmt: skip
    second = out.split("adding")[1]
    assert "2 rows x 3 grid points x 1 seeds = 6 trials" in second and "0 to run" in second
    assert "| algorithm=fedavg |  | 0.5000 | **[0.7000]** | 0.6500 |" in out
    assert "| algorithm=local | 0.5500 | **[0.6000]** | 0.6000 |  |" in out
    record = json.loads((tmp_path / "sweep" / "tuned.json").read_text())
    assert record["grid"]["algorithm.lr"] == ["0.03", "0.3"]
    assert [r["grid"]["algorithm.lr"] for r in record["rows"]] == [
        ["0.03", "0.3", "1.0"],
        ["0.01", "0.03", "0.3"],
    ]
    assert [r["chosen"]["algorithm.lr"] for r in record["rows"]] == ["0.3", "0.03"]
    assert [r["at_edge"] for r in record["rows"]] == [[], []]
    assert "added past a row's edge (--extend-edges), for that row only: algorithm=fedavg: " \
        "algorithm.lr=1.0; algorithm=local: algorithm.lr=0.01" in (
            tmp_path / "sweep" / "tuned.md").read_text()  # fmt: skip
    # The cap: with one extension and fedavg best at 1.0, the second pass reports the edge.
    (tmp_path / "sweep" / "tuned.json").unlink()
    summary = tmp_path / "sweep" / "fedavg-1.0" / "summary.json"
    summary.write_text(summary.read_text().replace("0.65", "0.8"))
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--extend-edges", "1") == 0
    out = capsys.readouterr().out
    assert out.count("adding") == 1 and "- algorithm=fedavg: algorithm.lr=1.0 (largest)" in out


def test_a_value_added_past_one_rows_edge_is_launched_for_that_row_only(tmp_path):
    from fedjax_semi.results.tune import launches
    from fedjax_semi.results.tune_plan import Plan

    rows = [{"algorithm": "fedavg"}, {"algorithm": "local"}]
    plan = Plan("p", rows, [[{}], [{}]], {"algorithm.lr": ["0.03", "0.3"]}, [0], 0.2, [], [],
                tmp_path, False, "accuracy", rounds=[2, 2])  # fmt: skip
    shared = launches(plan, 1, "basic")  # one product of the rows: one multirun
    assert [(c[-3:], n) for c, n in shared] == [
        (["algorithm=fedavg,local", "algorithm.lr=0.03,0.3", "seed=0"], 4)
    ]
    plan.added = [{"algorithm.lr": ["1.0"]}, {}]
    split = launches(plan, 1, "basic")
    assert [(c[-3:], n) for c, n in split] == [
        (["algorithm=fedavg", "algorithm.lr=0.03,0.3,1.0", "seed=0"], 3),
        (["algorithm=local", "algorithm.lr=0.03,0.3", "seed=0"], 2),
    ]


def test_the_value_past_an_edge_follows_the_grids_ladder():
    from fedjax_semi.results.tune_plan import Plan
    from fedjax_semi.results.tune_select import Choice, next_values

    def past(values: list[str], chosen: str) -> dict:
        plan = Plan("p", [{"algorithm": "a"}], [[{}]], {"k": values}, [0], 0.2, [], [],
                    Path("."), False, "accuracy")  # fmt: skip
        return next_values(plan, [Choice({"algorithm": "a"}, {"k": chosen}, 0.5)])[0]

    assert past(["0.01", "0.03", "0.1"], "0.1") == {"k": ["0.3"]}  # not 0.30000000000000004
    assert past(["0.03", "0.1", "0.3"], "0.3") == {"k": ["1.0"]}  # 1.0 as trials name it
    assert past(["0.01", "0.03"], "0.01") == {"k": ["0.003"]}
    assert past(["0.0001", "0.0003"], "0.0001") == {"k": ["3e-05"]}
    assert past(["10", "30"], "30") == {"k": ["100"]}  # integers stay integers
    assert past(["0", "10", "30"], "0") == {}  # nothing below a grid that reaches 0
    assert past(["0.05", "0.1"], "0.1") == {"k": ["0.2"]}  # off the ladder: the outer ratio
    assert past(["0.05", "0.1"], "0.05") == {"k": ["0.025"]}
    assert past(["0.01", "0.03", "0.1"], "0.03") == {}  # inside


def test_values_tuned_on_one_reading_of_the_data_are_written_for_that_reading(conf, tmp_path):
    # partition.alpha=5.0 is a constant override: the chosen values go into the file scoped to
    # it (`where`), so a run of another alpha keeps the preset's lr; other entries are kept.
    fake_sweep(tmp_path)
    write_tuned(conf, [{"where": {"algorithm": "fedavg"}, "set": {"algorithm.lr": 0.9}}])
    d, overrides = conf
    argv = [*overrides, "partition.alpha=5.0", "--grid", "algorithm.lr=0.03,0.3"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--dir", str(tmp_path / "sweep"), "--conf-out", str(d / "tuned")])
    assert not e.value.code
    written = yaml.safe_load((d / "tuned" / "tiny_table.yaml").read_text())["tuned"]
    alpha = {"partition.alpha": 5.0}
    assert written == [
        {"where": {"algorithm": "fedavg"}, "set": {"algorithm.lr": 0.9}},
        {"where": {"algorithm": "fedavg", **DATA, **alpha}, "set": {"algorithm.lr": 0.3}},
        {"where": {"algorithm": "local", **DATA, **alpha}, "set": {"algorithm.lr": 0.03}},
    ]
    assert apply(compose_tiny(conf, "algorithm=local")) == {}  # alpha 0.5: not this reading
    assert apply(compose_tiny(conf, "algorithm=local", "partition.alpha=5.0")) == {
        "algorithm.lr": 0.03
    }


def test_a_diverged_point_is_never_chosen_and_last_k_reads_the_curve(conf, tmp_path, capsys):
    fake_sweep(tmp_path, {("fedavg", "0.3"): {"stop_reason": "non-finite loss in round 2"}})
    for alg, lr, curve in [("local", "0.03", [0.9, 0.2]), ("local", "0.3", [0.5, 0.5])]:
        rows = [{"round": r + 1, "accuracy": a} for r, a in enumerate(curve)]
        lines = "\n".join(json.dumps(r) for r in rows)
        (tmp_path / "sweep" / f"{alg}-{lr}" / "metrics.jsonl").write_text(lines)
    tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--rows", "algorithm=local",
         "--last-k", "2")  # fmt: skip
    assert "| algorithm=local | **[0.5500]** | 0.5000 |" in capsys.readouterr().out
    assert (
        tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--rows", "algorithm=fedavg") == 0
    )
    assert "| algorithm=fedavg | **[0.5000]** | diverged |" in capsys.readouterr().out
    # Both runs wrote their rows into one file: the second kept the first's entry.
    written = yaml.safe_load((conf[0] / "tuned" / "tiny_table.yaml").read_text())["tuned"]
    assert {e["where"]["algorithm"]: e["set"]["algorithm.lr"] for e in written} == {
        "local": 0.03,
        "fedavg": 0.03,
    }


def test_budget_time_reads_each_trial_where_the_table_does(conf, tmp_path, capsys):
    # A run stopped by stop.sim_time crosses the budget in its last round; the table reads it at
    # sim_time <= budget (fedjax-semi-report --budget-time), and so must the tuner.
    fake_sweep(tmp_path)
    curves = {"0.03": [(40, 0.8), (90, 0.7), (101, 0.1)], "0.3": [(40, 0.6), (90, 0.6), (101, 0.6)]}
    for lr, curve in curves.items():
        rows = [{"round": r + 1, "sim_time": t, "accuracy": a} for r, (t, a) in enumerate(curve)]
        lines = "\n".join(json.dumps(r) for r in rows)
        (tmp_path / "sweep" / f"local-{lr}" / "metrics.jsonl").write_text(lines)
    grid = ["--grid", "algorithm.lr=0.03,0.3", "--rows", "algorithm=local", "--last-k", "2"]
    tune(conf, tmp_path, *grid)
    assert "| algorithm=local | 0.4000 | **[0.6000]** |" in capsys.readouterr().out
    tune(conf, tmp_path, *grid, "--budget-time", "100")
    assert "| algorithm=local | **[0.7500]** | 0.6000 |" in capsys.readouterr().out
    record = json.loads((tmp_path / "sweep" / "tuned.json").read_text())
    assert (record["last_k"], record["budget_time"]) == (2, 100.0)
    assert "sim_time <= 100 s" in (tmp_path / "sweep" / "tuned.md").read_text()


def test_a_cost_is_minimised_like_a_loss(conf, tmp_path, capsys):
    # Ada-FedSemi's tables rank by cum_cost (Eq. 10 spent until the target): lower is better.
    fake_sweep(tmp_path)
    for (alg, lr), v in VALUES.items():
        path = tmp_path / "sweep" / f"{alg}-{lr}" / "summary.json"
        s = json.loads(path.read_text())
        s["final"]["cum_cost"] = 10 * v
        path.write_text(json.dumps(s))
    tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--metric", "cum_cost")
    out = capsys.readouterr().out
    assert "| algorithm=fedavg | **[5.0000]** | 7.0000 |" in out
    assert "| algorithm=local | **[6.0000]** | 6.0000 |" in out  # a tie: the smaller lr


def test_a_missing_trial_is_the_only_one_to_run(conf, tmp_path, capsys):
    fake_sweep(tmp_path)
    (tmp_path / "sweep" / "local-0.3" / "summary.json").unlink()
    interrupted = {"stop_reason": "interrupted after round 1", "rounds_completed": 1}
    (tmp_path / "sweep" / "fedavg-0.3" / "summary.json").write_text(json.dumps(interrupted))
    tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3", "--dry-run")
    out = capsys.readouterr().out
    assert "4 trials on partition.holdout=0.2; 2 to run" in out
    assert "resume=true" in out and "hydra.sweep.subdir=${hydra.job.override_dirname}" in out


def test_a_new_grid_axis_reuses_the_trials_run_at_its_value(conf, tmp_path, capsys):
    # The four trials predate an algorithm.local_epochs axis and ran at 1 (run_config.json):
    # they answer for the points local_epochs=1, and only local_epochs=2 is left to run.
    fake_sweep(tmp_path)
    for d in (tmp_path / "sweep").iterdir():
        # 1.0: the same number as the grid's "1", spelled as a float.
        (d / "run_config.json").write_text(json.dumps({"algorithm": {"local_epochs": 1.0}}))
    grid = ["--grid", "algorithm.lr=0.03,0.3", "--grid", "algorithm.local_epochs=1,2"]
    tune(conf, tmp_path, *grid, "--dry-run")
    out = capsys.readouterr().out
    assert "8 trials on partition.holdout=0.2; 4 to run" in out
    assert "algorithm.local_epochs=2 " in out  # the launch leaves out the points already run
    # An explicit trial wins over the stand-in; a value the old trials did not run at (3) is not
    # theirs.
    for alg, lr in VALUES:
        for e, v in (("1", 0.1), ("2", 0.05)):
            ov = [f"algorithm={alg}", "seed=0", "partition.holdout=0.2", f"algorithm.lr={lr}"]
            fake_trial(
                tmp_path / "sweep", f"{alg}-{lr}-e{e}", [*ov, f"algorithm.local_epochs={e}"], v
            )
    assert tune(conf, tmp_path, *grid) == 0
    assert "0 to run" in capsys.readouterr().out
    record = json.loads((tmp_path / "sweep" / "tuned.json").read_text())
    points = [p for r in record["rows"] for p in r["points"]]
    assert len(points) == 8
    for p in points:
        assert p["dirs"][0].endswith("-e" + p["point"]["algorithm.local_epochs"])
    tune(conf, tmp_path, "--grid", "algorithm.lr=0.03", "--grid", "algorithm.local_epochs=3",
         "--dry-run")  # fmt: skip
    assert "2 trials on partition.holdout=0.2; 2 to run" in capsys.readouterr().out


def test_bad_flags_are_one_line_before_any_work(conf, tmp_path, capsys):
    cases = [
        (["--holdout", "0.7"], "--holdout='0.7' is not allowed: a share in (0, 0.5]"),
        (["--holdout", "0"], "(0 would tune on the test split)"),
        (["--seeds", "0,x"], "--seeds='0,x' is not allowed: distinct integers >= 0"),
        (["--grid", "algorithm.lr=0,0.1"], "learning rates that are numbers > 0"),
        (["--grid", "algorithm.lr="], "--grid='algorithm.lr=' is not allowed: KEY=V1,V2"),
        (["--grid", "algorithm.nope=1,2"], "--grid='algorithm.nope' is not allowed: a config key"),
        (["--rows", "partition.alpha=1"], "a row key of tiny_table: ['algorithm']"),
        (["--rows", "algorithm=fixavg"], "values among ['fedavg', 'local']"),
        (["--launcher", "ray"], "--launcher='ray' is not allowed"),
        (["--last-k", "0"], "--last-k='0' is not allowed"),
        (["--extend-edges", "-1"], "--extend-edges='-1' is not allowed: distinct integers >= 0"),
        (["--budget-time", "0"], "--budget-time='0' is not allowed: seconds of simulated clock"),
        (["--budget-time", "x"], "--budget-time='x' is not allowed"),
        (["algorithm.lr=0.1"], "algorithm.lr is set by the tuner"),
    ]
    for flags, needle in cases:
        assert tune(conf, tmp_path, *flags) == 2, flags
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, (flags, err)
    d, overrides = conf
    with pytest.raises(SystemExit):
        main(["+experiment=no_such_preset", "--dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert "+experiment='no_such_preset' is not allowed: a preset of conf/experiment: [" in err
    assert len(err.strip().splitlines()) == 1
    # A preset that names no rows (no hydra.sweeper.params at all) is refused the same way.
    (d / "experiment" / "one_run.yaml").write_text("# @package _global_\nrounds: 2\n")
    with pytest.raises(SystemExit):
        main([f"hydra.searchpath=[file://{d}]", "+experiment=one_run", "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "+experiment='one_run' is not allowed: a table preset (its hydra.sweeper.params" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "sweep").exists()  # no work started


def test_knobs_need_rows_with_equal_knob_grids(conf, tmp_path, capsys):
    d, _ = conf
    (d / "experiment" / "tiny_table.yaml").write_text(PRESET.format(rows="fedavg,fixavg"))
    assert tune(conf, tmp_path, "--knobs", "--dry-run") == 2
    err = capsys.readouterr().err
    assert "--knobs=True is not allowed: rows whose knob grids have equal sizes" in err
    assert "'algorithm=fedavg': 1, 'algorithm=fixavg': 2" in err
    flags = ("--knobs", "--rows", "algorithm=fixavg", "--grid", "algorithm.lr=0.01,0.1")
    assert tune(conf, tmp_path, *flags, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "1 rows x 4 grid points x 1 seeds = 4 trials" in out
    assert "algorithm.pl_threshold=0.8" in out and "algorithm.pl_threshold=0.95" in out


def test_knobs_reuse_the_trials_run_before_them_at_their_setting(conf, tmp_path, capsys):
    # A FixAvg and a UM-pFSSL trial per lr ran before --knobs (run_config.json): FixAvg's at
    # pl_threshold 0.95, UM-pFSSL's at corr_form inverse. They answer for those settings, and
    # only the other setting of each row is left to run. UM-pFSSL's config also holds a
    # pl_threshold (null), FixAvg's knob: it must not enter the UM-pFSSL trial's identity.
    d, _ = conf
    (d / "experiment" / "tiny_table.yaml").write_text(PRESET.format(rows="fixavg,um_pfssl"))
    ran = {
        "fixavg": {"pl_threshold": 0.95},
        "um_pfssl": {"corr_form": "inverse", "pl_threshold": None},
    }
    for alg, config in ran.items():
        for lr in ("0.01", "0.1"):
            ov = [f"algorithm={alg}", "seed=0", "partition.holdout=0.2", f"algorithm.lr={lr}"]
            trial = fake_trial(tmp_path / "sweep", f"{alg}-{lr}", ov, 0.5)
            (trial / "run_config.json").write_text(json.dumps({"algorithm": config}))
    flags = ("--knobs", "--grid", "algorithm.lr=0.01,0.1")
    assert tune(conf, tmp_path, *flags, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "8 trials on partition.holdout=0.2; 4 to run" in out
    launches = "\n".join(line for line in out.splitlines() if "fedjax-semi -m" in line)
    assert "algorithm.pl_threshold=0.8" in launches and "algorithm.corr_form=complement" in launches
    assert "0.95" not in launches and "inverse" not in launches


def test_sensitive_knobs_are_valid_settings_of_their_methods():
    """Every method's two settings name knobs of its own config with values it accepts."""
    from fedjax_semi.algorithms import ALGORITHM_CONFIGS

    for name, settings in SENSITIVE_KNOBS.items():
        assert len(settings) == 2, name
        for s in settings:
            kwargs = {k.removeprefix("algorithm."): v for k, v in s.items()}
            ALGORITHM_CONFIGS[name](**kwargs)  # runs the config's own checks
        assert settings[0] != settings[1]


# ----------------------------------------------------------------------------- the app's side


def compose_real(*overrides: str):
    """The app's config, Hydra's part included (what apply_tuned reads)."""
    from hydra import compose, initialize_config_dir

    from conftest import _register_configs_once
    from fedjax_semi.cli import CONF_DIR

    _register_configs_once()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def compose_tiny(conf, *overrides: str):
    return compose_real(*conf[1], *overrides)


def write_tuned(conf, entries) -> None:
    (conf[0] / "tuned").mkdir(exist_ok=True)
    text = "# @package _global_\n" + yaml.safe_dump({"tuned": entries})
    (conf[0] / "tuned" / "tiny_table.yaml").write_text(text)


ENTRIES = [
    {"where": {"algorithm": "fedavg"}, "set": {"algorithm.lr": 0.3, "algorithm.momentum": 0.5}},
    {"where": {"algorithm": "local", "partition.alpha": 0.5}, "set": {"algorithm.lr": 0.07}},
]


def apply(cfg):
    from fedjax_semi.tuned import apply_tuned, given_keys

    h = cfg.hydra
    return apply_tuned(cfg, h.runtime.choices, given_keys(h.overrides.task))


def test_the_app_applies_matching_tuned_values_unless_the_command_line_gives_them(conf):
    write_tuned(conf, ENTRIES)
    cfg = compose_tiny(conf, "algorithm=fedavg")
    assert apply(cfg) == {"algorithm.lr": 0.3, "algorithm.momentum": 0.5}
    assert (cfg.algorithm.lr, cfg.algorithm.momentum) == (0.3, 0.5)
    cfg = compose_tiny(conf, "algorithm=fedavg", "algorithm.lr=0.01")  # the command line wins
    assert apply(cfg) == {"algorithm.momentum": 0.5} and cfg.algorithm.lr == 0.01
    cfg = compose_tiny(conf, "algorithm=local")  # dirichlet's alpha 0.5: by value
    assert apply(cfg) == {"algorithm.lr": 0.07}
    cfg = compose_tiny(conf, "algorithm=local", "partition.alpha=5")
    assert apply(cfg) == {} and cfg.algorithm.lr == 0.05
    cfg = compose_tiny(conf, "algorithm=fedavg", "tuned=[]")  # the way to run without them
    assert apply(cfg) == {}


def test_dofed_records_tuned_values_apply_to_the_reading_they_were_tuned_on():
    # conf/tuned/dofed_spp_fmnist_record.yaml was tuned on SUBSET's `balanced` and `even`
    # assignments and on NORMAL's `fixed_total` sizing; NORMAL's `per_class` sizing keeps the
    # preset's lr.
    runs = {
        ("subset", "assignment=balanced", "fedfomo"): {"algorithm.lr": 0.0001},
        ("subset", "assignment=balanced", "dofed_spp"): {"algorithm.lr": 0.01},
        ("subset", "assignment=even", "fedfomo"): {"algorithm.lr": 0.0001},
        ("subset", "assignment=even", "fedavg"): {"algorithm.lr": 0.01},
        ("normal", "size_mode=fixed_total", "fedfomo"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=fixed_total", "fedbe_cpu"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=fixed_total", "local"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=per_class", "fedfomo"): {},
    }
    for (scheme, reading, alg), applied in runs.items():
        over = [f"partition={scheme}", f"partition.dofed.{reading}", f"algorithm={alg}"]
        cfg = compose_real("+experiment=dofed_spp_fmnist_record", *over)
        assert apply(cfg) == applied, over
    # `even` is the partition's default: the entry matches the value, not the override
    cfg = compose_real(
        "+experiment=dofed_spp_fmnist_record", "partition=subset", "algorithm=fedbe_cpu"
    )
    assert apply(cfg) == {"algorithm.lr": 0.03}


def test_cfsl_records_each_scenario_takes_its_own_lr():
    # conf/tuned/cfsl_fmnist_record.yaml: lr 0.1 was searched on BMSPGS; each other scenario's
    # own search chose 0.1 (BMSPRR, EMSPGS) or 0.05 (EMSPRR, the stopping-based four); a
    # command-line lr still wins.
    knobs = {"algorithm.bipartition": "complete", "algorithm.kappa2": 1.0}
    cases = [("bmspgs", 0.1), ("bmsprr", 0.1), ("emspgs", 0.1), ("emsprr", 0.05),
             ("bmstgs", 0.05), ("emstrr", 0.05)]  # fmt: skip
    for scenario, lr in cases:
        cfg = compose_real("+experiment=cfsl_fmnist_record", f"algorithm.scenario={scenario}")
        assert apply(cfg) == {"algorithm.lr": lr, **knobs}, scenario
    cfg = compose_real(
        "+experiment=cfsl_fmnist_record", "algorithm.scenario=bmstgs", "algorithm.lr=0.3"
    )
    assert apply(cfg) == knobs and cfg.algorithm.lr == 0.3


def test_um_pfssl_records_choices_apply_at_alpha_5_only():
    # conf/tuned/um_pfssl_table1_record.yaml holds the alpha-5 search; alpha 0.5 is not searched
    # yet, so its runs keep the preset's values.
    chosen = {
        "fedavg_sl": {"algorithm.lr": 1.0},
        "fixbn": {"algorithm.pl_threshold": 0.8, "algorithm.lr": 0.3},
        "um_pfssl_record": {"algorithm.corr_form": "complement", "algorithm.lr": 0.03},
        "local": {"algorithm.lr": 0.3},
    }
    for alg, applied in chosen.items():
        over = ["+experiment=um_pfssl_table1_record", f"algorithm={alg}"]
        cfg = compose_real(*over, "partition.alpha=5.0")
        assert apply(cfg) == applied, alg
        cfg = compose_real(*over, "partition.alpha=0.5")
        assert apply(cfg) == {} and cfg.algorithm.lr == 0.03, alg


def test_fedmds_tuned_lr_reaches_every_phase_of_its_record():
    # conf/tuned/cofed_fmnist_hard_fedmd_record.yaml sets one lr per split; the preset ties the
    # digest and fine-tuning lrs to it, so they must follow the tuned value, not the default.
    for variant, lr in (("iid", 0.003), ("noniid", 0.0003)):
        over = ["+experiment=cofed_fmnist_hard_fedmd_record", f"partition.cofed.variant={variant}"]
        cfg = compose_real(*over)
        assert apply(cfg) == {"algorithm.lr": lr}, variant
        a = cfg.algorithm
        assert (a.lr, a.digest_lr, a.finetune_lr) == (lr, lr, lr), variant


def test_a_stale_or_malformed_tuned_file_is_one_line(conf):
    for entries, needle in [
        ([{"where": {"algorithm.nope": 1}, "set": {"algorithm.lr": 0.1}}], "algorithm.nope"),
        ([{"where": {"algorithm": "fedavg"}, "set": {"algorithm.nope": 1}}], "'algorithm.nope'"),
        ([{"where": {"algorithm": "fedavg"}}], "a list of {where"),
        (ENTRIES + [{"where": {}, "set": {"algorithm.lr": 0.9}}], "tuned[0] also matches"),
    ]:
        write_tuned(conf, entries)
        with pytest.raises(ConfigError) as e:
            apply(compose_tiny(conf, "algorithm=fedavg"))
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def run_task(cfg, tmp_path):
    """The app's task as Hydra's launcher calls it: Hydra's config set, the task's without it."""
    import copy

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    from fedjax_semi.cli import _task

    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
    try:
        return _task(task)
    finally:
        HydraConfig.instance().cfg = None


def test_a_tuned_run_on_holdout_records_its_values_and_a_rerun_returns_its_result(conf, tmp_path):
    """One digits run of the tiny preset with a tuned file and partition.holdout=0.2: it trains
    and evaluates on the validation rows; the tuned lr is used and recorded; rerun with
    resume=true, the finished run returns its stored objective without training (its files
    untouched)."""
    write_tuned(conf, ENTRIES[:1])
    out = tmp_path / "run"
    args = ("algorithm=fedavg", f"out_dir={out}", "resume=true", "save_partition=true")
    args += ("hydra.mode=MULTIRUN",)  # a job of a sweep: the tuner's trials
    value = run_task(compose_tiny(conf, *args, "partition.holdout=0.2"), tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tuned"] == {"algorithm.lr": 0.3, "algorithm.momentum": 0.5}
    assert json.loads((out / "run_config.json").read_text())["algorithm"]["lr"] == 0.3
    assert value == summary["final"]["accuracy"] and summary["rounds_completed"] == 2
    # It evaluated on the validation rows: held out of the training split, none of the test's.
    p = Partition.load(out / "partition.npz")
    assert p.meta["holdout"] == 0.2 and (p.server["test_global"] < p.meta["n_train"]).all()
    counts = json.loads((out / "counts.json").read_text())
    assert sum(counts["test"]) == len(p.server["test_global"]) > 0
    stamps = {p.name: os.stat(p).st_mtime_ns for p in out.iterdir() if p.is_file()}
    assert run_task(compose_tiny(conf, *args, "partition.holdout=0.2"), tmp_path) == value
    assert {p.name: os.stat(p).st_mtime_ns for p in out.iterdir() if p.is_file()} == stamps
    # Other settings that change results in the same directory: one line, as a plain resume.
    with pytest.raises(SystemExit):
        run_task(compose_tiny(conf, *args, "partition.holdout=0.3"), tmp_path)


@pytest.mark.slow
def test_real_tuning_end_to_end_and_its_resume(conf, tmp_path, capsys):
    """The real multirun (2 rows x 2 lrs x 1 seed on digits): the choice is each row's argmax of
    the trials' own summary.json; with one summary deleted, the rerun trains that trial only."""
    sweep = tmp_path / "sweep"
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3") == 0
    trials = sorted(sweep.glob("*/summary.json"))
    assert len(trials) == 4
    acc = {p.parent.name: json.loads(p.read_text())["final"]["accuracy"] for p in trials}
    written = yaml.safe_load((conf[0] / "tuned" / "tiny_table.yaml").read_text())["tuned"]
    for e in written:
        alg = e["where"]["algorithm"]
        mine = {n: a for n, a in acc.items() if f"algorithm={alg}," in n}
        best = max(mine, key=lambda n: (mine[n], -float(n.split(",")[0].split("=")[1])))
        assert f"algorithm.lr={e['set']['algorithm.lr']}," in best
    capsys.readouterr()
    victim = trials[0]
    victim.unlink()
    stamps = {p: os.stat(p).st_mtime_ns for p in trials[1:]}
    assert tune(conf, tmp_path, "--grid", "algorithm.lr=0.03,0.3") == 0
    assert "4 trials on partition.holdout=0.2; 1 to run" in capsys.readouterr().out
    assert victim.exists() and {p: os.stat(p).st_mtime_ns for p in trials[1:]} == stamps


def test_a_diverged_job_of_a_multirun_returns_nan_and_the_sweep_goes_on(
    conf, tmp_path, monkeypatch, capsys
):
    """A job that ends in NaNError: in a multirun the task returns NaN (Hydra records the job
    and launches the next; an exit would end the whole tuning at its first too-large lr); a
    single run still exits with code 3."""
    from fedjax_semi import experiment
    from fedjax_semi.engine.loop import NaNError

    def diverge(exp, out_dir):
        raise NaNError("non-finite loss or model in round 2, client 3")

    monkeypatch.setattr(experiment, "run", diverge)
    args = ("algorithm=fedavg", f"out_dir={tmp_path / 'run'}")
    value = run_task(compose_tiny(conf, *args, "hydra.mode=MULTIRUN"), tmp_path)
    assert math.isnan(value)
    assert "fedjax-semi: error: non-finite loss or model in round 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run_task(compose_tiny(conf, *args), tmp_path)
    assert e.value.code == 3
