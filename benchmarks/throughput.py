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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from common import RESULTS, compose, emit, environment, runner_for, time_rounds
from fedjax_semi import experiment
from workloads import WORKLOADS, Workload, learnable_dataset, synthetic_dataset

COHORTS = (10, 30, 100, 300, 1000)
POPULATIONS = (100, 1000, 10_000, 100_000)


def matmul_flops_per_s(n: int | None = None, repeats: int = 5) -> float:
    """The device's dense f32 matmul rate, measured now: 2 n^3 / median time of n x n @ n x n."""
    n = n or (8192 if jax.default_backend() == "gpu" else 2048)
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(a))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a))
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / float(np.median(times))


def sgd_step_flops(exp, w: Workload) -> float | None:
    """FLOPs of one SGD step of the workload's model on one batch (XLA's cost analysis), counted
    on XLA's own convolution and its autodiff gradient whatever `model.conv` says, so the count
    is the model's and not a lowering's (im2col's concatenations add ~16% on W0)."""
    if w.extra:
        return None
    model = exp.model.with_conv("xla")
    # Counted by XLA:CPU on every backend: XLA:GPU leaves the convolutions it hands to cuDNN out
    # of its count (W0's step: 325 MFLOP on an H200 against 2,015 on the CPU).
    cpu = jax.devices("cpu")[0]
    variables = jax.device_put(model.init(jax.random.PRNGKey(0)), cpu)
    x = jnp.zeros((w.batch, *w.input_shape), jnp.uint8)
    y = jnp.zeros((w.batch,), jnp.int32)
    tx = optax.sgd(w.lr)

    def step(params, opt, x, y, key):
        def loss(p):
            logits, _ = model.apply({**variables, "params": p}, x, train=True, rng=key)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        g = jax.grad(loss)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt

    params = variables["params"]
    args = jax.device_put((params, tx.init(params), x, y, jax.random.PRNGKey(1)), cpu)
    cost = jax.jit(step).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0)) or None


def peak_memory() -> dict:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"peak_bytes": int(stats["peak_bytes_in_use"]), "peak_kind": "device"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"peak_bytes": int(rss), "peak_kind": "process_rss"}


def run_torch(w: Workload, ds, exp, rounds: int, **kw) -> dict:
    """`rounds` rounds of the PyTorch per-client loop on the same data and client split as
    `exp`; kw: TorchFedAvg's seed, device, threads, init."""
    import torch_loop

    x = (ds.x_train, ds.y_train, client_indices(exp), ds.x_test, ds.y_test, ds.mean, ds.std)
    return torch_loop.torch_fedavg(torch_loop.TorchFedAvg(w, *x, **kw), rounds)


def client_indices(exp) -> list[np.ndarray]:
    """Each client's training indices into x_train (labeled and unlabeled roles together)."""
    part = exp.partition.clients
    roles = [r for r in ("labeled", "unlabeled") if r in part]
    return [
        np.sort(np.concatenate([part[r][c] for r in roles])) for c in range(exp.cfg.num_clients)
    ]


def rates(w: Workload, cohort: int, t: float, flops: float | None, peak: float) -> dict:
    steps = cohort * w.steps_per_client
    out = {
        "round_s": t,
        "rounds_per_s": 1.0 / t,
        "client_steps_per_s": steps / t,
        "samples_per_s": cohort * w.local_epochs * w.per_client / t,
    }
    if flops is not None:
        out["flops_per_round"] = flops * steps
        out["achieved_flops_per_s"] = flops * steps / t
        out["fraction_of_matmul_peak"] = flops * steps / t / peak
    return out


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
    for threads in torch_threads(args) if args.torch and not w.extra else ():
        import torch_loop

        why = torch_loop.available()
        if why:
            print(f"# PyTorch loop skipped: {why}")
        else:
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


def _torch_worker(conn, workload: str, threads: int) -> None:
    """A PyTorch loop in its own process, one round per request (see TorchWorker)."""
    import torch_loop

    w = WORKLOADS[workload]
    ds = synthetic_dataset(w)
    split = torch_loop.iid_split(w.clients, w.per_client)
    x = (ds.x_train, ds.y_train, split, ds.x_test, ds.y_test, ds.mean, ds.std)
    fl = torch_loop.TorchFedAvg(w, *x, seed=0, threads=threads)
    conn.send("ready")
    while (msg := conn.recv()) != "stop":
        conn.send(fl.round() if msg == "round" else fl.evaluate())


