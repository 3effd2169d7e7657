"""Where a round's time goes: one workload's compiled round under `jax.profiler`, its XLA
operations grouped by kind, per `model.conv` lowering, side by side in one process.

    python benchmarks/profile_round.py [--workload W0] [--convs im2col,auto] [--chunk 1]
                                       [--rounds 2] [--out FILE]

Each lowering's round is compiled and run once, then `--rounds` rounds are traced (a Perfetto
trace, read back here: no TensorBoard plugin needed). XLA:CPU names each executed operation
after its HLO instruction (`ynn_fusion.3`: a matmul or convolution fused by YNNPACK;
`concatenate.11`, `pad_slice_fusion.8`: data movement); the suffix is dropped to group them.
Prints a table (ms per round by kind, and each kind's share of the traced time) and appends one
JSON line per lowering to --out (benchmarks/results/profile.jsonl).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import tempfile
import time
from pathlib import Path

import jax

from common import RESULTS, compose, emit, environment
from fedjax_semi import experiment
from workloads import WORKLOADS, synthetic_dataset

# Executor and Python frames in the trace, not XLA operations.
_NOT_OPS = re.compile(r"^(ThunkExecutor|\$|PjitFunction|CommonPjRt|while|end: |SlinkyThreadPool)")


def op_kind(name: str) -> str:
    """`ynn_fusion.12` -> `ynn_fusion`."""
    return re.sub(r"\.\d+$", "", name)


def profile(runner, state, rounds: int) -> tuple[dict[str, float], float]:
    """(ms per round by operation kind, seconds per round) over `rounds` traced rounds."""
    state, _ = runner.round(state)  # compile
    jax.block_until_ready(state)
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        t0 = time.perf_counter()
        for _ in range(rounds):
            state, _ = runner.round(state)
            jax.block_until_ready(state)
        seconds = (time.perf_counter() - t0) / rounds
        jax.profiler.stop_trace()
        trace = next(Path(d).rglob("*.trace.json.gz"))
        with gzip.open(trace) as f:
            events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    kinds: collections.Counter = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not _NOT_OPS.match(e["name"]):
            kinds[op_kind(e["name"])] += e.get("dur", 0) / 1e3 / rounds  # us -> ms per round
    return dict(kinds), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="W0")
    ap.add_argument("--convs", default="im2col,auto")
    ap.add_argument("--chunk", default="1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--out", default=str(RESULTS / "profile.jsonl"))
    args = ap.parse_args()
    env = environment()
    w = WORKLOADS[args.workload]
    ds = synthetic_dataset(w)
    chunk = args.chunk if args.chunk == "all" else int(args.chunk)
    results = {}
    for conv in args.convs.split(","):
        exp = experiment.build(compose(*w.overrides(), f"model.conv={conv}"), dataset=ds)
        runner = exp.runner(chunk=chunk)
        kinds, seconds = profile(runner, runner.init(), args.rounds)
        results[conv] = (kinds, seconds)
        rec = {
            "bench": "profile_round",
            "workload": w.name,
            "conv": conv,
            "chunk": args.chunk,
            "rounds_traced": args.rounds,
            "round_s": seconds,
            "ms_per_round_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        }
        emit({**rec, **env}, Path(args.out))
    for conv, (kinds, seconds) in results.items():
        total = sum(kinds.values())
        print(
            f"\n{w.name}, model.conv={conv}, chunk={args.chunk}: {seconds:.3f} s / round, "
            f"{total / 1e3:.3f} s in XLA operations"
        )
        print("| operation kind | ms / round | share |\n|---|---|---|")
        for k, ms in sorted(kinds.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"| {k} | {ms:.0f} | {100 * ms / total:.1f}% |")


if __name__ == "__main__":
    main()
