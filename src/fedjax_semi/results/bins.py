"""Per-client tables of a sweep: mean personal accuracy of the clients in bins of a per-client
quantity (labeled ratio, participations), per setting, averaged over seeds."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedjax_semi.results.report import grouped_runs


def _counts(run_dir: Path) -> dict | None:
    """counts.json of a run (a replica's seed_<s>/ shares its parent's partition)."""
    for d in (run_dir, run_dir.parent):
        if (d / "counts.json").exists():
            return json.loads((d / "counts.json").read_text())
    return None


def _client_bin_table(
    root: Path,
    per_client: Callable[[dict], np.ndarray],
    bins: list[tuple[str, Callable[[np.ndarray], np.ndarray]]],
    out_name: str,
) -> str:
    """Mean personal accuracy of the clients in each bin of a per-client quantity, per setting,
    averaged over seeds. per_client(run) -> values [K]; bins: (column name, values -> mask).
    Cells: "accuracy % (clients in the bin, mean over seeds)". Also written to DIR/out_name."""
    accs: dict[str, list[np.ndarray]] = defaultdict(list)
    sizes: dict[str, list[np.ndarray]] = defaultdict(list)
    for label, rs in grouped_runs(root).items():
        for r in rs:
            values, acc = per_client(r), np.asarray(r["summary"].get("client_acc", []), float)
            if acc.shape != values.shape:
                raise ValueError(
                    f"run {str(r['dir'])!r}: summary.json has {acc.size} client accuracies for "
                    f"{values.size} clients (the run ended before its first evaluation?)"
                )
            in_bin = [member(values) for _, member in bins]
            accs[label].append(np.array([acc[m].mean() if m.any() else np.nan for m in in_bin]))
            sizes[label].append(np.array([m.sum() for m in in_bin]))
    names = [name for name, _ in bins]
    md = ["| setting | seeds | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 2)]
    for label, per_seed in accs.items():
        with np.errstate(all="ignore"):
            mean = np.nanmean(np.stack(per_seed), axis=0)
        n = np.mean(np.stack(sizes[label]), axis=0)
        cells = [
            "–" if np.isnan(m) else f"{100 * m:.1f} ({c:.3g})" for m, c in zip(mean, n, strict=True)
        ]
        md.append(f"| {label} | {len(per_seed)} | " + " | ".join(cells) + " |")
    text = "\n".join(md)
    (Path(root) / out_name).write_text(text + "\n")
    return text


def labeled_ratio_table(root: Path, edges: list[float]) -> str:
    """Mean personal accuracy of the clients whose labeled ratio mu_k = |D_k^s| / (|D_k^s| +
    |D_k^u|) falls in each bin [edges[i], edges[i+1]) (the last bin includes 1), per setting,
    averaged over seeds. Shows where a semi-supervised method gains or loses: on the clients
    with many labels or on those with few. Written to DIR/report_by_labeled_ratio.md as well."""
    edges = [float(e) for e in edges]
    if (
        len(edges) < 2
        or any(b <= a for a, b in zip(edges[:-1], edges[1:], strict=True))
        or edges[0] < 0
        or edges[-1] > 1
    ):
        raise ValueError(
            f"--by-labeled-ratio={','.join(map(str, edges))!r} is not allowed: at least two "
            "increasing bin edges in [0, 1], e.g. 0,0.1,0.5,0.9,1"
        )

    def labeled_ratio(r: dict) -> np.ndarray:
        counts = _counts(r["dir"])
        if not counts or "labeled" not in counts or "unlabeled" not in counts:
            raise ValueError(
                f"run {str(r['dir'])!r} has no labeled/unlabeled split in counts.json: the "
                "labeled-ratio table needs a semi-supervised partition"
            )
        n_s = np.asarray(counts["labeled"], float)
        return n_s / np.maximum(n_s + np.asarray(counts["unlabeled"], float), 1)

    last = len(edges) - 2
    bins = [
        (
            f"μ in [{a:g}, {b:g}{']' if i == last else ')'}",
            lambda mu, a=a, b=b, i=i: (mu >= a) & ((mu <= b) if i == last else (mu < b)),
        )
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
    ]
    return _client_bin_table(root, labeled_ratio, bins, "report_by_labeled_ratio.md")


def participations(run_dir: Path, rounds: int, num_clients: int) -> np.ndarray:
    """How many of the first `rounds` rounds each client took part in, counted from the cohorts
    in the run's metrics.jsonl. int [K]."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if 1 <= row["round"] <= rounds]
    if len(rows) < rounds or any("cohort" not in row for row in rows):
        raise ValueError(
            f"run {str(run_dir)!r}: metrics.jsonl does not list the cohort of each of its first "
            f"{rounds} rounds (runs written before cohorts were logged cannot be binned)"
        )
    ids = np.concatenate([np.asarray(row["cohort"], int) for row in rows])
    return np.bincount(ids, minlength=num_clients)


def participation_table(root: Path, edges: list[int]) -> str:
    """Mean personal accuracy of the clients by how often they took part up to the final
    evaluation: bins [edges[i], edges[i+1]) and a last bin >= edges[-1]. Shows whether a
    personalized method's clients gain or lose from each round they take part in. Written to
    DIR/report_by_participations.md as well."""
    if (
        not edges
        or any(e != int(e) for e in edges)
        or edges[0] < 0
        or any(b <= a for a, b in zip(edges[:-1], edges[1:], strict=True))
    ):
        raise ValueError(
            f"--by-participations={','.join(f'{e:g}' for e in edges)!r} is not allowed: increasing "
            "integers >= 0, e.g. 0,1,2,3,6"
        )
    edges = [int(e) for e in edges]

    def counts(r: dict) -> np.ndarray:
        final_round = r["summary"].get("final", {}).get("round")
        if final_round is None:
            raise ValueError(f"run {str(r['dir'])!r} has no evaluated round in summary.json")
        return participations(r["dir"], int(final_round), len(r["summary"]["client_acc"]))

    bins = [
        (f"{a}" if b == a + 1 else f"{a}-{b - 1}", lambda p, a=a, b=b: (p >= a) & (p < b))
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    ] + [(f"≥ {edges[-1]}", lambda p: p >= edges[-1])]
    return _client_bin_table(root, counts, bins, "report_by_participations.md")
