"""CFSL end to end on a tiny cfsl partition of digits (8x8): 24 workers under 2 edge servers,
two latent groups told apart by a label permutation. The split finds the groups (acceptance
check 4), the round reduces to two-level FedAvg (8), the jit program equals the reference loop
(9), labeling timing and pool accounting (13, 14), selection in stopped clusters (15), hidden
labels, the scenario names (21) and bad input. The kernels: test_clustering.py,
test_cfsl_labeling.py, test_scheduling.py; the cost model: test_hwn.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, corrupt_hidden_labels, swapped_data
from fedjax_semi import experiment
from fedjax_semi.algorithms.base import RoundShared
from fedjax_semi.algorithms.cfsl_config import SCENARIOS, CFSLConfig
from fedjax_semi.algorithms.cfsl_steps import flatten_clients
from fedjax_semi.engine.simulate import Runner
from fedjax_semi.errors import ConfigError

N = 24
KEY = jax.random.PRNGKey(0)  # the Runner's key at seed 0: round_plan() again sees round t's draws
BASE = [
    "algorithm=cfsl",
    "partition=cfsl",
    "systems=hwn",
    f"num_clients={N}",
    f"clients_per_round={N}",
    "partition.cfsl.num_edges=2",
    "partition.cfsl.base=iid",
    "partition.labeled_fraction=0.6",
    "model.hidden=[16]",
    "algorithm.local_epochs=3",
    "algorithm.batch_size=16",
    "algorithm.lr=0.1",
    "algorithm.max_clusters=8",
    "algorithm.split_warmup=3",
    # Eqs. 5 and 6 always hold: the first split comes at the warm-up round, the test is its side.
    "algorithm.eps1=1e6",
    "algorithm.eps2=1e-6",
    "algorithm.phi=0.0",
]


def build(*extra: str):
    return experiment.build(compose_config(*BASE, *extra))


def run(exp, rounds: int, backend: str = "jit", chunk="all", fed=None, keep=False):
    """(runner, the last state (every state after round 0.. with keep), the rows)."""
    runner = Runner(exp.alg, exp.fed if fed is None else fed, backend=backend, chunk=chunk,
                    eval_chunk=chunk)  # fmt: skip
    state, rows = runner.init(), []
    states = [state]
    for _ in range(rounds):
        state, m = runner.round(state)
        rows.append(jax.device_get(m))
        states.append(state)
    return runner, states if keep else state, rows


@pytest.fixture(scope="module")
def exp():
    return build()


@pytest.fixture(scope="module")
def four(exp):
    """Four rounds: the split at round 3, labeling (split-based) in round 4. The state of the
    last round (and all of them in `states`)."""
    runner, states, rows = run(exp, 4, keep=True)
    return runner, states[-1], rows, states


def round_plan(exp, runner, state):
    """Round state.round + 1's plan (labels, C_r, pools) by the round's own server steps."""
    labels = exp.alg.pseudo_label(state, runner.data)
    return exp.alg.select(state, runner.data, labels, KEY)


def updates(exp, runner, state):
    """Round state.round + 1's plan and every worker's flattened update, computed again."""
    p, data = round_plan(exp, runner, state), runner.data
    shared = RoundShared(state.theta, data.x, data.y, state.round, KEY)  # the round's broadcast
    outs = jax.jit(jax.vmap(exp.alg.local_update, in_axes=(0, None)))(p.workers, shared)
    return p, np.asarray(flatten_clients(outs.delta), np.float64)


def test_first_split_separates_the_latent_groups_on_every_edge(exp, four):
    _, state, rows, _ = four
    assert [int(m["splits"]) for m in rows] == [0, 0, 2, 0]  # one per edge, at the warm-up
    cid = np.asarray(state.clusters.cid)
    edge = exp.partition.assignments["edge"]
    group = exp.partition.assignments["cluster"]
    assert len(np.unique(cid)) == 4
    for k in np.unique(cid):
        members = cid == k
        assert len(np.unique(edge[members])) == 1  # clusters stay inside one edge
        assert len(np.unique(group[members])) == 1  # purity 1.0
    assert not np.asarray(state.clusters.root)[np.unique(cid)].any()


def test_children_start_from_the_parent_then_take_their_own_mean(exp, four):
    """Acceptance 6-7: after the split both children = the parent's pre-round model + the
    weighted mean update of their own members (a NumPy per-cluster loop); the cloud then
    averages the cross-edge children of one latent group (their mean updates agree)."""
    runner, _, _, states = four
    state, new = states[2], states[3]  # round 3 splits
    plan, delta = updates(exp, runner, state)
    before = np.asarray(flatten_clients(state.theta))
    after = np.asarray(flatten_clients(new.theta))
    cid_old, cid = np.asarray(state.clusters.cid), np.asarray(new.clusters.cid)
    w = np.asarray(plan.n_train, np.float64)
    group = exp.partition.assignments["cluster"]
    own, weight = {}, {}
    for k in np.unique(cid):
        members = cid == k
        parent = np.unique(cid_old[members])
        assert len(parent) == 1
        own[k] = before[parent[0]] + (w[members, None] * delta[members]).sum(0) / w[members].sum()
        weight[k] = w[members].sum()
    for g in (0, 1):  # the cloud merge: one model per latent group, weighted by cluster data
        ks = [k for k in own if group[cid == k][0] == g]
        assert len(ks) == 2  # one child per edge
        want = sum(weight[k] * own[k] for k in ks) / sum(weight[k] for k in ks)
        for k in ks:
            # atol: float32 sums of ~1e-2 updates, values near zero.
            np.testing.assert_allclose(after[k], want, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def labeled_only():
    """Labeled-only CFL (the paper's baseline): no pseudo-labels."""
    return build("algorithm.prediction_time=none")


@pytest.mark.parametrize("edges", [2, 1])
def test_reduces_to_two_level_fedavg(labeled_only, edges):
    """Acceptance 8: before any split, with no labeling and everyone selected, every root holds
    theta0 + the data-weighted mean update of all workers (edge average, then the cloud's);
    with J = 1 that is FedAvg's round."""
    exp = labeled_only if edges == 2 else build("algorithm.prediction_time=none",
                                                "partition.cfsl.num_edges=1")  # fmt: skip
    runner = Runner(exp.alg, exp.fed, chunk="all", eval_chunk="all")
    state = runner.init()
    new, m = runner.round(state)
    _, delta = updates(exp, runner, state)
    w = np.asarray(exp.fed.roles["labeled"].count, np.float64)
    theta0 = np.asarray(flatten_clients(state.theta))[0]
    want = theta0 + (w[:, None] * delta).sum(0) / w.sum()
    after = np.asarray(flatten_clients(new.theta))
    assert int(np.sum(new.clusters.active)) == edges  # one root per edge
    for k in np.flatnonzero(np.asarray(new.clusters.active)):
        # atol: float32 sums of ~1e-2 updates, values near zero.
        np.testing.assert_allclose(after[k], want, rtol=1e-4, atol=1e-6)
    glob = flatten_clients(jax.tree.map(lambda a: a[None], new.theta_global))
    np.testing.assert_allclose(np.asarray(glob)[0], want, rtol=1e-4, atol=1e-6)
    assert int(m["selected"]) == N and int(m["splits"]) == 0


@pytest.mark.parametrize(
    "backend, chunk",
    [pytest.param(b, c, marks=pytest.mark.slow) for b, c in (("jit", 1), ("reference", "all"))],
)
def test_jit_chunks_and_reference_loop_agree(exp, four, backend, chunk):
    """Acceptance 9: all at once, one at a time and the reference loop, through a split and a
    labeling round."""
    _, a, _, _ = four
    _, b, _ = run(exp, 4, backend=backend, chunk=chunk)
    np.testing.assert_array_equal(a.clusters.cid, b.clusters.cid)
    np.testing.assert_array_equal(a.labels.accepted, b.labels.accepted)
    for x, y in zip(jax.tree.leaves(a.theta), jax.tree.leaves(b.theta), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)  # reassociation, near-0 values


def test_split_based_labeling_starts_after_the_first_split(exp, four):
    """Acceptance 13-14: no pseudo-labels before the first split (round 3), every unlabeled
    example from round 4 on (phi = 0); n_train = n_lab + accepted (Eq. 20) and the clock's
    compute time grows with it (Eq. 21)."""
    runner, state, rows, _ = four
    assert [int(m["pseudo_labeled"]) for m in rows[:3]] == [0, 0, 0]
    unl = exp.fed.roles["unlabeled"]
    assert int(rows[3]["pseudo_labeled"]) == int(np.sum(unl.count))
    plan = round_plan(exp, runner, state)
    n_lab = np.asarray(exp.fed.roles["labeled"].count)
    np.testing.assert_array_equal(plan.n_train, n_lab + np.asarray(plan.labels.accepted).sum(1))
    cost, f = np.asarray(plan.costs["t_cmp"]), np.asarray(state.devices.cpu_hz)
    # Eq. 21: T_cmp = epochs (3) x D_i,new x Psi (20 cycles) / f_i.
    np.testing.assert_allclose(cost * f / np.asarray(plan.n_train), 3 * 20.0, rtol=1e-5)


@pytest.mark.slow  # make test-slow: the fast suite must stay under 12 minutes
def test_stopping_based_labels_only_stopped_clusters():
    """Clusters stop at the warm-up round (eps2 huge: Eq. 25 holds, Eq. 6 never): only their
    workers label, and greedy keeps k = 1 worker per stopped cluster (acceptance 13, 15)."""
    exp = build("algorithm.scenario=bmstgs", "algorithm.eps2=1e6")
    runner, state, rows = run(exp, 4)
    assert [int(m["num_stopped"]) for m in rows] == [0, 0, 2, 2]
    assert [int(m["selected"]) for m in rows] == [N, N, N, 2]
    assert int(rows[2]["pseudo_labeled"]) == 0 and int(rows[3]["pseudo_labeled"]) > 0
    # Masked training: a worker not selected has an empty pool, so its update is exactly 0.
    plan, delta = updates(exp, runner, state)
    sel = np.asarray(plan.sel)
    assert sel.sum() == 2 and not delta[~sel].any() and delta[sel].any(1).all()


@pytest.mark.slow  # make test-slow: the fast suite must stay under 12 minutes
def test_labeled_only_cfl_never_pseudo_labels(labeled_only):
    _, _, rows = run(labeled_only, 4)
    assert all(int(m["pseudo_labeled"]) == 0 for m in rows)
    assert int(rows[2]["splits"]) == 2


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.hidden_labels(n)) for n in ("cfsl", "hfsl")]
)
def test_hidden_labels_never_reach_training(exp, four, name):
    """Through the split and the first labeling round (phi = 0: every unlabeled example); the
    same compiled programs on data whose hidden labels are all shifted (the unlabeled data's,
    the test split's, rows of no role) train to the same bits."""
    if name == "hfsl":
        exp = build("algorithm=hfsl")
        runner, a, _ = run(exp, 4)
    else:
        runner, a, _, _ = four
    with swapped_data(runner, corrupt_hidden_labels(exp.fed)):
        b = runner.init()
        for _ in range(4):
            b, _ = runner.round(b)
    for x, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, z)
    # The unlabeled data's labels reach the labeling-accuracy metric, and no other.
    t = exp.fed.roles["unlabeled"]
    idx = np.asarray(t.idx)[np.asarray(t.mask)]
    y = np.asarray(exp.fed.eval_y).copy()
    y[idx] = (y[idx] + 1) % exp.fed.num_classes
    ev_a = jax.device_get(runner.evaluate(a))
    with swapped_data(runner, exp.fed.with_hidden_labels(jnp.asarray(y))):
        ev_b = jax.device_get(runner.evaluate(a))
    assert ev_b["labeling_acc"] != ev_a["labeling_acc"]
    for key in ev_a:
        if key != "labeling_acc":
            np.testing.assert_array_equal(ev_a[key], ev_b[key])


