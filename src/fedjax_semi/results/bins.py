"""Per-client tables of a sweep: mean personal accuracy of the clients in bins of a per-client
quantity (labeled ratio, participations), per setting, averaged over seeds.

The tables read either a sweep directory or the per-client records that `fedjax-semi-report DIR
--clients OUT.jsonl` exports (one JSON object per client per run), so a results document can
commit the records beside its rows and its bin tables outlive the run directories:

    python -m fedjax_semi.results.bins docs/results/CLIENTS.jsonl \\
        --by-labeled-ratio 0,0.1,0.5,0.9,1 --by-participations 0,5,10,15,20
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedjax_semi.results.sweep_runs import _get, grouped_runs

NO_COHORTS = (
    "no participations: its summary.json has no evaluated round or its metrics.jsonl does not "
    "list the cohort of each round up to it (runs written before cohorts were logged cannot be "
    "binned)"
)


def _counts(run_dir: Path) -> dict | None:
    """counts.json of a run (a replica's seed_<s>/ shares its parent's partition)."""
    for d in (run_dir, run_dir.parent):
        if (d / "counts.json").exists():
            return json.loads((d / "counts.json").read_text())
    return None


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


def client_records(root: Path) -> list[dict]:
    """One record per client of every run under root: `setting`, `seed`, `run` (its folder
    relative to root), `client` (index), `acc` (personal accuracy at the final evaluation),
    `labeled` / `unlabeled` (its split's sizes; None without a semi-supervised split) and
    `participations` (rounds it took part in up to the final evaluation; None where the run
    did not log its cohorts)."""
    records = []
    for label, runs in grouped_runs(root).items():
        for r in runs:
            # jsonable() writes a NaN accuracy as null.
            acc = [
                float("nan") if a is None else float(a) for a in r["summary"].get("client_acc", [])
            ]
            counts = _counts(r["dir"]) or {}
            lab, unl = counts.get("labeled"), counts.get("unlabeled")
            sizes = {len(v) for v in (lab, unl) if v is not None}
            if not acc or sizes - {len(acc)}:
                raise ValueError(
                    f"run {str(r['dir'])!r}: summary.json has {len(acc)} client accuracies for "
                    f"{max(sizes, default=0)} clients (the run ended before its first evaluation?)"
                )
            final_round = r["summary"].get("final", {}).get("round")
            try:
                part = participations(r["dir"], int(final_round), len(acc))
            except (TypeError, KeyError, ValueError, OSError):  # no final round/cohorts/metrics
                part = None
            if part is not None and part.size > len(acc):
                raise ValueError(
                    f"run {str(r['dir'])!r}: a cohort lists client {part.size - 1} but the run "
                    f"has {len(acc)} client accuracies"
                )
            seed = _get(r["config"], "seed")  # as export_rows writes it (an int)
            run = str(Path(r["dir"]).relative_to(root))
            for k, a in enumerate(acc):
                records.append(
                    {
                        "setting": label,
                        "seed": r["seed"] if seed is None else seed,
                        "run": run,
                        "client": k,
                        "acc": a,
                        "labeled": None if lab is None or unl is None else int(lab[k]),
                        "unlabeled": None if lab is None or unl is None else int(unl[k]),
                        "participations": None if part is None else int(part[k]),
                    }
                )
    return records


def export_clients(root: Path, out: Path) -> int:
    """client_records(root) as JSON lines in out. Returns the record count."""
    records = client_records(root)
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in records))
    return len(records)


def _records(source: Path) -> list[dict]:
    """The per-client records of a sweep directory or of an exported file."""
    source = Path(source)
    if source.is_dir():
        return client_records(source)
    return [json.loads(line) for line in source.read_text().splitlines() if line.strip()]


def _client_bin_table(
    records: list[dict],
    per_client: Callable[[str, list[dict]], np.ndarray],
    bins: list[tuple[str, Callable[[np.ndarray], np.ndarray]]],
) -> str:
    """Mean personal accuracy of the clients in each bin of a per-client quantity, per setting,
    averaged over seeds. per_client(run, its records) -> values [K]; bins: (column name,
    values -> mask). Cells: "accuracy % (clients in the bin, mean over seeds)"."""
    by_run: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in records:
        by_run[(rec["setting"], rec["run"])].append(rec)
    accs: dict[str, list[np.ndarray]] = defaultdict(list)
    sizes: dict[str, list[np.ndarray]] = defaultdict(list)
    for (label, run), recs in by_run.items():
        recs = sorted(recs, key=lambda rec: rec["client"])
        if [rec["client"] for rec in recs] != list(range(len(recs))):
            raise ValueError(
                f"run {run!r} of setting {label!r}: its records do not list clients 0..K-1 once "
                "each (two exports joined, whose runs share a folder name?)"
            )
        values, acc = per_client(run, recs), np.array([rec["acc"] for rec in recs], float)
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
    return "\n".join(md)


def _written(source: Path, out_name: str, text: str) -> str:
    """A table of a sweep directory is also written to DIR/out_name (not beside a records file)."""
    if Path(source).is_dir():
        (Path(source) / out_name).write_text(text + "\n")
    return text


def labeled_ratio_table(source: Path, edges: list[float]) -> str:
    """Mean personal accuracy of the clients whose labeled ratio mu_k = |D_k^s| / (|D_k^s| +
    |D_k^u|) falls in each bin [edges[i], edges[i+1]) (the last bin includes 1), per setting,
    averaged over seeds. Shows where a semi-supervised method gains or loses: on the clients
    with many labels or on those with few. source: a sweep directory (the table is written to
    DIR/report_by_labeled_ratio.md as well) or an exported records file."""
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

    def labeled_ratio(run: str, recs: list[dict]) -> np.ndarray:
        if any(rec["labeled"] is None or rec["unlabeled"] is None for rec in recs):
            raise ValueError(
                f"run {run!r} has no labeled/unlabeled split in counts.json: the "
                "labeled-ratio table needs a semi-supervised partition"
            )
        n_s = np.array([rec["labeled"] for rec in recs], float)
        return n_s / np.maximum(n_s + np.array([rec["unlabeled"] for rec in recs], float), 1)

    last = len(edges) - 2
    bins = [
        (
            f"μ in [{a:g}, {b:g}{']' if i == last else ')'}",
            lambda mu, a=a, b=b, i=i: (mu >= a) & ((mu <= b) if i == last else (mu < b)),
        )
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
    ]
    text = _client_bin_table(_records(source), labeled_ratio, bins)
    return _written(source, "report_by_labeled_ratio.md", text)


def participation_table(source: Path, edges: list[int]) -> str:
    """Mean personal accuracy of the clients by how often they took part up to the final
    evaluation: bins [edges[i], edges[i+1]) and a last bin >= edges[-1]. Shows whether a
    personalized method's clients gain or lose from each round they take part in. source: a
    sweep directory (the table is written to DIR/report_by_participations.md as well) or an
    exported records file."""
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

    def counts(run: str, recs: list[dict]) -> np.ndarray:
        if any(rec["participations"] is None for rec in recs):
            raise ValueError(f"run {run!r}: {NO_COHORTS}")
        return np.array([rec["participations"] for rec in recs], int)

    bins = [
        (f"{a}" if b == a + 1 else f"{a}-{b - 1}", lambda p, a=a, b=b: (p >= a) & (p < b))
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    ] + [(f"≥ {edges[-1]}", lambda p: p >= edges[-1])]
    text = _client_bin_table(_records(source), counts, bins)
    return _written(source, "report_by_participations.md", text)


def parse_edges(flag: str, value: str | None, allowed: str) -> list[float] | None:
    """Comma-separated bin edges of a flag, or None when the flag is not given."""
    if value is None:
        return None
    try:
        return [float(e) for e in value.split(",")]
    except ValueError:
        raise ValueError(f"{flag}={value!r} is not allowed: comma-separated {allowed}") from None


LABELED_RATIO_ALLOWED = "numbers in [0, 1], e.g. 0,0.1,0.5,0.9,1"
PARTICIPATION_ALLOWED = "increasing integers >= 0, e.g. 0,1,2,3,6"


def main(argv: list[str] | None = None) -> int:
    """The bin tables of a records file (or of a sweep directory), printed."""
    p = argparse.ArgumentParser(
        prog="python -m fedjax_semi.results.bins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", type=Path, help="per-client records (--clients) or a sweep dir")
    p.add_argument("--by-labeled-ratio", metavar="EDGES", default=None)
    p.add_argument("--by-participations", metavar="EDGES", default=None)
    a = p.parse_args(argv)
    try:
        ratio = parse_edges("--by-labeled-ratio", a.by_labeled_ratio, LABELED_RATIO_ALLOWED)
        part = parse_edges("--by-participations", a.by_participations, PARTICIPATION_ALLOWED)
        if ratio is None and part is None:
            raise ValueError("name --by-labeled-ratio EDGES, --by-participations EDGES or both")
        if ratio is not None:
            print("Personal accuracy by labeled ratio:\n\n" + labeled_ratio_table(a.source, ratio))
        if part is not None:
            print(
                "\nPersonal accuracy by participations (rounds a client took part in):\n\n"
                + participation_table(a.source, part)
            )
    except (OSError, ValueError) as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
