"""One UM-pFSSL round at 100 clients: the chunked vmap against the reference loop, and the share
of the round spent in MC dropout (the STATS pass over every helper), side by side in one run.

    python benchmarks/um_pfssl.py [--width 0.125] [--repeats 3] [--chunks 1,all,reference]

Prints JSON lines and appends them to benchmarks/results/um_pfssl.jsonl. The timed round is a
search round (t <= F: REPLACE, then STATS), the most MC-heavy kind.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common import RESULTS, compose, dataset_or_synthetic, emit, environment
from fedjax_semi import experiment
from fedjax_semi.engine.clients import MC_STATS, map_clients


def timed(fn, repeats):
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def stats_pass(alg, chunk):
    """The STATS pass alone, jitted: MC dropout of every helper slot on each client's data."""
    cmap = functools.partial(map_clients, chunk=chunk)

    def one(inp, shared):
        n_s, n_u = inp["lab"].count, inp["unl"].count
        mu = n_s / jnp.maximum(n_s + n_u, 1)
        helpers = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), inp["own"], inp["cache"])
        return alg.helper_stats(helpers, inp["hidx"], MC_STATS, inp, shared, mu)["corr"]

    def run(state, data):
        _, inputs, shared = alg.prepare(state, data)
        return cmap(one, inputs, shared)

    return jax.jit(run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--cohort", type=int, default=10)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--mc-samples", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", default="1,all,reference")
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
    for chunk in args.chunks.split(","):
        if chunk == "reference":
            runner = exp.runner(backend="reference")
        else:
            runner = exp.runner(chunk=chunk if chunk == "all" else int(chunk))
        state = runner.init()
        t_round, all_round = timed(lambda r=runner, s=state: r.round(s)[0], args.repeats)
        record = {
            "bench": "um_pfssl_round",
            "backend": "reference" if chunk == "reference" else "jit",
            "chunk": chunk,
            "clients": args.clients,
            "cohort": args.cohort,
            "model": f"resnet9 width {args.width}",
            "mc_samples": args.mc_samples,
            "data": kind,
            "round_s_median": t_round,
            "round_s_all": all_round,
        }
        if chunk != "reference":
            stats = stats_pass(alg, chunk if chunk == "all" else int(chunk))
            t_mc, _ = timed(functools.partial(stats, state, runner.data), args.repeats)
            record["stats_pass_s"] = t_mc
            # A search round runs MC over M incumbents, R candidates and M final helpers:
            # (2M + R) / M STATS passes.
            m, r = cfg.algorithm.helper_list_size, cfg.algorithm.num_replace
            record["mc_share_of_round"] = t_mc * (2 * m + r) / m / t_round
        emit({**record, **env}, Path(args.out))


if __name__ == "__main__":
    main()