class TorchWorker:
    """The PyTorch loop in a process of its own, timed a round at a time on request. In the
    engine's process torch's OpenMP threads and XLA's thread pool contend: a W0 round with two
    torch threads took 13.5 s there against 2.3 s alone."""

    def __init__(self, workload: str, threads: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_torch_worker, args=(child, workload, threads))
        self.proc.start()
        assert self.conn.recv() == "ready"

    def round(self) -> float:
        self.conn.send("round")
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send("stop")
        self.proc.join()


def interleaved(w: Workload, args, env: dict) -> list[dict]:
    """--interleave: every contender (each --convs x --chunks engine runner, each
    --torch-threads PyTorch loop in a process of its own, and the dense matmul) compiled or
    warmed once, then timed one round at a time in turn, --repeats passes in a rotating order,
    so that a drift of the machine's speed (other jobs, another VM on the host) falls on all of
    them alike. Ratios are of medians over the passes."""
    ds = synthetic_dataset(w)
    overrides = w.overrides()
    exp = experiment.build(compose(*overrides), dataset=ds)
    flops = sgd_step_flops(exp, w)
    has_conv = hasattr(exp.model.module, "conv_impl")
    contenders: dict[str, object] = {}
    for conv in ([c for c in args.convs.split(",") if c] or [""]) if has_conv else [""]:
        if conv:
            exp = experiment.build(compose(*overrides, f"model.conv={conv}"), dataset=ds)
        for chunk in (c for c in args.chunks.split(",") if c):
            runner = runner_for(exp, chunk)
            contenders[f"engine conv={conv or '-'} chunk={chunk}"] = [runner, runner.init()]
    for threads in torch_threads(args) if args.torch and not w.extra else ():
        contenders[f"pytorch_loop threads={threads}"] = TorchWorker(w.name, threads)
    n = 8192 if jax.default_backend() == "gpu" else 2048
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    jax.block_until_ready(matmul(a))

    def one_round(name: str) -> float:
        c = contenders[name]
        if isinstance(c, list):  # an engine runner and its state
            t0 = time.perf_counter()
            c[1], _ = c[0].round(c[1])
            jax.block_until_ready(c[1])
            return time.perf_counter() - t0
        return c.round()

    firsts = {name: one_round(name) for name in contenders}  # compiles, warms
    times: dict[str, list[float]] = {name: [] for name in contenders}
    peaks = []
    names = list(contenders)
    for p in range(args.repeats):
        for name in names[p % len(names) :] + names[: p % len(names)]:
            times[name].append(one_round(name))
        t0 = time.perf_counter()
        jax.block_until_ready(matmul(a))
        peaks.append(2 * n**3 / (time.perf_counter() - t0))
    peak = float(np.median(peaks))
    for c in contenders.values():
        if isinstance(c, TorchWorker):
            c.close()
    records = []
    for name in names:
        t = float(np.median(times[name]))
        engine, *rest = name.split()
        rec = {
            "bench": "throughput_interleaved",
            "workload": w.name,
            "title": w.title,
            "clients": w.clients,
            "cohort": w.cohort,
            "steps_per_client": w.steps_per_client,
            "batch": w.batch,
            "data": "synthetic",
            "contender": name,
            "engine": "fedjax-semi" if engine == "engine" else "pytorch_loop",
            **dict(kv.split("=") for kv in rest),
            "passes": args.repeats,
            "first_round_s": firsts[name],
            "round_s_all": times[name],
            "matmul_flops_per_s": peak,
            "matmul_flops_per_s_all": peaks,
            "sgd_step_flops": flops,
            **rates(w, w.cohort, t, flops, peak),
            **peak_memory(),
        }
        emit({**rec, **env}, Path(args.out))
        records.append(rec)
    return records


