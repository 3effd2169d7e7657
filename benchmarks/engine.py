"""Engine throughput: client-steps/s of one FedAvg round over 100 clients, for the chunked vmap
(chunk = 1, 8, all) and the reference loop of per-client jitted calls, side by side in one run.

    python benchmarks/engine.py [--models cnn,mlp] [--repeats 3] [--steps 5]

Prints JSON lines and appends them to benchmarks/results/engine.jsonl.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common import (
    RESULTS,
    compose,
    dataset_or_synthetic,
    emit,
    environment,
    runner_for,
    time_rounds,
)
from fedjax_semi import experiment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--steps", type=int, default=5, help="local steps per client per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunks", default="1,8,all,reference")
    ap.add_argument("--out", default=str(RESULTS / "engine.jsonl"))
    args = ap.parse_args()
    ds, kind = dataset_or_synthetic("fashion_mnist")
    env = environment()
    for model in args.models.split(","):
        cfg = compose(
            "algorithm=fedavg_sl",
            "partition=iid",
            f"model={model}",
            f"num_clients={args.clients}",
            f"clients_per_round={args.clients}",
            "algorithm.local_epochs=0",
            f"algorithm.local_steps={args.steps}",
            f"algorithm.batch_size={args.batch}",
            "save_partition=false",
        )
        exp = experiment.build(cfg, dataset=ds)
        for chunk in args.chunks.split(","):
            runner = runner_for(exp, chunk)
            first, times, _ = time_rounds(runner, runner.init(), args.repeats)
            t = float(np.median(times))
            client_steps = args.clients * args.steps
            emit(
                {
                    "bench": "engine_round",
                    "model": model,
                    "backend": "reference" if chunk == "reference" else "jit",
                    "chunk": chunk,
                    "clients": args.clients,
                    "local_steps": args.steps,
                    "batch": args.batch,
                    "data": kind,
                    "round_s_median": t,
                    "round_s_all": times,
                    "first_round_s": first,
                    "client_steps_per_s": client_steps / t,
                    "samples_per_s": client_steps * args.batch / t,
                    **env,
                },
                Path(args.out),
            )


if __name__ == "__main__":
    main()
