"""Throughput of the standard workloads (benchmarks/workloads.py), side by side in one run: the
engine's compiled round at several chunk sizes, its reference loop of per-client jitted calls,
and (when PyTorch is installed) a plain PyTorch per-client loop with the same model, data and
hyper-parameters.

    python benchmarks/throughput.py [--workloads W1,W2,W3,W4] [--clients N] [--chunks 1,8,all]
                                    [--repeats 3] [--torch] [--markdown PATH]
    python benchmarks/throughput.py --scan cohort     [--workloads W3]   # 10 ... 1000 per round
    python benchmarks/throughput.py --scan population [--workloads W3]   # 100 ... 100,000 clients
    python benchmarks/throughput.py --accuracy 50 --seeds 3 [--workloads W1,W3]  # agreement
    python benchmarks/throughput.py --replicas 4 [--workloads W3] [--chunks 1,all]  # seeds
    python benchmarks/throughput.py --full-run 30 --convs auto,im2col --torch --torch-threads 1,2
    python benchmarks/throughput.py --interleave --workloads W0 --chunks 1,reference \
        --convs auto,im2col --torch --torch-threads 1,2 --repeats 9  # rounds taken in turns

Per mapping: rounds/s, client-steps/s, samples/s (the samples the clients train on), peak
memory (device peak where the backend reports it, else the process's peak RSS, which only grows
during a run), and achieved FLOP/s as a fraction of a dense f32 matmul measured in the same run.
FLOPs per round are counted, not estimated: XLA's cost analysis of one jitted SGD step of the
workload's model on one batch, times the steps the cohort runs (W1-W3). XLA counts a loop body
once, which is why the round program itself is not analysed; W4's round is not a plain sequence
of SGD steps, so its FLOP fraction is left out. JSON lines go to
benchmarks/results/throughput.jsonl (device, versions, date and load included) and a Markdown
table is printed (and written with --markdown).

--accuracy R trains each workload for R rounds on real Fashion-MNIST in the workload's shape
(`workloads.learnable_dataset`), with the engine and with the PyTorch loop, for --seeds seeds
each, and reports both final test accuracies: a fast simulator that learns differently is wrong.

The measures live in throughput_measures.py, the modes beyond the table (--interleave,
--accuracy, --replicas, --full-run) in throughput_modes.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import jax
import numpy as np

from common import RESULTS, compose, emit, environment, runner_for, time_rounds
from fedjax_semi import experiment
from throughput_measures import (
    matmul_flops_per_s,
    peak_memory,
    rates,
    run_torch,
    sgd_step_flops,
    torch_loops,
)
from throughput_modes import (
    accuracy_agreement,
    full_run,
    full_run_markdown,
    interleaved,
    interleaved_markdown,
    replicas_vs_sequential,
)
from workloads import WORKLOADS, Workload, synthetic_dataset

COHORTS = (10, 30, 100, 300, 1000)
POPULATIONS = (100, 1000, 10_000, 100_000)


def run_workload(w: Workload, args, peak: float, env: dict, **scale) -> list[dict]:
    clients = scale.get("clients", args.clients or w.clients)
    cohort = min(scale.get("cohort", w.cohort), clients)  # a scaled-down population caps it
    ds = synthetic_dataset(w, clients=clients)
    overrides = w.overrides(clients=clients, cohort=cohort)
    exp = experiment.build(compose(*overrides), dataset=ds)
    flops = sgd_step_flops(exp, w)
    base = {
        "bench": "throughput",
        "workload": w.name,
        "title": w.title,
        "clients": clients,
        "cohort": cohort,
        "steps_per_client": w.steps_per_client,
        "batch": w.batch,
        "data": "synthetic",
        "matmul_flops_per_s": peak,
        "sgd_step_flops": flops,
    }
    records = []
    # --convs: the convolution lowerings to compare (model.conv), each at every chunk; a model
    # without convolutions (W3) runs once.
    convs = (
        [c for c in args.convs.split(",") if c] or [""]
        if hasattr(exp.model.module, "conv_impl")
        else [""]
    )
    for conv in convs:
        if conv:
            exp = experiment.build(compose(*overrides, f"model.conv={conv}"), dataset=ds)
        for chunk in (c for c in args.chunks.split(",") if c):  # --chunks "": PyTorch only
            runner = runner_for(exp, chunk)
            first, times, _ = time_rounds(runner, runner.init(), args.repeats)
            t = float(np.median(times))
            rec = {
                **base,
                "engine": "fedjax-semi",
                "backend": runner.backend,
                "chunk": chunk if chunk != "auto" else f"auto->{runner.chunk}",
                "conv": conv or "-",
                "first_round_s": first,
                "round_s_all": times,
                **rates(w, cohort, t, flops, peak),
                **peak_memory(),
            }
            emit({**rec, **env}, Path(args.out))
            records.append(rec)
    for threads in torch_loops(args, w):
        res = run_torch(
            dataclasses.replace(w, cohort=cohort),  # the scan's cohort, not the workload's
            ds,
            exp,
            rounds=args.repeats + 1,
            seed=0,
            device="cuda" if jax.default_backend() == "gpu" else "cpu",
            threads=threads,
        )
        t = float(np.median(res["round_s"]))
        import torch

        rec = {
            **base,
            "torch": torch.__version__,
            "torch_threads": threads,
            "eval_s": res["eval_s"],
            "engine": "pytorch_loop",
            "backend": "torch",
            "chunk": "-",
            "first_round_s": res["first_round_s"],
            "round_s_all": res["round_s"],
            **rates(w, cohort, t, flops, peak),
            **peak_memory(),
        }
        emit({**rec, **env}, Path(args.out))
        records.append(rec)
    return records


def engine_label(r: dict) -> str:
    """The engine column: the conv lowering of an engine row, the threads of a PyTorch row."""
    if r["engine"] == "pytorch_loop":
        return f"pytorch_loop ({r['torch_threads']} thr)"
    return r["engine"] if r.get("conv", "-") == "-" else f"{r['engine']} (conv={r['conv']})"


def markdown(records: list[dict], device: str) -> str:
    lines = [
        f"Device: {device}",
        "",
        "| workload | clients | cohort | engine | chunk | s/round | rounds/s | client-steps/s "
        "| samples/s | % matmul peak | peak mem (GiB) | vs reference |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref = {
        (r["workload"], r["clients"], r["cohort"], r.get("conv", "-")): r["round_s"]
        for r in records
        if r["backend"] == "reference"
    }
    for r in records:
        frac = r.get("fraction_of_matmul_peak")
        pct = "-" if frac is None else f"{100 * frac:.1f}"
        base = ref.get((r["workload"], r["clients"], r["cohort"], r.get("conv", "-")))
        speedup = "-" if base is None else f"{base / r['round_s']:.2f}x"
        lines.append(
            f"| {r['workload']} | {r['clients']} | {r['cohort']} | {engine_label(r)} "
            f"| {r['chunk']} "
            f"| {r['round_s']:.3f} | {r['rounds_per_s']:.2f} | {r['client_steps_per_s']:,.0f} "
            f"| {r['samples_per_s']:,.0f} | {pct} "
            f"| {r['peak_bytes'] / 2**30:.2f} ({r['peak_kind']}) | {speedup} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="W0,W1,W2,W3,W4")
    ap.add_argument("--clients", type=int, default=0, help="population (default: the workload's)")
    ap.add_argument("--chunks", default="1,8,all,reference")
    # auto: im2col under a vmap over clients, XLA's conv with canonical gradients otherwise
    # "": each model's own default lowering (the CNNs im2col, ResNet-9 auto)
    ap.add_argument("--convs", default="", help="model.conv values to compare, e.g. auto,im2col")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch", action="store_true", help="also the PyTorch per-client loop")
    # One intra-op thread by default: on a small shared CPU torch's OpenMP threads spin against
    # XLA's and other jobs (a W3 round took 3.75 s with 2 threads, 0.023 s with 1, under load).
    # "1,2" runs the loop once per thread count (W0 compares against both).
    ap.add_argument("--torch-threads", default="1")
    ap.add_argument("--scan", choices=("cohort", "population"), default=None)
    ap.add_argument("--markdown", default="")
    ap.add_argument("--accuracy", type=int, default=0, help="rounds of the accuracy check")
    ap.add_argument("--seeds", type=int, default=3)
    # The accuracy check compares learning, so by default both start from the same distribution.
    ap.add_argument("--torch-init", choices=("engine", "native"), default="engine")
    ap.add_argument("--out", default=str(RESULTS / "throughput.jsonl"))
    ap.add_argument("--replicas", type=int, default=0, help="seeds as one program vs in turn")
    ap.add_argument("--replica-chunks", default="1,all", help="replicas mapped per chunk")
    ap.add_argument("--full-run", type=int, default=0, help="R: time whole W0 runs of R rounds")
    ap.add_argument("--interleave", action="store_true", help="contenders take turns by round")
    args = ap.parse_args()
    env = environment()
    if args.interleave:
        for name in args.workloads.split(","):
            table = interleaved_markdown(interleaved(WORKLOADS[name], args, env))
            print(table)
            if args.markdown:
                Path(args.markdown).write_text(table + "\n")
        return
    if args.full_run:
        print(full_run_markdown(full_run(args, env)))
        return
    if args.replicas:
        for name in args.workloads.split(","):
            for r in replicas_vs_sequential(WORKLOADS[name], args, env):
                print(
                    f"{name} chunk={r['chunk']} replica_chunk={r['replica_chunk']}: "
                    f"{r['replicas']} seeds as one program "
                    f"{r['one_program_round_s']:.4f} s/round, one after another "
                    f"{r['sequential_round_s']:.4f} s/round: {r['speedup']:.2f}x"
                )
        return
    if args.accuracy:
        for name in args.workloads.split(","):
            r = accuracy_agreement(WORKLOADS[name], args, env)
            print(
                f"{name}: engine {100 * r['engine_mean']:.1f} +- {100 * r['engine_std']:.1f}, "
                f"PyTorch loop {100 * r['pytorch_mean']:.1f} +- {100 * r['pytorch_std']:.1f}"
            )
        return
    peak = matmul_flops_per_s()
    records = []
    for name in args.workloads.split(","):
        w = WORKLOADS[name]
        if args.scan == "cohort":  # rounds/s against cohort size at a fixed population
            pop = args.clients or w.clients
            for cohort in (c for c in COHORTS if c <= pop):
                records += run_workload(w, args, peak, env, clients=pop, cohort=cohort)
        elif args.scan == "population":  # cost per round at a fixed cohort
            for pop in POPULATIONS:
                records += run_workload(w, args, peak, env, clients=pop, cohort=w.cohort)
        else:
            records += run_workload(w, args, peak, env)
    device = f"{jax.devices()[0].device_kind} ({env['platform']}, {env['cpu_count']} CPU cores)"
    table = markdown(records, device)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")


if __name__ == "__main__":
    main()
