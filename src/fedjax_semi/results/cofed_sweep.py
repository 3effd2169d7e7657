"""CoFED's alpha and public-size sweeps (the paper's Fig. 6-8) and its Table 2 reference, with
Steps 1-2 run once per (seed, setting) and shared by every center setting.

Steps 1-2 (local training, the public set's labels) do not depend on alpha or on how many public
rows the center votes on, so each (seed, variant) trains its participants once and then runs
Steps 3-4 from that state for every (alpha, public_size) asked for (`CoFED.with_center`): the
same numbers as separate runs with algorithm.alpha=..., algorithm.public_size=..., at a fraction
of the cost.

    python -m fedjax_semi.results.cofed_sweep --seeds 0,1,2 --variants iid,noniid \
        --alphas 0,0.1,0.3,0.5,0.7,1 --sizes 500,1000,2000 --out sweep.jsonl [overrides ...]
    python -m fedjax_semi.results.cofed_sweep --table sweep.jsonl [--plot fig.png]

Overrides are Hydra overrides on top of +experiment=cofed_fmnist (`--preset` names another).
Each (seed, variant, alpha, size) is one JSON line: the evaluation (accuracy, local_acc, rel_acc,
min, max, ...), the pseudo-label counts and their accuracy against the hidden labels (scored on
the host, after training).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_semi.config import Config
from fedjax_semi.engine.loop import pseudo_label_accuracy
from fedjax_semi.kernels import voting

PRESET = "+experiment=cofed_fmnist"
METRICS = ("accuracy", "local_acc", "rel_acc", "rel_acc_min", "rel_acc_max", "improved_frac")
COUNTS = ("pl_sum_pk", "pl_union_pk", "pl_sum_ri")


def compose(*overrides: str) -> Config:
    """The config `fedjax-semi` would run with these overrides, the preset's tuned values
    (conf/tuned/<preset>.yaml) applied as the app applies them: the command line's keys win."""
    return compose_tuned(*overrides)[0]


def compose_tuned(*overrides: str) -> tuple[Any, dict[str, Any]]:
    """(config, {key: tuned value applied}) for these overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    from fedjax_semi.cli import CONF_DIR
    from fedjax_semi.store import as_config, register_configs
    from fedjax_semi.tuned import apply_tuned, given_keys

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    applied = apply_tuned(cfg, choices, given_keys(overrides))
    return as_config(cfg), applied


def _host(tree) -> dict:
    return {k: np.asarray(v) for k, v in tree.items()}


def in_space_scores(
    label: np.ndarray, index: np.ndarray, owns: np.ndarray, eval_y: jax.Array
) -> dict:
    """R_i's labels [C, M] (-1 = not kept) scored where the hidden class lies in the receiving
    participant's label space (the only rows that can be right: a public sample of a class
    outside Y_i gets one of Y_i's labels), and the share of R_i that lies there."""
    truth = np.asarray(eval_y)[index]
    kept = label >= 0
    rows = np.arange(label.shape[0])[:, None]
    inside = kept & (truth >= 0) & owns[rows, np.maximum(truth, 0)]
    return {
        "pl_acc_in_space": float(np.mean(label[inside] == truth[inside])) if inside.any() else None,
        "in_space_share": float(inside.sum() / max(kept.sum(), 1)),
    }


def sweep_one(
    seed: int,
    variant: str,
    centers: list[tuple[float, int]],
    overrides: list[str],
    count_alphas: list[float] = (),
    preset: str = PRESET,
) -> list[dict]:
    """Steps 1-2 once for (seed, variant), then Steps 3-4 for every (alpha, public_size); and
    for every alpha of `count_alphas` Step 3 alone (the center's counts, no training: Fig. 7)."""
    from fedjax_semi import experiment

    cfg, tuned = compose_tuned(
        preset, f"seed={seed}", f"partition.cofed.variant={variant}", *overrides
    )
    exp = experiment.build(cfg)
    runner = exp.runner()
    t0 = time.perf_counter()
    state = jax.block_until_ready(runner.init())
    t_steps12 = time.perf_counter() - t0
    rows = []
    data = exp.fed.train_view()
    owns = np.asarray(state.Y)
    public = np.asarray(data.server["public"])
    for alpha in count_alphas:
        plan = exp.alg.vote(exp.alg.with_center(state, alpha), data)  # Step 3 alone
        counts = voting.pseudo_label_counts(plan.accept, plan.keep)
        label = np.where(np.asarray(plan.keep), np.asarray(plan.label), -1)
        index = np.broadcast_to(public, label.shape)
        rows.append(
            {
                "seed": seed,
                "variant": variant,
                "alpha": alpha,
                "public_size": int(label.shape[1]),
                "model_pool": cfg.algorithm.model_pool,
                "num_clients": cfg.num_clients,
                "counts_only": True,
                **{f"pl_{k}": int(v) for k, v in counts.items()},
                "pl_acc": pseudo_label_accuracy(index, label, exp.fed.eval_y),
                **in_space_scores(label, index, owns, exp.fed.eval_y),
                "overrides": overrides,
            }
        )
    for alpha, size in centers:
        t0 = time.perf_counter()
        new, metrics = runner.round(exp.alg.with_center(state, alpha, size))
        ev, m = _host(runner.evaluate(new)), _host(metrics)
        row = {
            "seed": seed,
            "variant": variant,
            "alpha": alpha,
            "public_size": size or int(m["upload_labels_per_client"]),
            "model_pool": cfg.algorithm.model_pool,
            "num_clients": cfg.num_clients,
            "preset": preset.removeprefix("+experiment="),
            **{k: float(ev[k]) for k in METRICS},
            **{k: int(m[k]) for k in COUNTS},
            "pl_acc": pseudo_label_accuracy(m["pl_index"], m["pl_label"], exp.fed.eval_y),
            **in_space_scores(m["pl_label"], m["pl_index"], owns, exp.fed.eval_y),
            "client_acc": ev["client_acc"].tolist(),
            "client_rel_acc": ev["client_rel_acc"].tolist(),
            "client_local_acc": ev["client_local_acc"].tolist(),
            "steps12_s": t_steps12,
            "steps34_s": time.perf_counter() - t0,
            "overrides": overrides,
            "tuned": tuned,
        }
        rows.append(row)
    return rows


