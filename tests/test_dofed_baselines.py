"""DoFed-SPP's baselines FedFomo, FedBE, FedAvg and Local (spec dofed_spp.md section 4) on the tiny
SUBSET setup of dofed_setups.py. chunk=1 == one vmap == the reference loop; hidden labels stay
hidden; FedFomo's downloads, weights, update and affinity replayed by hand; the shared clock; the
labels they report. Bad config values, seeds and the Shannon channels are in
test_dofed_baselines_config.py. Their kernels (the Gaussian fit and samples, the ensemble,
FedFomo's update) are tested in test_dofed_baselines_kernels.py, the similarity kernels in
test_dofed_spp_kernels.py."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import client_of, compose_config, corrupt_hidden_labels, swapped_data
from dofed_references import np_softmax
from dofed_setups import (
    BATCH,
    BE,
    FAVG,
    FOMO,
    LOCAL,
    POOL,
    S_INFER,
    S_TRAIN,
    SAMPLES,
    M,
    N,
    S,
    counts,
    leaves_equal,
)
from fedjax_semi import experiment
from fedjax_semi.algorithms import dofed_baselines as common
from fedjax_semi.algorithms import fedbe as fb
from fedjax_semi.algorithms import fedbe_ensemble as fbe
from fedjax_semi.algorithms import fedfomo as ff
from fedjax_semi.data.federated import RoleTable
from fedjax_semi.engine.keys import client_key, round_key
from fedjax_semi.engine.simulate import pseudo_label_accuracy
from fedjax_semi.engine.train import local_train
from fedjax_semi.errors import ConfigError
from fedjax_semi.kernels import fedfomo_weights as fw
from fedjax_semi.systems import wireless as wl

ROUNDS = 4


def run(runner, rounds=ROUNDS):
    """(states after rounds 0..rounds, each round's metrics, each round's evaluation)."""
    state = runner.init()
    states, rows, evals = [state], [], []
    for _ in range(rounds):
        state, m = runner.round(state)
        states.append(state)
        rows.append(jax.device_get(m))
        evals.append(jax.device_get(runner.evaluate(state)))
    return states, rows, evals


def flat(params) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(p, np.float64)) for p in jax.tree.leaves(params)])


def np_loss(exp, variables, n) -> float:
    """Mean CE of one model on client n's labeled target set, in NumPy from its logits."""
    t = exp.fed.roles["target_labeled"]
    idx = np.asarray(t.idx[n])[: int(t.count[n])]
    logits = np.asarray(exp.model.apply(variables, exp.fed.x[idx])[0], np.float64)
    y = np.asarray(exp.fed.y)[idx]
    return float(-np.mean(np.log(np_softmax(logits)[np.arange(len(y)), y])))


@pytest.fixture(scope="module")
def fomo():
    exp = experiment.build(compose_config(*FOMO))
    runner = exp.runner(chunk=1, eval_chunk=1)
    return (exp, runner, *run(runner))


@pytest.fixture(scope="module")
def be():
    exp = experiment.build(compose_config(*BE))
    runner = exp.runner(chunk=1, eval_chunk=1)
    return (exp, runner, *run(runner))


@pytest.fixture(scope="module")
def favg():
    exp = experiment.build(compose_config(*FAVG))
    runner = exp.runner(chunk=1, eval_chunk=1)
    return (exp, runner, *run(runner))


@pytest.fixture(scope="module")
def loc():
    exp = experiment.build(compose_config(*LOCAL))
    runner = exp.runner(chunk=1, eval_chunk=1)
    return (exp, runner, *run(runner))


@pytest.fixture
def runs(request):
    """The module fixture of one baseline, by name."""
    fixture = {"fedfomo": "fomo", "fedbe": "be", "fedavg": "favg", "local": "loc"}
    return lambda name: request.getfixturevalue(fixture[name])


ALL = ["fedfomo", "fedbe", "fedavg", "local"]


def test_training_table_is_train_plus_lab(fomo):
    exp = fomo[0]
    roles = exp.fed.roles
    union = common.training_table(roles, "train_and_lab")
    tr, lab = roles["labeled"], roles["target_labeled"]
    np.testing.assert_array_equal(union.count, np.asarray(tr.count) + np.asarray(lab.count))
    for n in range(N):
        got = np.asarray(union.idx[n])[: int(union.count[n])]
        want = np.concatenate(
            [np.asarray(t.idx[n])[: int(t.count[n])] for t in (tr, lab)]
        )  # valid entries packed first, D_train then D_lab
        np.testing.assert_array_equal(got, want)
    assert common.training_table(roles, "train") is tr
    # The generic fallback (D_lab = D_train = labeled) does not duplicate anything.
    generic = {"labeled": tr, "unlabeled": roles["target_unlabeled"], "test": roles["test"]}
    assert common.training_table(generic, "train_and_lab") is tr


