"""HeteroAda-FedSemi end to end on a tiny ada partition of digits (8x8, M = 10 clients,
heterogeneous TX2 clock): the masked full model against an implementation that trains each depth
group's sub-model alone (acceptance check 23), chunk=1 = chunk=all = the reference loop, the
round's clock, hidden pool labels and the validation set reaching nothing they must not, and
one-line errors for bad input; Semi-HFL (the same round with a static depth rule). The model
and kernels are in test_hetero_ada_parts.py."""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compose_config, corrupt_hidden_labels, corrupt_server_labels, swapped_data
from conftest import run_rounds as run
from fedjax_semi import experiment
from fedjax_semi.algorithms.hetero_ada import DepthTable, ExitsObjective
from fedjax_semi.engine import aggregate
from fedjax_semi.engine.clients import map_clients
from fedjax_semi.engine.keys import DROPOUT, SAMPLE, client_key
from fedjax_semi.engine.loop import pseudo_label_accuracy
from fedjax_semi.engine.train import local_train
from fedjax_semi.errors import ConfigError
from fedjax_semi.models.vgg import NUM_PARTS, exit_part
from fedjax_semi.systems import tx2
from test_hetero_ada_parts import np_quantile_depths

L = NUM_PARTS

# ----------------------------------------------------------------------------- the algorithm

M = 10
BASE = [
    "partition=ada",
    f"num_clients={M}",
    f"clients_per_round={M}",
    "partition.labeled_fraction=0.3",
    "algorithm=hetero_ada",
    "model=vgg9_exits",
    "model.width=0.125",
    "systems=tx2",
    "algorithm.local_steps=3",
    "algorithm.batch_size=16",
    "algorithm.server_batch=64",
    "algorithm.lr=0.1",
]
# Both agents off (P = 0.6, C = 0): six clients a round over several depths, and every pool
# sample pseudo-labeled, so the server epoch runs from round 1.
FIXED = ["algorithm.adaptive_p=false", "algorithm.adaptive_c=false", "algorithm.fixed_p=0.6",
         "algorithm.fixed_c=0.0"]  # fmt: skip


@pytest.fixture(scope="module")
def hetero():
    return experiment.build(compose_config(*BASE, *FIXED))


@pytest.fixture(scope="module")
def hetero_runner(hetero):
    return hetero.runner(chunk=1, eval_chunk=1)


@pytest.fixture(scope="module")
def hetero_rows(hetero_runner):
    return run(hetero_runner, 3)


def test_round_clock_depths_and_waiting_ratio(hetero, hetero_rows):
    """Every selected client gets a depth; t_k = max_m t_{k,m}(d_m) + t_p |D_{k,U}| with the
    TX2 times of Sec. 5.8 (written out here in NumPy), b_k = sum 2 size_{d_m}, Eq. 34's ratio;
    the estimates of the selected clients are renewed, the others kept."""
    alg, c, sysc = hetero.alg, hetero.cfg.algorithm, hetero.cfg.systems
    states, rows = hetero_rows
    key = jax.random.PRNGKey(hetero.cfg.seed)
    for k, m in enumerate(rows, start=1):
        sel, d = np.asarray(m["selected"]), np.asarray(m["depth"])
        assert sel.sum() == math.ceil(0.6 * M) and np.all((d > 0) == sel)
        assert sum(int(m[f"n_depth{b}"]) for b in range(1, L + 1)) == sel.sum()
        mode = np.asarray(tx2.modes(alg.tx2, key, k, M))
        bw = np.asarray(tx2.bandwidth_mbps(alg.tx2, key, k, M))
        di = np.clip(d, 1, L) - 1
        load, size = np.asarray(c.part_loads)[di] / c.part_loads[-1], np.asarray(c.part_bytes)[di]
        speed = np.asarray(sysc.tx2.speeds)[mode]
        t = sysc.tx2.overhead_s + sysc.tx2.compute_full_s * load / speed + 2 * size / 1e6 / bw
        want_t = t[sel].max() + c.t_p * int(m["num_pseudo"])
        np.testing.assert_allclose(m["round_time_s"], want_t, rtol=1e-5)
        np.testing.assert_allclose(m["round_traffic_gb"], 2 * size[sel].sum() / 1e9, rtol=1e-6)
        wait = 100 * np.mean((t[sel].max() - t[sel]) / t[sel].max())
        np.testing.assert_allclose(m["wait_ratio"], wait, rtol=1e-4)
        for name in ("psi_hat", "gamma_hat"):  # kept where not selected
            before, after = (np.asarray(getattr(s, name)) for s in (states[k - 1], states[k]))
            assert np.array_equal(before[~sel], after[~sel])
        # renewed where selected (the bandwidth is redrawn every round; the compute speed of a
        # client that trains the same depth in one mode period is the same number again)
        assert not np.any(before[sel] == after[sel])
        assert int(m["num_pseudo"]) > 0 and int(m["server_steps"]) > 0