def test_evaluation_reports_worker_spread_and_labeling(exp, four):
    runner, state, _, _ = four
    ev = jax.device_get(runner.evaluate(state))
    assert 0 <= ev["min_acc"] <= ev["accuracy"] <= ev["max_acc"] <= 1
    assert ev["coverage"] == pytest.approx(1.0)  # phi = 0
    assert 0 < ev["labeling_acc"] <= 1


def test_scenarios_name_the_three_axes():
    assert len(SCENARIOS) == 8
    assert SCENARIOS["bmspgs"] == ("best", "split", "greedy")
    assert SCENARIOS["emstrr"] == ("ensemble", "stopping", "round_robin")
    assert CFSLConfig(scenario="emsprr", selection="random").axes() == (
        "ensemble", "split", "random")  # fmt: skip


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.scenario=bmxxgs", "algorithm.scenario"),
        ("algorithm.selection=best", "algorithm.selection"),
        ("algorithm.max_clusters=1", "algorithm.max_clusters"),
        ("algorithm.eps1=0", "algorithm.eps1"),
        ("algorithm.eps2=-1", "algorithm.eps2"),
        ("algorithm.phi=-0.1", "algorithm.phi"),
        ("algorithm.phi=1.1", "algorithm.phi"),
        ("partition.labeled_fraction=0", "partition.labeled_fraction"),
        ("partition.labeled_fraction=1.5", "partition.labeled_fraction"),
        ("algorithm.cloud_tau=2", "algorithm.cloud_tau"),
    ],
)
def test_bad_input_one_line(override, key):
    with pytest.raises(ConfigError) as e:
        build(override)  # composing checks the algorithm's keys, building the partition's
    assert key in str(e.value) and "\n" not in str(e.value)