def test_predict_labels_matches_a_loop(fomo):
    exp, _, states, _, _ = fomo
    vars_ = states[-1].theta
    table = exp.fed.roles["target_unlabeled"]
    got = np.asarray(common.predict_labels(exp.model, vars_, exp.fed.x, table, per_client=True))
    for n in range(N):
        k = int(table.count[n])
        logits = exp.model.apply(client_of(vars_, n), exp.fed.x[np.asarray(table.idx[n])[:k]])[0]
        np.testing.assert_array_equal(got[n, :k], np.argmax(np.asarray(logits), -1))
        assert (got[n, k:] == -1).all()


# ----------------------------------------------------------------------------- engine


# FedAvg's and Local's clients train through the FedAvg family's client_update, whose FedAvg
# mappings test_equivalence.py compares in the fast suite (their DoFed-SPP clock and labels are
# computed after the mapping, on the server). All four baselines' mapping checks are here, in
# make test-slow like DoFed-SPP's own (the fast suite must stay under 12 minutes); each keeps
# its fast checks below (hidden labels, clock, labels) on the chunk=1 fixtures.
@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_chunk_all_and_reference_equal_chunk_one(runs, name):
    """States and metrics of chunk=1 (the fixtures), one vmap and the per-client loop agree;
    a rerun with the same seed is bit-identical."""
    exp, runner, states, rows, evals = runs(name)
    again, again_rows, _ = run(runner)
    assert leaves_equal(states[-1], again[-1])
    assert all(a["train_loss"] == b["train_loss"] for a, b in zip(rows, again_rows, strict=True))
    for other in (exp.runner(chunk="all", eval_chunk="all"), exp.runner(backend="reference")):
        o_states, o_rows, o_evals = run(other)
        for s, o in zip(states, o_states, strict=True):
            for a, b in zip(jax.tree.leaves(s), jax.tree.leaves(o), strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)
        for a, b in zip(rows, o_rows, strict=True):
            for key in ("cohort", "pl_index", "pl_label", "upload_times"):
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
            for key in ("train_loss", "compute_time", "upload_time"):
                np.testing.assert_allclose(a[key], b[key], atol=1e-4, err_msg=key)
            if name == "fedfomo":
                np.testing.assert_array_equal(a["download_ids"], b["download_ids"])
                np.testing.assert_allclose(a["fomo_weights"], b["fomo_weights"], atol=1e-4)
        for a, b in zip(evals, o_evals, strict=True):
            for key in ("accuracy", "client_acc", "cls_acc_on_unl"):
                np.testing.assert_allclose(a[key], b[key], atol=1e-4, err_msg=key)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.hidden_labels(n)) for n in ALL])
def test_hidden_labels_change_nothing(runs, name):
    """Corrupting the hidden labels leaves the whole state bit-identical; only the scores move
    (FedBE's pool overlaps the clients' D_unl, and its pseudo-labels stay the same too)."""
    exp, runner, states, rows, evals = runs(name)
    bad = corrupt_hidden_labels(exp.fed)
    with swapped_data(runner, bad):
        o_states, o_rows, o_evals = run(runner)
    for s, o in zip(states, o_states, strict=True):
        assert leaves_equal(s, o)
    for a, b in zip(rows, o_rows, strict=True):
        np.testing.assert_array_equal(a["pl_label"], b["pl_label"])
    last = rows[-1]
    good = pseudo_label_accuracy(last["pl_index"], last["pl_label"], exp.fed.eval_y)
    worse = pseudo_label_accuracy(last["pl_index"], last["pl_label"], bad.eval_y)
    assert good > 0.3 and worse < good - 0.2
    assert o_evals[-1]["accuracy"] < evals[-1]["accuracy"] - 0.2


# ----------------------------------------------------------------------------- FedFomo


