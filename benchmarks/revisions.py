"""`make bench` of two revisions side by side in one run: is HEAD (the working tree, or --head)
slower than BASE?

    python benchmarks/revisions.py --base REV [--head REV] [--passes 2] [--models cnn,mlp]
    python benchmarks/revisions.py --base REV [--head REV] --peak-memory 10 [--passes 2]

Checks REV (and --head) out into a temporary git worktree, then runs each tree's own
`benchmarks/engine.py` (its code, its configs) in a fresh interpreter, alternating BASE, HEAD,
HEAD, BASE, BASE, HEAD, ... so that load on the machine falls on both alike. Prints, per
workload (model x chunk), the median round time of each revision over all passes and HEAD /
BASE, and appends JSON lines to benchmarks/results/revisions.jsonl.

With --peak-memory R it runs instead the default job as a user does (`fedjax-semi
+experiment=fmnist_supervised rounds=R eval_every=5 progress=false`, each tree's own CLI and
configs, real Fashion-MNIST) as the only child of a wrapper process, alternating the same way,
and records each process's peak RSS (and wall time, beside the peak only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, emit, environment, git, revision, timed_process


def run_engine(tree: Path, args: argparse.Namespace, out: Path) -> list[dict]:
    """One `engine.py` run of `tree` in its own interpreter; its JSON lines."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [
        sys.executable,
        str(tree / "benchmarks" / "engine.py"),
        f"--models={args.models}",
        f"--chunks={args.chunks}",
        f"--repeats={args.repeats}",
        f"--out={out}",
    ]
    subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    out.unlink()
    return lines


def run_user_job(tree: Path, rounds: int, out: Path) -> dict:
    """One whole `fedjax-semi` run of `tree` (its CLI, its configs): rc, total_s, peak RSS."""
    # Each run starts with an empty compile cache (revisions before the cache compile every
    # time) and reads its own tree's configs.
    env = {k: v for k, v in os.environ.items() if k != "FEDJAX_SEMI_CONF"}
    env |= {"PYTHONPATH": str(tree / "src"), "JAX_COMPILATION_CACHE_DIR": f"{out}_xla"}
    cli = "import sys; from fedjax_semi.cli import main; sys.argv[0] = 'fedjax-semi'; main()"
    cmd = [sys.executable, "-c", cli, "+experiment=fmnist_supervised", f"rounds={rounds}"]
    cmd += ["eval_every=5", "progress=false", f"out_dir={out}"]
    return {**timed_process(cmd, env=env, cwd=tree), "command": " ".join(cmd[3:-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("--head", default=None, help="a revision (default: the working tree)")
    ap.add_argument("--passes", type=int, default=2, help="alternating runs of each revision")
    ap.add_argument("--models", default="cnn,mlp")
    ap.add_argument("--chunks", default="1,8,all,reference")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per workload per run")
    ap.add_argument(
        "--peak-memory",
        metavar="R",
        type=int,
        default=0,
        help="record whole R-round user runs' peak RSS instead of round times",
    )
    ap.add_argument("--out", default=str(RESULTS / "revisions.jsonl"))
    args = ap.parse_args()
    if args.peak_memory < 0 or args.passes < 1:
        ap.error(f"--peak-memory={args.peak_memory} --passes={args.passes}: R >= 0, passes >= 1")
    base_sha, head = revision(args.base), revision(args.head)
    times: dict[tuple[str, str, str], list[float]] = {}
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        git("worktree", "add", "--detach", str(base_tree), base_sha)
        head_tree = ROOT if args.head is None else Path(tmp) / "head"
        try:
            if args.head is not None:
                git("worktree", "add", "--detach", str(head_tree), head)
            for p in range(args.passes):
                order = [("base", base_tree), ("head", head_tree)]
                for label, tree in order if p % 2 == 0 else order[::-1]:
                    if args.peak_memory:
                        out = Path(tmp) / f"{label}_{p}"
                        runs[label].append(run_user_job(tree, args.peak_memory, out))
                        continue
                    for r in run_engine(tree, args, Path(tmp) / f"{label}.jsonl"):
                        key = (label, r["model"], str(r["chunk"]))
                        times.setdefault(key, []).extend(r["round_s_all"])
        finally:
            for tree in (base_tree, head_tree):  # best effort: never hide the error in flight
                if tree != ROOT:
                    cmd = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)]
                    subprocess.run(cmd, capture_output=True)
            git("worktree", "prune")
    if args.peak_memory:
        rss = {k: [r["peak_rss_bytes"] for r in v] for k, v in runs.items()}
        emit(
            {
                "bench": "peak_memory_revisions",
                "command": runs["head"][0]["command"],
                "base": base_sha,
                "head": head,
                "passes": args.passes,
                "compile_cache": "cold: an empty JAX_COMPILATION_CACHE_DIR per run",
                "peak_rss_bytes_base": rss["base"],
                "peak_rss_bytes_head": rss["head"],
                "head_over_base": max(rss["head"]) / max(rss["base"]),
                "total_s_base": [r["total_s"] for r in runs["base"]],
                "total_s_head": [r["total_s"] for r in runs["head"]],
                **environment(),
            },
            Path(args.out),
        )
        return
    env = environment()
    for model in args.models.split(","):
        for chunk in args.chunks.split(","):
            b = float(np.median(times[("base", model, chunk)]))
            h = float(np.median(times[("head", model, chunk)]))
            emit(
                {
                    "bench": "engine_round_revisions",
                    "model": model,
                    "chunk": chunk,
                    "base": base_sha,
                    "head": head,
                    "passes": args.passes,
                    "round_s_median_base": b,
                    "round_s_median_head": h,
                    "head_over_base": h / b,
                    "round_s_base": times[("base", model, chunk)],
                    "round_s_head": times[("head", model, chunk)],
                    **env,
                },
                Path(args.out),
            )


if __name__ == "__main__":
    main()
