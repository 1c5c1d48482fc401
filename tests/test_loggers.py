"""Every logger the project creates is in the `sealsync.` tree that `relay serve` and apps
configure: the packages are top-level (`replica`, `relay`, `clients`), so a bare `__name__`
would make a logger outside it, whose lines print as plain text or not at all (the LISTEN
lines of `relay.postgres` once did)."""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("replica", "relay", "clients")
CONFIGURED_ELSEWHERE = ("uvicorn",)
"""Loggers of other libraries that `relay.serve` configures (it creates none of its own)."""
CONFIGURES_BY_VARIABLE = {"relay/serve.py"}
"""Modules that configure a list of loggers (the tree's root and uvicorn's) in a loop."""


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def logger_names(tree: ast.AST, by_variable: bool = False) -> list[str | None]:
    """The name of each `getLogger` call: its literal prefix (the constant start of an
    f-string), or None when it is neither a literal nor an f-string (a variable is allowed
    `by_variable`: the loop in `relay.serve` over the loggers it configures)."""
    names: list[str | None] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called != "getLogger":
            continue
        argument = node.args[0] if node.args else None
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.append(argument.value)
        elif isinstance(argument, ast.JoinedStr) and isinstance(argument.values[0], ast.Constant):
            names.append(str(argument.values[0].value))
        elif isinstance(argument, ast.Name) and by_variable:
            continue
        else:
            names.append(None)
    return names


def stray(names: list[str | None]) -> list[str | None]:
    return [
        n
        for n in names
        if n is None or not (n == "sealsync" or n.startswith(("sealsync.", *CONFIGURED_ELSEWHERE)))
    ]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_logger_is_named_in_the_sealsync_tree(path: Path) -> None:
    by_variable = str(path.relative_to(ROOT)) in CONFIGURES_BY_VARIABLE
    names = logger_names(ast.parse(path.read_text(), str(path)), by_variable)
    assert not stray(names), f"{path} creates loggers outside sealsync.: {stray(names)}"


def test_the_check_sees_a_logger_outside_the_tree() -> None:
    """It can fail: `__name__`, another literal and an f-string of another prefix are caught."""
    tree = ast.parse(
        "import logging\n"
        "a = logging.getLogger(__name__)\n"
        "b = logging.getLogger('relay.postgres')\n"
        "c = logging.getLogger(f'relay.{__name__}')\n"
        "d = logging.getLogger(f'sealsync.{__name__}')\n"
        "e = logging.getLogger(name)\n"
    )
    assert stray(logger_names(tree)) == [None, "relay.postgres", "relay.", None]


def test_importing_every_module_makes_no_logger_named_after_a_package() -> None:
    """What the imports create at run time: nothing under `replica.`, `relay.`, `clients.`."""
    for path in sources():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        importlib.import_module(module.removesuffix(".__init__"))
    made = [name for name in logging.root.manager.loggerDict if name.split(".")[0] in PACKAGES]
    assert not made, made
