"""One DoFed-SPP round at N = 25 and N = 500 clients: the chunked vmap against the reference loop,
and the share of the round spent in the N x N similarity-ratio kernel, side by side in one run.

    python benchmarks/dofed_spp.py [--clients 25,500] [--chunks 1,reference] [--repeats 2]
                                   [--model dofed_cnn|mlp]

Prints JSON lines and appends them to benchmarks/results/dofed_spp.jsonl. Setup: the
`dofed_spp_fmnist` stand-in (Fashion-MNIST SUBSET, the 545k-parameter `dofed_cnn`, per client 200
training, 6 labeled and 114 unlabeled target images, K = B = 10), one warm-up round. A round
trains every client's reciprocal model and student (mapped by the engine) and recomputes the SR
matrix: every cached model on every client's D_lab, N^2 evaluations, plus N^2 parameter
distances (`refresh_similarity`, at the base station, the same code under every mapping). The SR
kernel is also timed alone, jitted, on the state after warm-up. `--model mlp` (784-200-200-10)
swaps in a cheaper model, so that N = 500 fits a CPU session: the N x N kernel's count of
evaluations is the same.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import jax

from common import RESULTS, compose, dataset_or_synthetic, emit, environment, runner_for, timed
from fedjax_semi import experiment


def sr_kernel(alg, state, data):
    """The round's Eq. 19 call alone: S [N, N] from the cache, R, R_prev and T on D_lab."""
    lab = data.roles["target_labeled"]

    def run(state):
        shown = alg.broadcast(state.cache)
        return alg.similarity(
            state.cache, shown, state.R, state.R_prev, state.T, data.x, data.y, lab, state.S
        )[0]

    return functools.partial(jax.jit(run), state)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="25,500")
    ap.add_argument("--chunks", default="1,reference")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default="dofed_cnn", choices=("dofed_cnn", "mlp"))
    ap.add_argument("--out", default=str(RESULTS / "dofed_spp.jsonl"))
    args = ap.parse_args()
    ds, kind = dataset_or_synthetic("fashion_mnist")
    env = environment()
    for n in (int(v) for v in args.clients.split(",")):
        cfg = compose(
            "+experiment=dofed_spp_fmnist",
            f"num_clients={n}",
            f"clients_per_round={min(n, 10)}",
            "algorithm.warmup_rounds=1",
            f"model={args.model}",
            "save_partition=false",
        )
        exp = experiment.build(cfg, dataset=ds)
        for chunk in args.chunks.split(","):
            runner = runner_for(exp, chunk)
            state = runner.init()
            first, t_round, all_round = timed(lambda r=runner, s=state: r.round(s)[0], args.repeats)
            record = {
                "bench": "dofed_spp_round",
                "backend": "reference" if chunk == "reference" else "jit",
                "chunk": chunk,
                "clients": n,
                "model": args.model,
                "data": kind,
                "first_round_s": first,
                "round_s_median": t_round,
                "round_s_all": all_round,
            }
            if chunk != "reference":
                _, t_sr, _ = timed(sr_kernel(exp.alg, state, runner.data), args.repeats)
                record["sr_kernel_s"] = t_sr
                record["sr_share_of_round"] = t_sr / t_round
            emit({**record, **env}, Path(args.out))


if __name__ == "__main__":
    main()
