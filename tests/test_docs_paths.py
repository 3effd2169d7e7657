"""Every file a document names exists in the repository: the paths under docs/results/ that the
pages cite as evidence (runs, rows, plots), the pages' relative links, and the headings their
`#anchor`s point to (a renamed section breaks the ledger's links). A results directory
that .gitignore swallowed (a `runs/` pattern once matched docs/results/cfsl_record/runs) fails
here on a fresh clone."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CITED = re.compile(r"docs/results/[A-Za-z0-9_./<>-]+")
LINK = re.compile(r"\]\(([^)#\s]+)")
ANCHORED = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters of any script,
    digits, `_` and `-` kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def heading_anchors(text: str) -> set[str]:
    """Every anchor of a page's headings (code blocks skipped); a repeated one gets -1, -2, ..."""
    anchors, count = set(), {}
    for h in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.M):
        n = count.get(slug(h), 0)
        count[slug(h)] = n + 1
        anchors.add(f"{slug(h)}-{n}" if n else slug(h))
    return anchors


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


def test_link_anchors_name_a_heading():
    missing = []
    for page in PAGES:
        for path, anchor in ANCHORED.findall(FENCE.sub("", page.read_text())):
            target = (page.parent / path) if path else page
            if "://" in path or target.suffix != ".md" or not target.exists():
                continue  # other files are test_relative_links_resolve's
            if unquote(anchor) not in heading_anchors(target.read_text()):
                missing.append(f"{page.relative_to(ROOT)}: {path}#{anchor}")
    assert not missing, missing


def test_heading_anchors_follow_github():
    text = "# Table 3: ν = 10, 8 and 5\n```\n# not a heading\n```\n## A `b` (c)\n## A `b` (c)\n"
    text += "### A3 — x `b_c`, 40%\n"
    assert heading_anchors(text) == {
        "table-3-ν--10-8-and-5", "a-b-c", "a-b-c-1", "a3--x-b_c-40"
    }  # fmt: skip
