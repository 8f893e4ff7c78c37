"""The benchmarks page and its notes: every link into them lands on a heading, and every script in
``benchmarks/`` is named by a document (where its figures are) or a test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTES = ROOT / "docs" / "notes"
PAGES = (
    ROOT / "docs" / "benchmarks.md",
    *sorted(NOTES.glob("*.md")),
    ROOT / "benchmarks" / "README.md",
)
LINKING = (
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
SHARED = {"common.py", "forms.py"}


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = anchor(line.lstrip("#"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links_into_pages() -> list[tuple[str, Path, str]]:
    """(where, page, anchor) for every link with an anchor into the benchmarks page or its notes."""
    found = []
    for doc in LINKING:
        for target in LINK.findall(doc.read_text()):
            path, _, fragment = target.partition("#")
            page = (doc.parent / path).resolve() if path else doc
            if page in PAGES and fragment:
                found.append((f"{doc.relative_to(ROOT)}: {target}", page, fragment))
    return found


LINKS = links_into_pages()


@pytest.mark.parametrize(("where", "page", "fragment"), LINKS, ids=[link[0] for link in LINKS])
def test_a_link_into_the_benchmark_pages_lands_on_a_heading(
    where: str, page: Path, fragment: str
) -> None:
    assert fragment in anchors(page), f"{where}: no heading with anchor #{fragment}"


def test_the_benchmarks_page_holds_the_current_figures_only() -> None:
    # How each figure was found goes to a page of the notes; the page stays readable in one go.
    assert len(PAGES[0].read_text().splitlines()) < 400


def test_the_pages_link_to_each_other() -> None:
    assert len(LINKS) > 20
    index, page = (NOTES / "README.md").read_text(), PAGES[0].read_text()
    assert "benchmarks.md#investigations" in index
    assert "notes/" in page


@pytest.mark.parametrize(
    "note", sorted(p.name for p in NOTES.glob("*.md") if p.name != "README.md")
)
def test_the_notes_index_lists_every_page_and_each_page_its_first_record(note: str) -> None:
    # One page per investigation: the index links it, and the page says when it was first
    # recorded, at which commit, and links back.
    assert f"]({note})" in (NOTES / "README.md").read_text()
    text = (NOTES / note).read_text()
    assert re.search(r"\*First recorded \d{4}-\d\d-\d\d, commit `[0-9a-f]{7,}`", text), note
    assert "[All notes](README.md)" in text


@pytest.mark.parametrize(
    "script",
    sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name not in SHARED),
)
def test_every_benchmark_script_is_named_by_a_document_or_a_test(script: str) -> None:
    named = [
        path
        for path in [*(ROOT / "docs").rglob("*.md"), *(ROOT / "tests").rglob("*.py")]
        if f"benchmarks/{script}" in path.read_text()
    ]
    assert named, f"benchmarks/{script}: no document or test names it; fold it or remove it"