# Semi-HFL (the paper's baseline for HeteroAda): the same round with a static depth rule and C
# fixed (its default 0.95 selects no pseudo-label of this tiny model in 3 rounds; C = 0 runs the
# server epoch, as above), P fixed: six clients a round. lr 0.01: at HeteroAda's 0.1 its depth
# pattern overflows this tiny model's loss by round 2 (3e29), where no comparison is meaningful.
SEMI = [*(o for o in BASE if o not in ("algorithm=hetero_ada", "algorithm.lr=0.1")),
        "algorithm=semi_hfl", "algorithm.lr=0.01", *FIXED]  # fmt: skip


@pytest.fixture(scope="module")
def semi():
    return experiment.build(compose_config(*SEMI))


@pytest.fixture(scope="module")
def semi_runner(semi):
    return semi.runner(chunk=1, eval_chunk=1)


@pytest.fixture(scope="module")
def semi_rows(semi_runner):
    return run(semi_runner, 3)


def test_semi_hfl_depths_are_static_and_its_threshold_fixed(semi, semi_rows):
    """Every round, the selected clients split into equal groups by the nominal full-model time
    profiled once before round 1 (written out here in NumPy: the mode of rounds 1-20, the
    group's mean bandwidth), the slowest on H^1; the estimates are never renewed; C is fixed
    (0.95 by default)."""
    alg, c, sysc = semi.alg, semi.cfg.algorithm, semi.cfg.systems
    states, rows = semi_rows
    mode = np.asarray(tx2.modes(alg.tx2, jax.random.PRNGKey(semi.cfg.seed), 0, M))
    bw = np.asarray(sysc.tx2.group_bw_mbps)[tx2.client_groups(M, alg.tx2.group_shares)]
    t_cp = sysc.tx2.overhead_s + sysc.tx2.compute_full_s / np.asarray(sysc.tx2.speeds)[mode]
    nominal = t_cp + 2 * c.part_bytes[-1] / 1e6 / bw
    seen = set()
    for m in rows:
        sel = np.asarray(m["selected"])
        assert sel.sum() == math.ceil(0.6 * M) and float(m["C"]) == 0.0
        np.testing.assert_array_equal(m["depth"], np_quantile_depths(nominal, sel, L))
        seen |= set(np.asarray(m["depth"])[sel].tolist())
    assert seen == {1, 2, 3}
    for name in ("psi_hat", "gamma_hat"):
        for s in states[1:]:
            np.testing.assert_array_equal(getattr(s, name), getattr(states[0], name))
    default = compose_config(*SEMI[: -len(FIXED)])  # C and P at their defaults
    assert (default.algorithm.adaptive_c, default.algorithm.fixed_c) == (False, 0.95)