def test_fedfomo_downloads_follow_affinity(fomo):
    """Round t's downloads are the epsilon_t-greedy draw on P_{t-1} for the participants; at
    epsilon 0 that is each row's top M peers (self excluded, ties to the lower id); only
    uploaded peers are valid; round 1 has nothing to download."""
    exp, _, states, rows, _ = fomo
    assert not rows[0]["download_valid"].any() and rows[0]["n_degenerate_rows"] == S
    uploaded = np.zeros(N, bool)
    for t in range(1, ROUNDS + 1):
        prev, row = states[t - 1], rows[t - 1]
        cohort, ids = row["cohort"], row["download_ids"]
        # float32 0.3 - 0.05 (t - 1) cancels toward 0: abs for that, a few float32 ulps of 0.3.
        assert row["epsilon"] == pytest.approx(max(0.3 - 0.05 * (t - 1), 0.0), abs=1e-6)
        key = round_key(exp.key, ff.DOWNLOAD, t)
        replay = fw.fedfomo_choose_downloads(key, prev.P, M, row["epsilon"])
        np.testing.assert_array_equal(ids, np.asarray(replay)[cohort])
        assert all(n not in ids[s] for s, n in enumerate(cohort))
        np.testing.assert_array_equal(row["download_valid"], uploaded[ids])
        uploaded[cohort] = True
        np.testing.assert_array_equal(states[t].uploaded, uploaded)
        # Greedy rows: top M of the affinity row, self excluded, ties to the lower id.
        p = np.asarray(prev.P, np.float64)
        greedy = np.asarray(fw.fedfomo_choose_downloads(key, prev.P, M, 0.0))
        for n in range(N):
            order = sorted((i for i in range(N) if i != n), key=lambda i: (-p[n, i], i))
            assert sorted(greedy[n]) == sorted(order[:M]), (t, n)
    assert rows[-1]["downloads"] > 0  # later rounds do exchange models


def test_fedfomo_weights_update_and_affinity_by_hand(fomo):
    """Round 4 replayed in NumPy: losses on D_lab, distances to the own model, the clipped and
    normalized weights, theta + sum w (theta_m - theta), local training on D_train + D_lab, and
    P[n, ids] += raw weights; non-participants keep their model and their affinity row."""
    exp, _, states, rows, _ = fomo
    alg, t = exp.alg, 4
    before, after, row = states[t - 1], states[t], rows[t - 1]
    data = exp.fed.train_view()
    table = common.training_table(exp.fed.roles, "train_and_lab")
    p_ref = np.asarray(before.P, np.float64).copy()
    signs = set()
    for s, n in enumerate(row["cohort"]):
        ids, valid = row["download_ids"][s], row["download_valid"][s]
        own = client_of(before.theta, n)
        l_own = np_loss(exp, own, n)
        peers = [client_of(before.theta, i) for i in ids]
        dist = [np.linalg.norm(flat(p["params"]) - flat(own["params"])) for p in peers]
        raw = np.array(
            [(l_own - np_loss(exp, p, n)) / max(d, 1e-8) for p, d in zip(peers, dist, strict=True)]
        )
        np.testing.assert_allclose(row["fomo_raw_weights"][s], raw, rtol=1e-3, atol=1e-5)
        a = np.where(valid, np.maximum(raw, 0.0), 0.0)
        w = a / a.sum() if a.sum() > 0 else a
        np.testing.assert_allclose(row["fomo_weights"][s], w, atol=1e-5)
        p_ref[n, ids] += np.where(valid, raw, 0.0)
        signs.update(np.sign(raw[valid]).tolist())
        mixed = jax.tree.map(
            lambda x, *ms, w=w: jnp.asarray(
                x + sum(a * (m - x) for a, m in zip(w, ms, strict=True))
            ),
            own,
            *peers,
        )
        trained, _, _ = local_train(
            alg.objective, alg.tx, mixed, alg.tx.init(mixed["params"]), data.x, data.y,
            jax.tree.map(lambda x, n=n: x[n], table), alg.schedule,
            client_key(exp.key, ff.SAMPLE, t, n), client_key(exp.key, ff.DROPOUT, t, n),
        )  # fmt: skip
        want = client_of(after.theta, n)
        for x, y in zip(jax.tree.leaves(trained), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(x), y, atol=1e-4)
    assert signs == {-1.0, 1.0}  # helpful and harmful peers both occur here
    np.testing.assert_allclose(after.P, p_ref, rtol=1e-4, atol=1e-5)
    for n in set(range(N)) - set(row["cohort"].tolist()):
        assert leaves_equal(client_of(after.theta, n), client_of(before.theta, n))


