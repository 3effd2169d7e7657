"""One Ada-FedSemi round at M = 20 and M = 1,000 clients with a 50,000-sample server pool: the
compiled round (chunk=1 and chunk=all) against the reference loop, and the server's share (the
teacher relabelling the pool and the epoch on its confident pseudo-labels), side by side.

    python benchmarks/ada_fedsemi.py [--clients 20,1000] [--chunks 1,all,reference] [--repeats 3]

Setup: the `ada_fmnist` preset (784-128-10 MLP, tau = 10 local steps of batch 32, R = 1: the
pool is relabelled every round, server batch 64) on synthetic images of Fashion-MNIST's shapes:
62,500 training images, of which the partition deals 20% (12,500) to the M clients as labeled
data and keeps 50,000 as the server's unlabeled pool; 2,500 test images (500 validation). Every
round maps all M clients (the participants are a mask: one program for every P arm).

The contenders take turns round by round (`--repeats` passes after a compiling round each), so
that other jobs on a shared machine slow them alike: the engine at each --chunks entry, and, at
the first jit chunk, the same round as FedAvg-P (`algorithm=fedavg_p`: no relabelling, no server
epoch), whose difference is the server's share. JSON lines (device, versions, date, load) go to
benchmarks/results/ada_fedsemi.jsonl; a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from common import RESULTS, compose, emit, environment, runner_for, synthetic
from fedjax_semi import experiment

POOL, LABELED, TEST = 50_000, 12_500, 2_500


def contenders(m: int, chunks: list[str]) -> dict[str, list]:
    """name -> [runner, state] for every mapping, plus FedAvg-P at the first jit chunk."""
    ds = synthetic("fashion_mnist", n_train=POOL + LABELED, n_test=TEST)
    base = ["+experiment=ada_fmnist", f"num_clients={m}", "dataset.fraction=1.0"]
    out = {}
    exp = experiment.build(compose(*base), dataset=ds)
    for chunk in chunks:
        runner = runner_for(exp, chunk)
        out[f"ada_fedsemi chunk={chunk}"] = [runner, runner.init()]
    jit_chunk = next((c for c in chunks if c != "reference"), None)
    if jit_chunk is not None:
        fexp = experiment.build(compose(*base, "algorithm=fedavg_p"), dataset=ds)
        runner = runner_for(fexp, jit_chunk)
        out[f"fedavg_p chunk={jit_chunk}"] = [runner, runner.init()]
    return out


def one_round(c: list) -> float:
    t0 = time.perf_counter()
    c[1], _ = c[0].round(c[1])
    jax.block_until_ready(c[1])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="20,1000")
    ap.add_argument("--chunks", default="1,all,reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "ada_fedsemi.jsonl"))
    args = ap.parse_args()
    env = environment()
    chunks = [c for c in args.chunks.split(",") if c]
    lines = [
        "| M | contender | first round (s) | round (s) | vs reference | server share |",
        "|---|---|---|---|---|---|",
    ]
    for m in (int(x) for x in args.clients.split(",")):
        cs = contenders(m, chunks)
        first = {name: one_round(c) for name, c in cs.items()}
        times: dict[str, list[float]] = {name: [] for name in cs}
        names = list(cs)
        for p in range(args.repeats):
            for name in names[p % len(names) :] + names[: p % len(names)]:
                times[name].append(one_round(cs[name]))
        med = {name: float(np.median(t)) for name, t in times.items()}
        ref = med.get("ada_fedsemi chunk=reference")
        fedavg = next((k for k in med if k.startswith("fedavg_p")), None)
        for name in names:
            same_chunk = f"ada_fedsemi chunk={fedavg.split('=')[1]}" if fedavg else None
            share = (med[name] - med[fedavg]) / med[name] if fedavg and name == same_chunk else None
            rec = {
                "bench": "ada_fedsemi_round",
                "clients": m,
                "pool": POOL,
                "labeled": LABELED,
                "contender": name,
                "first_round_s": first[name],
                "round_s": med[name],
                "round_s_all": times[name],
                "vs_reference": None if ref is None else ref / med[name],
                "server_share": share,
                "data": "synthetic",
                **env,
            }
            emit(rec, Path(args.out))
            lines.append(
                f"| {m} | {name} | {first[name]:.1f} | {med[name]:.3f} "
                f"| {'-' if ref is None else f'{ref / med[name]:.2f}x'} "
                f"| {'-' if share is None else f'{100 * share:.0f}%'} |"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
