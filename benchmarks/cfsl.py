"""One CFSL round at I = 200 and I = 2,000 workers (J = 3 edge servers): the chunked vmap against
the reference loop, and the share of the round spent in the clustering kernels (the cosine
matrix of the updates, Eq. 4, and the bipartitions, Alg. 1), side by side in one run.

    python benchmarks/cfsl.py [--workers 200,2000] [--chunks 1,all,reference] [--repeats 2]
                              [--data synthetic|real] [--images-per-worker 175]

Prints JSON lines (device, versions, date, load average) and appends them to
benchmarks/results/cfsl.jsonl, then a Markdown table of the run.

Setup: the `cfsl_fmnist` preset (MLP 784-128-10, P = 101,770 parameters, 2 local epochs of batch
32 at lr 0.05, K_max = 64 cluster slots, J = 3 edges, every worker mapped each round) at I
workers with 175 images per worker (140 training: 14 labeled, 126 unlabeled; 35 test), the
preset's count at I = 200. `--data synthetic` (the default) draws 175 I random images of
Fashion-MNIST's shapes, so both sizes see the same per-worker data; `--data real` subsamples
Fashion-MNIST (up to I = 400). Split thresholds absolute, eps1 = 1e9 and eps2 = 1e-9, so that
Eqs. 5 and 6 hold and every root cluster with >= 3 members splits in the timed round.

Per mapping: a first round (compile + round 1). Then two rounds are timed from the state after
the first mapping's round 1 with the round counter moved past the split warm-up
(r = split_warmup + 1), one untimed call each, then --repeats calls with the mappings taking
turns call by call (so that the other jobs on a shared machine slow them alike), median:
  * labeled round: labeling not yet on (SP starts it after the first split): each worker trains
    on its 14 labeled images;
  * labeling round: labeling on and phi = 0, so the round relabels every worker's unlabeled
    images with the active cluster models (BM) and accepts all of them: each worker trains on
    its 140 training images, the most a round trains on.
`CFSL.aggregate` computes the cosine matrix of all I updates and the bipartitions of all K_max
slots in every round (the warm-up and Eqs. 5-6 gate only which splits are granted), so both
timed rounds run them; the `labeled_splits` and `labeling_splits` fields count the splits it
granted.

The clustering's share of the round is measured by subtraction, under one mapping
(--share-chunk, default the first jit one): the same rounds traced again with the workers'
cosine matrix replaced by zeros and every bipartition by an empty one (`without_clustering`),
taking their turn right after the full ones; the median of the paired differences over the
full round's median.

The kernels are also timed alone, jitted, on random updates [I, P] (their cost does not depend
on the values: the Prim loop has a fixed length): as the round runs them (`cosine_matrix` on
[I, P], then `bipartition_maxst` vmapped over the K_max slots of the state's assignment, each on
the [I, I] matrix), and per edge (one [I/J, P] cosine matrix and one bipartition per edge, the
work the algorithm needs at the start).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common import RESULTS, compose, emit, environment, runner_for, synthetic, timed
from fedjax_semi import experiment
from fedjax_semi.data.registry import load_dataset
from fedjax_semi.kernels import clustering as cl
from fedjax_semi.systems import wireless


def dataset(kind: str, workers: int, per_worker: int):
    """(dataset, dataset.fraction) holding per_worker images per worker (pooled train + test)."""
    n = per_worker * workers
    if kind == "synthetic":
        return synthetic("fashion_mnist", n * 6 // 7, n - n * 6 // 7), 1.0
    ds = load_dataset("fashion_mnist")
    total = len(ds.y_train) + len(ds.y_test)
    if n > total:
        raise SystemExit(f"--data real holds {total} images: {per_worker} x {workers} do not fit")
    return ds, n / total


def kernels(state, num_edges: int, p: int, repeats: int) -> dict:
    """The clustering kernels alone on random updates [I, P]: as the round runs them, per edge."""
    cid = np.asarray(state.clusters.cid)
    k, i = state.clusters.active.shape[0], cid.shape[0]
    flat = jax.random.normal(jax.random.PRNGKey(0), (i, p), jnp.float32)
    sel = jnp.ones((i,), bool)
    member = jnp.asarray(cid[None, :] == np.arange(k)[:, None])  # [K, I]
    cos = jax.jit(cl.cosine_matrix)
    bip = jax.jit(jax.vmap(cl.bipartition_maxst, in_axes=(None, 0)))
    sim = cos(flat, sel)
    edges = [np.flatnonzero(cid == j) for j in range(num_edges)]

    @jax.jit
    def cos_edges(flat):
        return [cl.cosine_matrix(flat[e], jnp.ones((len(e),), bool)) for e in edges]

    @jax.jit
    def bip_edges(sims):
        return [cl.bipartition_maxst(s, jnp.ones((s.shape[0],), bool)) for s in sims]

    sims = cos_edges(flat)
    _, t_cos, _ = timed(lambda: cos(flat, sel), repeats)
    _, t_bip, _ = timed(lambda: bip(sim, member), repeats)
    _, t_cos_e, _ = timed(lambda: cos_edges(flat), repeats)
    _, t_bip_e, _ = timed(lambda: bip_edges(sims), repeats)
    return {
        "slots": k,
        "edge_sizes": [len(e) for e in edges],
        "cosine_s": t_cos,
        "bipartitions_s": t_bip,
        "kernels_s": t_cos + t_bip,
        "per_edge_cosine_s": t_cos_e,
        "per_edge_bipartition_s": t_bip_e,
    }


@contextlib.contextmanager
def without_clustering(num_workers: int):
    """While a round is traced: the workers' cosine matrix ([I, I]) is zeros and every
    bipartition is empty (`CFSL.aggregate` runs the same otherwise, shapes included), so the
    round traced inside costs the round less the clustering kernels. The cloud merge's [K, K]
    cosine matrix of the clusters' means is left as it is."""
    cos, bip = cl.cosine_matrix, cl.bipartition_maxst

    def no_cos(delta, part):
        if delta.shape[0] != num_workers:
            return cos(delta, part)
        return jnp.zeros((num_workers, num_workers), jnp.float32)

    def no_bip(s, member):
        return jnp.zeros_like(member, bool), jnp.ones((), jnp.float32)

    cl.cosine_matrix, cl.bipartition_maxst = no_cos, no_bip
    try:
        yield
    finally:
        cl.cosine_matrix, cl.bipartition_maxst = cos, bip