def test_fedfomo_normalized_affinity_knob(fomo):
    """fedfomo_affinity=normalized adds the clipped, normalized weights instead of the raw."""
    exp = fomo[0]
    cfg = dataclasses.replace(exp.alg.cfg, fedfomo_affinity="normalized")
    alg = ff.fedfomo(cfg, model=exp.model, num_clients=N, clients_per_round=S)
    other = experiment.Experiment(exp.cfg, exp.dataset, exp.partition, exp.fed, exp.model, alg)
    states, rows, _ = run(other.runner(chunk="all", eval_chunk="all"), rounds=3)
    row, p0 = rows[-1], np.asarray(states[2].P).copy()
    for s, n in enumerate(row["cohort"]):
        p0[n, row["download_ids"][s]] += np.where(
            row["download_valid"][s], row["fomo_weights"][s], 0
        )
    np.testing.assert_allclose(states[3].P, p0, atol=1e-6)
    assert (np.asarray(states[3].P) >= 0).all()


# ----------------------------------------------------------------------------- FedBE


def test_fedbe_ensemble_and_swa_distillation(be):
    """The ensemble is {mu} + S_m Gaussian samples + the client models; the distilled model is
    the SWA mean of the end-of-epoch models from fedbe_swa_start on (replayed epoch by epoch),
    or the last one without SWA."""
    exp, _, states, rows, _ = be
    alg = exp.alg
    rng = np.random.default_rng(5)
    mu = states[1].w
    var = jax.tree.map(lambda a: jnp.asarray(np.abs(rng.normal(size=a.shape)) * 1e-3), mu["params"])
    clients = jax.tree.map(lambda a: jnp.stack([a, a + 1.0]), mu)
    members = alg.ensemble(mu, var, clients, jnp.int32(2), exp.key)
    assert jax.tree.leaves(members)[0].shape[0] == 1 + SAMPLES + 2
    assert leaves_equal(client_of(members, 0), mu)
    assert leaves_equal(client_of(members, 1 + SAMPLES), client_of(clients, 0))
    want = fbe.gaussian_sample(round_key(exp.key, fb.GAUSSIAN, 2), mu["params"], var, SAMPLES)
    for s in range(SAMPLES):
        assert leaves_equal(client_of(members, 1 + s)["params"], client_of(want, s))
    assert all(r["ensemble_size"] == 1 + SAMPLES + S for r in rows)

    pool = states[0].pool
    targets = jax.nn.softmax(jnp.asarray(rng.normal(size=(pool.shape[0], 10)), jnp.float32))
    x, t = exp.fed.x, jnp.int32(2)
    distill = jax.jit(alg.distill)
    got, losses = distill(mu, targets, pool, x, t, exp.key)

    @jax.jit
    def one_epoch(variables, opt, e):
        return local_train(
            alg.distill_objective, alg.distill_tx, variables, opt, x,
            jnp.full((x.shape[0],), -1, jnp.int32), RoleTable(pool, jnp.int32(pool.shape[0])),
            alg.distill_schedule,
            jax.random.fold_in(round_key(exp.key, fb.DISTILL_SAMPLE, t), e),
            jax.random.fold_in(round_key(exp.key, fb.DISTILL_DROPOUT, t), e),
            extras={"p": targets},
        )  # fmt: skip

    variables, opt, snaps = mu, alg.distill_tx.init(mu["params"]), []
    for e in range(3):
        variables, opt, _ = one_epoch(variables, opt, e)
        snaps.append(variables["params"])
    swa = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2, snaps[1], snaps[2])
    for a, b in zip(jax.tree.leaves(got["params"]), jax.tree.leaves(swa), strict=True):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)
    assert float(losses[-1]) < float(losses[0])  # it does fit the targets
    cfg = dataclasses.replace(alg.cfg, fedbe_swa=False)
    plain = fb.fedbe(cfg, model=exp.model, num_clients=N, clients_per_round=S)
    last, _ = jax.jit(plain.distill)(mu, targets, pool, x, t, exp.key)
    for a, b in zip(jax.tree.leaves(last["params"]), jax.tree.leaves(snaps[2]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_fedbe_pool_choices(be):
    """train_split: POOL train-split inputs, none a test input; clients_unlabeled: inside the
    clients' D_unl; server: refused on a partition with no server pool. Labels are never read:
    corrupting every label leaves the pool as it was."""
    exp, _, states, _, _ = be
    fed = exp.fed
    pool = np.asarray(states[0].pool)
    assert len(pool) == POOL == len(np.unique(pool))
    assert not np.isin(pool, np.asarray(fed.server["test_global"])).any()
    scrambled = fed.with_hidden_labels(jnp.zeros_like(fed.eval_y))
    np.testing.assert_array_equal(fb.server_pool(scrambled, "train_split", POOL, 0), pool)
    unl = fed.roles["target_unlabeled"]
    held = np.asarray(unl.idx)[np.asarray(unl.mask)]
    mine = fb.server_pool(fed, "clients_unlabeled", 0, 0)
    np.testing.assert_array_equal(mine, np.unique(held))
    with pytest.raises(ConfigError, match=r"algorithm\.fedbe_pool='server'.*train_split"):
        fb.server_pool(fed, "server", 0, 0)
    probs = np.asarray(states[-1].pool_probs)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


# ----------------------------------------------------------------------------- both


@pytest.mark.parametrize("name", ALL)
def test_clock_and_training_data(runs, name):
    """A round adds the slowest participant's compute (E t_train(|D_train| + |D_lab|), plus for
    FedFomo t_infer((M + 1) |D_lab|)) and m / r_i for each participant, r_i ~ U[2, 10] MB/s from
    DoFed-SPP's upload stream (the same rate for client i in round t under every method).
    Local trains all N clients every round and uploads nothing."""
    from fedjax_semi.engine.keys import UPLOAD

    exp, _, states, rows, _ = runs(name)
    m = exp.alg.model_mb
    n_tr, n_l = counts(exp, "labeled", "target_labeled")
    assert float(states[0].sim_time) == 0.0
    for t in range(1, ROUNDS + 1):
        row, cohort = rows[t - 1], rows[t - 1]["cohort"]
        if name == "local":
            np.testing.assert_array_equal(cohort, np.arange(N))
        else:
            assert len(cohort) == S
        comp = (n_tr + n_l) * S_TRAIN + (M + 1) * n_l * S_INFER * (name == "fedfomo")
        assert row["compute_time"] == pytest.approx(np.max(comp[cohort]), rel=1e-5)
        rates = wl.sample_rates(round_key(exp.key, UPLOAD, t), (N,))
        want = np.zeros(N)
        want[cohort] = m / np.asarray(rates)[cohort] * (name != "local")
        np.testing.assert_allclose(row["upload_times"], want, rtol=1e-5)
        delta = float(states[t].sim_time) - float(states[t - 1].sim_time)
        assert delta == pytest.approx(row["compute_time"] + want.sum(), rel=1e-4)
        steps = -(-(n_tr + n_l) // BATCH)  # one epoch over D_train + D_lab
        assert row["local_steps"] == pytest.approx(np.mean(steps[cohort]))
        if name in ("fedfomo", "fedbe"):
            assert row["comm_uploads"] == S * t
        else:  # FedAvg: one download and one upload per participant
            assert row["comm_cost"] == 2 * S * t * (name == "fedavg")


@pytest.mark.parametrize("name", ALL)
def test_labels_are_the_classification_models_predictions(runs, name):
    """pl_label = the evaluated model's argmax on D_unl (each client's own model for FedFomo and
    Local, the global model for FedBE and FedAvg), -1 on padding; its pooled accuracy is the
    labeling score."""
    exp, _, states, rows, evals = runs(name)
    unl = exp.fed.roles["target_unlabeled"]
    row, state = rows[-1], states[-1]
    np.testing.assert_array_equal(row["pl_index"], unl.idx)
    for n in range(N):
        k = int(unl.count[n])
        if name == "local":  # each client's own model
            v = client_of(state.w_k, n)
        elif name == "fedavg":  # the global model
            v = state.w
        elif name == "fedfomo":  # each client's personalized model
            v = client_of(state.theta, n)
        else:  # FedBE's global model
            v = state.w
        logits = exp.model.apply(v, exp.fed.x[np.asarray(unl.idx[n])[:k]])[0]
        np.testing.assert_array_equal(row["pl_label"][n, :k], np.argmax(np.asarray(logits), -1))
        assert (row["pl_label"][n, k:] == -1).all()
    acc = pseudo_label_accuracy(row["pl_index"], row["pl_label"], exp.fed.eval_y)
    # Pooled over samples vs averaged over clients: close, not equal.
    assert acc == pytest.approx(evals[-1]["cls_acc_on_unl"], abs=0.1)
    if name == "fedbe":
        assert 0.0 < evals[-1]["server_pl_acc"] <= 1.0
