"""One UM-pFSSL round at 100 clients: the chunked vmap against the reference loop, and the share
of the round spent in MC dropout (the STATS pass over every helper), side by side in one run.

    python benchmarks/um_pfssl.py [--width 0.125] [--repeats 3] [--chunks 1,reference,all]

Prints JSON lines and appends them to benchmarks/results/um_pfssl.jsonl. Two rounds are timed per
mapping: a search round (t <= F: REPLACE, then STATS, the most MC-heavy kind) and a plain round
(t > F: STATS only). The MC share is the STATS pass timed alone over the plain round.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp

from common import RESULTS, compose, dataset_or_synthetic, emit, environment, runner_for, timed
from fedjax_semi import experiment
from fedjax_semi.algorithms.base import RoundShared
from fedjax_semi.engine.clients import map_clients
from fedjax_semi.engine.keys import MC_STATS


def stats_pass(alg, chunk):
    """The STATS pass alone, jitted: MC dropout of every helper slot on each client's data."""
    cmap = functools.partial(map_clients, chunk=chunk)

    def one(row, shared):
        n_s, n_u = row.lab.count, row.unl.count
        mu = n_s / jnp.maximum(n_s + n_u, 1)
        helpers = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), row.own, row.H.w_j)
        return alg.helper_stats(helpers, row.H.j, MC_STATS, row, shared, mu)["corr"]

    def run(state, data):
        key = jax.random.PRNGKey(0)
        rows = alg.cohort_rows(state, data, alg.sample_cohort(key, state.round))
        pool = RoundShared(state.w_k, data.x, data.y, state.round + 1, key, state.record)
        return cmap(one, rows, pool)

    return jax.jit(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--cohort", type=int, default=10)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--mc-samples", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", default="1,reference,all")
    ap.add_argument("--out", default=str(RESULTS / "um_pfssl.jsonl"))
    args = ap.parse_args()
    ds, kind = dataset_or_synthetic("fashion_mnist")
    cfg = compose(
        "+experiment=um_pfssl_table1_cpu",
        f"num_clients={args.clients}",
        f"clients_per_round={args.cohort}",
        f"model.width={args.width}",
        f"algorithm.mc_samples={args.mc_samples}",
        "save_partition=false",
    )
    exp = experiment.build(cfg, dataset=ds)
    alg, env = exp.alg, environment()
    c = cfg.algorithm
    # A search round (t = 1 <= F: REPLACE, then STATS) and a plain round (t > F, t % nu != 0:
    # STATS only), the latter being most of a 200-round run.
    t_plain = next(t for t in range(c.search_rounds + 1, 10**6) if t % c.refresh_period)
    single = copy.copy(alg)
    single.cfg = dataclasses.replace(c, mc_samples=1)
    for chunk in args.chunks.split(","):
        runner = runner_for(exp, chunk)
        state = runner.init()
        plain = state.replace(round=jnp.asarray(t_plain - 1, state.round.dtype))
        _, t_search, all_search = timed(lambda r=runner, s=state: r.round(s)[0], args.repeats)
        _, t_round, all_round = timed(lambda r=runner, s=plain: r.round(s)[0], args.repeats)
        record = {
            "bench": "um_pfssl_round",
            "backend": "reference" if chunk == "reference" else "jit",
            "chunk": chunk,
            "clients": args.clients,
            "cohort": args.cohort,
            "model": f"resnet9 width {args.width}",
            "mc_samples": args.mc_samples,
            "helpers": c.helper_list_size,
            "data": kind,
            "search_round_s_median": t_search,
            "search_round_s_all": all_search,
            "plain_round_s_median": t_round,
            "plain_round_s_all": all_round,
        }
        if chunk != "reference":
            mapping = chunk if chunk == "all" else int(chunk)
            _, t_mc, _ = timed(functools.partial(stats_pass(alg, mapping), state, runner.data), 1)
            _, t_one, _ = timed(
                functools.partial(stats_pass(single, mapping), state, runner.data), 1
            )
            # Measured, not estimated: the STATS pass (MC dropout of the M helpers on each
            # client's data) alone, against the plain round that contains it.
            record["stats_pass_s"] = t_mc
            record["stats_pass_s_one_sample"] = t_one
            record["mc_share_of_plain_round"] = t_mc / t_round
        emit({**record, **env}, Path(args.out))


if __name__ == "__main__":
    main()
