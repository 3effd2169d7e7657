"""fedjax-semi-tune: its choice, its files and its refusals, on trial directories written here
(a sweep whose every trial is complete launches nothing), so they take seconds. What the app
does for it (tuned values applied, finished runs skipped) and the real multirun end to end are
in test_tuned_apply.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedjax_semi.results.tune import SENSITIVE_KNOBS, main
from tiny_table import DATA, PRESET, apply, compose_tiny, make_conf, tune, write_tuned


@pytest.fixture
def conf(tmp_path):
    return make_conf(tmp_path)


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


def test_a_killed_tuner_ends_its_multirun(tmp_path):
    # SIGTERM to the tuner (a scheduler's kill) must not leave its multirun running: the orphan
    # went on writing trial directories that a rerun of the tuner then trained a second time.
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(99)"
    tuner = subprocess.Popen([
        sys.executable, "-c",
        "import sys; from fedjax_semi.results.tune_launch import run_multirun; "
        f"run_multirun([sys.executable, '-c', {child!r}])",
    ])  # fmt: skip
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert tuner.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    tuner.send_signal(signal.SIGTERM)
    try:
        assert tuner.wait(timeout=60) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # ended and reaped by the tuner
            os.kill(child_pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)
