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

from tests.sources import PACKAGES, ROOT, sources

CONFIGURED_ELSEWHERE = ("uvicorn",)
"""Loggers of other libraries that `relay.serve` configures (it creates none of its own)."""
CONFIGURES_BY_VARIABLE = {"relay/serve.py"}
"""Modules that configure a list of loggers (the tree's root and uvicorn's) in a loop."""


THE_NAME = "sealsync.{__name__}"
"""How each module names its logger: f"sealsync.{__name__}"."""


def is_the_name(argument: ast.JoinedStr) -> bool:
    """Whether an f-string is exactly f"sealsync.{__name__}"."""
    match argument.values:
        case [ast.Constant(value="sealsync."), ast.FormattedValue(value=ast.Name(id="__name__"))]:
            return True
    return False


def logger_names(tree: ast.AST, by_variable: bool = False) -> list[str | None]:
    """The name of each `getLogger` call: `THE_NAME` for f"sealsync.{__name__}", a literal as
    written, None for anything else (a variable is allowed `by_variable`: the loop in
    `relay.serve` over the loggers it configures)."""
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
        elif isinstance(argument, ast.JoinedStr):
            names.append(THE_NAME if is_the_name(argument) else None)
        elif isinstance(argument, ast.Name) and by_variable:
            continue
        else:
            names.append(None)
    return names


def stray(names: list[str | None]) -> list[str | None]:
    """Names other than the module's own in the tree, and other libraries' loggers."""
    return [n for n in names if n != THE_NAME and not (n or "").startswith(CONFIGURED_ELSEWHERE)]


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_logger_is_named_in_the_sealsync_tree(path: Path) -> None:
    by_variable = str(path.relative_to(ROOT)) in CONFIGURES_BY_VARIABLE
    names = logger_names(ast.parse(path.read_text(), str(path)), by_variable)
    assert not stray(names), f"{path} creates loggers outside sealsync.: {stray(names)}"


def test_the_check_sees_a_logger_outside_the_tree() -> None:
    """It can fail: `__name__`, literals (even in the tree), an f-string of another prefix and
    a variable are caught; only the module's own name in the tree passes."""
    tree = ast.parse(
        "import logging\n"
        "a = logging.getLogger(__name__)\n"
        "b = logging.getLogger('relay.postgres')\n"
        "c = logging.getLogger(f'relay.{__name__}')\n"
        "d = logging.getLogger(f'sealsync.{__name__}')\n"
        "e = logging.getLogger(name)\n"
        "f = logging.getLogger('sealsync.relay')\n"
    )
    assert stray(logger_names(tree)) == [None, "relay.postgres", None, None, "sealsync.relay"]


def test_importing_every_module_makes_no_logger_named_after_a_package() -> None:
    """What the imports create at run time: nothing under `replica.`, `relay.`, `clients.`."""
    for path in sources():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        importlib.import_module(module.removesuffix(".__init__"))
    made = [name for name in logging.root.manager.loggerDict if name.split(".")[0] in PACKAGES]
    assert not made, made
