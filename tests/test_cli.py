"""The command line: clear errors for bad input, a multirun sweep, and the report."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import SMALL, compose_hydra
from fedjax_semi.cli import report_main


def run_cli(*args: str, module: str = "fedjax_semi.cli", cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


BAD_INPUTS = [
    (["algorithm=nope"], ["algorithm", "nope", "fedavg", "fedavg_pl", "local"]),
    (["dataset=nope"], ["dataset", "nope", "fashion_mnist", "digits"]),
    (["partition.alpha=0"], ["partition.alpha", "0", "> 0"]),
    (["partition.alpha=-1"], ["partition.alpha", "-1", "> 0"]),
    (["clients_per_round=13"], ["clients_per_round", "13", "num_clients=12"]),
    (["partition.labeled_fraction=0"], ["partition.labeled_fraction", "(0, 1]"]),
    (["partition.labeled_fraction=1.5"], ["partition.labeled_fraction", "1.5", "(0, 1]"]),
    (["dataset=mnist", "dataset.data_dir=/no/such/dir"], ["/no/such/dir", "train-images-idx3"]),
    (["algorithm.lrr=0.1"], ["lrr", "algorithm"]),
    (["hardware.chunk=zero"], ["hardware.chunk", "zero", "positive integer, 'all' or 'auto'"]),
    (["hardware.eval_chunk=auto"], ["hardware.eval_chunk", "auto", "positive integer or 'all'"]),
    (
        ["hardware.chunk=auto", "hardware.backend=reference"],
        ["hardware.chunk", "auto", "hardware.backend=reference"],
    ),
    (["algorithm=fedprox", "algorithm.prox_mu=0"], ["algorithm.prox_mu", "> 0", "fedprox"]),
    (["dataset.fraction=0"], ["dataset.fraction", "0", "(0, 1]"]),
    (["stop.plateau=0.01"], ["stop.plateau", "0.01", "stop.patience >= 1"]),
    (["algorithm=um_pfssl", "algorithm.loss_schedule=mixed"], ["loss_schedule", "mixed", "joint"]),
    (
        ["algorithm=fixavg", "algorithm.pl_threshold=null"],
        ["algorithm.pl_threshold", "None", "um_pfssl"],
    ),
    (
        ["algorithm=um_pfssl", "algorithm.pl_threshold=1.5"],
        ["algorithm.pl_threshold", "1.5", "[0, 1]"],
    ),
    (
        ["hardware=multi_host", "hardware.backend=reference"],
        ["hardware.distributed=True", "hardware.backend=reference"],
    ),
    (["hardware=multi_host", "hardware.devices=2"], ["hardware.devices=2", "'all'"]),
]


def check_one_clear_message(err: str, needles: list[str], out_dir) -> None:
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err}"
    assert "Traceback" not in err
    # One message: Hydra's list of a group's options (tab-indented, one per option) aside.
    prose = [line for line in err.strip().splitlines() if not line.startswith("\t")]
    assert len(prose) <= 12, err
    assert not (out_dir / "metrics.jsonl").exists()  # no work started


# Through the real command line: Hydra's own refusals (an unknown config option or key), and one
# of ours end to end. The rest of BAD_INPUTS reach our checks the same way, so they run in this
# process through the CLI's task function (a fresh interpreter costs seconds per case).
SUBPROCESS_CASES = (0, 1, 2, 8)


@pytest.mark.parametrize("overrides,needles", [BAD_INPUTS[i] for i in SUBPROCESS_CASES], ids=str)
def test_bad_input_fails_with_one_clear_message(overrides, needles, tmp_path):
    r = run_cli(*SMALL, f"out_dir={tmp_path}", *overrides)
    assert r.returncode != 0
    check_one_clear_message(r.stderr + r.stdout, needles, tmp_path)


@pytest.mark.parametrize(
    "overrides,needles",
    [b for i, b in enumerate(BAD_INPUTS) if i not in SUBPROCESS_CASES],
    ids=lambda v: str(v)[:40],
)
def test_bad_value_fails_with_one_clear_message(overrides, needles, tmp_path, capsys):
    from fedjax_semi.cli import _task

    cfg = compose_hydra(f"out_dir={tmp_path}", *overrides)
    with pytest.raises(SystemExit) as exit_:
        _task(cfg)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("fedjax-semi: error: ")
    check_one_clear_message(captured.err + captured.out, needles, tmp_path)


# make test-slow: the CLI's multirun runs fast through the vectorized launcher
# (test_vectorized.py); this one adds Hydra's joblib plugin and two processes.
@pytest.mark.slow
def test_joblib_multirun_sweep_and_report(tmp_path, capsys):
    """Two jobs through Hydra's joblib launcher, in parallel; the report reads its sweep
    directory like any other."""
    sweep = tmp_path / "sweep"
    r = run_cli(
        "-m",
        *SMALL,
        "rounds=2",
        "algorithm=fedavg,local",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
    )
    assert r.returncode == 0, r.stderr
    assert "Joblib.Parallel" in r.stdout + r.stderr  # the joblib launcher ran the jobs
    assert sorted(p.parent.name for p in sweep.rglob("summary.json")) == ["0", "1"]
    for job in sweep.glob("[0-1]"):  # each job's resolved config says which setting it ran
        assert (job / ".hydra" / "config.yaml").exists()
    report_main([str(sweep), "--by-participations", "0,1,2"])  # as fedjax-semi-report does
    table, _, by_part = capsys.readouterr().out.partition("Personal accuracy by participations")
    lines = [ln for ln in table.splitlines() if ln.startswith("| algorithm=")]
    assert len(lines) == 2 and all("| 1 |" in ln and "±" in ln for ln in lines)
    # Each round's cohort is logged: 4 distinct clients of the 12.
    for metrics in sweep.rglob("metrics.jsonl"):
        cohorts = [json.loads(ln)["cohort"] for ln in metrics.read_text().splitlines()]
        assert len(cohorts) == 2 and all(len(set(c)) == 4 for c in cohorts)
        assert all(0 <= i < 12 for c in cohorts for i in c)
    part_rows = [ln.split("|")[3:-1] for ln in by_part.splitlines() if ln.startswith("| alg")]
    assert len(part_rows) == 2
    for cells in part_rows:  # clients per bin add up to 12
        n = [float(c.split("(")[1].rstrip(") ")) for c in cells if "(" in c]
        assert sum(n) == 12 and len(cells) == 3
    with open(sweep / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["setting"] for r in rows} == {"algorithm=fedavg", "algorithm=local"}
    assert all(0 <= float(r["accuracy_mean"]) <= 1 for r in rows)


def test_report_of_an_empty_dir_fails_clearly(tmp_path):
    rep = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fedjax_semi.cli import report_main; report_main()",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert rep.returncode == 2 and "no run with a summary.json" in rep.stderr


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_ttap_report_of_a_dofed_sweep(tmp_path):
    """fedjax-semi-report --ttap: CSV rows (method, dataset, partition, seed, round, clock,
    cls_acc, lab_acc) from round 0 (eval_initial, after the warm-up) on, and the panel PNG."""
    sweep = tmp_path / "sweep"
    tiny = [
        "partition=subset", "num_clients=6", "partition.dofed.train_per_class=20",
        "partition.dofed.target_per_class=20", "partition.dofed.target_labeled_fraction=0.1",
        "partition.dofed.test_per_class=8", "algorithm.warmup_rounds=1", "algorithm.selection_k=3",
        "algorithm.selection_b=2", "clients_per_round=3", "eval_initial=true",
    ]  # fmt: skip
    r = run_cli(
        "-m", *SMALL, *tiny, "rounds=2", "algorithm=dofed_spp", "seed=1",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report_main([str(sweep), "--ttap", "--metrics", "personal_acc,pl_acc"])
    with open(sweep / "ttap.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3  # rounds 0, 1, 2 (seeds are grouped as by the report's tables)
    for seed in ("1",):
        mine = sorted((r for r in rows if r["seed"] == seed), key=lambda r: int(r["round"]))
        assert [r["round"] for r in mine] == ["0", "1", "2"]
        clocks = [float(r["clock"]) for r in mine]
        assert 0 < clocks[0] < clocks[1] < clocks[2]  # the warm-up is on the clock
        assert mine[0]["lab_acc"] == "" and all(0 <= float(r["lab_acc"]) <= 1 for r in mine[1:])
        assert {(r["method"], r["dataset"], r["partition"]) for r in mine} == {
            ("dofed_spp", "digits", "subset")
        }
    assert (sweep / "ttap.png").stat().st_size > 10_000


def _fake_run(d, overrides, client_acc, labeled, unlabeled):
    """A run directory in the simulator's on-disk format: summary, counts, Hydra overrides."""
    import json

    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / "summary.json").write_text(
        json.dumps(
            {"final": {"personal_acc": float(np.mean(client_acc))}, "client_acc": client_acc}
        )
    )
    (d / "counts.json").write_text(json.dumps({"labeled": labeled, "unlabeled": unlabeled}))


