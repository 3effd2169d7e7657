"""Golden runs: the metrics.jsonl of a tiny run of every method family (and of replicas), saved
from the code before a refactoring and reproduced after it.

Rows may carry keys added after the files were written (they are compared on the files' keys).
Counts, cohorts, cluster ids and every other non-float value must match exactly. Floats match to
a few float32 ulps (`FLOAT_RTOL`, `FLOAT_ATOL`): the same code gives the same floats only on the
same host CPU, libraries and XLA flags, and this machine's files (written 2026-11-27) differed by
1-6 ulps three days later at the commit that wrote them (relative 6e-8 to 7e-7), where a
change of method changes a value by far more. Each run goes in a subprocess with the fast
suite's flags (`WORKER_XLA_FLAGS`), whichever way pytest was started, and the check is a slow
test, for the machine a refactoring is done on: `pytest -m slow tests/test_golden.py`.
Regenerate, before a change that is meant to alter results, with
`FEDJAX_SEMI_WRITE_GOLDEN=1 pytest -m slow tests/test_golden.py`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import WORKER_XLA_FLAGS

GOLDEN = Path(__file__).parent / "golden"

# The partitions of the methods' own tests, small.
COFED = [
    "partition=cofed",
    "num_clients=6",
    "clients_per_round=6",
    "model=cnn",
    "partition.cofed.min_classes=3",
    "partition.cofed.max_classes=4",
    "partition.cofed.samples_per_class=12",
    "partition.cofed.public_fraction=0.3",
]
CFSL = [
    "partition=cfsl",
    "systems=hwn",
    "num_clients=24",
    "clients_per_round=24",
    "partition.cfsl.num_edges=2",
    "partition.cfsl.base=iid",
    "partition.labeled_fraction=0.6",
    "model.hidden=[16]",
    "algorithm.local_epochs=3",
    "algorithm.batch_size=16",
    "algorithm.lr=0.1",
    "algorithm.max_clusters=8",
    "algorithm.split_warmup=3",
    "algorithm.eps1=1e6",
    "algorithm.eps2=1e-6",
    "algorithm.phi=0.0",
]
ADA = [
    "partition=ada",
    "num_clients=10",
    "clients_per_round=10",
    "partition.labeled_fraction=0.3",
    "algorithm.local_steps=3",
    "algorithm.batch_size=16",
    "algorithm.server_batch=64",
    "algorithm.lr=0.1",
]
SUBSET = [
    "partition=subset",
    "num_clients=6",
    "clients_per_round=3",
    "partition.dofed.train_per_class=40",
    "partition.dofed.target_per_class=40",
    "partition.dofed.target_labeled_fraction=0.5",
    "partition.dofed.test_per_class=15",
    "algorithm.lr=0.1",
    "algorithm.batch_size=16",
    "systems.wireless.time_sec_per_train_sample=2e-4",
    "systems.wireless.time_sec_per_infer_sample=5e-5",
]

RUNS = {
    "fedavg_pl": ["algorithm=fedavg_pl", "rounds=3"],
    "dofed_spp": [
        "algorithm=dofed_spp", "partition=subset", "partition.dofed.assignment=balanced",
        "num_clients=6",
        "partition.dofed.train_per_class=20", "partition.dofed.target_per_class=20",
        "partition.dofed.target_labeled_fraction=0.1", "partition.dofed.test_per_class=8",
        "algorithm.warmup_rounds=1", "algorithm.selection_k=3", "algorithm.selection_b=2",
        "clients_per_round=3", "eval_initial=true", "rounds=2",
    ],
    "um_pfssl": [
        "algorithm=um_pfssl", "num_clients=6", "clients_per_round=3",
        "algorithm.helper_list_size=3", "algorithm.num_replace=1", "algorithm.search_rounds=3",
        "algorithm.refresh_period=2", "algorithm.mc_samples=3", "algorithm.warmup_epochs=1",
        "algorithm.batch_size=16", "algorithm.lr=0.05", "algorithm.model_dropout=0.5",
        "partition.labeled_mode=dirichlet", "rounds=4",
    ],
    "replicas": ["algorithm=fedavg_pl", "rounds=3", "replicas=2", "seed=5"],
    # Every other method's round, recorded before each moved to one typed round function.
    "fedavg": ["algorithm=fedavg", "rounds=2"],
    "fedprox": ["algorithm=fedprox", "algorithm.prox_mu=0.1", "rounds=2"],
    "fixavg": ["algorithm=fixavg", "algorithm.pl_threshold=0.3", "rounds=2"],
    "lg_fedavg": ["algorithm=lg_fedavg", "algorithm.pl_threshold=0.3", "rounds=2"],
    "local": ["algorithm=local", "rounds=2"],
    "pfedme": ["algorithm=pfedme", "algorithm.pl_threshold=0.3", "rounds=2"],
    "pfedavg": [*COFED, "algorithm=pfedavg", "algorithm.local_epochs=1",
                "algorithm.batch_size=16", "algorithm.finetune_epochs=1",
                "algorithm.architecture=[8,8]", "rounds=1"],
    "cofed": [*COFED, "algorithm=cofed", "rounds=2", "algorithm.local_epochs=2",
              "algorithm.batch_size=16", "algorithm.update_epochs=1",
              "algorithm.update_batch_size=64", "algorithm.predict_batch=128",
              "algorithm.lr=0.003", "algorithm.update_lr=0.003", "algorithm.table1_models=2"],
    "fedmd": [*COFED, "algorithm=fedmd", "rounds=2", "dataset.server_pool=digits",
              "dataset.server_pool_labels=true", "dataset.server_pool_size=200",
              "algorithm.local_epochs=2", "algorithm.public_epochs=1", "algorithm.lr=0.005",
              "algorithm.batch_size=16", "algorithm.digest_batch_size=16",
              "algorithm.revisit_epochs=1", "algorithm.finetune_epochs=1",
              "algorithm.align_size=48", "algorithm.predict_batch=64",
              "algorithm.table1_models=2"],
    "cfsl": [*CFSL, "algorithm=cfsl", "rounds=4"],
    "hfsl": [*CFSL, "algorithm=hfsl", "rounds=4"],
    "ada_fedsemi": [*ADA, "algorithm=ada_fedsemi", "rounds=3"],
    "fedsemi": [*ADA, "algorithm=fedsemi", "algorithm.fixed_p=0.5", "algorithm.fixed_c=0.2",
                "rounds=2"],
    "hetero_ada": [*ADA, "algorithm=hetero_ada", "model=vgg9_exits", "model.width=0.125",
                   "systems=tx2", "rounds=2"],
    "dofed_fedavg": [*SUBSET, "algorithm=fedavg", "rounds=2"],
    "dofed_local": [*SUBSET, "algorithm=local", "rounds=2"],
    "fedfomo": [*SUBSET, "algorithm=fedfomo", "algorithm.fedfomo_m=3", "rounds=3"],
    "fedbe": [*SUBSET, "algorithm=fedbe", "algorithm.fedbe_samples=4",
              "algorithm.fedbe_pool_size=200", "algorithm.fedbe_distill_epochs=2",
              "algorithm.fedbe_swa_start=1", "algorithm.fedbe_distill_batch_size=64",
              "algorithm.fedbe_distill_lr=0.05", "rounds=2"],
}  # fmt: skip

# Host timings differ from run to run; everything else must not.
UNTIMED = ("wall_time",)

# Floats: 1e-5 relative is ~80 float32 ulps, 100x the largest drift seen between days on one
# machine (7e-7); the absolute 1e-6 covers values near zero (pl_rate 0.0, small losses), where a
# relative bound alone would ask for exact bits.
FLOAT_RTOL = 1e-5
FLOAT_ATOL = 1e-6


def _differ(a, b) -> bool:
    """Whether a (this run) and b (golden) differ: floats within tolerance, the rest exactly."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) != len(b) or any(_differ(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, int | float) or isinstance(a, bool) or isinstance(b, bool):
            return True
        both_nan = math.isnan(a) and math.isnan(b)
        return not both_nan and not math.isclose(a, b, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL)
    return a != b


