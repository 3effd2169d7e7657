"""A sweep as one program: `hydra/launcher=vectorized` against Hydra's basic launcher and joblib,
and the persistent compilation cache, side by side in one run.

    python benchmarks/sweeps.py [--workloads W3,default] [--lrs 0.02,0.05,0.1,0.2]
        [--seeds 0,1,2] [--rounds default=3,W3=10] [--launchers vectorized,basic,joblib]
        [--passes 1] [--cache] [--hardware gpu]

Each sweep is `fedjax-semi -m` of len(lrs) x len(seeds) jobs (data_seed=0: the seeds share the
data, so the vectorized launcher runs them as one program) on real Fashion-MNIST, each launcher
with a cold compilation cache of its own; the launchers alternate within each pass. A record
per sweep: its wall time (process start to exit) and each job's first_round_s (compile and
first round, from summary.json). Then the ratios of record: each launcher's wall time over the
vectorized one's. `--cache`: a 6-job basic multirun of the default job (3 lrs x 2 seeds, one
round) without the cache, with a cold one and with the same one warm. JSON lines go to
benchmarks/results/sweeps.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, emit, environment
from workloads import WORKLOADS

# The default job is conf/config.yaml as it is (FedAvg-PL, CNN, Fashion-MNIST, 100 clients).
SETTINGS = {"default": [], **{n: WORKLOADS[n].overrides() for n in ("W0", "W1", "W3")}}


def sweep(
    launcher: str, overrides: list[str], cache: str, workdir: Path
) -> tuple[float, list[dict]]:
    """One multirun through the CLI: (wall seconds, each job's summary)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "sweep"
    cmd = [
        sys.executable,  # the CLI as a module: works with PYTHONPATH=src as with the install
        "-m",
        "fedjax_semi.cli",
        "-m",
        f"hydra/launcher={launcher}",
        *overrides,
        f"hardware.compile_cache={cache}",
        f"hydra.sweep.dir={out}",
        "progress=false",
        "writers=[jsonl]",
        "save_partition=false",
        "checkpoint_every=1000",
    ]
    if launcher == "joblib":
        cmd.append("hydra.launcher.n_jobs=2")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{launcher}: {r.stderr[-2000:]}")
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))]
    return wall, summaries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="W3,default")
    ap.add_argument("--lrs", default="0.02,0.05,0.1,0.2")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", default="default=3,W0=3,W1=3,W3=10")
    ap.add_argument("--launchers", default="vectorized,basic,joblib")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--cache", action="store_true", help="also the compilation-cache rows")
    ap.add_argument(
        "--hardware", default=None, help="hardware= of every sweep (gpu on a GPU machine)"
    )
    ap.add_argument("--out", default=str(RESULTS / "sweeps.jsonl"))
    args = ap.parse_args()
    out = Path(args.out)
    rounds = dict(kv.split("=") for kv in args.rounds.split(","))
    env = environment()
    launchers = args.launchers.split(",")
    for name in [w for w in args.workloads.split(",") if w]:
        overrides = [
            *SETTINGS[name],
            f"rounds={rounds.get(name, 3)}",
            f"algorithm.lr={args.lrs}",
            f"seed={args.seeds}",
            "data_seed=0",
            *([f"hardware={args.hardware}"] if args.hardware else []),
        ]
        jobs = len(args.lrs.split(",")) * len(args.seeds.split(","))
        walls: dict[str, list[float]] = {k: [] for k in launchers}
        for p in range(args.passes):
            for launcher in launchers:  # alternating: load falls on every launcher alike
                with tempfile.TemporaryDirectory(prefix="fedjax-semi-bench-") as tmp:
                    wall, summaries = sweep(launcher, overrides, str(Path(tmp) / "xla"), Path(tmp))
                walls[launcher].append(wall)
                first = [s["timings"].get("first_round_s") for s in summaries]
                emit(
                    {
                        "bench": "sweep",
                        "workload": name,
                        "launcher": launcher,
                        "pass": p,
                        "jobs": jobs,
                        "rounds": int(rounds.get(name, 3)),
                        "wall_s": round(wall, 2),
                        "first_round_s": [None if f is None else round(f, 2) for f in first],
                        "final_accuracy": [s["final"].get("accuracy") for s in summaries],
                        "overrides": overrides,
                        "env": env,
                    },
                    out,
                )
        if "vectorized" in walls:
            v = float(np.median(walls["vectorized"]))
            emit(
                {
                    "bench": "sweep_ratio",
                    "workload": name,
                    "jobs": jobs,
                    "median_wall_s": {k: round(float(np.median(w)), 2) for k, w in walls.items()},
                    "speedup_vs_vectorized": {
                        k: round(float(np.median(w)) / v, 2) for k, w in walls.items()
                    },
                    "env": env,
                },
                out,
            )
    if args.cache:
        # One round: the time to a job's first round is what the cache changes.
        overrides = ["rounds=1", "algorithm.lr=0.02,0.05,0.1", "seed=0,1"]
        with tempfile.TemporaryDirectory(prefix="fedjax-semi-cache-") as tmp:
            tmp = Path(tmp)
            for label, cache in (("off", "off"), ("cold", tmp / "xla"), ("warm", tmp / "xla")):
                wall, summaries = sweep("basic", overrides, str(cache), tmp / label)
                emit(
                    {
                        "bench": "compile_cache",
                        "cache": label,
                        "jobs": len(summaries),
                        "wall_s": round(wall, 2),
                        "first_round_s": [
                            round(s["timings"]["first_round_s"], 2) for s in summaries
                        ],
                        "overrides": overrides,
                        "env": env,
                    },
                    out,
                )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "benchmarks"))
    main()