def once(runner, state) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(runner.round(state)[0])
    return time.perf_counter() - t0


def first_round(exp, chunk: str, bare: bool = False):
    """(runner, compile + round 1 seconds, the state after round 1). bare: the runner is traced
    without the clustering kernels (`without_clustering`)."""
    runner = runner_for(exp, chunk)
    ctx = without_clustering(exp.alg.num_clients) if bare else contextlib.nullcontext()
    with ctx:
        state = runner.init()
        t0 = time.perf_counter()
        state, _ = runner.round(state)
        jax.block_until_ready(state)
    return runner, time.perf_counter() - t0, state


def interleaved(runners: dict, states: dict, repeats: int, workers: int) -> tuple[dict, dict]:
    """Round times {mapping: {kind: [s]}}, the mappings taking turns round by round (so a
    drift in the machine's speed falls on all of them), after one untimed round each; and the
    metrics {kind: metrics} of the first mapping's untimed round. The "bare" runner is always
    called without the clustering kernels, so that a retrace could not bring them back."""

    def call(name, fn):
        with without_clustering(workers) if name == "bare" else contextlib.nullcontext():
            return fn()

    times = {name: {kind: [] for kind in states} for name in runners}
    metrics = {}
    for kind, s in states.items():
        for name, runner in runners.items():
            _, m = call(name, lambda r=runner, s=s: jax.block_until_ready(r.round(s)))
            metrics.setdefault(kind, jax.device_get(m))
        for _ in range(repeats):
            for name, runner in runners.items():
                times[name][kind].append(call(name, lambda r=runner, s=s: once(r, s)))
    return times, metrics


