"""Plain PyTorch per-client FedAvg, the way the papers' own code runs (pfl-research, FLUTE,
Flower clients): one model instance, clients trained one after the other with torch.optim.SGD,
the weighted mean of their parameters applied by the server. The PyTorch side of the throughput
comparison for workloads W1-W3 of workloads.py.

    python benchmarks/torch_loop.py --workload W3 --rounds 5 [--clients N]
        [--data synthetic|fashion_mnist] [--device cpu] [--threads T] [--out FILE]

Prints one JSON line (and appends it to FILE when --out is given).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common import emit, environment
from workloads import WORKLOADS, Workload, learnable_dataset, synthetic_dataset

if TYPE_CHECKING:
    import torch

# The parameter counts of our JAX models (and of the papers' models) for the same workloads.
PARAMS = {"W0": 1_663_370, "W1": 1_626_442, "W2": 6_603_710, "W3": 199_210}


def available() -> str | None:
    """None when PyTorch can be imported, else a one-line reason."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # any failure (missing wheel, broken install) means unavailable
        return f"{type(e).__name__}: {e}"
    return None


def torch_model(w: Workload) -> torch.nn.Module:
    """The workload's model in PyTorch; inputs NCHW float (see `preprocess`)."""
    from torch import nn

    if w.name == "W1":
        # pfl-research `simple_cnn` (benchmarks/model/pytorch/cnn.py): VALID convs, 32x32 -> 14x14.
        model = nn.Sequential(
            nn.Conv2d(w.input_shape[-1], 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(14 * 14 * 64, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, w.num_classes),
        )
        # pfl uses Glorot-uniform kernels (to match its TF model); biases keep torch's init.
        for m in model.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.xavier_uniform_(m.weight)
        return model
    if w.name in ("W0", "W2"):
        # The FedAvg CNN (W0: Dense 512) and LEAF / FLUTE's FEMNIST CNN (W2: Dense 2048): SAME
        # 5x5 convs, two 2x2 pools, 28 -> 7.
        dense = 512 if w.name == "W0" else 2048
        return nn.Sequential(
            nn.Conv2d(w.input_shape[-1], 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(7 * 7 * 64, dense),
            nn.ReLU(),
            nn.Linear(dense, w.num_classes),
        )
    if w.name == "W3":
        h, wd, c = w.input_shape
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(h * wd * c, 200),
            nn.ReLU(),
            nn.Linear(200, 200),
            nn.ReLU(),
            nn.Linear(200, w.num_classes),
        )
    raise ValueError(f"{w.name}: the PyTorch loop covers W0-W3 only")


def local_epochs(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    idx: np.ndarray,
    w: Workload,
    rng: np.random.Generator,
) -> torch.Tensor:
    """One client's local training: w.local_epochs epochs of SGD over x[idx] in batches of
    w.batch, reshuffled each epoch by `rng`. Returns the loss summed over the examples, as a
    tensor on x's device (no host sync per step)."""
    import torch
    import torch.nn.functional as F

    loss_sum = torch.zeros((), device=x.device)
    for _ in range(w.local_epochs):
        order = torch.from_numpy(rng.permutation(idx)).to(x.device)
        for i in range(0, len(idx), w.batch):
            b = order[i : i + w.batch]
            loss = F.cross_entropy(model(x[b]), y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * len(b)
    return loss_sum


def engine_init(model: torch.nn.Module) -> None:
    """The engine's initialisation (flax's defaults): kernels LeCun normal, a normal truncated
    at two standard deviations and rescaled to variance 1 / fan_in; biases zero."""
    import math

    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            fan_in = m.weight[0].numel()  # in_features, or in_channels * kh * kw
            std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # flax's truncation correction
            nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std)
            nn.init.zeros_(m.bias)


def param_count(model: torch.nn.Module, w: Workload) -> int:
    """The number of trainable parameters, asserted equal to our JAX model's."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n == PARAMS[w.name], f"{w.name}: {n} parameters, expected {PARAMS[w.name]}"
    return n


def preprocess(
    x: np.ndarray,
    mean: Sequence[float],
    std: Sequence[float],
    device: str | torch.device,
    chunk: int = 65536,
) -> torch.Tensor:
    """uint8 NHWC -> float32 NCHW, (x/255 - mean) / std per channel, as our data pipeline does.
    In chunks, so the float copy of a large training set is made only once."""
    import torch

    dev = torch.device(device)
    m = torch.tensor(mean, dtype=torch.float32, device=dev).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=dev).view(1, -1, 1, 1)
    n, h, wd, c = x.shape
    out = torch.empty((n, c, h, wd), dtype=torch.float32, device=dev)
    for i in range(0, n, chunk):
        xb = torch.from_numpy(np.array(x[i : i + chunk])).to(dev)  # a writable copy
        out[i : i + chunk] = (xb.permute(0, 3, 1, 2).float() / 255.0 - m) / s
    return out


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TorchFedAvg:
    """FedAvg over `client_idx` (one index array into x_train per client) with one torch model:
    `round()` trains a sampled cohort one client after the other and averages, `evaluate()`
    scores the global model on the test set; both return their seconds. init="engine" draws the
    weights as the engine's flax models do (`engine_init`), for the accuracy agreement; "native"
    keeps torch's (and, on W1, pfl's Glorot) initialisation."""

    def __init__(
        self,
        w: Workload,
        x_train: np.ndarray,
        y_train: np.ndarray,
        client_idx: list[np.ndarray],
        x_test: np.ndarray,
        y_test: np.ndarray,
        mean: Sequence[float],
        std: Sequence[float],
        seed: int = 0,
        device: str = "cpu",
        threads: int | None = None,
        init: str = "native",
    ) -> None:
        import torch

        self.threads = threads
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.w, self.client_idx, self.x_test, self.y_test = w, client_idx, x_test, y_test
        self.mean, self.std = mean, std
        self.rng = np.random.default_rng(seed)
        self.dev = dev = torch.device(device)
        # All clients' data as one preprocessed tensor on the device (pfl's in-RAM dataset);
        # batches are gathered from it by index.
        self.x = preprocess(x_train, mean, std, dev)
        self.y = torch.from_numpy(np.array(y_train, dtype=np.int64)).to(dev)
        model = torch_model(w)
        if init == "engine":
            engine_init(model)
        self.model = model.to(dev)
        self.n_params = param_count(model, w)
        self.params = list(model.parameters())
        self.global_params = [p.detach().clone() for p in self.params]
        # No momentum and no weight decay: SGD keeps no state, so one optimizer serves all.
        self.opt = torch.optim.SGD(self.params, lr=w.lr, momentum=0.0, weight_decay=0.0)
        self.cohort = min(w.cohort, len(client_idx))
        self.last_loss, self.correct = float("nan"), 0

    def _load_global(self) -> None:
        import torch

        with torch.no_grad():
            for p, g in zip(self.params, self.global_params, strict=True):
                p.copy_(g)

    def round(self) -> float:
        """One FedAvg round; returns its seconds (the device synchronised at both ends)."""
        import torch

        w, dev = self.w, self.dev
        if self.threads:  # a process-wide setting: several loops in one process take turns
            torch.set_num_threads(self.threads)
        _sync(dev)
        t0 = time.perf_counter()
        sampled = self.rng.choice(len(self.client_idx), size=self.cohort, replace=False)
        acc = [torch.zeros_like(g) for g in self.global_params]
        total = 0
        loss_sum = torch.zeros((), device=dev)  # on the device: no sync per step
        self.model.train()
        for c in sampled:
            self._load_global()
            idx = self.client_idx[c]
            loss_sum += local_epochs(self.model, self.opt, self.x, self.y, idx, w, self.rng)
            with torch.no_grad():
                for a, p in zip(acc, self.params, strict=True):
                    a.add_(p, alpha=float(len(idx)))
            total += len(idx)
        with torch.no_grad():
            for g, a in zip(self.global_params, acc, strict=True):
                g.add_(a / total - g, alpha=w.server_lr)
        self.last_loss = loss_sum.item() / (total * w.local_epochs)
        _sync(dev)
        return time.perf_counter() - t0

    def evaluate(self) -> float:
        """Test accuracy of the global model (into self.correct); returns its seconds."""
        import torch

        _sync(self.dev)
        t0 = time.perf_counter()
        self._load_global()
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(self.x_test), 1000):
                xb = preprocess(self.x_test[i : i + 1000], self.mean, self.std, self.dev)
                yb = np.array(self.y_test[i : i + 1000], dtype=np.int64)
                yb = torch.from_numpy(yb).to(self.dev)
                correct += int((self.model(xb).argmax(-1) == yb).sum().item())
        self.correct = correct
        return time.perf_counter() - t0


def torch_fedavg(fl: TorchFedAvg, rounds: int, eval_every: int = 0) -> dict:
    """`rounds` rounds of `TorchFedAvg`; eval_every > 0 also evaluates the global model every
    eval_every rounds, as a run does.

    Returns {"first_round_s", "round_s" (rounds after the first), "accuracy" (final global model
    on the test set), "eval_s" (that test evaluation's seconds), "eval_s_all" (every one),
    "train_loss_last_round" (mean over the examples of the last round), "params", "cohort"}."""
    times: list[float] = []
    eval_times: list[float] = []
    for rnd in range(1, rounds + 1):
        times.append(fl.round())
        if eval_every and rnd % eval_every == 0 and rnd < rounds:
            eval_times.append(fl.evaluate())
    eval_times.append(fl.evaluate())  # the final global model (timed: what a run repeats)
    return {
        "first_round_s": times[0] if times else None,
        "round_s": times[1:],
        "accuracy": fl.correct / max(len(fl.x_test), 1),
        "eval_s": eval_times[-1],
        "eval_s_all": eval_times,
        "train_loss_last_round": fl.last_loss,
        "params": fl.n_params,
        "cohort": fl.cohort,
    }


def iid_split(n_clients: int, per_client: int, seed: int = 0) -> list[np.ndarray]:
    """A seeded permutation of n_clients * per_client indices cut into equal clients."""
    perm = np.random.default_rng(seed).permutation(n_clients * per_client)
    return [perm[i * per_client : (i + 1) * per_client] for i in range(n_clients)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="W3", choices=["W0", "W1", "W2", "W3"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=None, help="default: the workload's")
    ap.add_argument("--data", default="synthetic", choices=["synthetic", "fashion_mnist"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every k rounds too")
    ap.add_argument("--out", default=None, help="also append the JSON line to this file")
    args = ap.parse_args()

    reason = available()
    if reason is not None:
        raise SystemExit(f"torch unavailable: {reason}")
    import torch

    w = WORKLOADS[args.workload]
    clients = args.clients or w.clients
    if args.data == "synthetic":
        ds = synthetic_dataset(w, clients=clients, seed=args.seed)
    else:
        ds = learnable_dataset(w, clients=clients, seed=args.seed)
    split = iid_split(clients, w.per_client, args.seed)
    data = (ds.x_train, ds.y_train, split, ds.x_test, ds.y_test, ds.mean, ds.std)
    fl = TorchFedAvg(w, *data, seed=args.seed, device=args.device, threads=args.threads)
    res = torch_fedavg(fl, rounds=args.rounds, eval_every=args.eval_every)
    # Steady state: the median of the rounds after the first (the first when there is only one).
    steady = statistics.median(res["round_s"]) if res["round_s"] else res["first_round_s"]
    cohort = res["cohort"]
    record = {
        "bench": "torch_loop",
        "framework": "pytorch",
        "workload": w.name,
        "title": w.title,
        "data": args.data,
        "clients": clients,
        "per_client": w.per_client,
        "cohort": cohort,
        "local_epochs": w.local_epochs,
        "batch": w.batch,
        "lr": w.lr,
        "server_lr": w.server_lr,
        "steps_per_client": w.steps_per_client,
        "rounds": args.rounds,
        "params": res["params"],
        "first_round_s": res["first_round_s"],
        "round_s_median": steady,
        "rounds_per_s": 1.0 / steady,
        "client_steps_per_s": cohort * w.steps_per_client / steady,
        "samples_per_s": cohort * w.local_epochs * w.per_client / steady,
        "accuracy": res["accuracy"],
        "eval_s_all": res["eval_s_all"],
        "train_loss_last_round": res["train_loss_last_round"],
        "torch": torch.__version__,
        "torch_device": args.device,
        "torch_threads": torch.get_num_threads(),
        **environment(),
    }
    if args.out:
        emit(record, Path(args.out))
    else:
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
