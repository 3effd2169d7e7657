"""CoFED on UCI Adult (algorithms.cofed_adult; the paper's Sec. 5.7): the center against a NumPy
replay of Eq. 15-19, hidden test labels, the vmapped NN group against one NN at a time, config
errors, the data recipe and the CLI's table and Fig. 9 -- on a generated fixture in the real UCI
format, with 8 participants (2 of each type) of 40 rows and 300 synthetic public rows."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from adult_fixture import write_adult_fixture
from fedjax_semi.algorithms import cofed_adult as ca
from fedjax_semi.data.tabular import ADULT_NUMERIC, AdultEncoding, read_adult_rows
from fedjax_semi.engine.keys import COFED_LOCAL_SAMPLE
from fedjax_semi.errors import ConfigError
from fedjax_semi.results import cofed_adult as report

SMALL = {
    "num_clients": 8,
    "num_dt": 2,
    "num_svm": 2,
    "num_gam": 2,
    "num_nn": 2,
    "rows_per_client": 40,
    "public_size": 300,
    "nn_epochs": 3,
    "nn_update_epochs": 2,
    "nn_batch_size": 16,
    "nn_update_batch_size": 16,
}


@pytest.fixture(scope="module")
def adult_dir(tmp_path_factory) -> Path:
    return write_adult_fixture(tmp_path_factory.mktemp("adult"), n_train=400, n_test=200)


@pytest.fixture(scope="module")
def base(adult_dir):
    return ca.run(ca.CoFEDAdultConfig(**SMALL, data_dir=str(adult_dir)))


def replay_center(preds: np.ndarray, alpha: float, op: str) -> tuple[np.ndarray, ...]:
    """Eq. 15-19 in plain NumPy for K = 2 with every participant owning both classes: the owners
    of k are all C participants (Eq. 16), m joins P_k when the share of them voting k is > alpha
    (Eq. 17-18; ">=" for op "ge", voted classes only), and m enters R_i with label k when exactly
    one class of Y_i = {0, 1} claims it (Eq. 19, conflicts dropped)."""
    c = preds.shape[0]
    votes = np.stack([(preds == k).sum(0) for k in (0, 1)], axis=1)  # [M, 2]
    share = votes.astype(np.float32) / np.float32(c)  # f32, like the kernel (ties stay ties)
    accept = share > np.float32(alpha) if op == "gt" else (share >= np.float32(alpha)) & (votes > 0)
    one = accept.sum(1) == 1  # [M]
    keep = np.broadcast_to(one, preds.shape)
    label = np.where(keep, np.argmax(accept, axis=1)[None, :], -1)
    return accept, keep, label


def test_center_equals_numpy_replay_of_eq_15_19(base):
    rec, out = base
    accept, keep, label = replay_center(out.preds, 0.3, "gt")
    # What the run used (its R_i trained the participants) is the replay of its own uploads.
    np.testing.assert_array_equal(out.plan["accept"], accept)
    np.testing.assert_array_equal(out.plan["keep"], keep)
    np.testing.assert_array_equal(out.plan["label"], label)
    assert 0 < keep.sum() < keep.size  # neither empty nor everything: the test has teeth
    assert rec["pl_sum_pk"] == accept.sum() and rec["pl_union_pk"] == accept.any(1).sum()
    assert rec["pl_sum_ri"] == keep.sum()
    for alpha in (0.0, 0.25, 0.5, 0.75, 1.0):  # 0.25, 0.5, 0.75: exact ties at C = 8
        for op in ("gt", "ge"):
            cfg = ca.CoFEDAdultConfig(**SMALL, alpha=alpha, threshold_op=op)
            plan = ca.center(out.preds, cfg)
            for got, want in zip(
                (plan["accept"], plan["keep"], plan["label"]),
                replay_center(out.preds, alpha, op),
                strict=True,
            ):
                np.testing.assert_array_equal(got, want, err_msg=f"alpha={alpha} op={op}")


def test_corrupted_test_labels_change_no_prediction(base, adult_dir, tmp_path):
    rec, out = base
    bad_dir = tmp_path / "adult"
    shutil.copytree(adult_dir, bad_dir)
    text = (bad_dir / "adult.test").read_text()
    flipped = text.replace("<=50K.", "@").replace(">50K.", "<=50K.").replace("@", ">50K.")
    assert flipped != text
    (bad_dir / "adult.test").write_text(flipped)
    rec2, out2 = ca.run(ca.CoFEDAdultConfig(**SMALL, data_dir=str(bad_dir)))
    np.testing.assert_array_equal(out2.preds, out.preds)  # the uploads
    for k in ("accept", "keep", "label"):  # the pseudo-labels
        np.testing.assert_array_equal(out2.plan[k], out.plan[k])
    np.testing.assert_array_equal(out2.test_local, out.test_local)  # the fitted models
    np.testing.assert_array_equal(out2.test_fed, out.test_fed)
    # ... while the scores did read the flipped labels.
    np.testing.assert_allclose(rec2["client_acc"], 1.0 - np.asarray(rec["client_acc"]))


def test_nn_group_vmapped_equals_one_at_a_time():
    rng = np.random.default_rng(0)
    d, hidden, nmax = 10, 64, 60
    ids = np.asarray([3, 7, 11])
    widths = jnp.asarray([16, 32, 64], jnp.int32)
    n = jnp.asarray([30, 45, 60], jnp.int32)  # padded rows past n must not count
    x_all = jnp.asarray(rng.normal(size=(200, d)), jnp.float32)
    idx = jnp.asarray(rng.integers(0, 200, size=(3, nmax)), jnp.int32)
    y = jnp.asarray(rng.integers(0, 2, size=(3, nmax)), jnp.int32)
    keys = ca.nn_keys(0, COFED_LOCAL_SAMPLE, ids)
    params, masks = ca.nn_init(0, jnp.asarray(ids), widths, d=d, hidden=hidden)
    kw = {"epochs": 3, "batch": 16, "lr": 1e-2}
    group = ca.train_group(params, masks, x_all, idx, y, n, keys, **kw)
    for j in range(3):
        one = ca.train_single(
            jax.tree_util.tree_map(lambda a, j=j: a[j], params),
            masks[j], x_all, idx[j], y[j], n[j], keys[j], **kw,
        )  # fmt: skip
        # atol 1e-5: the same float32 program, but vmap turns the matmuls into batched ones
        # that XLA may sum in another order, so results differ in the last bits (a few ulps of
        # weights of size ~0.3: 1.2e-7 at most here, where training moved them by 0.06-0.11);
        # 1e-5 leaves that 100x room and is still 1000x below the training's own movement.
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(group), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b)[j], rtol=0, atol=1e-5)
    # Hidden units past each width are zero at init and stay exactly zero (zero gradient).
    dead = ~np.asarray(masks, bool)
    assert dead.sum(1).tolist() == [48, 32, 0]
    assert np.all(np.asarray(group["hidden"]["kernel"]).transpose(0, 2, 1)[dead] == 0)
    assert np.all(np.asarray(group["out"]["kernel"])[dead] == 0)
    assert not np.allclose(np.asarray(group["out"]["kernel"]), np.asarray(params["out"]["kernel"]))


@pytest.mark.parametrize(
    "kw, line",
    [
        ({"alpha": 1.5}, "alpha=1.5 is not allowed: a number in [0, 1]"),
        ({"conflict": "vote"}, "conflict='vote' is not allowed: one of ['drop_in_client'"),
        ({"threshold_op": "lt"}, "threshold_op='lt' is not allowed: one of ['gt', 'ge']"),
        (
            {"rows_per_client": 400},
            "rows_per_client=400 is not allowed: rows_per_client * num_clients <= 32561",
        ),
        (
            {"num_clients": 0, "num_dt": 0, "num_svm": 0, "num_gam": 0, "num_nn": 0},
            "num_dt+num_svm+num_gam+num_nn=0 is not allowed: at least 1 participant",
        ),
        ({"num_clients": 90}, "num_clients=90 is not allowed: num_dt+num_svm+num_gam+num_nn = 100"),
        ({"num_svm": -1, "num_clients": 74}, "num_svm=-1 is not allowed: an integer >= 0"),
        ({"public_size": 0}, "public_size=0 is not allowed: an integer >= 1"),
        ({"nn_widths": (16, 0)}, "nn_widths=(16, 0) is not allowed: a non-empty list of integers"),
        ({"svm_cs": ()}, "svm_cs=() is not allowed: a non-empty list of numbers > 0"),
        ({"assignment": "random"}, "assignment='random' is not allowed: one of ['round_robin'"),
    ],
)
def test_bad_config_is_one_clear_line(kw, line):
    # data_dir does not exist: the error comes from the config, before any data is read.
    with pytest.raises(ConfigError) as err:
        ca.CoFEDAdultConfig(**kw, data_dir="/nonexistent/adult")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(line), msg


def test_bad_values_at_load_and_on_the_command_line(adult_dir, capsys):
    # The fixture has 400 training rows, fewer than 8 x 60: caught once the file is read.
    with pytest.raises(ConfigError, match=r"^rows_per_client=60 is not allowed: .* <= 400$"):
        ca.run(ca.CoFEDAdultConfig(**{**SMALL, "rows_per_client": 60}, data_dir=str(adult_dir)))
    with pytest.raises(SystemExit) as ex:
        report.main(["--seeds", "0", "--alpha", "2", "--data-dir", "/nonexistent"])
    assert ex.value.code == 2
    assert capsys.readouterr().err == "error: alpha=2.0 is not allowed: a number in [0, 1]\n"
    for item, line in (
        ("nn_epochs=many", "nn_epochs='many' is not allowed: int values"),
        ("depth=3", "--set='depth=3' is not allowed: key=value with key in ['alpha'"),
    ):
        with pytest.raises(SystemExit):
            report.main(["--set", item, "--data-dir", "/nonexistent"])
        assert capsys.readouterr().err.startswith(f"error: {line}")


def test_data_recipe_disjoint_rows_and_synthetic_public(adult_dir):
    cfg = ca.CoFEDAdultConfig(**SMALL, data_dir=str(adult_dir))
    task, y_test = ca.load_task(cfg)
    assert task.x_private.shape == (8, 40, task.x_test.shape[1]) and y_test.shape == (200,)
    assert len(np.unique(task.rows)) == 8 * 40  # without replacement: disjoint (Sec. 5.7)
    train_rows, y_train, _, _ = read_adult_rows(str(adult_dir))
    np.testing.assert_array_equal(task.y_private, y_train[task.rows])
    raw = ca.synthetic_rows(train_rows, 300, np.random.default_rng(0))
    cols = np.asarray(train_rows).T
    for j, col in enumerate(ca.ADULT_COLUMNS):
        if col in ADULT_NUMERIC:  # integers in the training [min, max]
            v, a = raw[:, j].astype(np.int64), cols[j].astype(np.int64)
            assert a.min() <= v.min() and v.max() <= a.max()
        else:  # categories seen in training, "?" never drawn
            assert set(raw[:, j]) <= set(cols[j]) - {"?"}
    # Encoded like the private rows: one indicator per categorical column, never "?".
    names = list(AdultEncoding.fit(train_rows).names)
    onehot = np.asarray([n for n in names if "=" in n])
    x_cat = task.x_public[:, [names.index(n) for n in onehot]]
    assert np.all(x_cat.sum(1) == 8) and np.all(x_cat[:, [n.endswith("=?") for n in onehot]] == 0)


def test_assignment_round_robin_and_blocks():
    cfg = ca.CoFEDAdultConfig(num_clients=6, num_dt=3, num_svm=1, num_gam=0, num_nn=2)
    assert ca.assign_types(cfg) == ["dt", "svm", "nn", "dt", "nn", "dt"]
    cfg = dataclasses.replace(cfg, assignment="blocks")
    assert ca.assign_types(cfg) == ["dt", "dt", "dt", "svm", "nn", "nn"]


def test_cli_writes_lines_then_table_and_fig9(adult_dir, tmp_path, capsys):
    out, png = tmp_path / "adult.jsonl", tmp_path / "fig9.png"
    sets = [f"{k}={v}" for k, v in SMALL.items()]
    argv = ["--seeds", "0,1", "--out", str(out), "--data-dir", str(adult_dir), "--quiet"]
    report.main(argv + [a for s in sets for a in ("--set", s)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in records] == [0, 1]
    assert all(len(r["client_rel_acc"]) == 8 and len(r["types"]) == 8 for r in records)
    assert records[0]["config"]["public_size"] == 300
    capsys.readouterr()
    report.main(["--table", str(out), "--plot", str(png)])
    text = capsys.readouterr().out
    assert "| rel_acc | 1.085 |" in text and "(2 seeds)" in text and "| nn_rel_acc |" in text
    rel = [r["rel_acc"] for r in records]
    assert f"{np.mean(rel):.3f} ± {np.std(rel, ddof=1):.3f}" in text  # mean ± sample std
    assert png.stat().st_size > 10_000 and f"wrote {png}" in text