def against_local(rows: list[dict], reference: list[dict]) -> list[dict]:
    """`rows` with their local-only side taken from `reference`: the Step 1 models of another
    sweep of the same seeds and splits, trained with the local-only models' own tuned recipe
    (Fig. 2 compares acc(CoFED) with acc(local only), each model tuned for itself). Step 1 does
    not depend on the center, so any reference row of the (seed, variant) serves. Per
    participant: rel = client_acc / reference client_local_acc [C]; the run's own Step 1 mean
    stays as `local_acc_same_run`."""
    ref: dict[tuple, np.ndarray] = {}
    for r in reference:
        if "client_local_acc" not in r:
            raise SystemExit(f"--local-from: a row of seed {r['seed']} has no client_local_acc")
        ref.setdefault(
            (r["seed"], r["variant"], r["num_clients"]), np.asarray(r["client_local_acc"])
        )
    out = []
    for r in rows:
        key = (r["seed"], r["variant"], r["num_clients"])
        if "client_acc" not in r or key not in ref:
            raise SystemExit(f"--local-from has no local-only models for seed {key[0]}, {key[1]}")
        rel = np.asarray(r["client_acc"]) / np.maximum(ref[key], 1e-12)
        out.append(
            {
                **r,
                "local_acc_same_run": r["local_acc"],
                "local_acc": float(ref[key].mean()),
                "rel_acc": float(rel.mean()),
                "rel_acc_min": float(rel.min()),
                "rel_acc_max": float(rel.max()),
                "improved_frac": float(np.mean(rel > 1.0)),
                "client_rel_acc": rel.tolist(),
            }
        )
    return out


def paired(rows: list[dict], by: tuple[str, ...], against: str, metric: str) -> str:
    """Markdown: per setting, mean ± std over seeds of `metric` minus its value in the row that
    differs only in `against` ("variant=iid"), with the seeds where the difference is > 0."""
    key, value = against.split("=", 1)
    base = {
        (*(r[k] for k in by if k != key), r["seed"]): r[metric]
        for r in rows
        if str(r[key]) == value
    }
    diffs: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        b = base.get((*(r[k] for k in by if k != key), r["seed"]))
        if str(r[key]) != value and b is not None:
            diffs[tuple(r[k] for k in by)].append(r[metric] - b)
    lines = [
        f"| {' | '.join(by)} | seeds | {metric} minus {against} | above |",
        "|" + "---|" * (len(by) + 3),
    ]
    for k in sorted(diffs):
        d = diffs[k]
        above = f"{sum(x > 0 for x in d)}/{len(d)}"
        lines.append(f"| {' | '.join(map(str, k))} | {len(d)} | {mean_std(d)} | {above} |")
    return "\n".join(lines)


def mean_std(values: list[float]) -> str:
    v = np.asarray([x for x in values if x is not None], float)
    if not len(v):
        return "n/a"
    return f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}"