def table(rows: list[dict], kerns: list[dict]) -> str:
    """The run as Markdown: the rounds per mapping, then the kernels alone."""
    lines = [
        "| I | mapping | first round (s) | labeled round (s) | labeling round (s) "
        "| vs reference (labeled / labeling) | clustering in the round, s (share) "
        "| load before / after |",
        "|" + "---|" * 8,
    ]
    ref = {r["workers"]: r for r in rows if r["chunk"] == "reference"}
    for r in rows:
        base = ref.get(r["workers"])
        vs = (
            f"{base['labeled_round_s_median'] / r['labeled_round_s_median']:.2f}x / "
            f"{base['labeling_round_s_median'] / r['labeling_round_s_median']:.2f}x"
            if base
            else "-"
        )
        sub = (
            f"{r['labeled_clustering_s']:.3f} ({r['labeled_clustering_share']:.0%}) / "
            f"{r['labeling_clustering_s']:.3f} ({r['labeling_clustering_share']:.0%})"
            if "labeled_clustering_s" in r
            else ""
        )
        mapping = "reference loop" if r["chunk"] == "reference" else f"chunk={r['chunk']}"
        lines.append(
            f"| {r['workers']} | {mapping} | {r['first_round_s']:.2f} "
            f"| {r['labeled_round_s_median']:.3f} | {r['labeling_round_s_median']:.3f} | {vs} "
            f"| {sub} | {r['load_1m_before']:.1f} / {r['load_1m']:.1f} |"
        )
    lines += [
        "",
        "| I | cosine [I, P] (s) | K_max bipartitions [I, I] (s) | per edge: J cosine "
        "[I/J, P] (s) | per edge: J bipartitions (s) | load |",
        "|" + "---|" * 6,
    ]
    for k in kerns:
        lines.append(
            f"| {k['workers']} | {k['cosine_s']:.3f} | {k['bipartitions_s']:.4f} "
            f"| {k['per_edge_cosine_s']:.3f} | {k['per_edge_bipartition_s']:.4f} "
            f"| {k['load_1m']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="200,2000")
    ap.add_argument("--chunks", default="1,all,reference")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data", default="synthetic", choices=("synthetic", "real"))
    ap.add_argument("--images-per-worker", type=int, default=175)
    ap.add_argument(
        "--share-chunk",
        default=None,
        help="the mapping whose rounds are also timed without the clustering kernels "
        "(default: the first jit one in --chunks)",
    )
    ap.add_argument("--out", default=str(RESULTS / "cfsl.jsonl"))
    args = ap.parse_args()
    rows, kerns = [], []
    for n in (int(v) for v in args.workers.split(",")):
        ds, fraction = dataset(args.data, n, args.images_per_worker)
        cfg = compose(
            "+experiment=cfsl_fmnist",
            f"num_clients={n}",
            f"clients_per_round={n}",
            f"dataset.fraction={fraction}",
            "algorithm.eps_mode=absolute",
            "algorithm.eps1=1e9",
            "algorithm.eps2=1e-9",
            "algorithm.phi=0",
            "save_partition=false",
        )
        exp = experiment.build(cfg, dataset=ds)
        p = int(wireless.param_count(exp.alg.template["params"]))
        num_edges = int(np.max(np.asarray(exp.fed.server["edge_of"]))) + 1
        common = {
            "workers": n,
            "edges": num_edges,
            "params": p,
            "data": args.data,
            "images_per_worker": args.images_per_worker,
            "repeats": args.repeats,
        }
        chunks = args.chunks.split(",")
        share = args.share_chunk or next((c for c in chunks if c != "reference"), None)
        runners, firsts, state = {}, {}, None
        for chunk in chunks:
            runners[chunk], firsts[chunk], st = first_round(exp, chunk)
            state = st if state is None else state  # every mapping is timed from one state
            if chunk == share:
                runners["bare"], firsts["bare"], _ = first_round(exp, chunk, bare=True)
        past = state.replace(round=jnp.asarray(exp.alg.cfg.split_warmup, state.round.dtype))
        states = {
            "labeled": past,
            "labeling": past.replace(labels=past.labels.replace(on=jnp.asarray(True))),
        }
        kern = {"bench": "cfsl_kernels", **common, **kernels(past, num_edges, p, args.repeats)}
        kern.update(environment())
        emit(kern, Path(args.out))
        kerns.append(kern)
        load_before = os.getloadavg()[0]
        times, metrics = interleaved(runners, states, args.repeats, n)
        for chunk in chunks:
            record = {
                "bench": "cfsl_round",
                **common,
                "backend": "reference" if chunk == "reference" else "jit",
                "chunk": chunk,
                "first_round_s": firsts[chunk],
            }
            for kind in states:
                t = times[chunk][kind]
                record[f"{kind}_round_s_median"] = float(np.median(t))
                record[f"{kind}_round_s_all"] = t
                record[f"{kind}_splits"] = int(metrics[kind]["splits"])
                record[f"{kind}_pool_mean"] = float(
                    (metrics[kind]["pseudo_labeled"] + np.sum(exp.fed.roles["labeled"].count)) / n
                )
                if chunk == share:
                    # Paired: each full round against the bare one timed right after it.
                    b = times["bare"][kind]
                    diff = float(np.median(np.subtract(t, b)))
                    record[f"{kind}_bare_round_s_median"] = float(np.median(b))
                    record[f"{kind}_bare_round_s_all"] = b
                    record[f"{kind}_clustering_s"] = diff
                    record[f"{kind}_clustering_share"] = diff / float(np.median(t))
            record["load_1m_before"] = load_before
            record["kernels_alone_s"] = kern["kernels_s"]
            record.update(environment())
            emit(record, Path(args.out))
            rows.append(record)
    print(table(rows, kerns))


if __name__ == "__main__":
    main()
