"""The project's own Python files, for the tests that read the code itself (imports, error
codes, loggers, size bounds)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("replica", "relay", "clients", "chat")


def sources(*packages: str) -> list[Path]:
    """Every `.py` file of `packages` (all of them by default), in a stable order."""
    return sorted(p for package in packages or PACKAGES for p in (ROOT / package).rglob("*.py"))
