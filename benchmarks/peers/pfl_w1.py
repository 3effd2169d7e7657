"""Peer run: workload W1 in pfl-research (apple/pfl-research, PyTorch backend), timed per round.

pfl's own CIFAR-10 benchmark setup (`../shared/specs/anchors.md` A1): an in-memory federated
dataset (`pfl.data.FederatedDataset.from_slices`, users sampled at random), `simple_cnn`,
FedAvg with 50 users per round, 1 local epoch, batch 10, local lr 0.1, central SGD lr 1.0.
Synthetic images of the real shapes (workloads.synthetic_dataset): speed does not depend on the
pixel values.

    python benchmarks/peers/pfl_w1.py [--rounds 20] [--clients 1000] [--threads T]

Prints one JSON line and appends it to benchmarks/results/peers.jsonl; where pfl cannot be
imported or run, the line says "status": "unavailable" with the exception text.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
import types
from pathlib import Path

# benchmarks/ holds common.py, workloads.py and torch_loop.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import RESULTS, emit, environment  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

W = WORKLOADS["W1"]


def run(rounds: int, clients: int, seed: int = 0, threads: int | None = None) -> dict:
    """Train W1 for `rounds` central iterations in pfl; per-round wall times and versions."""
    import numpy as np
    import pfl
    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.pytorch_ops import get_default_device
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    from torch_loop import param_count, preprocess, torch_model
    from workloads import synthetic_dataset

    if threads:
        torch.set_num_threads(threads)
    # pfl samples users with the global numpy RNG.
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = get_default_device()

    # pfl's make_iid_federated_dataset: shuffle once, then consecutive slices, one per user,
    # as tensors already on the device (its fastest, in-RAM data path).
    ds = synthetic_dataset(W, clients=clients, seed=seed)
    perm = torch.from_numpy(np.random.permutation(len(ds.x_train)))
    x = preprocess(ds.x_train, ds.mean, ds.std, device)[perm.to(device)]
    y = torch.from_numpy(ds.y_train.astype(np.int64)).to(device)[perm.to(device)]
    pc = W.per_client
    users = {u: [x[u * pc : (u + 1) * pc], y[u * pc : (u + 1) * pc]] for u in range(clients)}
    train_data = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))

    # pfl wants `loss` and `metrics` on the module (as its benchmarks' simple_cnn has).
    net = torch_model(W)
    n_params = param_count(net, W)

    def loss(self, inputs, targets, eval=False):  # noqa: A002 - pfl's keyword
        self.eval() if eval else self.train()
        return F.cross_entropy(self(inputs), targets)

    @torch.no_grad()
    def metrics(self, inputs, targets, eval=True):  # noqa: A002 - pfl's keyword
        self.eval() if eval else self.train()
        logits = self(inputs)
        n = len(inputs)
        return {
            "loss": Weighted(F.cross_entropy(logits, targets, reduction="sum").item(), n),
            "accuracy": Weighted((logits.argmax(-1) == targets).sum().item(), n),
        }

    net.loss = types.MethodType(loss, net)
    net.metrics = types.MethodType(metrics, net)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=W.server_lr),
    )

    class RoundTimer(TrainingProcessCallback):
        """perf_counter at the start and after every central iteration."""

        def __init__(self) -> None:
            self.marks: list[float] = []

        def _mark(self) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.marks.append(time.perf_counter())

        def on_train_begin(self, *, model):
            self._mark()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self._mark()
            return False, Metrics()

    timer = RoundTimer()
    # Weights by user as pfl's baseline config (weight_by_samples: false); all users are equal
    # in size here, so it is the same mean as weighting by examples.
    backend = SimulatedBackend(
        training_data=train_data, val_data=None, postprocessors=[WeightByUser()]
    )
    # pfl evaluates the cohort before and after local training on iterations that are a multiple
    # of evaluation_frequency, iteration 0 always: only the warm-up round (reported apart) pays it.
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=rounds,
        evaluation_frequency=rounds + 1,
        train_cohort_size=W.cohort,
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_learning_rate=W.lr, local_num_epochs=W.local_epochs, local_batch_size=W.batch
    )
    FederatedAveraging().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=NNEvalHyperParams(local_batch_size=1000),
        callbacks=[timer],
    )
    times = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)]
    return {
        "pfl": pfl.__version__,
        "torch": torch.__version__,
        "torch_device": str(device),
        "torch_threads": torch.get_num_threads(),
        "params": n_params,
        "first_round_s": times[0],
        "round_s": times[1:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=W.clients)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "peers.jsonl"))
    args = ap.parse_args()

    record = {
        "bench": "peers",
        "framework": "pfl-research",
        "workload": W.name,
        "title": W.title,
        "data": "synthetic",
        "clients": args.clients,
        "per_client": W.per_client,
        "cohort": W.cohort,
        "local_epochs": W.local_epochs,
        "batch": W.batch,
        "lr": W.lr,
        "server_lr": W.server_lr,
        "steps_per_client": W.steps_per_client,
        "rounds": args.rounds,
    }
    try:
        res = run(args.rounds, args.clients, args.seed, args.threads)
    except Exception as e:  # not installed, or failed to run: say so, never a number
        traceback.print_exc()
        record |= {"status": "unavailable", "reason": f"{type(e).__name__}: {e}"}
    else:
        steady = statistics.median(res["round_s"]) if res["round_s"] else res["first_round_s"]
        record |= {
            "status": "ok",
            **{k: v for k, v in res.items() if k != "round_s"},
            "round_s_median": steady,
            "rounds_per_s": 1.0 / steady,
            "client_steps_per_s": W.cohort * W.steps_per_client / steady,
            "samples_per_s": W.cohort * W.local_epochs * W.per_client / steady,
        }
    emit({**record, **environment()}, Path(args.out))


if __name__ == "__main__":
    main()
