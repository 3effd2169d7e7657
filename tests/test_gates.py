"""The sanity columns of every evaluation row and fedjax-semi-report's gates: the arithmetic on
hand-made logits, a real short run's rows, and the report's flags on run directories written
in the real format (no training)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.algorithms.base import sanity
from fedjax_semi.cli import report_main
from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.loop import Run, participation
from fedjax_semi.engine.train import evaluate_indices, evaluate_row
from fedjax_semi.results.gates import Gates, same_but_algorithm
from fedjax_semi.results.report import report

K = 4


@dataclasses.dataclass
class FixedLogits:
    """A stand-in model whose logits are a lookup table by input row (x holds row ids)."""

    table: jax.Array  # [N, K]

    def apply(self, variables, x):
        return self.table[x], {}


# ------------------------------------------------------------------ the arithmetic


def test_columns_of_one_client_and_of_a_collapsed_one():
    """Two clients whose model predicts one class for all their rows (client 0's labels
    spread 2/1/1, client 1's all one class; its row padded); a client without rows counts
    neither way."""
    logits = jnp.array(
        [[9, 0, 0, 0], [9, 0, 0, 0], [0, 0, 0, 0], [9, 0, 0, 0], [0, 0, -5, 0], [0, 0, -5, 0]],
        jnp.float32,
    )
    labels = jnp.array([0, 1, 0, 2, 3, 3])
    model = FixedLogits(logits)
    x = jnp.arange(6)
    tables = RoleTable(
        idx=jnp.array([[0, 1, 2, 3], [4, 5, 0, 0], [0, 0, 0, 0]]), count=jnp.array([4, 2, 0])
    )
    rows = jax.vmap(lambda t: evaluate_row(model, None, x, labels, t))(tables)
    # argmax of a tie is its first class: every prediction is class 0; padding is not counted
    assert rows["pred_hist"].tolist() == [[4, 0, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]
    assert rows["label_hist"].tolist() == [[2, 1, 1, 0], [0, 0, 0, 2], [0, 0, 0, 0]]
    got = {k: float(v) for k, v in sanity(rows).items()}
    # Client 0: 4/4 predictions in one class, labels 2/4; client 1: 2/2, labels 2/2.
    assert got["pred_top_share"] == pytest.approx(1.0)
    assert got["pred_top_share_max"] == pytest.approx(1.0)
    assert got["label_top_share"] == pytest.approx((0.5 + 1.0) / 2)
    assert got["num_classes"] == K
    # Per row: max |logit| 9, 9, 0, 9, 5, 5 over the 6 rows of clients 0 and 1.
    assert got["max_logit"] == pytest.approx((9 * 3 + 0 + 5 * 2) / 6)
    ent = lambda z: float(-jnp.sum(jax.nn.softmax(z) * jax.nn.log_softmax(z)))
    want = (3 * ent(logits[0]) + math.log(K) + 2 * ent(logits[4])) / 6
    # float32 softmax of logits up to 9: entropies agree to ~1e-6 nats
    assert got["pred_entropy"] == pytest.approx(want, abs=1e-5)


def test_shares_are_per_client_then_averaged():
    """pred_top_share is each client's own share, averaged over the clients holding rows: two
    clients each predicting one (different) class are both collapsed, though together they
    spread over two classes."""
    result = {
        "pred_hist": jnp.array([[5, 0, 0], [0, 0, 3], [0, 0, 0]]),
        "label_hist": jnp.array([[2, 2, 1], [1, 1, 1], [0, 0, 0]]),
        "entropy": jnp.array([0.5, 0.3, 0.0]),
        "max_logit": jnp.array([10.0, 6.0, 0.0]),
        "count": jnp.array([5, 3, 0]),
    }
    got = {k: float(v) for k, v in sanity(result, prefix="personal_").items()}
    assert got["personal_pred_top_share"] == 1.0 and got["personal_pred_top_share_max"] == 1.0
    assert got["personal_label_top_share"] == pytest.approx((2 / 5 + 1 / 3) / 2)
    assert got["personal_pred_entropy"] == pytest.approx(0.8 / 8)
    assert got["personal_max_logit"] == pytest.approx(16 / 8)
    nobody = dict(result, count=jnp.zeros(3, jnp.int32))
    assert math.isnan(float(sanity(nobody)["pred_top_share"]))  # nothing evaluated: no value


def test_server_set_matches_the_same_rows_as_one_client():
    """evaluate_indices (batched, padded) gives the same sums as one client's table row."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(7, K)) * 3, jnp.float32)
    labels = jnp.asarray(rng.integers(0, K, 7))
    model = FixedLogits(logits)
    idx = jnp.array([6, 0, 2, 3, 5])
    g = evaluate_indices(model, None, jnp.arange(7), labels, idx, batch=2)  # 3 batches, 1 pad
    row = evaluate_row(model, None, jnp.arange(7), labels, RoleTable(idx, jnp.array(5)))
    for key in ("pred_hist", "label_hist"):
        np.testing.assert_array_equal(g["stats"][key], row[key])
    for key in ("entropy", "max_logit"):  # float32 sums of 5 terms in another order
        np.testing.assert_allclose(g["stats"][key], row[key], rtol=1e-6)
    assert int(jnp.sum(g["stats"]["pred_hist"])) == 5  # the padding row is not counted


def test_participation_counts_restored_rows_once():
    """Participation so far comes from the cohorts of run.rows (what the JSON-lines writer
    restores on resume) plus this round's, each row counted once."""
    run = Run(dirs=[None], seeds=None, rounds=5)
    run.rows[0] = [{"round": 0}, {"round": 1, "cohort": [0, 1]}, {"round": 2, "cohort": [1, 2]}]
    first = participation(run, 0, 5, [1, 3])
    assert first == {"participation_mean": 6 / 5, "participation_min": 0, "never_selected": 0.2}
    run.rows[0].append({"round": 3, "cohort": [1, 3]})
    second = participation(run, 0, 5, [4])  # round 4: every client taken part at least once
    assert second == {"participation_mean": 7 / 5, "participation_min": 1, "never_selected": 0.0}


# ------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def fedavg():
    """FedAvg on the tiny digits setting (SMALL), 2 rounds: one build for the two tests below."""
    return experiment.build(compose_config("algorithm=fedavg", "rounds=2"))


def test_a_short_run_logs_sane_columns(fedavg, tmp_path, monkeypatch):
    """Every evaluation row of a real run carries the sanity columns in their ranges,
    participation matching the logged cohorts, num_classes, and the personal_ columns of the
    clients' test splits; summary.json keeps the declared mechanism metrics."""
    exp = fedavg
    monkeypatch.setattr(type(exp.alg), "mechanism_metrics", ("never_selected", "absent_key"))
    summary = experiment.run(exp, tmp_path)
    rows = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2]
    n = exp.fed.num_clients
    counts = np.zeros(n, int)
    for row in rows:
        counts[np.unique(row["cohort"])] += 1
        assert row["participation_mean"] == pytest.approx(counts.mean())
        assert row["participation_min"] == counts.min()
        assert row["never_selected"] == pytest.approx(np.mean(counts == 0))
        assert row["num_classes"] == 10
        for p in ("", "personal_"):
            top, top_max = row[p + "pred_top_share"], row[p + "pred_top_share_max"]
            assert 1 / 10 <= top <= top_max <= 1
            assert 1 / 10 <= row[p + "label_top_share"] <= 1
            assert 0 <= row[p + "pred_entropy"] <= math.log(10) + 1e-5  # float32 rounding
            assert row[p + "max_logit"] > 0
    assert summary["mechanism"] == {
        "never_selected": rows[-1]["never_selected"],
        "absent_key": None,
    }


