"""Lint and strict typing are part of the suite, so CI cannot land code that fails them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def test_mypy_strict_passes() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_checks_the_tests_bench_and_examples_too() -> None:
    """`python -m mypy` above checks what pyproject lists: the tests are typed like the code."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert {"replica", "relay", "clients", "tests", "bench", "examples"} <= set(mypy["files"])


def test_packages_ship_their_types() -> None:
    """A py.typed marker (PEP 561) in each package, so an installed sealsync is typed."""
    for package in ("replica", "relay", "clients"):
        assert (ROOT / package / "py.typed").is_file(), package
