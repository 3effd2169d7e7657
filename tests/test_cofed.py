"""CoFED end to end on a tiny cofed partition of digits (8x8): N = 6 participants with 3-4 of
the 10 classes, in two architecture groups (Table 1's Models 1 and 2: two and three conv
layers). The protocol against a NumPy replay of the center, the grouped program against the
reference loop, hidden labels, the uplink, alpha bounds, the metrics and bad input. The voting
kernels themselves: test_voting.py; the model pool: test_model_pool.py."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, one_round
from fedjax_semi import experiment
from fedjax_semi.engine.simulate import Runner
from fedjax_semi.errors import ConfigError

N = 6
BASE = [
    "algorithm=cofed",
    "partition=cofed",
    f"num_clients={N}",
    f"clients_per_round={N}",
    "rounds=1",
    "model=cnn",
    "partition.cofed.min_classes=3",
    "partition.cofed.max_classes=4",
    "partition.cofed.samples_per_class=12",
    "partition.cofed.public_fraction=0.3",
    "algorithm.local_epochs=3",
    "algorithm.batch_size=16",
    "algorithm.update_epochs=2",
    "algorithm.update_batch_size=64",
    "algorithm.predict_batch=128",
    "algorithm.lr=0.003",
    "algorithm.update_lr=0.003",
    "algorithm.table1_models=2",
]


def build(*extra: str):
    return experiment.build(compose_config(*BASE, *extra))


@pytest.fixture(scope="module")
def exp():
    return build()


@pytest.fixture(scope="module")
def ran(exp):
    return one_round(exp)


def test_groups_follow_table1_round_robin(exp):
    alg = exp.alg
    assert [m.module.filters for m in alg.models] == [(24, 40), (24, 32, 56)]
    for g, ids in enumerate(alg.members):
        assert np.asarray(ids).tolist() == list(range(g, N, 2))


def test_label_spaces_are_the_partitions(exp, ran):
    state = ran[0]
    want = np.asarray(exp.partition.assignments["label_space"])
    np.testing.assert_array_equal(np.asarray(state.Y), want)


def test_uploads_are_hard_labels_inside_each_label_space(exp, ran):
    state, _, metrics, _ = ran
    preds, owns = np.asarray(state.y_hat), np.asarray(state.Y)
    m = len(exp.fed.server["public"])
    assert preds.shape == (N, m) and preds.dtype == np.int32
    assert owns[np.arange(N)[:, None], preds].all()  # masked argmax never leaves Y_i
    assert int(metrics["upload_labels_per_client"]) == m


def test_center_replayed_in_numpy(exp, ran):
    """P_k and R_i of the round equal the paper's Algorithm 1 and Eq. 19 run on the uploads."""
    state, _, metrics, _ = ran
    preds, owns = np.asarray(state.y_hat), np.asarray(state.Y)
    alpha = exp.alg.cfg.alpha
    total = owns.sum(0)
    votes = np.zeros((preds.shape[1], owns.shape[1]))
    for i in range(N):
        votes[np.arange(preds.shape[1]), preds[i]] += 1
    accept = (total > 0) & (votes / np.maximum(total, 1) > alpha)
    claims = owns.astype(int) @ accept.T.astype(int)  # [C, M]
    keep = claims == 1
    assert int(metrics["pl_sum_pk"]) == accept.sum()
    assert int(metrics["pl_union_pk"]) == accept.any(1).sum()
    assert int(metrics["pl_sum_ri"]) == keep.sum()
    label = np.asarray(metrics["pl_label"])
    np.testing.assert_array_equal(label >= 0, keep)
    for i, m in zip(*np.nonzero(keep), strict=True):
        assert accept[m, label[i, m]] and owns[i, label[i, m]]


