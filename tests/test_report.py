"""fedjax-semi-report's equal-budget cut, last-k mean and seed aggregation, on run directories
written by the test (metrics.jsonl rows, no training)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fedjax_semi.cli import report_main
from fedjax_semi.results.report import cut_value, report

# One run: evaluations every other round (round 0 too), the clock 1.5 s a round.
ROUNDS = range(0, 11)


def _run(d, overrides, acc_of_round, final=None):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = []
    for t in ROUNDS:
        row = {"round": t, "sim_time": 1.5 * t, "train_loss": 1.0}
        if t % 2 == 0:
            row["personal_acc"] = acc_of_round(t)
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {"personal_acc": acc_of_round(10)} if final is None else final
    (d / "summary.json").write_text(json.dumps({"final": final, "algorithm": "x"}))


def test_cut_picks_the_last_evaluation_within_the_budget(tmp_path):
    _run(tmp_path, ["algorithm=x"], lambda t: t / 100)
    # sim_time <= 7 s: rounds 0..4 (round 4 at 6 s is the last evaluation; round 5 has none)
    assert cut_value(tmp_path, "personal_acc", budget_time=7.0) == (0.04, 4)
    assert cut_value(tmp_path, "personal_acc", budget_time=6.0) == (0.04, 4)  # "at or before"
    assert cut_value(tmp_path, "personal_acc", budget_rounds=7) == (0.06, 6)
    assert cut_value(tmp_path, "personal_acc", budget_time=100, budget_rounds=3) == (0.02, 2)
    assert cut_value(tmp_path, "personal_acc") == (0.10, 10)
    assert cut_value(tmp_path, "personal_acc", budget_time=0.0) == (0.0, 0)
    assert cut_value(tmp_path, "pl_acc", budget_time=5.0) is None  # never evaluated
    # last-k: the mean of the last K evaluations within the budget (rounds 2, 4, 6 of <= 7)
    v, rnd = cut_value(tmp_path, "personal_acc", budget_rounds=7, last_k=3)
    assert rnd == 6 and v == pytest.approx(np.mean([0.02, 0.04, 0.06]))
    v, _ = cut_value(tmp_path, "personal_acc", budget_rounds=2, last_k=5)  # fewer than K
    assert v == pytest.approx(np.mean([0.0, 0.02]))


def test_report_aggregates_seeds_at_the_cut(tmp_path, capsys):
    """Two settings x three seeds; mean and std over seeds (numpy's, ddof=1), the seed count,
    and the mean round at the cut, in the table and the CSV."""
    rng = np.random.default_rng(0)
    acc = {}
    for alg in ("a", "b"):
        for seed in range(3):
            a = rng.uniform(0, 1, 11)
            acc[alg, seed] = a
            _run(tmp_path / f"{alg}{seed}", [f"algorithm={alg}", f"seed={seed}"], a.__getitem__)
    text = report(tmp_path, ["personal_acc"], budget_time=10.0, last_k=2)  # rounds 4, 6
    lines = text.splitlines()
    assert "last 2 evals" in lines[0] and "sim_time ≤ 10 s" in lines[0]
    rows = {ln.split("|")[1].strip(): ln.split("|")[2:-1] for ln in lines[2:]}
    assert set(rows) == {"algorithm=a", "algorithm=b"}
    for alg in ("a", "b"):
        vals = [np.mean(acc[alg, s][[4, 6]]) for s in range(3)]
        seeds, cell, rnd = (c.strip() for c in rows[f"algorithm={alg}"])
        want = f"{100 * np.mean(vals):.2f} ± {100 * np.std(vals, ddof=1):.2f}"
        assert (seeds, cell, rnd) == ("3", want, "6.0")
    with open(tmp_path / "report.csv") as f:
        header, *csv_rows = f.read().splitlines()
    assert "personal_acc_std" in header and "round_at_cut" in header and len(csv_rows) == 2

    # Without a cut the table reads summary.json's final values, as before.
    plain = report(tmp_path, ["personal_acc"])
    vals = [acc["a", s][10] for s in range(3)]
    assert f"{100 * np.mean(vals):.2f} ± {100 * np.std(vals, ddof=1):.2f}" in plain

    report_main([str(tmp_path), "--metrics", "personal_acc", "--budget-rounds", "4"])
    assert "round ≤ 4" in capsys.readouterr().out
    for flag, bad in (("--last-k", "0"), ("--budget-rounds", "-1"), ("--budget-time", "-2")):
        with pytest.raises(SystemExit) as e:
            report_main([str(tmp_path), flag, bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err and "not allowed" in err


def test_budget_time_needs_the_clock(tmp_path):
    d = tmp_path / "r"
    _run(d, ["algorithm=x"], lambda t: 0.5)
    rows = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        del r["sim_time"]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="sim_time"):
        report(tmp_path, ["personal_acc"], budget_time=5.0)
    assert "50.00 ± 0.00" in report(tmp_path, ["personal_acc"], budget_rounds=5)


def test_fa_rule_replays_the_stop_on_plateau(tmp_path, capsys):
    """The FA rule cut: |m_r - m_(r-1)| < plateau in `patience` evaluations in a row, after
    min_rounds. Evaluations at rounds 0, 2, 4, ...; a curve flat from round 4 stops at round 8
    with patience 2 (flat at 6 and 8), and a run it never stops is read at the budget."""
    flat = {0: 0.1, 2: 0.5, 4: 0.8, 6: 0.805, 8: 0.81, 10: 0.9}
    _run(tmp_path / "a0", ["algorithm=a", "seed=0"], flat.__getitem__)
    _run(tmp_path / "b0", ["algorithm=b", "seed=0"], lambda t: t / 10)  # steps of 0.2: never flat
    from fedjax_semi.results.report import fa_stop_round

    assert fa_stop_round(tmp_path / "a0", "personal_acc", (0.01, 2, 0)) == 8
    assert fa_stop_round(tmp_path / "a0", "personal_acc", (0.01, 2, 9)) is None  # min_rounds
    assert fa_stop_round(tmp_path / "a0", "personal_acc", (0.01, 1, 0)) == 6
    assert fa_stop_round(tmp_path / "a0", "personal_acc", (0.01, 2, 0), budget_time=10.0) is None
    assert fa_stop_round(tmp_path / "b0", "personal_acc", (0.01, 1, 0)) is None
    text = report(tmp_path, ["personal_acc"], budget_time=12.0, fa_rule=(0.01, 2, 0))
    rows = {ln.split("|")[1].strip(): ln.split("|")[2:-1] for ln in text.splitlines()[2:]}
    assert "FA rule (0.01, 2, 0)" in text.splitlines()[0]
    assert [c.strip() for c in rows["algorithm=a"]] == ["1", "81.00 ± 0.00", "8.0"]
    assert [c.strip() for c in rows["algorithm=b"]] == ["1", "80.00 ± 0.00", "8.0"]  # budget
    with pytest.raises(SystemExit) as e:
        report_main([str(tmp_path), "--fa-rule", "0.01,0"])
    assert e.value.code == 2 and "--fa-rule" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([str(tmp_path), "--fa-rule", "0,3,10"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fa-rule" in err


def test_rows_export_tags_setting_and_seed(tmp_path, capsys):
    for alg in ("a", "b"):
        for seed in (0, 1):
            _run(tmp_path / f"{alg}{seed}", [f"algorithm={alg}", f"seed={seed}"], lambda t: t / 10)
            cfg = tmp_path / f"{alg}{seed}" / ".hydra" / "config.yaml"
            cfg.write_text(f"seed: {seed}\n")
    rows_path = tmp_path / "rows.jsonl"
    report_main([str(tmp_path), "--metrics", "personal_acc", "--rows", str(rows_path)])
    assert f"wrote 44 rows to {rows_path}" in capsys.readouterr().out  # 4 runs x 11 rounds
    rows = [json.loads(ln) for ln in rows_path.read_text().splitlines()]
    assert {(r["setting"], r["seed"]) for r in rows} == {
        (f"algorithm={a}", s) for a in "ab" for s in (0, 1)
    }
    assert rows[4] == {
        "setting": "algorithm=a",
        "seed": 0,
        "round": 4,
        "sim_time": 6.0,
        "train_loss": 1.0,
        "personal_acc": 0.4,
    }


def test_runs_committed_without_hydra_take_their_seed_from_run_config(tmp_path, capsys):
    # A results directory keeps metrics.jsonl, run_config.json and summary.json only.
    for seed in (3, 4):
        d = tmp_path / f"s{seed}"
        _run(d, [], lambda t: t / 10)
        (d / "run_config.json").write_text(json.dumps({"seed": seed}))
        shutil.rmtree(d / ".hydra")
    rows_path = tmp_path / "rows.jsonl"
    report_main([str(tmp_path), "--metrics", "personal_acc", "--rows", str(rows_path)])
    rows = [json.loads(ln) for ln in rows_path.read_text().splitlines()]
    assert sorted({r["seed"] for r in rows}) == [3, 4]


def test_paired_differences_against_the_reference_seed_by_seed(tmp_path, capsys):
    """Each setting minus the reference run of the same seed: mean ± std (ddof=1) of the
    differences, the pair count and the seeds above; a seed the reference lacks is left out."""
    rng = np.random.default_rng(1)
    acc = {}
    for alg, seeds in (("ref", (0, 1, 2)), ("a", (0, 1, 2, 3)), ("b", (1, 2))):
        for seed in seeds:
            acc[alg, seed] = rng.uniform(0, 1, 11)
            d = tmp_path / f"{alg}{seed}"
            _run(d, [f"algorithm={alg}", f"seed={seed}"], acc[alg, seed].__getitem__)
    report_main(
        [
            str(tmp_path),
            "--metrics",
            "personal_acc",
            "--budget-rounds",
            "6",
            "--paired-to",
            "algorithm=ref",
        ]
    )
    out = capsys.readouterr().out
    table = out.split("Paired against the reference")[1]
    rows = {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
        for ln in table.splitlines()
        if ln.startswith("| algorithm=")
    }
    assert set(rows) == {"algorithm=a", "algorithm=b"}  # the reference has no row
    for alg, seeds in (("a", (0, 1, 2)), ("b", (1, 2))):  # a's seed 3 has no partner
        d = np.array([acc[alg, s][6] - acc["ref", s][6] for s in seeds])
        n, _, _, diff, above = rows[f"algorithm={alg}"]
        assert n == str(len(seeds))
        assert diff == f"{100 * d.mean():+.2f} ± {100 * d.std(ddof=1):.2f}"
        assert above == f"{int((d > 0).sum())}/{len(seeds)}"
    assert (tmp_path / "report_paired.md").exists()
    for bad in ("algorithm=zzz", "seed=0"):  # matches no setting; seeds are not settings
        with pytest.raises(SystemExit):
            report_main([str(tmp_path), "--metrics", "personal_acc", "--paired-to", bad])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--paired-to" in err and "exactly one setting" in err


def test_paper_column_only_for_metrics_the_paper_gives(tmp_path):
    """A preset's `paper:` rows print beside ours, matched on the run's config; a metric the paper
    does not give gets no paper column (not a column of dashes)."""
    import yaml

    for alg, acc in (("a", 0.5), ("b", 0.25)):
        d = tmp_path / alg
        _run(
            d,
            [f"algorithm={alg}"],
            lambda t, acc=acc: acc,
            final={"personal_acc": acc, "pl_acc": 0.1},
        )
        cfg = {
            "algorithm": {"name": alg},
            "paper": [{"where": {"algorithm.name": "a"}, "personal_acc": 0.75}],
        }
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    header, _, *rows = report(tmp_path, ["personal_acc", "pl_acc"]).splitlines()
    assert header.count("paper") == 1 and "paper personal_acc" in header
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows}
    assert cells["algorithm=a"] == ["1", "50.00 ± 0.00", "10.00 ± 0.00", "75.00"]
    assert cells["algorithm=b"] == ["1", "25.00 ± 0.00", "10.00 ± 0.00", "–"]


def test_counts_print_as_logged_and_default_tokens_are_vacuous_where_a_key_never_varies(tmp_path):
    """A metric outside [0, 1] (a transfer count) is printed as logged, not times 100, in the
    table and the paired differences; `key=default` picks the reference even when no run varies
    that key yet (every run then has the same value), while an unknown value picks nothing."""
    for alg, cost in (("ref", 600), ("a", 1110)):
        for seed in (0, 1):
            d = tmp_path / f"{alg}{seed}"
            _run(
                d,
                [f"algorithm={alg}", f"seed={seed}"],
                lambda t: 0.5,
                final={"personal_acc": 0.5, "comm_cost": cost + seed},
            )
    text = report(tmp_path, ["comm_cost", "personal_acc"])
    assert "comm_cost (mean ± std, as logged)" in text and "1110.5 ± 0.707" in text
    assert "50.00 ± 0.00" in text  # accuracies still in percent
    from fedjax_semi.results.paired import paired_table

    paired = paired_table(tmp_path, "comm_cost", ["algorithm=ref", "algorithm.corr_form=default"])
    assert "difference (as logged)" in paired and "| +510 ± 0 | 2/2 |" in paired
    with pytest.raises(ValueError, match="matches 0"):
        paired_table(tmp_path, "comm_cost", ["algorithm=ref", "algorithm.corr_form=complement"])


def test_a_loss_below_one_prints_as_logged_not_in_percent(tmp_path):
    """A training loss of 0.25 is not a share: the table and the paired differences print it as
    logged, while an accuracy in [0, 1] beside it stays in percent; so is a learning rate."""
    from fedjax_semi.results.report import is_fraction

    assert not is_fraction([0.03], "lr") and not is_fraction([0.2], "global_loss")
    assert is_fraction([0.2], "pl_acc") and is_fraction([0.2], "slr_acc")  # "slr" is not "lr"
    from fedjax_semi.results.paired import paired_table

    for alg, loss in (("ref", 0.25), ("a", 0.5)):
        for seed in (0, 1):
            _run(
                tmp_path / f"{alg}{seed}",
                [f"algorithm={alg}", f"seed={seed}"],
                lambda t: 0.5,
                final={"personal_acc": 0.5, "train_loss": loss},
            )
    text = report(tmp_path, ["train_loss", "personal_acc"])
    assert "train_loss (mean ± std, as logged)" in text and "0.25 ± 0" in text
    assert "50.00 ± 0.00" in text
    paired = paired_table(tmp_path, "train_loss", ["algorithm=ref"])
    assert "difference (as logged)" in paired and "| +0.25 ± 0 | 2/2 |" in paired


def test_runs_with_the_same_overrides_but_other_settings_are_not_pooled(tmp_path):
    """Two sweeps of `algorithm=ada` whose tuned file changed between them (run_config.json
    says psi 30 in one, psi 10 and beta 0.3 in the other) are two rows, labelled by the keys
    that differ; seeds of one setting (and the result-neutral keys, here `rounds`) still pool."""
    runs = {"old": ({"psi": 30.0, "beta": 0.1}, 0.6), "new": ({"psi": 10.0, "beta": 0.3}, 0.7)}
    for name, (alg, acc) in runs.items():
        for seed in (0, 1):
            d = tmp_path / name / f"seed_{seed}"
            _run(d, ["algorithm=ada", f"seed={seed}"], lambda t, a=acc: a)
            cfg = {"algorithm": {"name": "ada", **alg}, "seed": seed, "rounds": 10 + seed}
            (d / "run_config.json").write_text(json.dumps(cfg))
    text = report(tmp_path, ["personal_acc"])
    assert "| algorithm.beta=0.1 algorithm.psi=30.0 x | 2 | 60.00 ± 0.00" in text
    assert "| algorithm.beta=0.3 algorithm.psi=10.0 x | 2 | 70.00 ± 0.00" in text
    assert "rounds=" not in text and "seed=" not in text


def test_a_resumed_run_pools_with_the_runs_it_ran_beside(tmp_path):
    """A sweep whose one setting was resumed (its overrides add resume=True) and whose other
    setting was not is one row per algorithm, not a `resume=` row apart from its reference."""
    for alg, acc in (("a", 0.6), ("b", 0.7)):
        extra = ["resume=True", "progress=false"] if alg == "a" else []
        _run(tmp_path / alg, [f"algorithm={alg}", "seed=0", *extra], lambda t, a=acc: a)
    text = report(tmp_path, ["personal_acc"])
    assert "| algorithm=a | 1 | 60.00 ± 0.00" in text
    assert "| algorithm=b | 1 | 70.00 ± 0.00" in text
    assert "resume=" not in text and "progress=" not in text


def test_the_values_behind_default_are_listed_from_run_config(tmp_path):
    """A setting that overrides no lr reads `algorithm.lr=default`; the lines under the table
    give the lr its runs resolved (a tuned file's 0.04, not the preset's), and say nothing of
    a key whose runs did not record it."""
    for alg, over, lr in (("a", ["algorithm.lr=0.05"], 0.05), ("b", [], 0.04), ("c", [], None)):
        for seed in (0, 1):
            d = tmp_path / f"{alg}{seed}"
            _run(d, [f"algorithm={alg}", f"seed={seed}", *over], lambda t: 0.5)
            algo = {"name": alg} if lr is None else {"name": alg, "lr": lr}
            (d / "run_config.json").write_text(json.dumps({"algorithm": algo, "seed": seed}))
    text = report(tmp_path, ["personal_acc"])
    assert "| algorithm.lr=default algorithm=b | 2 |" in text
    behind = text.split("Behind `default`")[1]
    assert "- algorithm.lr=default algorithm=b: algorithm.lr=0.04" in behind
    assert "algorithm=c" not in behind and "0.05" not in behind


def test_runs_without_a_summary_are_named_not_silently_dropped(tmp_path, capsys):
    """A stopped or running seed has metrics.jsonl but no summary.json: the table counts only the
    finished seeds and a line under it names the others with their last round (a line cut by a
    kill is skipped); with no finished run at all the one-line error names them too."""
    for seed in (0, 1, 2):
        _run(tmp_path / f"s{seed}", ["algorithm=a", f"seed={seed}"], lambda t: 0.5)
    for seed in (1, 2):
        (tmp_path / f"s{seed}" / "summary.json").unlink()
    rows = (tmp_path / "s2" / "metrics.jsonl").read_text().splitlines()[:5]
    (tmp_path / "s2" / "metrics.jsonl").write_text("\n".join(rows) + '\n{"round": 5, "sim_')
    text = report(tmp_path, ["personal_acc"])
    assert "| 1 | 50.00 ± 0.00 |" in text  # one seed: the finished one
    assert text.endswith("per-seed summaries): s1 (round 10), s2 (round 4)")
    (tmp_path / "s0" / "summary.json").unlink()
    with pytest.raises(SystemExit) as exit_:
        report_main([str(tmp_path), "--metrics", "personal_acc"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "s0 (round 10), s1 (round 10), s2 (round 4)" in err
