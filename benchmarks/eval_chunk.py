"""One evaluation of the per-client tables at several `hardware.eval_chunk` sizes, side by side in
one run: how many clients' evaluations one vmapped step takes.

    python benchmarks/eval_chunk.py [--workloads dofed_local,dofed_fedavg,...]
                                    [--chunks 1,5,20,all] [--repeats 3]

Prints one JSON line per workload and appends it to benchmarks/results/eval_chunk.jsonl: the
median seconds of one evaluation at each chunk (the same state, the chunks timed in turn, round
robin, the order rotated on every repeat, so neither a change of load nor a position in the
order favours one chunk), each as a ratio to the CPU config's
former `eval_chunk` (`--baseline`, 20), the largest difference between any chunk's metrics and the
first chunk's, and the largest difference of an accuracy (the chunks must agree: an evaluation
is the same function of the same state; float sums may differ in the last bits). The state is
the algorithm's initial one (`Runner.template`, no warm-up): the evaluation's cost does not
depend on the weights' values. Workloads: the presets of record on Fashion-MNIST. A per-client
model (Local, DoFed-SPP, UM-pFSSL) makes a chunk of C clients a batched matmul of C weight sets;
one shared model (FedAvg) makes it one larger matmul.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from common import RESULTS, compose, emit, environment, revision
from fedjax_semi import experiment

WORKLOADS = {
    # DoFed-SPP's table of record: 25 clients, each evaluated on its test and D_unl rows.
    "dofed_local": ("+experiment=dofed_spp_fmnist_record", "partition=subset", "algorithm=local"),
    "dofed_fedavg": ("+experiment=dofed_spp_fmnist_record", "partition=subset", "algorithm=fedavg"),
    "dofed_spp": ("+experiment=dofed_spp_fmnist_record", "partition=subset", "algorithm=dofed_spp"),
    # UM-pFSSL's table of record at alpha 5: 100 clients, ResNet-9 at 1/8 width.
    "um_pfssl": (
        "+experiment=um_pfssl_table1_record",
        "partition.alpha=5.0",
        "algorithm=um_pfssl_record",
    ),
    "um_fedavg_sl": (
        "+experiment=um_pfssl_table1_record",
        "partition.alpha=5.0",
        "algorithm=fedavg_sl",
    ),
    # CFSL's table of record: 200 workers, one model per cluster.
    "cfsl": ("+experiment=cfsl_fmnist_record", "algorithm=cfsl"),
}


def _chunk(text: str) -> int | str:
    return text if text == "all" else int(text)


def _numbers(metrics: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, np.float64) for k, v in metrics.items() if np.asarray(v).size}


def measure(name: str, chunks: list[str], repeats: int, baseline: str) -> dict:
    """Median seconds of one evaluation per chunk, the ratios to `baseline`, the agreement."""
    cfg = compose(*WORKLOADS[name], "save_partition=false")
    exp = experiment.build(cfg)
    runners = {c: exp.runner(eval_chunk=_chunk(c)) for c in chunks}
    state = runners[chunks[0]].template()
    first, metrics, times = {}, {}, {c: [] for c in chunks}
    for c, r in runners.items():
        t0 = time.perf_counter()
        metrics[c] = _numbers(jax.device_get(jax.block_until_ready(r.evaluate(state))))
        first[c] = time.perf_counter() - t0
    for i in range(repeats):
        for c in chunks[i % len(chunks) :] + chunks[: i % len(chunks)]:  # rotated order
            t0 = time.perf_counter()
            jax.block_until_ready(runners[c].evaluate(state))
            times[c].append(time.perf_counter() - t0)
    median = {c: float(np.median(t)) for c, t in times.items()}
    ref = metrics[chunks[0]]
    keys = {k for m in metrics.values() for k in m}
    if any(set(m) != keys or any(m[k].shape != ref[k].shape for k in m) for m in metrics.values()):
        raise SystemExit(f"{name}: the chunks' evaluations return different metrics or shapes")
    diffs = {k: max(float(np.max(np.abs(m[k] - ref[k]))) for m in metrics.values()) for k in ref}
    worst = max(diffs, key=diffs.get) if diffs else None
    return {
        "workload": name,
        "overrides": list(WORKLOADS[name]),
        "clients": cfg.num_clients,
        "model": cfg.model.name,
        "conv": cfg.model.conv,
        "eval_s": median,
        "eval_s_all": times,
        "first_call_s": first,
        "speedup_over_baseline": {c: median[baseline] / median[c] for c in chunks},
        "baseline_chunk": baseline,
        "max_metric_diff": diffs.get(worst, 0.0),
        "max_metric_diff_key": worst,
        # Accuracies are counts of right rows: any difference there is a changed prediction.
        "max_accuracy_diff": max((d for k, d in diffs.items() if "acc" in k), default=0.0),
        "repeats": repeats,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--chunks", default="1,5,20,all")
    ap.add_argument("--baseline", default="20", help="the chunk the ratios divide by")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "eval_chunk.jsonl"))
    args = ap.parse_args()
    chunks = args.chunks.split(",")
    for c in chunks:
        if c != "all" and not (c.isdigit() and int(c) > 0):
            raise SystemExit(f"--chunks: {c!r} is not allowed: a positive integer or 'all'")
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise SystemExit(f"--workloads: {unknown} not allowed: one of {sorted(WORKLOADS)}")
    if args.baseline not in chunks:
        raise SystemExit(f"--baseline: {args.baseline!r} not allowed: one of --chunks {chunks}")
    commit = revision(None)
    for name in names:
        before = environment()  # date and load per workload, read before and after it
        record = measure(name, chunks, args.repeats, args.baseline)
        after = environment()["load_1m"]
        line = {"bench": "eval_chunk", **record, **before, "load_1m_after": after}
        emit({**line, "data": "real", "revision": commit}, Path(args.out))


if __name__ == "__main__":
    main()