def test_reused_global_pass_equals_the_per_client_pass(fedavg):
    """With every client's test split inside the server test set, FedAvg's personal_ columns
    come from the global pass (table_stats); they equal a per-client pass over the tables."""
    exp = fedavg
    assert exp.fed.test_in_global
    runner = exp.runner()
    state = runner.init()
    fast = jax.device_get(runner.evaluate(state))
    slow_fed = dataclasses.replace(exp.fed, test_in_global=False)
    slow = jax.device_get(jax.jit(lambda s, f: exp.alg.evaluate(s, f, runner_map))(state, slow_fed))
    for key in fast:
        if key.startswith("personal_"):
            # float32 sums of the same per-row values in another order
            np.testing.assert_allclose(fast[key], slow[key], rtol=1e-5, err_msg=key)


def runner_map(fn, xs, *shared):
    from fedjax_semi.engine.clients import map_clients

    return map_clients(fn, xs, *shared, chunk="all")


# ------------------------------------------------------------------ the report's gates

HEALTHY = {"pred_top_share": 0.2, "pred_top_share_max": 0.3, "label_top_share": 0.15}


def _write_run(d, algorithm: str, seed: int, acc: float, columns: dict | None, extra=()):
    """A run directory as the simulator writes it: resolved config, overrides, metrics.jsonl
    (two evaluations) and summary.json whose final row is the last evaluation."""
    (d / ".hydra").mkdir(parents=True)
    overrides = [f"algorithm={algorithm}", *extra, f"seed={seed}"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    cfg = {"seed": seed, "algorithm": {"name": algorithm}, "dataset": {"name": "digits"}}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    cols = {} if columns is None else {"num_classes": 10, "pred_entropy": 0.4, "max_logit": 8.0}
    rows = []
    for t in (1, 2):  # round 1 healthy, round 2 with `columns`
        row = {"round": t, "cohort": [0, 1], "sim_time": float(t), "accuracy": acc, **cols}
        row.update((HEALTHY if t == 1 else columns) or {})
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = {k: v for k, v in rows[-1].items() if k != "cohort"}
    (d / "summary.json").write_text(json.dumps({"algorithm": algorithm, "final": final}))


def _cells(text: str) -> dict[str, list[str]]:
    return {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
        for ln in text.splitlines()[2:]
        if ln.startswith("| ")
    }


def test_report_flags_the_collapsed_and_the_chance_rows_only(tmp_path):
    """Four settings x two seeds: collapsed (0.90 and 0.96 in one class, labels 0.12), at chance
    (12% on 10 classes), healthy, and a skewed test split whose labels are as concentrated as
    the predictions (not a collapse). Only the first two are flagged, with their diagnosis."""
    for seed in (0, 1):
        share = (0.90, 0.96)[seed]
        collapsed = {"pred_top_share": share, "pred_top_share_max": 0.99, "label_top_share": 0.12}
        skewed = {"pred_top_share": 0.90, "pred_top_share_max": 0.95, "label_top_share": 0.92}
        _write_run(tmp_path / f"c{seed}", "collapsed", seed, 0.40, collapsed)
        _write_run(tmp_path / f"a{seed}", "atchance", seed, 0.12, HEALTHY)
        _write_run(tmp_path / f"h{seed}", "healthy", seed, 0.70, HEALTHY)
        _write_run(tmp_path / f"s{seed}", "skewed", seed, 0.85, skewed)
    text = report(tmp_path, ["accuracy"], gates=Gates())
    header = text.splitlines()[0]
    assert header.rstrip(" |").endswith("gates")
    cells = _cells(text)
    assert cells["algorithm=collapsed"][-1] == "collapse (0.93 in one class)"
    assert cells["algorithm=atchance"][-1] == "chance (12.0% vs 1/K = 10.0%)"
    assert cells["algorithm=healthy"][-1] == "" and cells["algorithm=skewed"][-1] == ""
    below = text.split("\n\n", 1)[1]
    assert below.startswith("Gates (chance margin 0.05, collapse 0.8, local margin 0.01")
    assert "2 of 4 rows flagged" in below
    assert "`algorithm=collapsed`: collapse: pred_top_share 0.93" in below
    assert "label_top_share 0.12" in below and "max_logit 8" in below
    assert "`algorithm=atchance`: chance: mean 12.0%, chance 1/10 = 10.0%" in below
    with open(tmp_path / "report.csv") as f:
        by_setting = {r["setting"]: r["gates"] for r in csv.DictReader(f)}
    assert by_setting["algorithm=collapsed"] == "collapse (0.93 in one class)"
    assert by_setting["algorithm=healthy"] == ""

    # At round 1 (a budget cut) the collapsed models were still healthy: the gates read the
    # values at the table's cut.
    cut = _cells(report(tmp_path, ["accuracy"], budget_rounds=1, gates=Gates()))
    assert cut["algorithm=collapsed"][-1] == ""
    # A looser threshold lets the collapse through; no gates: no column.
    loose = _cells(report(tmp_path, ["accuracy"], gates=Gates(collapse=0.95)))
    assert loose["algorithm=collapsed"][-1] == ""
    plain = report(tmp_path, ["accuracy"])
    assert "gates" not in plain and "Gates" not in plain


def test_below_local_compares_with_the_matching_local_row(tmp_path):
    """Local's row is the setting that differs only in the algorithm (algorithm.* knobs one
    method lacks do not count); a row without such a Local row says so."""
    alpha = "partition.alpha=0.5"
    for seed in (0, 1):
        _write_run(tmp_path / f"l{seed}", "local", seed, 0.75, HEALTHY, [alpha])
        _write_run(tmp_path / f"w{seed}", "worse", seed, 0.70, HEALTHY, [alpha, "algorithm.mu=1"])
        _write_run(tmp_path / f"n{seed}", "near", seed, 0.745, HEALTHY, [alpha])
        _write_run(tmp_path / f"o{seed}", "worse", seed, 0.70, HEALTHY, ["partition.alpha=5"])
    cells = _cells(report(tmp_path, ["accuracy"], gates=Gates()))
    worse = "algorithm.mu=1 algorithm=worse partition.alpha=0.5"
    assert cells[worse][-1] == "below-local (70.0% < 75.0%)"
    assert cells["algorithm.mu=default algorithm=near partition.alpha=0.5"][-1] == ""  # margin
    other = "algorithm.mu=default algorithm=worse partition.alpha=5"
    assert cells[other][-1] == "below-local: n/a (no matching Local row)"
    assert cells["algorithm.mu=default algorithm=local partition.alpha=0.5"][-1] == ""
    assert same_but_algorithm({"algorithm": "a", "x": "1"}, {"algorithm": "local", "x": "1"})
    assert not same_but_algorithm({"algorithm.lr": "0.1"}, {"algorithm.lr": "0.2"})


def test_old_runs_get_only_the_gates_they_can(tmp_path):
    """A run written before the sanity columns: collapse and chance cannot be computed, and the
    cell says so instead of passing."""
    _write_run(tmp_path / "old", "fedavg", 0, 0.11, None)
    text = report(tmp_path, ["accuracy"], gates=Gates())
    cell = _cells(text)["fedavg"][-1]
    assert "chance: n/a (num_classes not logged)" in cell
    assert "collapse: n/a (no pred_top_share logged)" in cell
    assert "not checked fully" in text


def test_mechanism_column_shows_the_mean_over_seeds(tmp_path):
    for seed, ari in ((0, 0.8), (1, 0.6)):
        d = tmp_path / f"m{seed}"
        _write_run(d, "clustered", seed, 0.7, HEALTHY)
        summary = json.loads((d / "summary.json").read_text())
        summary["mechanism"] = {"cluster_ari": ari, "stopped_cluster_share": None}
        (d / "summary.json").write_text(json.dumps(summary))
    text = report(tmp_path, ["accuracy"])
    assert "mechanism (final, mean)" in text.splitlines()[0]
    assert _cells(text)["clustered"][-1] == "cluster_ari 0.7"


def test_bad_gate_flags_are_one_line_before_any_work(tmp_path, capsys):
    missing = tmp_path / "nowhere"  # never read: the flags are checked first
    for flag, value in (
        ("--gate-collapse", "1.5"),
        ("--gate-chance-margin", "-0.1"),
        ("--gate-local-margin", "nan"),
        ("--gate-collapse", "high"),
    ):
        with pytest.raises(SystemExit) as e:
            report_main([str(missing), f"{flag}={value}"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag}=" in err and "[0, 1]" in err, err
    with pytest.raises(ValueError, match=r"--gate-collapse=1.5 is not allowed"):
        Gates(collapse=1.5)  # the Python API checks the same
    _write_run(tmp_path / "r", "healthy", 0, 0.7, HEALTHY)
    report_main([str(tmp_path), "--metrics", "accuracy", "--no-gates"])
    assert "gates" not in capsys.readouterr().out
