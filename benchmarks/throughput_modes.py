"""benchmarks/throughput.py's comparisons beyond the throughput table: contenders timed a round
at a time in turn (--interleave), the accuracy agreement with the PyTorch loop (--accuracy), seeds
as one program against one after another (--replicas), and whole user runs (--full-run)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from common import compose, emit, runner_for, time_rounds, timed_process
from fedjax_semi import experiment
from throughput_measures import (
    peak_memory,
    rates,
    run_torch,
    sgd_step_flops,
    torch_loops,
    torch_threads,
)
from workloads import WORKLOADS, Workload, learnable_dataset, synthetic_dataset


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
        child.close()  # so that a worker that dies ends recv() with EOFError, not a hang
        try:
            assert self.conn.recv() == "ready"
        except EOFError:
            self.proc.join()
            raise SystemExit(f"the PyTorch worker exited with code {self.proc.exitcode}") from None

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
    for threads in torch_loops(args, w):
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
            res = timed_process(cmd)
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
            res = timed_process([*cmd, "--out", f"{out}/t.jsonl"])
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
