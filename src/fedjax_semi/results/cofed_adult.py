"""The CLI of CoFED on UCI Adult (algorithms.cofed_adult; the paper's Sec. 5.7, Fig. 9): runs
seeds into JSON lines, prints their markdown table and draws Fig. 9.

    python -m fedjax_semi.results.cofed_adult --seeds 0,1,2,3,4 --out adult.jsonl \
        [--data-dir D] [--alpha 0.3] [--set nn_epochs=20 ...]
    python -m fedjax_semi.results.cofed_adult --table adult.jsonl [--plot fig9.png]

One JSON line per seed: the config, each participant's type, hyperparameters and accuracies
(after CoFED, local-only, their ratio) and the summary (`algorithms.cofed_adult.score`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_semi.algorithms.cofed_adult import TYPES, CoFEDAdultConfig, run
from fedjax_semi.errors import ConfigError, bad
from fedjax_semi.results.cofed_sweep import mean_std

ROWS = (  # (metric, the paper's value: Sec. 5.7)
    ("local_acc", ""), ("accuracy", ""), ("rel_acc", "1.085"), ("rel_acc_min", ""),
    ("rel_acc_max", "> 1.25"), ("improved_frac", "most"), ("rel_of_means", ""),
    *((f"{t}_{m}", "") for t in TYPES for m in ("local_acc", "accuracy", "rel_acc")),
    ("pl_sum_pk", ""), ("pl_union_pk", ""), ("pl_sum_ri", ""), ("pl_share", ""),
    ("pl_agree_own", ""), ("pl_positive", ""), ("upload_positive", ""),
)  # fmt: skip
SETTING = ("alpha", "threshold_op", "conflict", "public_size", "num_clients")


def _setting(r: dict) -> str:
    return " ".join(f"{k}={r['config'][k]}" for k in SETTING)


def table(records: list[dict]) -> str:
    """Markdown: one row per metric, one column per setting; mean ± sample std over seeds."""
    settings = sorted({_setting(r) for r in records})
    by = {s: [r for r in records if _setting(r) == s] for s in settings}
    head = ["metric", "paper", *(f"ours: {s} ({len(by[s])} seeds)" for s in settings)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric, paper in ROWS:
        cells = [mean_std([r.get(metric) for r in by[s]]) for s in settings]
        lines.append("| " + " | ".join([metric, paper, *cells]) + " |")
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> Path:
    """Fig. 9: every participant's relative accuracy, sorted, coloured by model type (the first
    setting's seeds pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = _setting(records[0])
    rs = [r for r in records if _setting(r) == first]
    rel = np.concatenate([r["client_rel_acc"] for r in rs])
    types = np.concatenate([r["types"] for r in rs])
    order = np.argsort(rel)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for t, colour in zip(TYPES, ("tab:green", "tab:red", "tab:purple", "tab:blue"), strict=True):
        pos = np.flatnonzero(types[order] == t)
        ax.bar(pos, rel[order][pos] - 1.0, bottom=1.0, width=1.0, color=colour, label=t)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(rel.mean(), color="k", ls="--", lw=0.8, label=f"mean {rel.mean():.3f}")
    ax.set_xlabel(f"participant (sorted; {len(rs)} seed(s) pooled)")
    ax.set_ylabel("relative test accuracy")
    ax.set_title(f"CoFED on Adult (Fig. 9): {first}", fontsize=9)
    ax.legend(fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_set(items: list[str]) -> dict[str, Any]:
    """--set key=value pairs -> config kwargs, typed by the config's defaults."""
    fields = {f.name: f for f in dataclasses.fields(CoFEDAdultConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields or key in ("seed", "data_dir"):
            raise bad(
                "--set", item, f"key=value with key in {sorted(set(fields) - {'seed', 'data_dir'})}"
            )
        default = fields[key].default
        kind = type(default[0]) if isinstance(default, tuple) else type(default)
        try:
            if isinstance(default, tuple):
                out[key] = tuple(kind(v) for v in value.split(",") if v)
            else:
                out[key] = kind(value)
        except ValueError:
            many = " (comma-separated)" if isinstance(default, tuple) else ""
            raise bad(key, value, f"{kind.__name__} values{many}") from None
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--out", default="cofed_adult.jsonl", help="JSON lines, appended")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other CoFEDAdultConfig field, e.g. --set nn_epochs=20")  # fmt: skip
    ap.add_argument("--table", help="print the markdown table of these JSON lines and exit")
    ap.add_argument("--plot", help="with --table: draw Fig. 9 into this PNG")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    if args.table:
        records = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line]
        print(table(records))
        if args.plot:
            print(f"wrote {plot(records, Path(args.plot))}")
        return
    try:
        kw = parse_set(args.set)
        if args.alpha is not None:
            kw["alpha"] = args.alpha
        cfgs = [CoFEDAdultConfig(seed=int(s), data_dir=args.data_dir, **kw)
                for s in args.seeds.split(",")]  # fmt: skip
    except (ConfigError, ValueError) as e:
        ap.exit(2, f"error: {e}\n")
    for cfg in cfgs:
        rec, _ = run(cfg, progress=not args.quiet)
        with Path(args.out).open("a") as f:
            f.write(json.dumps(rec) + "\n")
        short = {k: v for k, v in rec.items() if not k.startswith("client_") and k not in
                 ("config", "types", "hparams")}  # fmt: skip
        print(json.dumps(short), flush=True)


if __name__ == "__main__":
    main()
