"""Lint and strict typing are part of the suite, so CI cannot land code that fails them."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib

import pytest

from tests.sources import ROOT, sources


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_passes() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_checks_the_tests_bench_and_examples_too() -> None:
    """`python -m mypy` above checks what pyproject lists: the tests are typed like the code."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert {"replica", "relay", "clients", "chat", "tests", "bench", "examples"} <= set(
        mypy["files"]
    )


def test_packages_ship_their_types() -> None:
    """A py.typed marker (PEP 561) in each package, so an installed sealsync is typed."""
    for package in ("replica", "relay", "clients", "chat"):
        assert (ROOT / package / "py.typed").is_file(), package


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 40
"""Bounds of STYLE.md's house rules: a module under ~600 lines, a function under 40."""


def function_lengths(source: str) -> dict[str, int]:
    """Each function's length in lines, from its first decorator (or its `def`) to its last
    line: decorators, signature, docstring and body."""
    lengths: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lengths[f"{node.name}:{node.lineno}"] = node.end_lineno - first + 1
    return lengths


def test_no_source_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_no_function_is_40_lines_or_longer() -> None:
    long = {
        f"{p.relative_to(ROOT)}:{name}": n
        for p in sources()
        for name, n in function_lengths(p.read_text()).items()
        if n >= MAX_FUNCTION_LINES
    }
    assert not long, long


def test_function_lengths_count_from_the_first_decorator_to_the_last_line() -> None:
    source = "@decorator\ndef f(\n    x: int,\n) -> int:\n    '''doc'''\n    return x\n"
    assert function_lengths(source) == {"f:2": 6}
