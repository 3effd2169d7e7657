"""FedAvg in plain PyTorch, written apart from the engine: the other side of `agreement.py`.

It imports neither jax nor fedjax_semi (tests/test_agreement.py checks): it reads the
Fashion-MNIST IDX files itself and, from a partition file, only index lists (each client's
training rows and the test rows, as positions in the official train and test files).

    python benchmarks/agreement_torch.py --partition P.npz --data-dir D --model cnn --out R.json

The rules it follows (the engine's, re-implemented here; docs/results/agreement.md):
* inputs: (x / 255 - mean) / std, mean and std over every pixel of the 60,000 train images;
* initialization: flax's defaults, lecun_normal kernels (a normal truncated at +-2 std with
  std = sqrt(1 / fan_in) / 0.87962566, the standard deviation of N(0, 1) truncated to (-2, 2),
  as jax.nn.initializers.variance_scaling(1, "fan_in", "truncated_normal")) and zero biases;
* local training: `epochs` passes over the client's rows, each a fresh random permutation cut
  into batches of `batch` (the last one smaller: mean loss over its own rows), plain SGD;
* every client every round; the new global model is the mean of the clients' models weighted
  by their numbers of rows (McMahan et al. 2017, Algorithm 1).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

# Standard deviation of a standard normal truncated to (-2, 2) (jax's variance_scaling).
TRUNCATED_STD = 0.87962566103423978
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (plain or .gz): a big-endian header of magic (0, 0, dtype code, ndim) and
    ndim int32 sizes, then the uint8 values."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int(s) for s in np.frombuffer(raw, ">i4", ndim, 4))
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_fashion_mnist(data_dir: Path) -> dict[str, np.ndarray]:
    """The four IDX arrays of `data_dir` (each found plain or gzipped)."""
    out = {}
    for key, stem in IDX_FILES.items():
        path = next((p for p in (data_dir / stem, data_dir / f"{stem}.gz") if p.exists()), None)
        if path is None:
            raise FileNotFoundError(f"{data_dir}: no {stem} or {stem}.gz")
        out[key] = read_idx(path)
    return out


def normalized(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    """uint8 [N, 28, 28] -> float32 [N, 1, 28, 28] of (x / 255 - mean) / std."""
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    return ((x - mean) / std).unsqueeze(1)


class CNN(nn.Module):
    """McMahan et al.'s CNN: [conv 5x5 'same' -> ReLU -> max-pool 2] x (32, 64) channels,
    dense 512 -> ReLU -> dense 10; channel and dense widths times `width` (rounded)."""

    def __init__(self, width: float = 1.0, classes: int = 10) -> None:
        super().__init__()
        c1, c2, d = (max(1, round(c * width)) for c in (32, 64, 512))
        self.conv1 = nn.Conv2d(1, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        self.fc1 = nn.Linear(c2 * 7 * 7, d)
        self.fc2 = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class MLP(nn.Module):
    """Flatten -> [dense h -> ReLU] per h -> dense 10 (the 2NN of McMahan et al. at 200, 200)."""

    def __init__(self, hidden: tuple[int, ...] = (200, 200), classes: int = 10) -> None:
        super().__init__()
        sizes = (28 * 28, *hidden)
        self.hidden = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.out = nn.Linear(sizes[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)


def flax_init_(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Re-initialize every conv and dense layer as flax does: lecun_normal kernels, zero
    biases. fan_in is what one output unit sums over (in_channels * kh * kw, or in_features)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            fan_in = m.weight[0].numel()
            std = math.sqrt(1.0 / fan_in) / TRUNCATED_STD
            nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std, generator=gen)
            nn.init.zeros_(m.bias)
    return model


def make_model(name: str, width: float, hidden: tuple[int, ...]) -> nn.Module:
    if name == "cnn":
        return CNN(width)
    if name == "mlp":
        return MLP(hidden)
    raise ValueError(f"--model={name!r} is not allowed: cnn or mlp")


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    batch: int,
    lr: float,
    gen: torch.Generator,
) -> None:
    """`epochs` passes of plain SGD over (x, y): a fresh permutation each pass, consecutive
    batches of `batch`, the last one smaller."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), batch):
            rows = perm[start : start + batch]
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    correct = sum(
        int((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum())
        for i in range(0, len(y), batch)
    )
    return correct / len(y)


def fedavg(
    model: nn.Module,
    clients: list[tuple[torch.Tensor, torch.Tensor]],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    rounds: int,
    epochs: int,
    batch: int,
    lr: float,
    eval_every: int,
    gen: torch.Generator,
) -> dict[int, float]:
    """FedAvg with every client every round; the global model's test accuracy at round 0 and
    every `eval_every` rounds (and the last) -> {round: accuracy}."""
    weights = torch.tensor([len(y) for _, y in clients], dtype=torch.float64)
    weights = (weights / weights.sum()).tolist()
    curve = {0: accuracy(model, *test)}
    local = copy.deepcopy(model)
    for t in range(1, rounds + 1):
        total = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
        for w, (x, y) in zip(weights, clients, strict=True):
            local.load_state_dict(model.state_dict())
            local_sgd(local, x, y, epochs, batch, lr, gen)
            for k, v in local.state_dict().items():
                total[k] += w * v
        model.load_state_dict(total)
        if t % eval_every == 0 or t == rounds:
            curve[t] = accuracy(model, *test)
    return curve


def read_partition(path: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """(each client's rows of the train file, the test file's evaluation rows) from a file of
    `offsets` [C + 1], `values` (the clients' rows, concatenated) and `test`."""
    with np.load(path) as z:
        offsets, values, test = z["offsets"], z["values"], z["test"]
    return [values[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)], test


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    data = load_fashion_mnist(Path(args.data_dir))
    pixels = data["x_train"].astype(np.float64) / 255.0
    mean, std = float(pixels.mean()), float(pixels.std())
    rows, test_rows = read_partition(Path(args.partition))
    labels = torch.from_numpy(data["y_train"].astype(np.int64))
    clients = [
        (normalized(data["x_train"][r], mean, std), labels[torch.from_numpy(r)]) for r in rows
    ]
    test = (
        normalized(data["x_test"][test_rows], mean, std),
        torch.from_numpy(data["y_test"][test_rows].astype(np.int64)),
    )
    hidden = tuple(args.hidden)
    curves, t0 = {}, time.perf_counter()
    for seed in args.seeds:
        gen = torch.Generator().manual_seed(seed)
        model = flax_init_(make_model(args.model, args.width, hidden), gen)
        curves[seed] = fedavg(
            model,
            clients,
            test,
            rounds=args.rounds,
            epochs=args.epochs,
            batch=args.batch,
            lr=args.lr,
            eval_every=args.eval_every,
            gen=gen,
        )
        print(f"torch seed {seed}: {curves[seed][args.rounds]:.4f}", file=sys.stderr, flush=True)
    rounds = sorted(curves[args.seeds[0]])
    return {
        "rounds": rounds,
        "seeds": list(args.seeds),
        "acc": [[curves[s][t] for t in rounds] for s in args.seeds],
        "wall_s": time.perf_counter() - t0,
        "torch": torch.__version__,
        "threads": args.threads,
        "pixel_mean": mean,
        "pixel_std": std,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partition", required=True, help=".npz of offsets, values, test")
    p.add_argument("--data-dir", required=True, help="directory of the four IDX files")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"))
    p.add_argument("--width", type=float, default=1.0, help="CNN width multiplier")
    p.add_argument("--hidden", type=int, nargs="+", default=[200, 200], help="MLP hidden sizes")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--out", required=True, help="JSON file of the curves")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    Path(a.out).write_text(json.dumps(run(a)))
