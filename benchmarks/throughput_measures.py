"""What benchmarks/throughput.py measures a contender by: the device's matmul rate, FLOPs per SGD
step (XLA's cost analysis), peak memory, the rates of a round time, and the PyTorch loop on the
engine's data and client split."""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from workloads import Workload


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


def torch_threads(args) -> list[int]:
    """--torch-threads as a list (e.g. "1,2": the loop once per thread count)."""
    return [int(t) for t in str(args.torch_threads).split(",") if t]


def torch_loops(args, w: Workload) -> list[int]:
    """The thread counts to run the PyTorch loop at: none without --torch, for a workload the
    loop does not implement (`w.extra`), or when PyTorch cannot be imported (one line says why)."""
    if not args.torch or w.extra:
        return []
    import torch_loop

    if why := torch_loop.available():
        print(f"# PyTorch loop skipped: {why}")
        return []
    return torch_threads(args)