def test_fewer_cluster_slots_than_edges_is_one_line():
    """K_max < J: every edge needs its root slot."""
    exp = build("partition.cfsl.num_edges=3", "algorithm.max_clusters=2")
    with pytest.raises(ConfigError) as e:
        exp.alg.init(KEY, exp.fed)
    assert "algorithm.max_clusters=2" in str(e.value) and "\n" not in str(e.value)


def test_more_edges_than_workers_is_one_line():
    """J > I."""
    with pytest.raises(ValueError) as e:
        build(f"partition.cfsl.num_edges={N + 1}")
    assert str(e.value).startswith("partition.cfsl.num_edges=") and "\n" not in str(e.value)


def test_hfsl_refuses_clustering():
    with pytest.raises(ConfigError, match="algorithm.clustering"):
        experiment.build(compose_config(*BASE[1:], "algorithm=hfsl", "algorithm.clustering=true"))


def test_mechanism_metrics_recover_the_latent_groups(exp, four):
    """cluster_ari is the adjusted Rand index of the workers' clusters against the partition's
    latent groups (sklearn's, as an independent reference); stopped_cluster_share the share of
    live clusters that stopped."""
    from sklearn.metrics import adjusted_rand_score

    runner, state, _, _ = four
    ev = jax.device_get(runner.evaluate(state))
    cid = np.asarray(state.clusters.cid)
    want = adjusted_rand_score(exp.partition.assignments["cluster"], cid)
    assert 0 < want < 1  # four pure clusters (two groups x two edges): a refinement
    np.testing.assert_allclose(ev["cluster_ari"], want, rtol=1e-5, atol=1e-6)
    live = np.asarray(state.clusters.active)
    stopped = np.asarray(state.clusters.stopped) & live
    assert ev["stopped_cluster_share"] == pytest.approx(stopped.sum() / live.sum())
    assert exp.alg.mechanism_metrics == ("cluster_ari", "stopped_cluster_share")
