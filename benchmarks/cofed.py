"""CoFED: the consensus kernel at the paper's scale, and a whole run of heterogeneous clients with
one vmapped program per architecture group against the reference loop, side by side in one run.

    python benchmarks/cofed.py [--clients 100] [--public 50000] [--classes 20] [--repeats 5]
                               [--run-clients 100] [--run-public 5000] [--chunks all,1,reference]

Prints JSON lines and appends them to benchmarks/results/cofed.jsonl.

* kernel: `consensus_votes` + `distribute` (jitted) at C clients, M public samples, K classes,
  against the same computation in vectorized NumPy (np.add.at, two matmuls) on the host.
* run: Step 1-2 (the warm-up: local training and the public set's labels) and Step 3-4 (the one
  round: votes, distribution, update training) of the Fashion-MNIST stand-in with the ten
  Table-1 CNNs round-robin, timed per mapping: "all" (one vmap per group), 1 (a loop inside the
  program) and the reference backend (a Python loop of per-client jitted calls). Epochs are cut
  (--local-epochs, --update-epochs) so the reference loop finishes; every mapping runs the same.
  Each phase is timed twice: the first call (compile + run) and a second one (run).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common import RESULTS, compose, dataset_or_synthetic, emit, environment, runner_for
from fedjax_semi import experiment
from fedjax_semi.kernels import voting


def kernel_inputs(c: int, m: int, k: int, seed: int = 0):
    """Random label spaces of 6-8 classes and predictions inside them: preds [C, M], owns [C, K]."""
    rng = np.random.default_rng(seed)
    owns = np.zeros((c, k), bool)
    for i in range(c):
        owns[i, rng.choice(k, rng.integers(6, 9), replace=False)] = True
    choice = rng.random((c, m))
    space = [np.flatnonzero(o) for o in owns]
    preds = np.stack([s[(choice[i] * len(s)).astype(int)] for i, s in enumerate(space)])
    return preds.astype(np.int32), owns


def numpy_center(preds: np.ndarray, owns: np.ndarray, alpha: float):
    """Algorithm 1 and Eq. 19 in vectorized NumPy: accept [M, K], keep [C, M], label [C, M]."""
    c, m = preds.shape
    count = np.zeros((m, owns.shape[1]), np.float32)
    np.add.at(count, (np.broadcast_to(np.arange(m), (c, m)), preds), 1.0)
    total = owns.sum(0).astype(np.float32)
    accept = (total > 0) & (count / np.where(total > 0, total, 1) > alpha)
    a, p = owns.astype(np.int32), accept.astype(np.int32)
    claims = a @ p.T
    label = a @ (p * np.arange(p.shape[1])).T
    keep = claims == 1
    return accept, keep, np.where(keep, label, -1)


def best_of(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def bench_kernel(args, env) -> None:
    preds, owns = kernel_inputs(args.clients, args.public, args.classes)
    jp, jo = jnp.asarray(preds), jnp.asarray(owns)

    @jax.jit
    def center(p, o, alpha):
        accept = voting.consensus_votes(p, o, alpha)
        keep, label = voting.distribute(accept, o)
        return accept, keep, label

    out = center(jp, jo, 0.3)  # compile
    ref = numpy_center(preds, owns, 0.3)
    for a, b in zip(out, ref, strict=True):  # the timed kernels agree
        np.testing.assert_array_equal(np.asarray(a), b)
    t_jit, all_jit = best_of(lambda: center(jp, jo, 0.3), args.repeats)
    t_np, all_np = best_of(lambda: numpy_center(preds, owns, 0.3), args.repeats)
    emit(
        {
            "bench": "cofed_consensus_kernel",
            "clients": args.clients,
            "public": args.public,
            "classes": args.classes,
            "jit_s_median": t_jit,
            "jit_s_all": all_jit,
            "numpy_s_median": t_np,
            "numpy_s_all": all_np,
            "numpy_over_jit": t_np / t_jit,
            **env,
        },
        Path(args.out),
    )


def timed_once(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - t0, out


def bench_run(args, env) -> None:
    ds, kind = dataset_or_synthetic("fashion_mnist")
    cfg = compose(
        "+experiment=cofed_fmnist",
        f"num_clients={args.run_clients}",
        f"clients_per_round={args.run_clients}",
        f"partition.cofed.public_fraction={args.run_public / 60000}",
        f"algorithm.local_epochs={args.local_epochs}",
        f"algorithm.update_epochs={args.update_epochs}",
        "save_partition=false",
    )
    exp = experiment.build(cfg, dataset=ds)
    for chunk in args.chunks.split(","):
        runner = runner_for(exp, chunk)
        t_warm_first, state = timed_once(runner.init)
        t_warm, state = timed_once(runner.init)
        t_round_first, _ = timed_once(lambda r=runner, s=state: r.round(s)[0])
        t_round, _ = timed_once(lambda r=runner, s=state: r.round(s)[0])
        emit(
            {
                "bench": "cofed_run",
                "backend": "reference" if chunk == "reference" else "jit",
                "chunk": chunk,
                "clients": args.run_clients,
                "groups": len(exp.alg.models),
                "public": int(exp.fed.server["public"].shape[0]),
                "local_epochs": args.local_epochs,
                "update_epochs": args.update_epochs,
                "data": kind,
                "steps12_first_s": t_warm_first,
                "steps12_s": t_warm,
                "steps34_first_s": t_round_first,
                "steps34_s": t_round,
                **env,
            },
            Path(args.out),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--public", type=int, default=50000)
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--run-clients", type=int, default=100)
    ap.add_argument("--run-public", type=int, default=5000)
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--update-epochs", type=int, default=1)
    ap.add_argument("--chunks", default="all,1,reference")
    ap.add_argument("--skip-run", action="store_true")
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "cofed.jsonl"))
    args = ap.parse_args()
    env = environment()
    if not args.skip_kernel:
        bench_kernel(args, env)
    if not args.skip_run:
        bench_run(args, env)


if __name__ == "__main__":
    main()