def test_semi_hfl_needs_a_fixed_threshold():
    with pytest.raises(ConfigError) as e:
        experiment.build(compose_config(*SEMI, "algorithm.adaptive_c=true"))
    assert str(e.value).startswith("algorithm.adaptive_c=True") and "semi_hfl" in str(e.value)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_masked_full_model_equals_group_per_depth(hetero, hetero_runner, hetero_rows):
    """Acceptance 23: the masked full model (the runtime) and a second implementation, one map
    per depth group training the sub-model H^b alone on the parameters of parts <= b (what
    a real client receives and uploads), aggregated over the uploads that hold each part, give
    the same models for the same keys: the same depths and arithmetic, equal to float32
    rounding (atol 1e-6; they are two XLA programs, the masked one carrying the zero-weighted
    deeper exits, so XLA fuses and orders some float32 sums differently: 6e-8 measured)."""
    alg, runner = hetero.alg, hetero_runner
    state, key, data = hetero_rows[0][1], runner._keys, runner.data  # after round 1
    plan, inputs, shared = jax.jit(alg.select)(state, data, key)
    masked_out = jax.jit(lambda i, s: map_clients(alg.client_update, i, s, chunk=1))(inputs, shared)
    masked = jax.jit(alg.aggregate)(state, plan, masked_out)

    depth = np.asarray(plan.depth)
    assert len(set(depth[depth > 0].tolist())) >= 2  # several depth groups this round
    g = state.w["params"]
    uploads: dict[int, dict] = {}
    for b in range(1, L + 1):
        ids = np.flatnonzero(depth == b)
        if ids.size == 0:
            continue
        sub = dataclasses.replace(alg.exits_model, module=alg.exits_model.module.clone(depth=b))

        def train(inp, shared, sub=sub, b=b):
            w = {k: v for k, v in shared.models["params"].items() if exit_part(k) <= b}
            tx = alg._tx(alg.lr_at(shared.round + 1))
            new, _, _ = local_train(
                ExitsObjective(sub), tx, {"params": w}, tx.init(w), shared.x, shared.y,
                inp.table, alg.schedule, client_key(shared.key, SAMPLE, shared.round, inp.id),
                client_key(shared.key, DROPOUT, shared.round, inp.id),
            )  # fmt: skip
            return new["params"]

        group = jax.tree.map(lambda a, ids=ids: a[ids], inputs)
        out = jax.jit(lambda i, s, f=train: map_clients(f, i, s, chunk=1))(group, shared)
        for j, m in enumerate(ids):
            uploads[int(m)] = jax.tree.map(lambda a, j=j: a[j], out)
    weights = np.asarray(masked_out.weight)
    for name, leaf in g.items():
        b = exit_part(name)
        w = jnp.asarray(np.where(depth >= b, weights, 0.0), jnp.float32)
        stack = [uploads[m][name] if depth[m] >= b else leaf for m in range(M)]
        want = aggregate.weighted_mean(jax.tree.map(lambda *a: jnp.stack(a), *stack), w)
        if not np.any(depth >= b):
            want = leaf
        got = jax.tree.leaves(masked["params"][name])
        for x, y in zip(got, jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
@pytest.mark.parametrize("name", ["hetero", "semi"])
def test_chunk_and_reference_agree(name, request):
    """chunk=1 (lax.map), chunk=all (one vmap) and the reference loop: the same selections and
    depths exactly, the same numbers to float32 rounding (atol 1e-4: a vmap batches the
    clients' matmuls, which reorders float32 sums; the arithmetic is otherwise the same)."""
    exp = request.getfixturevalue(name)
    results = {
        "chunk=1": request.getfixturevalue(f"{name}_rows"),
        "chunk=all": run(exp.runner(chunk="all", eval_chunk="all"), 3),
        "reference": run(exp.runner(backend="reference"), 3),
    }
    ref_states, ref_rows = results["reference"]
    for label, (states, rows) in results.items():
        for r, (a, b) in enumerate(zip(rows, ref_rows, strict=True)):
            for key in ("n", "selected", "depth"):
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{label} {r} {key}")
            for key in ("val_acc", "val_acc_half", "accuracy", "client_acc", "train_loss",
                        "round_time_s", "wait_ratio", "cum_cost"):  # fmt: skip
                np.testing.assert_allclose(a[key], b[key], atol=1e-4, err_msg=f"{label} {r} {key}")
        pairs = zip(
            jax.tree.leaves(states[-1].w),
            jax.tree.leaves(ref_states[-1].w),
            strict=True,
        )
        for x, y in pairs:
            np.testing.assert_allclose(x, y, atol=1e-4, err_msg=label)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("hetero", marks=pytest.mark.hidden_labels("hetero_ada")),
        pytest.param("semi", marks=pytest.mark.hidden_labels("semi_hfl")),
    ],
)
def test_hidden_labels_change_only_the_pseudo_label_accuracy(name, request):
    """Every hidden label corrupted (the pool's, the clients', the test splits'): every state
    and round metric stays; only the pseudo-labels' hits, which read them, move. The evaluation
    does not read the pool's labels either."""
    exp = request.getfixturevalue(name)
    runner = request.getfixturevalue(f"{name}_runner")
    states, rows = request.getfixturevalue(f"{name}_rows")
    bad_fed = corrupt_hidden_labels(exp.fed)
    with swapped_data(runner, bad_fed) as r:  # the test labels are corrupted too: no evaluation
        bad_states, bad_rows = run(r, 3, r.alg.init(jax.random.PRNGKey(0), r.fed), evaluate=False)
    chex.assert_trees_all_equal(states, bad_states)
    chex.assert_trees_all_equal(
        [{k: row[k] for k in bad} for row, bad in zip(rows, bad_rows, strict=True)], bad_rows
    )
    index, label = np.asarray(rows[-1]["pl_index"]), np.asarray(rows[-1]["pl_label"])
    assert pseudo_label_accuracy(index, label, exp.fed.eval_y) is not None
    # The diagnostic reads them: row by row, the hits change (the shares can tie: a model that
    # predicts one class scores that class's share under both labelings).
    hits = [label == np.asarray(f.eval_y)[index] for f in (exp.fed, bad_fed)]
    assert not np.array_equal(*hits)
    # The evaluation does not read the pool's labels either (the test splits' stay).
    clean = jax.device_get(runner.evaluate(states[-1]))
    with swapped_data(runner, corrupt_server_labels(exp.fed, "server_unlabeled", False)) as r:
        chex.assert_trees_all_equal(jax.device_get(r.evaluate(states[-1])), clean)
    with swapped_data(runner, bad_fed) as r:  # it does read the data it is pointed at
        bad = jax.device_get(r.evaluate(states[-1]))
    assert not np.array_equal(bad["client_acc"], clean["client_acc"])


