"""Golden runs: the metrics.jsonl of four tiny runs (the default method, DoFed-SPP, UM-pFSSL and
replicas), saved from the code before a refactoring and reproduced exactly after it.

Rows may carry keys added after the files were written (they are compared on the files' keys).
Exact float equality holds on the machine and library versions that wrote the files (XLA may
compile other instructions on another CPU), so the check is a slow test, for the machine a
refactoring is done on: `pytest -m slow tests/test_golden.py`. Regenerate, before a change that
is meant to alter results, with `FEDJAX_SEMI_WRITE_GOLDEN=1 pytest -m slow tests/test_golden.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import compose_config
from fedjax_semi import experiment

GOLDEN = Path(__file__).parent / "golden"

RUNS = {
    "fedavg_pl": ["algorithm=fedavg_pl", "rounds=3"],
    "dofed_spp": [
        "algorithm=dofed_spp", "partition=subset", "partition.assignment=balanced",
        "num_clients=6",
        "partition.train_per_class=20", "partition.target_per_class=20",
        "partition.target_labeled_fraction=0.1", "partition.test_per_class=8",
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
}  # fmt: skip

# Host timings differ from run to run; everything else must not.
UNTIMED = ("wall_time",)


def _rows(run_dir: Path) -> list[dict]:
    paths = sorted(run_dir.rglob("metrics.jsonl"))
    rows = []
    for p in paths:
        for line in p.read_text().splitlines():
            row = {k: v for k, v in json.loads(line).items() if k not in UNTIMED}
            rows.append({"file": str(p.relative_to(run_dir)), **row})
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_golden_metrics(name, tmp_path):
    exp = experiment.build(compose_config(*RUNS[name]))
    experiment.run(exp, tmp_path)
    rows = _rows(tmp_path)
    path = GOLDEN / f"{name}.jsonl"
    if os.environ.get("FEDJAX_SEMI_WRITE_GOLDEN"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    golden = [json.loads(line) for line in path.read_text().splitlines()]
    # Exact (see the module docstring) on every key the golden rows hold; a row may hold keys
    # added since they were written (the sanity columns of docs/gates.md), never lose one.
    assert len(rows) == len(golden)
    shared = [{k: row.get(k, "<missing>") for k in g} for row, g in zip(rows, golden, strict=True)]
    assert shared == golden
