"""What the app does for fedjax-semi-tune: tuned values applied to the runs they were chosen
for, a finished trial returned without training, a diverged job that lets the sweep go on; and
one slow test of the real multirun end to end, and its resume."""

from __future__ import annotations

import json
import math
import os

import pytest
import yaml

from fedjax_semi.data.partitions import Partition
from fedjax_semi.errors import ConfigError
from tiny_table import apply, compose_real, compose_tiny, make_conf, tune, write_tuned


@pytest.fixture
def conf(tmp_path):
    return make_conf(tmp_path)


ENTRIES = [
    {"where": {"algorithm": "fedavg"}, "set": {"algorithm.lr": 0.3, "algorithm.momentum": 0.5}},
    {"where": {"algorithm": "local", "partition.alpha": 0.5}, "set": {"algorithm.lr": 0.07}},
]


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
    # assignments and on NORMAL's `fixed_total` and `per_class` sizings, with other values in
    # each; SUBSET's `random` assignment, never searched, keeps the preset's lr.
    runs = {
        ("subset", "assignment=balanced", "fedfomo"): {"algorithm.lr": 0.0001},
        ("subset", "assignment=balanced", "dofed_spp"): {"algorithm.lr": 0.01},
        ("subset", "assignment=even", "fedfomo"): {"algorithm.lr": 0.0001},
        ("subset", "assignment=even", "fedavg"): {"algorithm.lr": 0.01},
        ("normal", "size_mode=fixed_total", "fedfomo"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=fixed_total", "fedbe_cpu"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=fixed_total", "local"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=per_class", "fedfomo"): {"algorithm.lr": 0.03},
        ("normal", "size_mode=per_class", "dofed_spp"): {"algorithm.lr": 0.03},
        ("subset", "assignment=random", "fedfomo"): {},
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


def test_um_pfssl_records_choices_apply_at_their_own_alpha():
    # conf/tuned/um_pfssl_table1_record.yaml holds both alphas' searches; at an alpha not
    # searched (1.0) every row keeps the preset's values.
    chosen = {
        "fedavg_sl": ({"algorithm.lr": 1.0}, {"algorithm.lr": 0.3}),
        "fixavg": (
            {"algorithm.pl_threshold": 0.95, "algorithm.lr": 0.1},
            {"algorithm.pl_threshold": 0.95, "algorithm.lr": 0.3},
        ),
        "fixbn": (
            {"algorithm.pl_threshold": 0.8, "algorithm.lr": 0.3},
            {"algorithm.pl_threshold": 0.95, "algorithm.lr": 0.3},
        ),
        "fedper": ({"algorithm.lr": 0.1}, {"algorithm.lr": 0.1}),
        "pfedme": ({"algorithm.lr": 0.1}, {"algorithm.lr": 0.1}),
        "um_pfssl_record": (
            {"algorithm.corr_form": "complement", "algorithm.lr": 0.03},
            {"algorithm.corr_form": "complement", "algorithm.lr": 0.03},
        ),
        "local": ({"algorithm.lr": 0.3}, {"algorithm.lr": 0.3}),
    }
    for alg, (at_5, at_half) in chosen.items():
        over = ["+experiment=um_pfssl_table1_record", f"algorithm={alg}"]
        cfg = compose_real(*over, "partition.alpha=5.0")
        assert apply(cfg) == at_5, alg
        cfg = compose_real(*over, "partition.alpha=0.5")
        assert apply(cfg) == at_half, alg
        assert apply(compose_real(*over, "partition.alpha=1.0")) == {}, alg
        assert cfg.algorithm.lr == at_half.get("algorithm.lr", 0.03), alg


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


def test_a_run_with_one_diverged_seed_returns_nan_and_a_single_run_exits_3(
    conf, tmp_path, monkeypatch, capsys
):
    """Replicas where one seed diverged and the others ran on (NaNGuard stops only that seed):
    the task names it on one error line and returns NaN in a multirun; a single run exits 3,
    as a run that diverged does."""
    from fedjax_semi import experiment

    reason = "seed 0: rounds completed; seed 1: non-finite loss or model in round 2, seed 1: ..."

    def one_seed_diverges(exp, out_dir):
        return {"stop_reason": reason, "final": {"accuracy": 0.5}, "rounds_completed": 3}

    monkeypatch.setattr(experiment, "run", one_seed_diverges)
    args = ("algorithm=fedavg", f"out_dir={tmp_path / 'run'}")
    assert math.isnan(run_task(compose_tiny(conf, *args, "hydra.mode=MULTIRUN"), tmp_path))
    assert f"fedjax-semi: error: {reason}; outputs in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run_task(compose_tiny(conf, *args), tmp_path)
    assert e.value.code == 3
