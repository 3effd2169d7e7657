"""Every file a document names exists in the repository: the paths under docs/results/ that the
pages cite as evidence (runs, rows, plots) and the pages' relative links. A results directory
that .gitignore swallowed (a `runs/` pattern once matched docs/results/cfsl_record/runs) fails
here on a fresh clone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"docs/results/[A-Za-z0-9_./<>-]+")
LINK = re.compile(r"\]\(([^)#\s]+)")


def cited_paths(text: str) -> list[str]:
    """docs/results/... paths named in a page, cut at the first placeholder (`<setting>`)."""
    out = []
    for m in CITED.findall(text):
        path = m.split("<", 1)[0].rstrip(".,;:)")
        out.append(path)
    return out


def test_cited_results_paths_exist():
    missing = [
        f"{page.relative_to(ROOT)}: {p}"
        for page in PAGES
        for p in cited_paths(page.read_text())
        if not (ROOT / p).exists()
    ]
    assert not missing, missing


def test_relative_links_resolve():
    missing = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in PAGES
        for link in LINK.findall(page.read_text())
        if "://" not in link and not link.startswith("mailto:")
        and not (page.parent / link).exists()
    ]  # fmt: skip
    assert not missing, missing


def test_placeholders_are_cut():
    assert cited_paths("see `docs/results/x/runs/<setting>/seed_<s>/`.") == ["docs/results/x/runs/"]