# Both agents on (the defaults): a program of its own, make test-slow; the fast suite checks
# the agents' path on Ada-FedSemi (test_ada_fedsemi.py) and HeteroAda's round with them off.
@pytest.mark.slow
@pytest.mark.hidden_labels("hetero_ada")
def test_adaptive_agents_never_read_hidden_labels():
    """HeteroAda-FedSemi with its P and C agents on and every hidden label corrupted (the
    pool's, the clients', the test splits'): every state and round metric stays."""
    exp = experiment.build(compose_config(*BASE))
    assert exp.cfg.algorithm.adaptive_p and exp.cfg.algorithm.adaptive_c
    runner = exp.runner(chunk=1, eval_chunk=1)
    states, rows = run(runner, 3, evaluate=False)
    with swapped_data(runner, corrupt_hidden_labels(exp.fed)) as r:
        bad_states, bad_rows = run(r, 3, evaluate=False)
    chex.assert_trees_all_equal(states, bad_states)
    chex.assert_trees_all_equal(rows, bad_rows)


def test_validation_set_never_trains(hetero, hetero_runner, hetero_rows):
    runner = hetero_runner
    states, rows = hetero_rows
    with swapped_data(runner, corrupt_server_labels(hetero.fed, "server_val", visible=True)) as r:
        bad_states, bad_rows = run(r, 3, r.alg.init(jax.random.PRNGKey(0), r.fed))
    chex.assert_trees_all_equal(states[-1].w, bad_states[-1].w)
    chex.assert_trees_all_equal(states[-1].w_tilde, bad_states[-1].w_tilde)
    assert rows[-1]["val_acc"] != bad_rows[-1]["val_acc"]
    assert rows[-1]["accuracy"] == bad_rows[-1]["accuracy"]


@pytest.mark.slow  # make test-slow (the fast suite must stay under 12 minutes)
def test_update_mask_in_the_round(hetero, hetero_runner, hetero_rows):
    """Acceptance 19 through the method's own client update, with weight decay on: each
    selected client's parts deeper than its depth come back exactly as broadcast."""
    cfg = dataclasses.replace(hetero.alg.cfg, weight_decay=0.01)
    alg = dataclasses.replace(hetero.alg, cfg=cfg)
    runner = hetero_runner
    state = hetero_rows[0][1]
    plan, inputs, shared = jax.jit(alg.select)(state, runner.data, runner._keys)
    out = jax.jit(lambda i, s: map_clients(alg.client_update, i, s, chunk=1))(inputs, shared)
    g = state.w["params"]
    for m, d in enumerate(np.asarray(plan.depth)):
        for name, leaf in g.items():
            got = jax.tree.map(lambda a, m=m: a[m], out.w["params"][name])
            same = all(np.array_equal(a, b) for a, b in
                       zip(jax.tree.leaves(got), jax.tree.leaves(leaf), strict=True))  # fmt: skip
            assert same == (exit_part(name) > d), (m, d, name)
    assert isinstance(inputs, DepthTable)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model=vgg9"], "model.name"),
        (["systems=wireless"], "systems.name"),
        (
            ["algorithm.part_bytes=[1.0,2.0]", "algorithm.part_loads=[1.0,2.0]"],
            "algorithm.part_bytes",
        ),  # fmt: skip
        (["algorithm.part_loads=[1.0,2.0]"], "algorithm.part_loads"),
        (["algorithm.part_bytes=[0,1.0,2.0]"], "algorithm.part_bytes"),
        (["algorithm.server_exit_losses=mean"], "algorithm.server_exit_losses"),
        (["algorithm.kmeans_restarts=0"], "algorithm.kmeans_restarts"),
        (["algorithm.min_rel_gap=-0.1"], "algorithm.min_rel_gap"),
        (["systems.tx2.speeds=[]"], "systems.tx2.speeds"),
        (["systems.tx2.group_shares=[0.5,0.4]"], "systems.tx2.group_shares"),
        (["systems.tx2.group_bw_mbps=[4.5,1.5]"], "systems.tx2.group_bw_mbps"),
        (["systems.tx2.mode_period=0"], "systems.tx2.mode_period"),
    ],
)
def test_bad_config_is_one_line(overrides, key):
    with pytest.raises(ConfigError) as e:
        experiment.build(compose_config(*BASE, *overrides))
    assert str(e.value).startswith(key + "=") and "\n" not in str(e.value)