def interleaved_markdown(records: list[dict]) -> str:
    torch_best = min((r["round_s"] for r in records if r["engine"] == "pytorch_loop"), default=None)
    ref = {r.get("conv"): r["round_s"] for r in records if r.get("chunk") == "reference"}
    lines = [
        f"matmul rate (median of the passes): {records[0]['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s",
        "",
        "| contender | s / round | client-steps/s | % of matmul rate | vs reference "
        "| vs best PyTorch loop |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        frac, t = r.get("fraction_of_matmul_peak"), r["round_s"]
        base = ref.get(r.get("conv"))
        lines.append(
            f"| {r['contender']} | {t:.3f} | {r['client_steps_per_s']:,.0f} "
            f"| {'-' if frac is None else f'{100 * frac:.0f}%'} "
            f"| {'-' if base is None else f'{base / t:.2f}x'} "
            f"| {'-' if torch_best is None else f'{torch_best / t:.2f}x'} |"
        )
    return "\n".join(lines)


def torch_threads(args) -> list[int]:
    """--torch-threads as a list (e.g. "1,2": the loop once per thread count)."""
    return [int(t) for t in str(args.torch_threads).split(",") if t]


def accuracy_agreement(w: Workload, args, env: dict) -> dict:
    """Final global test accuracy after args.accuracy rounds, engine vs PyTorch loop, per seed."""
    import torch_loop

    why = torch_loop.available()
    if why:
        raise SystemExit(f"--accuracy needs PyTorch: {why}")
    clients = args.clients or w.clients
    ds = learnable_dataset(w, clients=clients)
    chunk = args.chunks.split(",")[0]
    out = {"engine": [], "pytorch_loop": []}
    for seed in range(args.seeds):
        over = [*w.overrides(clients=clients, cohort=min(w.cohort, clients)), f"seed={seed}"]
        exp = experiment.build(compose(*over), dataset=ds)
        runner = runner_for(exp, chunk)
        state = runner.init()
        for _ in range(args.accuracy):
            state, _ = runner.round(state)
        out["engine"].append(float(runner.evaluate(state)["global_acc"]))
        res = run_torch(
            w,
            ds,
            exp,
            rounds=args.accuracy,
            seed=seed,
            threads=torch_threads(args)[0],
            init=args.torch_init,
        )
        out["pytorch_loop"].append(float(res["accuracy"]))
    rec = {
        "bench": "accuracy_agreement",
        "workload": w.name,
        "title": w.title,
        "clients": clients,
        "rounds": args.accuracy,
        "seeds": args.seeds,
        "data": ds.name,
        "torch_init": args.torch_init,
        "engine_acc": out["engine"],
        "pytorch_acc": out["pytorch_loop"],
        "engine_mean": float(np.mean(out["engine"])),
        "engine_std": float(np.std(out["engine"])),
        "pytorch_mean": float(np.mean(out["pytorch_loop"])),
        "pytorch_std": float(np.std(out["pytorch_loop"])),
    }
    emit({**rec, **env}, Path(args.out))
    return rec


def replicas_vs_sequential(w: Workload, args, env: dict) -> list[dict]:
    """--replicas R: the seeds 0..R-1 of the workload as one program (a leading replica axis,
    `Runner(seeds=...)`) against the same seeds one after another (one runner per seed, each
    compiled for its own seed, as separate runs would be), at each engine chunk of --chunks.
    Steady-state round times (median of --repeats after a first round) and the first rounds
    (compile included) are both reported: R sequential runs also compile R times."""
    clients = args.clients or w.clients
    cohort = min(w.cohort, clients)
    ds = synthetic_dataset(w, clients=clients)
    exp = experiment.build(compose(*w.overrides(clients=clients, cohort=cohort)), dataset=ds)
    seeds = list(range(args.replicas))
    records = []
    for chunk in (c for c in args.chunks.split(",") if c not in ("reference", "auto", "")):
        size = chunk if chunk == "all" else int(chunk)
        seq_first, seq_round = 0.0, 0.0
        for seed in seeds:
            runner = exp.runner(chunk=size, seed=seed)
            f, t, _ = time_rounds(runner, runner.init(), args.repeats)
            seq_first += f
            seq_round += float(np.median(t))
        for rchunk in args.replica_chunks.split(","):
            rsize = rchunk if rchunk == "all" else int(rchunk)
            one = exp.runner(chunk=size, seeds=seeds, replica_chunk=rsize)
            first, times, _ = time_rounds(one, one.init(), args.repeats)
            t = float(np.median(times))
            steps = len(seeds) * cohort * w.steps_per_client
            rec = {
                "bench": "replicas",
                "workload": w.name,
                "title": w.title,
                "clients": clients,
                "cohort": cohort,
                "data": "synthetic",
                "replicas": len(seeds),
                "chunk": chunk,
                "replica_chunk": rchunk,
                "one_program_round_s": t,
                "one_program_round_s_all": times,
                "sequential_round_s": seq_round,
                "speedup": seq_round / t,
                "one_program_first_round_s": first,
                "sequential_first_rounds_s": seq_first,
                "one_program_client_steps_per_s": steps / t,
                "sequential_client_steps_per_s": steps / seq_round,
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


# Runs a command and prints, last, a JSON line with its wall time and peak RSS (the only child).
_WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:]).returncode
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": rc, "total_s": time.perf_counter() - t0, "peak_rss_bytes": rss}))
"""


def _timed_process(cmd: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True, check=True
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {res['rc']}):\n{out.stderr[-3000:]}")
    return res


def full_run(args, env: dict) -> list[dict]:
    """--full-run R: the default job as a user runs it (`fedjax-semi +experiment=fmnist_supervised
    rounds=R eval_every=5 progress=false`, real Fashion-MNIST, every default: checkpoints every 5
    rounds, JSON-lines and TensorBoard writers, the summary and plot), one process per --convs
    value, and beside it the PyTorch loop's whole process on the same setting (torch_loop.py
    --workload W0 --data fashion_mnist --eval-every 5), each timed as a whole with its peak RSS.
    The engine's phases come from its summary.json `timings` and per-round `wall_time`."""
    cli = Path(sys.executable).parent / "fedjax-semi"
    records = []
    for conv in [c for c in args.convs.split(",") if c] or [""]:
        with tempfile.TemporaryDirectory() as out:
            cmd = [
                str(cli), "+experiment=fmnist_supervised", f"rounds={args.full_run}",
                "eval_every=5", "progress=false", f"out_dir={out}",
            ] + ([f"model.conv={conv}"] if conv else [])  # fmt: skip
            res = _timed_process(cmd)
            summary = json.loads((Path(out) / "summary.json").read_text())
            rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        t = summary["timings"]
        plain = [r["wall_time"] for r in rows if r["round"] > 1 and "accuracy" not in r]
        evals = t["eval_s"]
        round_s = float(np.median(plain))
        rec = {
            "bench": "full_run",
            "workload": "W0",
            "engine": "fedjax-semi",
            "command": " ".join(c for c in cmd[1:] if not c.startswith("out_dir=")),
            "conv": conv or "default",
            "rounds": args.full_run,
            **res,
            "startup_s": t["startup_s"],
            "first_round_s": t["first_round_s"],
            "round_s": round_s,
            "eval_s_all": evals,
            "eval_s": float(np.median(evals[1:] or evals)),
            "eval_share_at_5": float(np.median(evals[1:] or evals)) / (5 * round_s),
            "accuracy": summary["final"].get("accuracy"),
        }
        emit({**rec, **env}, Path(args.out))
        records.append(rec)
    for threads in torch_threads(args) if args.torch else ():
        cmd = [
            sys.executable, str(Path(__file__).parent / "torch_loop.py"), "--workload", "W0",
            "--data", "fashion_mnist", "--rounds", str(args.full_run), "--eval-every", "5",
            "--threads", str(threads),
        ]  # fmt: skip
        with tempfile.TemporaryDirectory() as out:
            res = _timed_process([*cmd, "--out", f"{out}/t.jsonl"])
            line = json.loads(Path(f"{out}/t.jsonl").read_text().splitlines()[-1])
        rec = {
            "bench": "full_run",
            "workload": "W0",
            "engine": "pytorch_loop",
            "command": " ".join(cmd[1:]),
            "torch_threads": threads,
            "rounds": args.full_run,
            **res,
            "first_round_s": line["first_round_s"],
            "round_s": line["round_s_median"],
            "eval_s_all": line["eval_s_all"],
            "eval_s": float(np.median(line["eval_s_all"])),
            "accuracy": line["accuracy"],
        }
        emit({**rec, **env}, Path(args.out))
        records.append(rec)
    return records


def full_run_markdown(records: list[dict]) -> str:
    lines = [
        "| process | total (s) | start-up (s) | first round (s) | round (s) | eval (s) "
        "| peak RSS (GB) | accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        who = (
            f"fedjax-semi (model.conv={r['conv']})"
            if r["engine"] == "fedjax-semi"
            else f"PyTorch loop ({r['torch_threads']} threads)"
        )
        start = r.get("startup_s")
        lines.append(
            f"| {who} | {r['total_s']:.1f} | {'-' if start is None else f'{start:.1f}'} "
            f"| {r['first_round_s']:.2f} | {r['round_s']:.3f} | {r['eval_s']:.3f} "
            f"| {r['peak_rss_bytes'] / 1e9:.2f} | {r['accuracy']:.4f} |"
        )
    return "\n".join(lines)


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
