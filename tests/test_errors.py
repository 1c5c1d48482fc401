"""One exception tree and one type for the relay's codes (docs/architecture.md §1), checked on the code
itself: every exception class of the three packages descends from `SealsyncError`, every relay
error answers with an `ErrorCode`, and no relay code is spelled as a bare string anywhere — a
renamed or mistyped code would otherwise pass mypy and fail only on the wire."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

from relay.bodylimit import BodyTooLargeError
from relay.errors import RelayError, StoreFailedError
from replica.errors import SealsyncError
from replica.wire import ErrorCode
from tests.sources import PACKAGES, ROOT, sources

CODE_VALUES = frozenset(code.value for code in ErrorCode)
ENUM_HOME = ROOT / "replica" / "wire.py"
LIBRARY_WORDS = {("replica/errors.py", "malformed")}
"""Strings that spell a relay code but are not one: `ProtocolError.code`, the library's name
for bytes that break the wire format, which the relay answers with `ErrorCode.MALFORMED`."""


def bare_codes(path: Path) -> list[tuple[int, str]]:
    """(line, value) of each string literal in `path` that spells an `ErrorCode` value:
    docstrings aside, and the enum's own definition in replica/wire.py."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))  # a docstring, of a module, class, function or field
        if path == ENUM_HOME and isinstance(node, ast.ClassDef) and node.name == "ErrorCode":
            skipped.update(id(inner) for inner in ast.walk(node))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in CODE_VALUES
        and id(node) not in skipped
    )


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_relay_code_is_a_bare_string(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    found = [
        (line, value) for line, value in bare_codes(path) if (where, value) not in LIBRARY_WORDS
    ]
    assert not found, f"{where}: relay codes as bare strings (use ErrorCode): {found}"


def test_checker_sees_a_bare_relay_code(tmp_path: Path) -> None:
    """The check above can fail: a code given, compared or used as a hint key as a string."""
    module = tmp_path / "bad.py"
    module.write_text(
        '"""clock_ahead in a docstring is prose."""\n'
        'TOO_LARGE = Receipt("refused", code="too_large")\n'
        'HINTS = {"rate_limited": "wait"}\n'
        'if exc.code == "unauthorized":\n'
        "    pass\n"
        'print(f"malformed {kind}")\n'
    )
    assert bare_codes(module) == [(2, "too_large"), (3, "rate_limited"), (4, "unauthorized")]


def test_every_code_is_one_the_relay_sends() -> None:
    """No dead member: each is named by the relay's code (errors, receipts, app, middleware)."""
    named = {
        node.attr
        for path in sorted((ROOT / "relay").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ErrorCode"
    }
    assert named == {code.name for code in ErrorCode}


def modules() -> list[ModuleType]:
    """Every module of the three packages, imported (so every class they define exists)."""
    found: list[ModuleType] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            found.append(importlib.import_module(info.name))
    return found


def outside_the_tree(module: ModuleType) -> list[str]:
    """Exception classes `module` defines that do not descend from `SealsyncError`."""
    return [
        name
        for name, value in inspect.getmembers(module, inspect.isclass)
        if value.__module__ == module.__name__
        and issubclass(value, BaseException)
        and not issubclass(value, SealsyncError)
    ]


def test_every_exception_class_descends_from_sealsync_error() -> None:
    found = {module.__name__: outside_the_tree(module) for module in modules()}
    assert {"relay.errors", "clients.errors", "replica.errors", "relay.bodylimit"} <= set(found)
    assert not {name: classes for name, classes in found.items() if classes}


def test_checker_sees_an_exception_outside_the_tree(tmp_path: Path) -> None:
    """The check above can fail: a module defining an error on plain `Exception` is caught."""
    path = tmp_path / "stray.py"
    path.write_text(
        "from replica.errors import SealsyncError\n"
        "class Kept(SealsyncError): pass\n"
        "class Stray(Exception): pass\n"
        "class Deeper(Stray): pass\n"
    )
    spec = importlib.util.spec_from_file_location("stray", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert outside_the_tree(module) == ["Deeper", "Stray"]


def subclasses(cls: type[RelayError]) -> list[type[RelayError]]:
    return [cls, *(deeper for sub in cls.__subclasses__() for deeper in subclasses(sub))]


def test_every_relay_error_answers_with_a_code_of_the_enum() -> None:
    modules()  # every subclass is defined, wherever it lives
    classes = subclasses(RelayError)
    assert BodyTooLargeError in classes and len(classes) >= 15
    for cls in classes:
        assert type(cls.code) is ErrorCode, cls
        assert 400 <= cls.status < 500, cls


def test_a_storage_failure_is_in_the_tree_but_no_refusal() -> None:
    """`StoreFailedError` is printed like every error, with an operator hint; it is not a
    `RelayError`, so the app answers it with a 500, never with a code a client would take
    as the relay's definitive word (tests/relay/test_api.py checks the answer)."""
    error = StoreFailedError("the commit this push joined failed")
    assert isinstance(error, SealsyncError) and not isinstance(error, RelayError)
    assert error.hint and "storage" in error.hint
