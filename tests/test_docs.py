"""The architecture document is the repository's own: every section a module, spec or test
cites as `docs/architecture.md §n` exists, and nothing cites the design document that lives
outside the repository (a successor could not follow such a reference)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CITATION = re.compile(r"architecture\.md((?:(?:,| and|\u2013|-)?\s*§\d+(?:\.\d+)?)+)")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)
OUTSIDE_DESIGN = re.compile(r"DESIGN(?:\.md)?[ ,]*(?:§|preamble)")


def cited_files() -> list[Path]:
    """Every source and document, but this test's own examples."""
    folders = ("replica", "relay", "clients", "tests", "bench", "examples", "specs", "docs")
    found = [p for f in folders for p in (ROOT / f).rglob("*") if p.suffix in {".py", ".md"}]
    mine = Path(__file__).resolve()
    return sorted([*(p for p in found if p != mine), ROOT / "README.md", ROOT / "CONTRIBUTING.md"])


def citations(text: str) -> list[str]:
    """Each section number cited, `architecture.md §3, §5` giving both."""
    return [n for group in CITATION.findall(text) for n in SECTION.findall(group)]


def headings(text: str) -> set[str]:
    return set(HEADING.findall(text))


def test_the_document_has_its_numbered_sections() -> None:
    numbered = headings(ARCHITECTURE.read_text())
    assert {str(n) for n in range(1, 14)} <= numbered, sorted(numbered)


@pytest.mark.parametrize("path", cited_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_section_exists(path: Path) -> None:
    missing = set(citations(path.read_text())) - headings(ARCHITECTURE.read_text())
    assert not missing, f"{path.relative_to(ROOT)} cites architecture.md §{sorted(missing)}"


@pytest.mark.parametrize("path", cited_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_cites_the_design_outside_the_repository(path: Path) -> None:
    if path == ARCHITECTURE:  # it says what an old "DESIGN §n" citation meant
        return
    assert not OUTSIDE_DESIGN.search(path.read_text()), path.relative_to(ROOT)


def test_the_checks_see_a_missing_section_and_an_outside_citation() -> None:
    """They can fail: a section the document lacks, and the old form of citation."""
    text = "see docs/architecture.md §3, §5 and §8.4; then architecture.md §42 and §6.9"
    assert citations(text) == ["3", "5", "8.4", "42", "6.9"]
    assert {"42", "6.9"} == set(citations(text)) - headings(ARCHITECTURE.read_text())
    assert OUTSIDE_DESIGN.search("as DESIGN §4 says") and OUTSIDE_DESIGN.search(
        "(DESIGN.md, preamble)"
    )
