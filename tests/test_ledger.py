"""docs/results/ledger.md: the counts at its top are what its rows say."""

from __future__ import annotations

import re
from pathlib import Path

LEDGER = Path(__file__).resolve().parents[1] / "docs" / "results" / "ledger.md"
VERDICTS = ("reproduced", "direction only", "not reproduced", "not run")


def cells(line: str) -> list[str]:
    """A Markdown table row's cells (an escaped \\| stays inside its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_counts_are_the_rows_verdicts_and_protocols():
    sections = {}
    for block in re.split(r"^## ", LEDGER.read_text(), flags=re.M)[1:]:
        title, *body = block.splitlines()
        sections[title] = body
    counted = {}
    for title, body in sections.items():
        rows = [cells(line) for line in body if re.match(r"\| [A-Z]+-R?\d+ \|", line)]
        if not rows:
            continue
        assert all(r[4] in VERDICTS for r in rows), [r[0] for r in rows if r[4] not in VERDICTS]
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids)), title
        full = sum(r[5].startswith("full") for r in rows)
        counted[title] = [sum(r[4] == v for r in rows) for v in VERDICTS] + [len(rows), full]
    table = [cells(line) for line in sections["Counts"] if line.startswith("| ")][1:]  # no header
    assert len(table) == len(counted) + 1  # a line per paper and the total
    for paper, *numbers in table[:-1]:
        (title,) = [t for t in counted if t.startswith(paper + " ")]
        got = [int(n) for n in numbers[:5]] + [int(numbers[5].split()[0])]
        assert got == counted[title], (paper, got, counted[title])
    total = [int(n.strip("*").split()[0]) for n in table[-1][1:]]
    assert total == [sum(c[i] for c in counted.values()) for i in range(6)]
