"""Peer run: workload W3 in Flower's Simulation Engine (adap/flower, `flwr.simulation`, Ray).

The setting of FLUTE's comparison with Flower (`../shared/specs/anchors.md` A5, A6): 1000
clients x 60 images, 10 per round, 1 local epoch, batch 10, the MLP 784-200-200-10. A message-API
ServerApp runs the `FedAvg` strategy; each virtual SuperNode runs a PyTorch ClientApp that
loads the global weights, trains on its partition and replies with its weights and its number
of examples. Synthetic images of the real shapes (workloads.synthetic_dataset).

    python benchmarks/peers/flower_w3.py [--rounds 20] [--clients 1000] [--cpus-per-client 1]

Prints one JSON line and appends it to benchmarks/results/peers.jsonl; where Flower cannot be
imported or run, the line says "status": "unavailable" with the exception text.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import traceback
from pathlib import Path

# benchmarks/ holds common.py, workloads.py and torch_loop.py. Flower's Ray backend hands the
# driver's sys.path to its workers as PYTHONPATH, so they find these modules (and this one) too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import RESULTS, emit, environment  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

W = WORKLOADS["W3"]

# Per worker process: (clients, seed) -> (preprocessed images, labels, client index arrays).
# Built once per Ray actor, as Flower apps cache their partitioned dataset at module level.
_DATA: dict = {}


def _client_data(clients: int, seed: int):
    if (clients, seed) not in _DATA:
        import torch

        from torch_loop import iid_split, preprocess
        from workloads import synthetic_dataset

        ds = synthetic_dataset(W, clients=clients, seed=seed)
        x = preprocess(ds.x_train, ds.mean, ds.std, "cpu")
        y = torch.from_numpy(ds.y_train.astype("int64"))
        _DATA[(clients, seed)] = (x, y, iid_split(clients, W.per_client, seed))
    return _DATA[(clients, seed)]


def client_train(msg, context):
    """The ClientApp's train handler: global weights in, local SGD, weights and count out."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    from torch_loop import local_epochs, torch_model

    cfg = msg.content["config"]
    torch.set_num_threads(int(cfg["threads"]))  # as many as the actor's CPUs: no oversubscription
    x, y, client_idx = _client_data(int(cfg["clients"]), int(cfg["seed"]))
    pid = int(context.node_config["partition-id"])
    idx = client_idx[pid]
    # Flower clients are ephemeral: a fresh model per call, as in Flower's own examples.
    model = torch_model(W)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=W.lr, momentum=0.0, weight_decay=0.0)
    rng = np.random.default_rng([int(cfg["seed"]), int(cfg["server-round"]), pid])
    loss_sum = float(local_epochs(model, opt, x, y, idx, W, rng))
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord(
                {
                    "train_loss": loss_sum / (len(idx) * W.local_epochs),
                    "num-examples": len(idx),
                }
            ),
        }
    )
    return Message(content=content, reply_to=msg)


def make_client_app():
    """A ClientApp whose handler is this module's `client_train`. Built from the module imported
    by name (not __main__), so Ray pickles the handler by reference and each actor keeps its
    `_DATA` cache across messages, instead of getting a fresh by-value copy with every message."""
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(client_train)
    return app


def run(
    rounds: int, clients: int, cohort: int, seed: int = 0, cpus_per_client: float = 1.0
) -> dict:
    """Train W3 for `rounds` rounds in Flower's simulation; per-round wall times and versions."""
    import flwr
    import ray
    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from torch_loop import param_count, torch_model

    torch.manual_seed(seed)
    net = torch_model(W)
    n_params = param_count(net, W)
    marks: list[float] = []  # perf_counter before round 1 and after each round
    answered: list[int] = []  # clients that answered without error, per round
    results: list = []  # the strategy's Result

    def mark_round(server_round, arrays):
        # FedAvg.start calls evaluate_fn before round 1 and after every round: a round timer.
        marks.append(time.perf_counter())
        return None

    class CountingFedAvg(FedAvg):
        """FedAvg that records how many clients answered without error in each round, so a
        round where the clients failed is never timed as if it had trained."""

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            answered.append(sum(not m.has_error() for m in replies))
            return super().aggregate_train(server_round, replies)

    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context) -> None:
        strategy = CountingFedAvg(
            fraction_train=cohort / clients,
            fraction_evaluate=0.0,  # no federated evaluation: time training rounds only
            min_train_nodes=cohort,
            min_available_nodes=cohort,
        )
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(net.state_dict()),
            num_rounds=rounds,
            train_config=ConfigRecord(
                {"clients": clients, "seed": seed, "threads": max(1, int(cpus_per_client))}
            ),
            evaluate_fn=mark_round,
        )
        results.append(result)

    client_app = importlib.import_module(Path(__file__).stem).make_client_app()
    t0 = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=clients,
        backend_name="ray",
        backend_config={"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0}},
    )
    total = time.perf_counter() - t0
    if len(marks) != rounds + 1 or answered != [cohort] * rounds:
        raise RuntimeError(f"Flower ran {len(answered)} of {rounds} rounds, answers {answered}")
    last = results[0].train_metrics_clientapp[rounds]
    times = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return {
        "flwr": flwr.__version__,
        "ray": ray.__version__,
        "torch": torch.__version__,
        "cpus_per_client": cpus_per_client,
        "params": n_params,
        "train_loss_last_round": float(last["train_loss"]),
        "total_s": total,  # Ray start-up and shut-down included
        "first_round_s": times[0],
        "round_s": times[1:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=W.clients)
    ap.add_argument("--cpus-per-client", type=float, default=1.0, help="Ray num_cpus per client")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "peers.jsonl"))
    args = ap.parse_args()

    cohort = min(W.cohort, args.clients)
    record = {
        "bench": "peers",
        "framework": "flower",
        "workload": W.name,
        "title": W.title,
        "data": "synthetic",
        "clients": args.clients,
        "per_client": W.per_client,
        "cohort": cohort,
        "local_epochs": W.local_epochs,
        "batch": W.batch,
        "lr": W.lr,
        "server_lr": W.server_lr,
        "steps_per_client": W.steps_per_client,
        "rounds": args.rounds,
    }
    try:
        res = run(args.rounds, args.clients, cohort, args.seed, args.cpus_per_client)
    except (Exception, SystemExit) as e:  # not installed or failed (flwr may sys.exit): say so
        traceback.print_exc()
        record |= {"status": "unavailable", "reason": f"{type(e).__name__}: {e}"}
    else:
        steady = statistics.median(res["round_s"]) if res["round_s"] else res["first_round_s"]
        record |= {
            "status": "ok",
            **{k: v for k, v in res.items() if k != "round_s"},
            "round_s_median": steady,
            "rounds_per_s": 1.0 / steady,
            "client_steps_per_s": cohort * W.steps_per_client / steady,
            "samples_per_s": cohort * W.local_epochs * W.per_client / steady,
        }
    emit({**record, **environment()}, Path(args.out))


if __name__ == "__main__":
    main()