def test_center_reads_only_the_uploads(exp, ran):
    """Changing every participant's model after Step 2 changes nothing the center decides."""
    state = ran[0]
    data = exp.fed.train_view()
    plan = exp.alg.vote(state, data)
    noisy = state.replace(
        f=jax.tree.map(lambda a: a + 1.0, state.f),
        f_local=jax.tree.map(lambda a: a + 1.0, state.f_local),
    )
    plan2 = exp.alg.vote(noisy, data)
    for a, b in zip(jax.tree.leaves(plan), jax.tree.leaves(plan2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# make test-slow, like the other methods' mapping checks (CFSL, DoFed-SPP, UM-pFSSL): the fast
# suite must stay under 12 minutes; CoFED keeps its fast hidden-label check.
@pytest.mark.slow
def test_grouped_program_equals_reference_loop(exp, ran):
    """One vmap per group, chunk=1 and the reference loop give the same predictions and
    accuracies. Weights agree to float32 reassociation only (atol: the update of a 1e-2-sized
    weight after ~20 Adam steps)."""
    _, new, m_all, ev_all = ran
    for backend, chunk in (("reference", 1),):
        old2, new2, m2, ev2 = one_round(exp, backend, chunk)
        np.testing.assert_array_equal(np.asarray(ran[0].y_hat), np.asarray(old2.y_hat))
        np.testing.assert_array_equal(np.asarray(m_all["pl_label"]), np.asarray(m2["pl_label"]))
        for a, b in zip(jax.tree.leaves(new.f), jax.tree.leaves(new2.f), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(
            np.asarray(ev_all["client_acc"]), np.asarray(ev2["client_acc"]), atol=0.02
        )


@pytest.mark.hidden_labels("cofed")
def test_hidden_labels_never_reach_training(exp, ran):
    _, new, metrics, _ = ran
    rng = np.random.default_rng(0)
    corrupt = jnp.asarray(rng.integers(0, 10, exp.fed.eval_y.shape), jnp.int32)
    _, new2, m2, _ = one_round(exp, fed=exp.fed.with_hidden_labels(corrupt))
    for a, b in zip(jax.tree.leaves(new.f), jax.tree.leaves(new2.f), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(metrics["pl_label"]), np.asarray(m2["pl_label"]))


def test_relative_accuracy_is_the_mean_of_ratios(ran):
    ev = ran[3]
    acc, local = np.asarray(ev["client_acc"]), np.asarray(ev["client_local_acc"])
    rel = acc / local
    np.testing.assert_allclose(float(ev["rel_acc"]), rel.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(ev["rel_acc_min"]), rel.min(), rtol=1e-6)
    np.testing.assert_allclose(float(ev["improved_frac"]), (rel > 1).mean())
    np.testing.assert_allclose(float(ev["local_acc"]), local.mean(), rtol=1e-6)


def test_local_models_are_kept_and_scored_before_the_round(ran):
    state, new, _, _ = ran
    for a, b in zip(jax.tree.leaves(state.f), jax.tree.leaves(new.f_local), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_alpha_bounds_on_the_uploads(exp, ran, alpha):
    """alpha = 1 selects nothing (Eq. 18 is strict); alpha = 0 any voted class, so the
    participants' tables hold all of D_i plus R_i."""
    alg = exp.alg
    state, data, key = alg.with_center(ran[0], alpha), exp.fed.train_view(), jax.random.PRNGKey(0)
    plan = alg.vote(state, data)
    inputs, _ = alg.update_rows(state, data, key, plan)
    keep = np.asarray(plan.keep)
    if alpha == 1.0:
        assert not np.asarray(plan.accept).any() and not keep.any()
    else:
        preds = np.asarray(state.y_hat)
        voted = np.zeros_like(np.asarray(plan.accept))
        for i in range(N):
            voted[np.arange(preds.shape[1]), preds[i]] = True
        np.testing.assert_array_equal(np.asarray(plan.accept), voted)
    n_priv = np.asarray(data.roles["labeled"].count)
    for g, inp in enumerate(inputs):
        ids = np.asarray(alg.members[g])
        np.testing.assert_array_equal(np.asarray(inp.table.count), n_priv[ids] + keep[ids].sum(1))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.alpha=1.5", "algorithm.alpha=1.5"),
        ("algorithm.alpha=-0.1", "algorithm.alpha=-0.1"),
        ("algorithm.model_pool=resnet", "algorithm.model_pool='resnet'"),
        ("algorithm.conflict=vote", "algorithm.conflict='vote'"),
        ("algorithm.update_epochs=0", "algorithm.update_epochs=0"),
        ("partition.cofed.min_classes=11", "partition.cofed.min_classes=11"),
    ],
)
def test_bad_input_one_line(override, key):
    with pytest.raises((ConfigError, ValueError)) as e:
        build(override)
    msg = str(e.value)
    assert key in msg and "\n" not in msg


def test_empty_public_set_is_refused():
    exp = build("partition.cofed.public_fraction=0.0")
    with pytest.raises(ConfigError, match="public"):
        exp.alg.init(jax.random.PRNGKey(0), exp.fed)


def test_subclusters_give_coarse_tasks():
    from fedjax_semi.data.registry import load_dataset
    from fedjax_semi.data.subclusters import with_subclusters

    ds = load_dataset("digits")
    sub = with_subclusters(ds, 2, seed=0)
    assert sub.num_classes == 20
    np.testing.assert_array_equal(sub.y_train // 2, ds.y_train)
    np.testing.assert_array_equal(sub.y_test // 2, ds.y_test)
    np.testing.assert_array_equal(sub.side["y_train_coarse"], ds.y_train)
    again = with_subclusters(ds, 2, seed=0)
    np.testing.assert_array_equal(again.y_train, sub.y_train)
    # Both sub-clusters of every class are used.
    assert len(np.unique(sub.y_train)) == 20


def test_noniid_draws_from_one_or_two_subclusters():
    exp = build(
        "dataset.subclusters=3",
        "partition.cofed.variant=noniid",
        "partition.cofed.samples_per_class=8",
    )
    fine = exp.dataset.y_train
    space = np.asarray(exp.partition.assignments["label_space"])
    for i, idx in enumerate(exp.partition.clients["labeled"]):
        for task in np.flatnonzero(space[i]):
            subs = np.unique(fine[idx][fine[idx] // 3 == task])
            assert 1 <= len(subs) <= 2
    # The public set's hidden labels are task labels (the label map applies to it too).
    pub = np.asarray(exp.fed.server["public"])
    assert np.asarray(exp.fed.eval_y)[pub].max() < 10


@pytest.mark.hidden_labels("pfedavg")
def test_pfedavg_personalizes_inside_label_spaces():
    exp = experiment.build(
        compose_config(
            *[b for b in BASE if not b.startswith("algorithm.")],
            "algorithm=pfedavg",
            "algorithm.local_epochs=1",
            "algorithm.batch_size=16",
            "algorithm.finetune_epochs=1",
            "algorithm.architecture=[8,8]",
            "rounds=1",
        )
    )
    runner = Runner(exp.alg, exp.fed, chunk="all", eval_chunk="all")
    state = runner.init()
    state, _ = runner.round(state)
    ev = runner.evaluate(state)
    # Hidden labels never reach training: corrupted, the round trains the same global model.
    corrupt = jnp.asarray(np.random.default_rng(1).integers(0, 10, exp.fed.eval_y.shape), jnp.int32)
    other = Runner(exp.alg, exp.fed.with_hidden_labels(corrupt), chunk="all", eval_chunk="all")
    again, _ = other.round(other.init())
    for a, b in zip(jax.tree.leaves(state.w), jax.tree.leaves(again.w), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    acc = np.asarray(ev["client_acc"])
    assert acc.shape == (N,) and (acc >= 0).all() and (acc <= 1).all()
    # Fine-tuning changes the scores (a fine-tune of 0 epochs scores the global model).
    cfg0 = dataclasses.replace(exp.alg.cfg, finetune_epochs=0)
    alg0 = type(exp.alg)(cfg0, exp.model, N, N)
    ev0 = alg0.evaluate(
        state, exp.fed, lambda f, xs, *s: jax.vmap(f, in_axes=(0,) + (None,) * len(s))(xs, *s)
    )
    assert not np.array_equal(np.asarray(ev0["client_acc"]), acc)


def test_center_knobs_from_the_state_equal_the_config(exp, ran):
    """A sweep's with_center(state, alpha, size) plans exactly what a run configured with
    algorithm.alpha=alpha, algorithm.public_size=size plans (Steps 1-2 do not depend on them),
    and a smaller public_size uses a subset of the larger one's rows (nested sizes)."""
    state, data = ran[0], exp.fed.train_view()
    key = jax.random.PRNGKey(exp.cfg.seed)  # the run's key: it orders the public rows (init)
    m = int(state.y_hat.shape[1])
    used = {}
    for alpha, size in ((0.5, 0), (0.3, m // 2), (0.3, m // 4)):
        cfg = dataclasses.replace(exp.alg.cfg, alpha=alpha, public_size=size)
        configured = dataclasses.replace(exp.alg, cfg=cfg)
        fresh = configured.init(key, exp.fed)
        want = state.replace(center=fresh.center, public_rank=fresh.public_rank)
        plan_a = configured.vote(want, data)
        plan_b = exp.alg.vote(exp.alg.with_center(state, alpha, size), data)
        for a, b in zip(jax.tree.leaves(plan_a), jax.tree.leaves(plan_b), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        used[size] = np.asarray(plan_b.accept).any(1)
    assert not (used[m // 4] & ~used[m // 2]).any()  # nested
    assert used[m // 2].sum() <= m // 2


def test_public_size_beyond_the_public_set_is_refused(exp):
    cfg = dataclasses.replace(exp.alg.cfg, public_size=10**6)
    with pytest.raises(ConfigError, match="algorithm.public_size=1000000"):
        dataclasses.replace(exp.alg, cfg=cfg).init(jax.random.PRNGKey(0), exp.fed)


def test_pseudo_labels_of_rows_without_truth_are_not_scored():
    """A second dataset's public pool has no labels (-1): its rows count neither way."""
    from fedjax_semi.engine.loop import pseudo_label_accuracy

    eval_y = np.array([0, 1, -1, -1])
    index = np.array([[0, 1, 2, 3]])
    assert pseudo_label_accuracy(index, np.array([[0, 0, 5, 5]]), eval_y) == 0.5
    assert pseudo_label_accuracy(np.array([[2, 3]]), np.array([[1, 1]]), eval_y) is None


def test_sweep_table_and_plot(tmp_path):
    """The sweep's table is mean ± sample std over seeds per setting; the plot is drawn."""
    from fedjax_semi.results import cofed_sweep as sweep

    rows = [
        {"model_pool": "table1", "variant": v, "alpha": a, "public_size": 100, "seed": s,
         "rel_acc": 1.0 + 0.1 * s, "pl_sum_pk": int(10 * (1 - a))}
        for v in ("iid", "noniid") for a in (0.0, 0.3, 1.0) for s in (0, 1, 2)
    ]  # fmt: skip
    text = sweep.table(rows, ("variant", "alpha"), ("rel_acc", "pl_sum_pk"))
    assert "| iid | 0.3 | 3 | 1.100 ± 0.100 | 7.000 ± 0.000 |" in text
    png = sweep.plot(rows, tmp_path / "fig.png")
    assert png.stat().st_size > 0


def test_importing_the_package_does_not_start_xla():
    """XLA reads XLA_FLAGS once, when its backend starts: importing fedjax_semi must not start
    it, or a caller's flags (the test workers', a user's) would be ignored."""
    import subprocess
    import sys

    code = (
        "import fedjax_semi.algorithms, fedjax_semi.experiment, fedjax_semi.cli\n"
        "from jax._src import xla_bridge as xb\n"
        "assert not xb._backends, 'a module made an array at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sweep_table_keeps_only_the_given_seeds(tmp_path, capsys):
    from fedjax_semi.results import cofed_sweep as sweep

    keys = sweep.METRICS + sweep.COUNTS + ("pl_acc", "pl_acc_in_space")
    rows = [
        {"model_pool": "table1", "variant": "iid", "alpha": 0.3, "public_size": 100, "seed": s,
         **dict.fromkeys(keys, float(s))}
        for s in range(5)
    ]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(map(json.dumps, rows)))
    sweep.main(["--table", str(path), "--seeds", "0,1,2"])
    assert "| table1 | iid | 0.3 | 100 | 3 | 1.000 ± 1.000 |" in capsys.readouterr().out
    sweep.main(["--table", str(path)])
    assert "| table1 | iid | 0.3 | 100 | 5 | 2.000 ± 1.581 |" in capsys.readouterr().out


def test_mechanism_metrics_are_row_keys(exp, ran):
    """pl_acc is scored by the loop from the round's pl_label; pl_sum_pk is a round metric."""
    metrics = ran[2]
    keys = set(metrics) | {s for label, s in exp.alg.label_scores.items() if label in metrics}
    assert exp.alg.mechanism_metrics == ("pl_acc", "pl_sum_pk")
    assert set(exp.alg.mechanism_metrics) <= keys


def test_sweep_runs_the_named_preset(tmp_path, monkeypatch):
    """--preset reaches Steps 1-2's composition; every row is written to --out."""
    from fedjax_semi.results import cofed_sweep as sweep

    calls = []

    def fake(seed, variant, centers, overrides, counted, preset):
        calls.append((seed, variant, centers, overrides, preset))
        return [{"seed": seed, "variant": variant}]

    monkeypatch.setattr(sweep, "sweep_one", fake)
    out = tmp_path / "rows.jsonl"
    sweep.main(["--preset", "cofed_fmnist_hard", "--seeds", "0,1", "--variants", "iid",
                "--out", str(out), "seed=9"])  # fmt: skip
    assert calls == [
        (s, "iid", [(0.3, 0)], ["seed=9"], "+experiment=cofed_fmnist_hard") for s in (0, 1)
    ]
    assert len(out.read_text().splitlines()) == 2


def test_sweep_refuses_an_unknown_preset(capsys):
    """A wrong --preset is one line naming the flag, the value and the allowed presets."""
    from fedjax_semi.results import cofed_sweep as sweep

    with pytest.raises(SystemExit):
        sweep.main(["--preset", "cofed_fmnist_hrad", "--seeds", "0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--preset='cofed_fmnist_hrad'" in err and "cofed_fmnist_hard" in err


def test_sweep_applies_the_presets_tuned_values_as_the_app_does(tmp_path):
    """cofed_sweep composes what `fedjax-semi` would run: a tuned entry applies to the split it
    names (Step 4's lr follows Step 1's in cofed_fmnist_hard_record), the command line wins."""
    from fedjax_semi.results.cofed_sweep import compose_tuned

    d = tmp_path / "conf"
    (d / "tuned").mkdir(parents=True)
    (d / "tuned" / "tiny_cofed.yaml").write_text(
        "# @package _global_\ntuned:\n- where: {partition.cofed.variant: noniid}\n"
        "  set: {algorithm.lr: 0.003}\n"
    )
    base = [f"hydra.searchpath=[file://{d}]", "+experiment=cofed_fmnist_hard_record"]
    base.append("tuned=tiny_cofed")  # this file in place of conf/tuned's
    cfg, applied = compose_tuned(*base, "partition.cofed.variant=noniid")
    assert (cfg.algorithm.lr, cfg.algorithm.update_lr, applied) == (
        0.003, 0.003, {"algorithm.lr": 0.003}
    )  # fmt: skip
    cfg, applied = compose_tuned(*base, "partition.cofed.variant=iid")
    assert (cfg.algorithm.lr, cfg.algorithm.update_lr, applied) == (0.001, 0.001, {})
    cfg, applied = compose_tuned(*base, "partition.cofed.variant=noniid", "algorithm.lr=0.01")
    assert (cfg.algorithm.lr, cfg.algorithm.update_lr, applied) == (0.01, 0.01, {})


def test_sweep_table_against_local_models_of_their_own_recipe(tmp_path, capsys):
    """--local-from: each participant's ratio is taken against the reference sweep's Step 1
    model of the same seed and split (numbers chosen by hand), and --paired-to pairs seeds."""
    from fedjax_semi.results import cofed_sweep as sweep

    def row(seed, variant, acc, local):
        return {
            "model_pool": "table1",
            "variant": variant,
            "alpha": 0.3,
            "public_size": 100,
            "seed": seed,
            "num_clients": 2,
            "accuracy": sum(acc) / 2,
            "local_acc": sum(local) / 2,
            "client_acc": acc,
            "client_local_acc": local,
        }

    cofed = [row(0, "iid", [0.8, 0.6], [0.7, 0.7]), row(0, "noniid", [0.9, 0.9], [0.5, 0.5])]
    local = [row(0, "iid", [0.0, 0.0], [0.8, 0.5]), row(0, "noniid", [0.0, 0.0], [0.6, 0.9])]
    out = sweep.against_local(cofed, local)
    assert out[0]["client_rel_acc"] == pytest.approx([1.0, 1.2])
    assert (out[0]["rel_acc"], out[0]["rel_acc_min"], out[0]["improved_frac"]) == pytest.approx(
        (1.1, 1.0, 0.5)
    )
    assert (out[0]["local_acc"], out[0]["local_acc_same_run"]) == pytest.approx((0.65, 0.7))
    assert out[1]["rel_acc"] == pytest.approx((1.5 + 1.0) / 2)
    text = sweep.paired(out, ("variant", "alpha"), "variant=iid", "rel_acc")
    assert "| noniid | 0.3 | 1 | 0.150 ± 0.000 | 1/1 |" in text
    with pytest.raises(SystemExit, match="seed 0, noniid"):
        sweep.against_local(cofed, local[:1])
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(map(json.dumps, cofed)))
    b.write_text("\n".join(map(json.dumps, local)))
    sweep.main(["--table", str(a), "--local-from", str(b), "--paired-to", "variant=iid"])
    text = capsys.readouterr().out
    assert "| table1 | noniid | 0.3 | 100 | 1 | 0.150 ± 0.000 | 1/1 |" in text
