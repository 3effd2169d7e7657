"""The engine's FedAvg against an independent PyTorch FedAvg on Fashion-MNIST (make agreement).

For each setting (CNN and MLP; IID and Dirichlet(0.5) label skew) both sides train FedAvg on
exactly the same labeled rows, from the same initialization scheme, with the same optimizer and
batch rule, and their test accuracies over seeds are compared at rounds 10, 50 and 100
(`agreement_stats`: the difference of the means within two standard errors).

* Engine: `fedjax-semi algorithm=fedavg_sl` (every training row labeled), all clients every
  round, `replicas=` seeds as one program, on a random subset of the train and test files.
* PyTorch: `agreement_torch.py`, a separate process that shares nothing with the engine but the
  IDX files and the index lists this script exports from the engine's partition (each client's
  training rows, the test rows, as positions in the official files).

    python benchmarks/agreement.py                      # the full run (77 min here, 2 cores)
    python benchmarks/agreement.py --rounds 3 --seeds 2 --eval-every 1 --check-rounds 3
    python benchmarks/agreement.py --report             # table + plot from the results file

Writes JSON lines to benchmarks/results/agreement.jsonl and the plot to
docs/results/agreement.png; prints the table and the verdict. docs/results/agreement.md says
what every rule is and what the run found.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import agreement_stats as stats
from common import RESULTS, ROOT, compose, emit, environment

HERE = Path(__file__).resolve().parent
RESULTS_FILE = RESULTS / "agreement.jsonl"
PLOT = ROOT / "docs" / "results" / "agreement.png"
MODELS = ("cnn", "mlp")
PARTITIONS = ("iid", "dirichlet")


def setting_name(model: str, partition: str, alpha: float) -> str:
    skew = "IID" if partition == "iid" else f"Dirichlet({alpha:g})"
    return f"{model.upper()}, {skew}"


def subset(ds, n_train: int, n_test: int, seed: int):
    """(the dataset cut to a uniform random n_train train and n_test test images, the kept
    positions in the train file, those in the test file); mean and std stay the full train
    set's (the engine's normalization, `Model.preprocess`)."""
    sizes = (("--train-size", n_train, len(ds.y_train)), ("--test-size", n_test, len(ds.y_test)))
    for key, n, total in sizes:
        if not 1 <= n <= total:
            raise SystemExit(f"agreement: {key}={n} is not allowed: an integer in [1, {total}]")
    rng = np.random.default_rng([seed, 2017])
    tr = np.sort(rng.choice(len(ds.y_train), n_train, replace=False))
    te = np.sort(rng.choice(len(ds.y_test), n_test, replace=False))
    cut = dataclasses.replace(
        ds, x_train=ds.x_train[tr], y_train=ds.y_train[tr], x_test=ds.x_test[te],
        y_test=ds.y_test[te],
    )  # fmt: skip
    return cut, tr, te


def export_partition(part, train_pos: np.ndarray, test_pos: np.ndarray, path: Path) -> None:
    """The torch side's whole view of the engine's partition: per client the rows fedavg_sl
    trains on (its `train` role: labeled and unlabeled rows), and the server's `test_global`,
    as positions in the official train and test files (`offsets` [C + 1], `values`, `test`)."""
    n_train = len(train_pos)
    rows = [
        np.sort(np.concatenate([a, b]))
        for a, b in zip(part.clients["labeled"], part.clients["unlabeled"], strict=True)
    ]
    values = np.concatenate(rows).astype(np.int64)
    test = np.asarray(part.server["test_global"], np.int64)
    if (values >= n_train).any() or (test < n_train).any():
        raise ValueError(
            "partition: training rows outside the train split or test rows outside the test split"
        )
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    with open(path, "wb") as f:
        np.savez(f, offsets=offsets, values=train_pos[values], test=test_pos[test - n_train])


def engine_config(args: argparse.Namespace, model: str, partition: str):
    over = [
        "algorithm=fedavg_sl",
        f"algorithm.lr={args.lr}",
        f"algorithm.batch_size={args.batch}",
        f"algorithm.local_epochs={args.epochs}",
        "algorithm.momentum=0.0",
        "algorithm.optimizer=sgd",
        "algorithm.weighting=num_samples",
        f"model={model}",
        f"partition={partition}",
        f"partition.alpha={args.alpha}",
        f"num_clients={args.clients}",
        f"clients_per_round={args.clients}",
        f"replicas={args.seeds}",
        f"seed={args.seed}",
        f"data_seed={args.data_seed}",
        "progress=false",
    ]
    if model == "cnn":
        over.append(f"model.width={args.cnn_width}")
    else:
        over.append("model.hidden=[" + ",".join(str(h) for h in args.hidden) + "]")
    return compose(*over)


def run_engine(exp, rounds: int, eval_every: int) -> dict:
    """Global test accuracy of every replica at round 0, every eval_every rounds and the last."""
    import jax

    runner = exp.runner()
    t0 = time.perf_counter()
    state = runner.init()
    evals = {0: np.asarray(runner.evaluate(state)["global_acc"])}
    for t in range(1, rounds + 1):
        state, metrics = runner.round(state)
        if t % eval_every == 0 or t == rounds:
            evals[t] = np.asarray(runner.evaluate(state)["global_acc"])
            loss = np.asarray(metrics["train_loss"])
            acc = np.round(evals[t], 4).tolist()
            print(f"engine round {t}: acc {acc} loss {np.round(loss, 3).tolist()}", file=sys.stderr)
    jax.block_until_ready(state)
    ts = sorted(evals)
    acc = np.stack([evals[t] for t in ts], axis=1)  # [replicas, evaluations]
    return {
        "rounds": ts,
        "seeds": exp.replica_seeds(),
        "acc": acc.tolist(),
        "wall_s": time.perf_counter() - t0,
    }


def torch_command(args: argparse.Namespace, model: str, part: Path, data_dir: str, out: Path):
    cmd = [
        sys.executable, str(HERE / "agreement_torch.py"), "--partition", str(part),
        "--data-dir", data_dir, "--model", model, "--width", str(args.cnn_width),
        "--hidden", *map(str, args.hidden), "--rounds", str(args.rounds),
        "--seeds", *(str(args.torch_seed + s) for s in range(args.seeds)),
        "--epochs", str(args.epochs), "--batch", str(args.batch), "--lr", str(args.lr),
        "--eval-every", str(args.eval_every), "--threads", str(args.torch_threads),
        "--out", str(out),
    ]  # fmt: skip
    return cmd


def run(args: argparse.Namespace) -> None:
    from fedjax_semi import experiment
    from fedjax_semi.data.registry import load_dataset, locate

    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    data_dir = locate("fashion_mnist")
    ds, train_pos, test_pos = subset(
        load_dataset("fashion_mnist"), args.train_size, args.test_size, args.data_seed
    )
    knobs = {k: v for k, v in vars(args).items() if k not in ("report", "run", "out", "plot")}
    base = {"bench": "agreement", "run": run_id}
    emit({**base, "kind": "setting", **knobs, "data_dir": data_dir, **environment()}, args.out)
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for partition in args.partitions:
                name = setting_name(model, partition, args.alpha)
                exp = experiment.build(engine_config(args, model, partition), dataset=ds)
                npz, out = Path(tmp) / f"{model}_{partition}.npz", Path(tmp) / "torch.json"
                export_partition(exp.partition, train_pos, test_pos, npz)
                counts = [int(c) for c in np.diff(np.load(npz)["offsets"])]
                print(f"== {name}: client rows {counts}", file=sys.stderr, flush=True)
                # The torch process runs beside the engine (each mostly on one core).
                proc = subprocess.Popen(torch_command(args, model, npz, data_dir, out))
                if args.sequential:
                    proc.wait()
                try:
                    eng = run_engine(exp, args.rounds, args.eval_every)
                except BaseException:
                    proc.kill()  # the torch process started above, not left running alone
                    raise
                if proc.wait() != 0:
                    raise SystemExit(f"agreement: the torch side failed on {name}")
                tor = json.loads(out.read_text())
                rec = {**base, "kind": "curve", "setting": name, "client_rows": counts}
                emit({**rec, "side": "engine", **eng}, args.out)
                emit({**rec, "side": "torch", **tor}, args.out)
                curves[name] = {"engine": eng, "torch": tor}
                for t in args.check_rounds:
                    a = stats.agreement(stats.at_round(eng, t), stats.at_round(tor, t))
                    verdict = {"diff": a.diff, "se": a.se, "agree": a.agree}
                    rec = {**base, "kind": "agreement", "setting": name, "round": t}
                    emit({**rec, **dataclasses.asdict(a), **verdict}, args.out)
    show(curves, args)


def show(curves: dict, args: argparse.Namespace) -> bool:
    windows = [tuple(args.window)] if args.window else []
    lines, every = stats.table(curves, args.check_rounds)
    print("\n".join(lines))
    print(f"verdict: {'every comparison agrees' if every else 'NOT every comparison agrees'}")
    if windows:
        lines, _ = stats.table(curves, [], windows)
        print("\n".join(lines))
    if args.plot is not None:
        stats.plot(curves, args.plot)
        print(f"plot: {args.plot}")
    return every


def report(args: argparse.Namespace) -> bool:
    """The tables and plot of stored runs (--run: one or more, default the latest): the seeds of
    a setting and side in several runs are pooled."""
    path = args.out
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records = [r for r in records if r.get("bench") == "agreement"]
    runs = args.run or ([records[-1]["run"]] if records else [])
    curves: dict[str, dict] = {}
    for r in records:
        if r["run"] in runs and r["kind"] == "curve":
            sides = curves.setdefault(r["setting"], {})
            if r["side"] not in sides:
                sides[r["side"]] = {"rounds": r["rounds"], "acc": []}
            if sides[r["side"]]["rounds"] != r["rounds"]:
                raise SystemExit(f"agreement: runs {runs} evaluated different rounds")
            sides[r["side"]]["acc"] += r["acc"]
    if not curves:
        known = sorted({r["run"] for r in records})
        raise SystemExit(f"agreement: --run={runs} has no curves in {path}; runs there: {known}")
    print(f"runs {runs}")
    return show(curves, args)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="store_true", help="only the table and plot of a run")
    p.add_argument(
        "--run", nargs="+", help="--report: runs (start times in the results file), seeds pooled"
    )
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=PARTITIONS)
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--seeds", type=int, default=5, help="seeds per side (engine: replicas)")
    p.add_argument("--seed", type=int, default=0, help="the engine's first seed")
    p.add_argument("--torch-seed", type=int, default=0, help="the torch side's first seed")
    p.add_argument("--data-seed", type=int, default=0, help="subset and partition seed")
    p.add_argument("--clients", type=int, default=10, help="clients, all in every round")
    p.add_argument("--train-size", type=int, default=1000, help="random train images used")
    p.add_argument("--test-size", type=int, default=2000, help="random test images evaluated")
    p.add_argument("--cnn-width", type=float, default=0.5, help="CNN width multiplier")
    p.add_argument("--hidden", type=int, nargs="+", default=[200, 200], help="MLP hidden sizes")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--check-rounds", type=int, nargs="+", default=[10, 50, 100])
    p.add_argument(
        "--window",
        type=int,
        nargs=2,
        default=[50, 100],
        metavar=("LO", "HI"),
        help="also compare each seed's mean accuracy over rounds LO..HI",
    )
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--sequential", action="store_true", help="torch first, then the engine")
    p.add_argument("--out", type=Path, default=RESULTS_FILE)
    p.add_argument("--plot", type=Path, default=PLOT)
    a = p.parse_args(argv)
    if a.seeds < 2:
        p.error(f"--seeds={a.seeds} is not allowed: 2 or more (a standard deviation per side)")
    if a.rounds < 1 or a.eval_every < 1:
        p.error("--rounds and --eval-every must be >= 1")
    evaluated = lambda t: t == a.rounds or (0 <= t <= a.rounds and t % a.eval_every == 0)
    bad_rounds = [t for t in a.check_rounds if not evaluated(t)]
    if bad_rounds:
        p.error(
            f"--check-rounds={bad_rounds} are not evaluated rounds: multiples of "
            f"--eval-every={a.eval_every} up to --rounds={a.rounds}, or --rounds"
        )
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.report:
        report(args)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
