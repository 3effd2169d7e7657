"""Replay of engine rounds in PyTorch: the same initial weights and the same batches, so the two
must end with the same weights to float32 rounding (a check of the mechanics, next to
`agreement.py`'s statistical check, which shares neither).

The engine runs `rounds` rounds of fedavg_sl (one seed). The torch side starts from the
engine's initial weights (converted to torch's layouts), and in every round trains every
client with plain SGD on exactly the engine's batches: its row positions from the engine's own
`batch_positions` for the client's sampling key, masked positions left out, steps without a
row skipped; then the mean of the clients' weights by their numbers of rows. Printed: the
largest weight difference and the largest logit difference on the test rows after each round.

    python benchmarks/agreement_replay.py --model cnn --partition dirichlet --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch

import agreement
import agreement_torch as tside


def to_torch(model: torch.nn.Module, params: dict, name: str) -> None:
    """Copy flax parameters into the torch model (HWIO conv kernels -> OIHW; dense kernels
    [in, out] -> [out, in]; the CNN's first dense layer reads the NHWC flattening, so its rows
    are reordered to torch's NCHW one)."""
    p = {k: {n: np.asarray(v) for n, v in d.items()} for k, d in params.items()}
    if name == "cnn":
        pairs = [(model.conv1, p["Conv_0"]), (model.conv2, p["Conv_1"])]
        for m, d in pairs:
            m.weight.data = torch.from_numpy(d["kernel"].transpose(3, 2, 0, 1).copy())
            m.bias.data = torch.from_numpy(d["bias"].copy())
        k = p["Dense_0"]["kernel"]  # [7 * 7 * C, D] in (h, w, c) order
        c = model.conv2.out_channels
        k = k.reshape(7, 7, c, -1).transpose(2, 0, 1, 3).reshape(7 * 7 * c, -1)
        model.fc1.weight.data = torch.from_numpy(k.T.copy())
        model.fc1.bias.data = torch.from_numpy(p["Dense_0"]["bias"].copy())
        dense = [(model.fc2, p["Dense_1"])]
    else:
        layers = [*model.hidden, model.out]
        dense = [(m, p[f"Dense_{i}"]) for i, m in enumerate(layers)]
    for m, d in dense:
        m.weight.data = torch.from_numpy(d["kernel"].T.copy())
        m.bias.data = torch.from_numpy(d["bias"].copy())


def split_pool(x: torch.Tensor) -> torch.Tensor:
    """2x2 max-pool whose gradient is shared equally by tied maxima (torch.amax's rule, and
    jax's for the engine's reshape-and-max pool); max_pool2d gives all of it to one of them."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).amax(dim=(3, 5))


class SplitTiesCNN(tside.CNN):
    """The torch side's CNN with `split_pool` instead of max_pool2d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = split_pool(torch.relu(self.conv1(x)))
        x = split_pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return max(float((x - y).abs().max()) for x, y in pairs)


def kinks(pre32: np.ndarray, pre64: np.ndarray, pooled: bool) -> int:
    """Where float32 rounding alone decides a non-differentiable point, between the engine's
    float32 pre-activations and float64 ones of one layer ([B, ..., C], channels last): ReLU
    inputs on the other side of 0, and (pooled: a 2x2 max-pool follows the ReLU) windows whose
    largest value is tied in float32 only or sits at another position."""
    n = int(((pre32 > 0) != (pre64 > 0)).sum())
    if not pooled:
        return n

    def windows(a):
        b, h, w, c = a.shape
        win = np.maximum(a, 0).reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4)
        return win.reshape(b, h // 2, w // 2, c, 4)

    w32, w64 = windows(pre32), windows(pre64)
    s32, s64 = np.sort(w32, -1), np.sort(w64, -1)
    top = s32[..., -1] > 0
    tie = (s32[..., -1] == s32[..., -2]) & (s64[..., -1] != s64[..., -2])
    moved = (s32[..., -1] != s32[..., -2]) & (w32.argmax(-1) != w64.argmax(-1))
    return n + int((top & (tie | moved)).sum())


def explain(exp, state, t: int, key, x64, y, idx, count, tol: float = 1e-5) -> None:
    """Round t's steps, each from the engine's weights of that step: the steps where the engine's
    gradient differs from float64 PyTorch's by more than `tol`, which layers, and how many
    points of each layer's activation and pooling `kinks` float32 rounding decided (CNN)."""
    import jax
    import jax.numpy as jnp

    from fedjax_semi.engine.keys import SAMPLE, client_key
    from fedjax_semi.engine.train import batch_positions

    data = exp.fed.train_view(oracle=True)
    obj = exp.alg.objective
    grad = jax.jit(jax.grad(lambda p, b: obj(p, {}, b, key, p, True)[0]))
    name = "cnn" if "Conv_0" in state.w["params"] else "mlp"
    width, hidden = exp.cfg.model.width, tuple(exp.cfg.model.hidden)
    for cid in range(len(count)):
        params = state.w["params"]
        pos, valid = batch_positions(
            client_key(key, SAMPLE, t, cid), count[cid], idx.shape[1], exp.alg.schedule
        )
        for step, (ps, vs) in enumerate(zip(np.asarray(pos), np.asarray(valid), strict=True)):
            if not vs.any():
                continue
            ids = idx[cid][ps]
            g = grad(params, {"x": data.x[ids], "y": data.y[ids], "valid": jnp.asarray(vs)})
            rows = torch.from_numpy(ids[vs].astype(np.int64))
            ref = tside.make_model(name, width, hidden)
            to_torch(ref, params, name)
            ref = ref.double()
            torch.nn.functional.cross_entropy(ref(x64[rows]), y[rows]).backward()
            mine = tside.make_model(name, width, hidden)
            to_torch(mine, g, name)
            diffs = {
                n: float((a.grad - b.data.double()).abs().max())
                for (n, a), b in zip(ref.named_parameters(), mine.parameters(), strict=True)
            }
            if max(diffs.values()) > tol:
                off = ", ".join(f"{n} {d:.1e}" for n, d in diffs.items() if d > tol)
                ties = ""
                if name == "cnn":
                    x32 = exp.model.preprocess(data.x[ids[vs]])
                    _, inter = exp.model.module.apply(
                        {"params": params}, x32, capture_intermediates=True
                    )
                    with torch.no_grad():
                        a1 = ref.conv1(x64[rows])
                        a2 = ref.conv2(torch.nn.functional.max_pool2d(torch.relu(a1), 2))
                        a3 = ref.fc1(torch.nn.functional.max_pool2d(torch.relu(a2), 2).flatten(1))
                    layers = [("Conv_0", a1, True), ("Conv_1", a2, True), ("Dense_0", a3, False)]
                    counts = [
                        kinks(
                            np.asarray(inter["intermediates"][k]["__call__"][0]),
                            a.numpy().transpose(0, 2, 3, 1) if pooled else a.numpy(),
                            pooled,
                        )
                        for k, a, pooled in layers
                    ]
                    ties = f"; kinks decided by float32 in conv1, conv2, dense1: {counts}"
                print(f"round {t + 1}, client {cid}, step {step + 1}: differs in {off}{ties}")
            params = jax.tree.map(lambda w, d: w - exp.cfg.algorithm.lr * d, params, g)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn", choices=agreement.MODELS)
    p.add_argument("--partition", default="iid", choices=agreement.PARTITIONS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--cnn-width", type=float, default=0.5)
    p.add_argument("--train-size", type=int, default=1000)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument(
        "--resync",
        action="store_true",
        help="start every round of the torch side from the engine's weights of that round (one "
        "round's difference, without the growth of earlier rounds' rounding differences)",
    )
    p.add_argument("--double", action="store_true", help="the torch side in float64")
    p.add_argument(
        "--explain",
        type=int,
        metavar="ROUND",
        help="instead of the replay: the steps of ROUND (1-based) whose gradient differs from "
        "float64 PyTorch's at the engine's own weights, and why (pooling ties)",
    )
    p.add_argument(
        "--onednn",
        action="store_true",
        help="keep torch's oneDNN convolutions (off by default: their float32 weight gradients "
        "were ~1e-3 off float64 on this CPU, XLA's and torch's own ~1e-7)",
    )
    p.add_argument(
        "--ties",
        default="one",
        choices=("one", "split"),
        help="CNN max-pool gradient at tied maxima: to one (torch's max_pool2d) or split (jax's)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import jax

    from fedjax_semi import experiment
    from fedjax_semi.data.registry import load_dataset, locate
    from fedjax_semi.engine.keys import SAMPLE, client_key
    from fedjax_semi.engine.train import batch_positions

    a = parse(argv)
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = a.onednn
    dtype = torch.float64 if a.double else torch.float32
    # The main run's knobs (agreement.py's defaults), one engine seed.
    args = agreement.parse(["--seeds", "2"])
    for k in ("cnn_width", "train_size", "test_size", "seed", "data_seed"):
        setattr(args, k, getattr(a, k))
    args.seeds = 1
    full = load_dataset("fashion_mnist")
    ds, _, _ = agreement.subset(full, a.train_size, a.test_size, a.data_seed)
    exp = experiment.build(agreement.engine_config(args, a.model, a.partition), dataset=ds)
    runner = exp.runner()
    state = runner.init()
    # The torch side's own normalization of the same uint8 images, and their true labels.
    files = tside.load_fashion_mnist(Path(locate("fashion_mnist")))
    pixels = files["x_train"].astype(np.float64) / 255.0
    x_all = tside.normalized(np.asarray(exp.fed.x)[..., 0], pixels.mean(), pixels.std()).to(dtype)
    y_all = torch.from_numpy(np.asarray(exp.fed.eval_y).astype(np.int64))
    x_test = x_all[torch.from_numpy(np.asarray(exp.fed.server["test_global"]).astype(np.int64))]
    table = exp.fed.roles["train"]
    idx, count = np.asarray(table.idx), np.asarray(table.count)
    weights = count / count.sum()
    if a.explain:
        for _ in range(a.explain - 1):
            state, _ = runner.round(state)
        x64 = tside.normalized(np.asarray(exp.fed.x)[..., 0], pixels.mean(), pixels.std()).double()
        explain(exp, state, a.explain - 1, jax.random.PRNGKey(a.seed), x64, y_all, idx, count)
        return 0
    if a.model == "cnn" and a.ties == "split":
        new = lambda: SplitTiesCNN(a.cnn_width)
    else:
        new = lambda: tside.make_model(a.model, a.cnn_width, tuple(args.hidden))

    def from_engine(params) -> torch.nn.Module:
        m = new()
        to_torch(m, params, a.model)
        return m.to(dtype)

    print(
        f"{a.model}, {a.partition}: torch {dtype}, oneDNN {a.onednn}, pool ties {a.ties}, "
        f"resync {a.resync}; {len(count)} clients of {count.tolist()} rows"
    )
    key = jax.random.PRNGKey(a.seed)
    model = from_engine(state.w["params"])
    for t in range(a.rounds):
        if a.resync:
            model = from_engine(state.w["params"])
        total = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
        for cid in range(len(count)):
            local = copy.deepcopy(model)
            opt = torch.optim.SGD(local.parameters(), lr=args.lr)
            k = client_key(key, SAMPLE, t, cid)
            pos, valid = batch_positions(k, count[cid], idx.shape[1], exp.alg.schedule)
            for ps, vs in zip(np.asarray(pos), np.asarray(valid), strict=True):
                if not vs.any():
                    continue
                rows = torch.from_numpy(idx[cid][ps[vs]].astype(np.int64))
                opt.zero_grad()
                torch.nn.functional.cross_entropy(local(x_all[rows]), y_all[rows]).backward()
                opt.step()
            for n, v in local.state_dict().items():
                total[n] += float(weights[cid]) * v
        model.load_state_dict(total)
        state, _ = runner.round(state)
        ref = from_engine(state.w["params"])
        with torch.no_grad():
            mine, theirs = model(x_test), ref(x_test)
        same = float((mine.argmax(1) == theirs.argmax(1)).double().mean())
        print(
            f"round {t + 1}: max |w_torch - w_engine| {max_diff(model, ref):.2e}, max |logit "
            f"difference| on {len(x_test)} test rows {float((mine - theirs).abs().max()):.2e}, "
            f"same predictions {100 * same:.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