def test_report_by_participations(tmp_path, capsys):
    """Per-bin mean accuracy of the clients by rounds taken part in, counted from the cohorts
    of metrics.jsonl up to the final evaluation, against a direct computation; runs without
    logged cohorts and bad edges fail clearly."""
    from fedjax_semi.cli import report_main
    from fedjax_semi.results.bins import main as bins_main
    from fedjax_semi.results.bins import participation_table

    rng = np.random.default_rng(1)
    k, rounds, s = 30, 6, 5
    cohorts = [rng.choice(k, s, replace=False) for _ in range(rounds + 2)]  # 2 past the final
    part = np.bincount(np.concatenate(cohorts[:rounds]), minlength=k)
    accs = []
    for seed in (0, 1):
        acc = rng.uniform(0, 1, k)
        accs.append(acc)
        d = tmp_path / f"r{seed}"
        _fake_run(d, ["algorithm=x", f"seed={seed}"], acc.tolist(), [1] * k, [1] * k)
        summary = json.loads((d / "summary.json").read_text())
        summary["final"]["round"], summary["algorithm"] = rounds, "x"
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"round": t + 1, "cohort": c.tolist()}) + "\n"
                for t, c in enumerate(cohorts)
            )
        )
    text = participation_table(tmp_path, [0, 1, 3])
    header, _, row = text.splitlines()
    assert header.split("|")[3:-1] == [" 0 ", " 1-2 ", " ≥ 3 "]
    cells = row.split("|")[3:-1]
    for cell, m in zip(cells, [part == 0, (part >= 1) & (part < 3), part >= 3], strict=True):
        want = (
            "–"
            if not m.any()
            else f"{100 * np.mean([a[m].mean() for a in accs]):.1f} ({m.sum():g})"
        )
        assert cell.strip() == want
    assert (tmp_path / "report_by_participations.md").read_text().strip() == text

    report_main([str(tmp_path), "--metrics", "personal_acc", "--by-participations", "0,1,3"])
    assert "≥ 3" in capsys.readouterr().out
    # The same table from the exported per-client records, with the run directories gone.
    records = tmp_path.parent / f"{tmp_path.name}_clients.jsonl"
    report_main([str(tmp_path), "--clients", str(records)])
    assert f"wrote {2 * k} per-client records" in capsys.readouterr().out
    first = json.loads(records.read_text().splitlines()[k + 3])  # seed 1's client 3
    assert first == {
        "setting": first["setting"],
        "seed": "1",  # from the overrides (these runs have no config.yaml)
        "run": "r1",
        "client": 3,
        "acc": accs[1][3],
        "labeled": 1,
        "unlabeled": 1,
        "participations": int(part[3]),
    }
    moved = tmp_path.parent / f"{tmp_path.name}_gone"
    tmp_path.rename(moved)
    assert participation_table(records, [0, 1, 3]) == text
    assert bins_main([str(records), "--by-participations", "0,1,3"]) == 0
    assert text in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        bins_main([str(records)])
    assert e.value.code == 2 and "--by-participations EDGES" in capsys.readouterr().err
    moved.rename(tmp_path)
    for bad in ("2,1", "0,1.5", "-1,2", "a"):
        with pytest.raises(SystemExit) as e:
            report_main([str(tmp_path), f"--by-participations={bad}"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--by-participations" in err and bad in err and "integers" in err
    (tmp_path / "r1" / "metrics.jsonl").write_text('{"round": 1}\n')  # logged before cohorts
    with pytest.raises(ValueError, match="cohort"):
        participation_table(tmp_path, [0, 1])
    (tmp_path / "r1" / "metrics.jsonl").write_text(  # a client the run has no accuracy for
        "".join(json.dumps({"round": t + 1, "cohort": [k]}) + "\n" for t in range(rounds))
    )
    with pytest.raises(ValueError, match=f"a cohort lists client {k} but the run has {k} client"):
        participation_table(tmp_path, [0, 1])


def test_report_by_labeled_ratio(tmp_path, capsys):
    """Per-bin mean accuracy of the clients by labeled ratio, against a direct computation; a
    key overridden in one run only still separates the settings; bad edges fail clearly."""
    from fedjax_semi.cli import report_main
    from fedjax_semi.results.bins import labeled_ratio_table, participation_table

    rng = np.random.default_rng(0)
    labeled, unlabeled = rng.integers(0, 50, 40), rng.integers(0, 50, 40)
    labeled[0], unlabeled[0] = 0, 0  # a client with no data: mu = 0
    labeled[1], unlabeled[1] = 7, 0  # mu = 1 falls in the last, closed bin
    mu = labeled / np.maximum(labeled + unlabeled, 1)
    accs = {}
    for name, overrides in [("a", ["algorithm=x"]), ("b", ["algorithm=x", "algorithm.k=2"])]:
        for seed in (0, 1):
            acc = rng.uniform(0, 1, 40)
            accs.setdefault(name, []).append(acc)
            _fake_run(
                tmp_path / f"{name}{seed}",
                [*overrides, f"seed={seed}"],
                acc.tolist(),
                labeled.tolist(),
                unlabeled.tolist(),
            )
    text = labeled_ratio_table(tmp_path, [0, 0.5, 1])
    rows = {ln.split("|")[1].strip(): ln.split("|")[2:-1] for ln in text.splitlines()[2:]}
    assert set(rows) == {"algorithm.k=default", "algorithm.k=2"}
    for name, label in [("a", "algorithm.k=default"), ("b", "algorithm.k=2")]:
        seeds, low, high = rows[label]
        assert int(seeds) == 2
        for cell, m in [(low, mu < 0.5), (high, mu >= 0.5)]:
            want = 100 * np.mean([a[m].mean() for a in accs[name]])
            assert cell.strip() == f"{want:.1f} ({m.sum():g})"
    assert (tmp_path / "report_by_labeled_ratio.md").read_text().strip() == text

    report_main([str(tmp_path), "--metrics", "personal_acc", "--by-labeled-ratio", "0,0.5,1"])
    assert "μ in [0.5, 1]" in capsys.readouterr().out
    records = tmp_path.parent / f"{tmp_path.name}_clients.jsonl"
    report_main([str(tmp_path), "--clients", str(records)])
    capsys.readouterr()
    assert labeled_ratio_table(records, [0, 0.5, 1]) == text  # the records give the same table
    lines = records.read_text().splitlines()
    joined = tmp_path.parent / f"{tmp_path.name}_joined.jsonl"
    joined.write_text("\n".join(lines + lines[:3]) + "\n")  # two exports' runs share a folder
    with pytest.raises(ValueError, match="clients 0..K-1"):
        labeled_ratio_table(joined, [0, 0.5, 1])
    with pytest.raises(ValueError, match="no participations"):  # these runs logged no cohorts
        participation_table(records, [0, 1])
    for bad in ("0.5,0.1", "1", "0,2", "a,b"):
        with pytest.raises(SystemExit) as e:
            report_main([str(tmp_path), "--by-labeled-ratio", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--by-labeled-ratio" in err and bad in err and "[0, 1]" in err


def test_the_entry_points_module_imports_neither_jax_nor_hydra():
    """`fedjax-semi-report` and the tools that read rows start without jax or Hydra: the CLI
    module imports them only inside the entry points that need them (cli.py's TYPE_CHECKING)."""
    code = (
        "import sys, contextlib, io, fedjax_semi.cli, fedjax_semi.results.rows_table\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    fedjax_semi.cli.report_main(['--help'])\n"
        "print(sorted(m for m in ('jax', 'hydra', 'flax', 'optax') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