def mismatches(rows: list[dict], golden: list[dict]) -> list[str]:
    """One line per value of the golden rows that this run's rows do not reproduce.

    Every key a golden row holds is compared; a row may hold keys added since the files were
    written (the sanity columns of docs/gates.md), never lose one.
    """
    if len(rows) != len(golden):
        return [f"{len(rows)} rows, golden has {len(golden)}"]
    out = []
    for i, (row, gold) in enumerate(zip(rows, golden, strict=True)):
        for key, want in gold.items():
            got = row.get(key, "<missing>")
            if _differ(got, want):
                out.append(f"row {i} {key}: {got!r}, golden {want!r}")
    return out


def _rows(run_dir: Path) -> list[dict]:
    paths = sorted(run_dir.rglob("metrics.jsonl"))
    rows = []
    for p in paths:
        for line in p.read_text().splitlines():
            row = {k: v for k, v in json.loads(line).items() if k not in UNTIMED}
            rows.append({"file": str(p.relative_to(run_dir)), **row})
    return rows


# One golden run in a fresh interpreter: conftest's compose_config, then the run directory.
RUN = """
import sys
sys.path.insert(0, sys.argv[1])
from conftest import compose_config
from fedjax_semi import experiment
experiment.run(experiment.build(compose_config(*sys.argv[3:])), sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_metrics(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["XLA_FLAGS"] = WORKER_XLA_FLAGS
    out = tmp_path / "run"
    cmd = [sys.executable, "-c", RUN, str(Path(__file__).parent), str(out), *RUNS[name]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(out)
    path = GOLDEN / f"{name}.jsonl"
    if os.environ.get("FEDJAX_SEMI_WRITE_GOLDEN"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    golden = [json.loads(line) for line in path.read_text().splitlines()]
    assert mismatches(rows, golden) == []


def test_golden_comparison_allows_ulps_and_catches_changes():
    """The fast check of the slow test's comparison, on a real golden file's rows."""
    golden = [json.loads(line) for line in (GOLDEN / "fedavg_pl.jsonl").read_text().splitlines()]
    assert mismatches(copy.deepcopy(golden), golden) == []

    def changed(key, value, row=0):
        rows = copy.deepcopy(golden)
        rows[row][key] = value
        return mismatches(rows, golden)

    loss = golden[0]["train_loss"]
    ulp = float(np.spacing(np.float32(loss)))
    assert changed("train_loss", loss + 6 * ulp) == []  # the drift seen between days
    assert changed("train_loss", loss * (1 + 1e-4)) != []  # a change of arithmetic
    assert changed("pl_rate", 5e-7) == []  # near zero: the absolute bound (golden 0.0)
    assert changed("pl_rate", 1e-4) != []
    assert changed("comm_cost", golden[0]["comm_cost"] + 1) != []  # counts exactly
    assert changed("cohort", [*golden[0]["cohort"][:-1], 0]) != []
    assert changed("cohort", golden[0]["cohort"][:-1]) != []
    rows = copy.deepcopy(golden)
    del rows[1]["train_loss"]
    want = golden[1]["train_loss"]
    assert mismatches(rows, golden) == [f"row 1 train_loss: '<missing>', golden {want!r}"]
    assert mismatches(golden[:-1], golden) == [f"{len(golden) - 1} rows, golden has {len(golden)}"]
    # Keys added since the file was written are ignored.
    assert mismatches([{**r, "new_column": 1.0} for r in golden], golden) == []
