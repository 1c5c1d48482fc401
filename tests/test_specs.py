"""Every spec names the tests that check each of its sections (STYLE: docs): those names must
stay true as tests move and change, or the specs would point at nothing."""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VECTORS: dict[str, Any] = json.loads((ROOT / "specs" / "vectors" / "envelope.json").read_text())
ENVELOPES: list[dict[str, Any]] = VECTORS["envelopes"]
TAMPERED: list[dict[str, Any]] = VECTORS["tampered"]

SPECS = sorted((ROOT / "specs").glob("*.md"))
TESTS = ROOT / "tests"
BARE_NAMES_IN = {"envelope.md": "tests/replica/test_envelope.py"}
"""Where a spec's citations without a path live; `keys::` is tests/replica/test_keys.py."""
CITATION = re.compile(r"`([^`\s]+)`")


@functools.cache
def defined_in(path: Path) -> frozenset[str]:
    """Top-level functions, classes, `Class.method` and assigned names of one test file."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return frozenset(names)


def cited_file(cited: str) -> Path:
    """A cited test file: a path from the root, or a name in tests/replica/."""
    if cited == "keys":
        cited = "test_keys.py"
    return ROOT / cited if cited.startswith("tests/") else TESTS / "replica" / cited


def missing_citations(spec: Path) -> tuple[list[str], int]:
    """Cited test files, `file::name` tests, bare test names and `[vector]` cases that do not
    exist, and how many citations the spec makes."""
    every_test_file = sorted(TESTS.rglob("test_*.py"))
    home = BARE_NAMES_IN.get(spec.name)
    cases = {c["name"] for c in TAMPERED} | {v["name"] for v in ENVELOPES}
    missing: list[str] = []
    count = 0
    for cited in CITATION.findall(spec.read_text(encoding="utf-8")):
        if case := re.fullmatch(r"\[([\w*]+)\]", cited):
            ok = bool(fnmatch.filter(cases, case[1]))
        elif re.fullmatch(r"(keys|[\w/]+\.py)::[\w.]+", cited):  # not the notation `file::function`
            path, name = cited.split("::")
            ok = cited_file(path).is_file() and name in defined_in(cited_file(path))
        elif re.fullmatch(r"test_\w+", cited):
            places = [ROOT / home] if home else every_test_file
            ok = any(cited in defined_in(place) for place in places)
        elif re.fullmatch(r"(tests/)?[\w/]*test_\w+\.py", cited):
            ok = cited_file(cited).is_file()
        else:
            continue
        count += 1
        if not ok:
            missing.append(f"{spec.name}: {cited}")
    return missing, count


def test_spec_names_only_tests_and_vectors_that_exist() -> None:
    """Every spec says which tests check each section; those names must stay true."""
    assert {s.name for s in SPECS} >= {
        "envelope.md",
        "limits.md",
        "merge.md",
        "protocol.md",
        "replica.md",
    }
    missing: list[str] = []
    for spec in SPECS:
        gaps, count = missing_citations(spec)
        assert count > 20, f"{spec.name} cites only {count} tests: has the notation changed?"
        missing += gaps
    assert not missing, missing


def test_citation_check_finds_a_missing_test(tmp_path: Path) -> None:
    spec = tmp_path / "spec.md"
    spec.write_text(
        "`test_merge.py::test_concurrent_versions_both_stay` `test_merge.py::test_gone` "
        "`tests/test_imports.py::test_public_names_are_sorted_and_complete` "
        "`test_convergence.py::ConvergenceMachine.relay_holds_only_siblings` "
        "`test_no_such_test` `test_nowhere.py` `[relabel_*]` `[no_such_case]` `lp(s)` `[]`",
        encoding="utf-8",
    )
    missing, count = missing_citations(spec)
    assert count == 8
    assert missing == [
        "spec.md: test_merge.py::test_gone",
        "spec.md: test_no_such_test",
        "spec.md: test_nowhere.py",
        "spec.md: [no_such_case]",
    ]
