"""Paired differences: every setting of a sweep against one reference setting, seed by seed.

With a few seeds, the spread between seeds (the partition, the initialization, the cohorts) is
often larger than the effect of a switch. Two settings run on the same seeds share all of it, so
the difference per seed, averaged over seeds, is the sharper test of "this switch against the
defaults". Each setting's runs are paired with the reference run of the same seed; seeds the
reference lacks are left out and the count says how many pairs there are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_semi.results.report import _check_cut, is_fraction, mean_std, run_value
from fedjax_semi.results.sweep_runs import grouped_runs


def reference_setting(labels: list[str], tokens: list[str]) -> str:
    """The one setting label holding every ``key=value`` token (labels as `fedjax-semi-report`
    prints them, a key absent from a run's overrides reading ``key=default``)."""

    def holds(label: str, token: str) -> bool:
        # key=default also holds where no setting varies the key (then every run has one value)
        key = token.partition("=")[0]
        mentioned = any(t.partition("=")[0] == key for t in label.split())
        return token in label.split() or (token.endswith("=default") and not mentioned)

    hits = [label for label in labels if all(holds(label, t) for t in tokens)]
    if len(hits) != 1 or not tokens:
        raise ValueError(
            f"--paired-to={' '.join(tokens)!r} is not allowed: it must name key=value tokens that "
            f"exactly one setting holds; it matches {len(hits)} of: {' | '.join(labels)}"
        )
    return hits[0]


def paired_lines(
    seeded: dict[str, list[tuple[int, float | None]]],
    ref_label: str,
    metric: str,
    decimals: int = 2,
) -> list[str]:
    """Markdown lines: every setting of ``seeded`` (label -> [(seed, value or None)]) against
    ``ref_label``'s value of the same seed: the paired seeds, both means, the difference (mean
    ± std over seeds; percentage points, to ``decimals`` places, for a metric in [0, 1]) and in
    how many seeds it is above the reference."""
    ref = dict(seeded[ref_label])
    pct = is_fraction([v for pairs in seeded.values() for _, v in pairs if v is not None], metric)
    unit = "points" if pct else "as logged"
    header = ["setting", "paired seeds", metric, "reference", f"difference ({unit})", "above in"]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, values in seeded.items():
        if label == ref_label:
            continue
        pairs = [(v, ref.get(seed)) for seed, v in values]
        pairs = [(v, w) for v, w in pairs if v is not None and w is not None]
        if not pairs:
            md.append(f"| {label} | 0 | – | – | – | – |")
            continue
        a, b = np.array(pairs).T
        (mu, sd), (mu_a, _), (mu_b, _) = mean_std(a - b), mean_std(a), mean_std(b)
        k, f = (100, f".{decimals}f") if pct else (1, ".6g")
        md.append(
            f"| {label} | {len(a)} | {k * mu_a:{f}} | {k * mu_b:{f}} | "
            f"{k * mu:+{f}} ± {k * sd:{f}} | {int(np.sum(a > b))}/{len(a)} |"
        )
    return md


def paired_table(
    root: Path,
    metric: str,
    tokens: list[str],
    budget_time: float | None = None,
    budget_rounds: int | None = None,
    last_k: int | None = None,
) -> str:
    """Markdown: per setting, the paired seeds, its value and the reference's on those seeds,
    the difference (mean ± std over seeds; percentage points for a metric in [0, 1]) and in how
    many seeds it is above the reference. Uses the same cut as the main table. Also written to
    DIR/report_paired.md."""
    _check_cut(budget_time, budget_rounds, last_k)
    groups = grouped_runs(root)
    ref_label = reference_setting(list(groups), tokens)

    def at_cut(r: dict) -> float | None:
        got = run_value(r, metric, budget_time, budget_rounds, last_k)
        return None if got is None else got[0]

    # Each run read once: setting -> [(seed, value at the cut or None)].
    seeded = {label: [(r["seed"], at_cut(r)) for r in runs] for label, runs in groups.items()}
    md = paired_lines(seeded, ref_label, metric)
    text = f"Reference: {ref_label}\n\n" + "\n".join(md)
    (Path(root) / "report_paired.md").write_text(text + "\n")
    return text
