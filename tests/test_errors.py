"""One exception tree (DESIGN: errors), checked on the code itself: every exception class of
the three packages descends from `SealsyncError`, and every relay error answers with an
`ErrorCode`."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

from relay.bodylimit import BodyTooLargeError
from relay.errors import RelayError, StoreFailedError
from replica.errors import SealsyncError
from replica.wire import ErrorCode

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("replica", "relay", "clients")


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