def table(rows: list[dict], by: tuple[str, ...], metrics: tuple[str, ...]) -> str:
    """Markdown: one line per setting `by`, mean ± std (sample std) over seeds of `metrics`."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in by)].append(r)
    head = "| " + " | ".join((*by, "seeds", *metrics)) + " |"
    lines = [head, "|" + "---|" * (len(by) + 1 + len(metrics))]
    for key in sorted(groups):
        rs = groups[key]
        cells = [mean_std([r.get(m) for r in rs]) for m in metrics]
        lines.append("| " + " | ".join((*map(str, key), str(len(rs)), *cells)) + " |")
    return "\n".join(lines)


def _curve(rows: list[dict], x: str, y: str, variant: str, where: dict) -> tuple:
    """(xs, mean, std) of y over seeds at each x, for one variant and the fixed keys `where`."""
    pts: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        if y in r and r["variant"] == variant and all(r[k] == v for k, v in where.items()):
            pts[r[x]].append(r[y])
    xs = sorted(pts)
    return xs, [np.mean(pts[v]) for v in xs], [np.std(pts[v]) for v in xs]


def plot(rows: list[dict], path: Path) -> Path:
    """Fig. 6-8 of the paper from a sweep: the pseudo-label count and the mean relative accuracy
    against alpha (at the largest public size), and the relative accuracy against the public
    size (at alpha 0.3); mean and std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = max(r["public_size"] for r in rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = [
        ("alpha", "pl_sum_pk", {"public_size": full}, "sum_k |P_k| (Fig. 7)"),
        ("alpha", "rel_acc", {"public_size": full}, "mean relative accuracy (Fig. 8)"),
        ("public_size", "rel_acc", {"alpha": 0.3}, "mean relative accuracy (Fig. 6)"),
    ]
    for ax, (x, y, where, title) in zip(axes, panels, strict=True):
        for variant in sorted({r["variant"] for r in rows}):
            xs, mean, std = _curve(rows, x, y, variant, where)
            ax.errorbar(xs, mean, yerr=std, marker="o", capsize=3, label=variant)
        ax.set_xlabel(x)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if y == "pl_sum_pk":
            ax.set_yscale("symlog")
        if x == "public_size":
            ax.set_xscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", help="seeds to run (default 0,1,2); with --table: to keep")
    ap.add_argument("--preset", default="cofed_fmnist", help="the experiment preset to run")
    ap.add_argument("--variants", default="iid,noniid")
    ap.add_argument("--alphas", default="0.3")
    ap.add_argument("--sizes", default="0", help="public rows the center uses; 0 = all")
    ap.add_argument("--count-alphas", default="", help="alphas of the counts alone (Fig. 7)")
    ap.add_argument("--out", default="cofed_sweep.jsonl")
    ap.add_argument("--table", help="print the tables of a sweep's JSON lines and exit")
    ap.add_argument("--plot", help="with --table: also draw Fig. 6-8 into this PNG")
    ap.add_argument(
        "--local-from",
        help="with --table: a sweep of the same seeds whose Step 1 (local-only) models the "
        "relative accuracy is taken against (their own tuned recipe)",
    )
    ap.add_argument("--paired-to", help="with --table: e.g. variant=iid, the paired rel_acc gap")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line]
        if args.seeds is not None:  # only these seeds (e.g. those every setting has)
            keep = {int(x) for x in args.seeds.split(",")}
            rows = [r for r in rows if r["seed"] in keep]
        trained = [r for r in rows if not r.get("counts_only")]
        counted = [r for r in rows if r.get("counts_only")]
        by = ("model_pool", "variant", "alpha", "public_size")
        in_space = ("pl_acc", "pl_acc_in_space", "in_space_share")
        if args.local_from:
            lines = Path(args.local_from).read_text().splitlines()
            reference = [json.loads(line) for line in lines if line]
            trained = against_local(trained, [r for r in reference if not r.get("counts_only")])
            in_space += ("local_acc_same_run",)
        print(table(trained, by, METRICS + COUNTS + in_space))
        if args.paired_to:
            print()
            print(paired(trained, by, args.paired_to, "rel_acc"))
        if counted:
            print()
            print(table(counted, by, COUNTS + in_space))
        if args.plot:
            print(f"wrote {plot(rows, Path(args.plot))}")
        return
    from fedjax_semi.cli import CONF_DIR

    presets = sorted(p.stem for p in (Path(CONF_DIR) / "experiment").glob("cofed*.yaml"))
    if args.preset not in presets:  # before any training
        ap.error(f"--preset={args.preset!r} is not a CoFED preset; use one of {', '.join(presets)}")
    alphas = [float(a) for a in args.alphas.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    # The alpha sweep at the largest size, the size sweep at the first alpha.
    centers = [(a, max(sizes) if 0 not in sizes else 0) for a in alphas]
    centers += [(alphas[0], s) for s in sizes if (alphas[0], s) not in centers]
    out = Path(args.out)
    for seed in (int(s) for s in (args.seeds or "0,1,2").split(",")):
        for variant in args.variants.split(","):
            counted = [float(a) for a in args.count_alphas.split(",") if a]
            preset = f"+experiment={args.preset}"
            for row in sweep_one(seed, variant, centers, list(args.overrides), counted, preset):
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                short = {k: v for k, v in row.items() if not k.startswith("client_")}
                print(json.dumps(short), flush=True)


if __name__ == "__main__":
    main()
