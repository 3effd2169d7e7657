"""Is a refactoring's round the same program? `make bench-revisions` times two revisions, where a
2-core machine's drift (up to 2.2x within one run in benchmarks/results/revisions.jsonl) hides a
few percent; this lowers one FedAvg round of each revision to StableHLO and compares the texts
with SSA names and locations removed.

    python benchmarks/round_hlo.py --base REV [--head REV] [--model cnn] [--chunk 8]

Checks REV out into a temporary git worktree and lowers its round in a fresh interpreter (its
own code and configs), then the working tree's (or --head's, checked out the same way); prints
each program's operation count and the lines that differ (module and result names aside, none
means the same program), and appends one JSON line (both revisions, the counts, whether the
programs are the same, the versions) to benchmarks/results/round_hlo.jsonl.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import RESULTS, ROOT, emit, environment, git, revision

LOWER = """
import re, sys
sys.path.insert(0, {bench!r})
from common import compose, synthetic
from fedjax_semi import experiment
cfg = compose("algorithm=fedavg_sl", "partition=iid", "model={model}", "num_clients=100",
              "clients_per_round=100", "algorithm.local_epochs=0", "algorithm.local_steps=5",
              "algorithm.batch_size=32", "save_partition=false")
r = experiment.build(cfg, dataset=synthetic()).runner(chunk={chunk!r})
state = r.template()
hp = getattr(r, "_hp", None)  # revisions before traced hyperparameters have no such argument
args = (r._keys, state) if hp is None else (r._keys, hp, state)
print(r._round.lower(*args, r.data, r._flags(1)).as_text())
"""


def lowered(tree: Path, model: str, chunk: str) -> str:
    code = LOWER.format(bench=str(tree / "benchmarks"), model=model, chunk=chunk)
    env = {"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
    )
    return out.stdout


def normalized(text: str) -> list[str]:
    """The program without SSA names, locations, module and result names."""
    text = re.sub(r"%[\w#.:]+", "%", text)
    text = re.sub(r"loc\([^)]*\)|#loc\d*", "", text)
    text = re.sub(r"module @\S+", "module", text)
    text = re.sub(r'jax\.result_info = "[^"]*"', "", text)
    return text.splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--chunk", default="8")
    ap.add_argument("--head", default=None, help="a revision (default: the working tree)")
    ap.add_argument("--out", default=str(RESULTS / "round_hlo.jsonl"))
    args = ap.parse_args()

    base_sha, head = revision(args.base), revision(args.head)
    chunk = args.chunk if args.chunk == "all" else int(args.chunk)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for name, rev in (("base", base_sha), ("head", args.head and head)):
            if rev is None:  # the working tree
                trees[name] = normalized(lowered(ROOT, args.model, chunk))
                continue
            tree = Path(tmp) / name
            git("worktree", "add", "--detach", "-f", str(tree), rev)
            try:
                trees[name] = normalized(lowered(tree, args.model, chunk))
            finally:
                git("worktree", "remove", "--force", str(tree))
    old, new = trees["base"], trees["head"]

    def ops(lines):
        return sum(len(re.findall(r"= \"?stablehlo\.", x)) for x in lines)

    print(f"base {args.base}: {ops(old)} operations; head {head}: {ops(new)} operations")
    diff = list(difflib.unified_diff(old, new, "base", "head", lineterm="", n=0))
    print("\n".join(diff) if diff else "the same program (names aside)")
    emit(
        {
            "bench": "round_hlo",
            "base": base_sha,
            "head": head,
            "model": args.model,
            "chunk": args.chunk,
            "base_operations": ops(old),
            "head_operations": ops(new),
            "same_program": not diff,
            # diff[:2] are the file headers; then hunk headers (@@) and changed lines.
            "differing_lines": sum(1 for x in diff[2:] if x[:1] in "+-"),
            **environment(),
        },
        Path(args.out),
    )


if __name__ == "__main__":
    main()
