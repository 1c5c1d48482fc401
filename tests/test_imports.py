"""The dependency direction of docs/architecture.md §1, checked on the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.sources import ROOT, sources

RELAY_MAY_IMPORT = {"replica.wire", "replica.errors"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".", maxsplit=1)[0]


@pytest.mark.parametrize("path", sources("replica"), ids=str)
def test_replica_imports_neither_relay_nor_clients(path: Path) -> None:
    bad = {n for n in imported_modules(path) if top(n) in {"relay", "clients"}}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", sources("relay"), ids=str)
def test_relay_imports_only_wire_and_errors_from_replica(path: Path) -> None:
    from_replica = {n for n in imported_modules(path) if top(n) == "replica"}
    modules = {
        n for n in from_replica if n in RELAY_MAY_IMPORT or n.rsplit(".", 1)[0] in RELAY_MAY_IMPORT
    }
    assert from_replica == modules, f"{path} imports {from_replica - modules}"
    assert "clients" not in {top(n) for n in imported_modules(path)}


@pytest.mark.parametrize("path", sources("chat"), ids=str)
def test_chat_uses_only_the_engine_s_public_api(path: Path) -> None:
    """The chat store is an app of the engine (specs/chat.md): `from replica import …` of
    names in `replica.__all__`, and nothing of the relay or the clients."""
    import replica

    modules = imported_modules(path)
    from_replica = {n for n in modules if top(n) == "replica"} - {"replica"}
    private = {n for n in from_replica if n.removeprefix("replica.") not in replica.__all__}
    assert not private, f"{path} imports {private}"
    assert not {top(n) for n in modules} & {"relay", "clients"}, path


def is_command_line(path: Path) -> bool:
    """The composition root: the `clients.cli` package, the one place that may import both
    the client library and `relay` (architecture.md §1)."""
    return (ROOT / "clients" / "cli") in path.parents


@pytest.mark.parametrize("path", sources("clients"), ids=str)
def test_only_the_cli_imports_relay(path: Path) -> None:
    if is_command_line(path):
        return
    assert "relay" not in {top(n) for n in imported_modules(path)}, f"{path} imports relay"


@pytest.mark.parametrize("path", sources("clients"), ids=str)
def test_the_client_library_never_imports_the_command_line(path: Path) -> None:
    """The library (transport, sync driver, account access) works without click or a console:
    only the command line builds on it, never the other way round."""
    if is_command_line(path):
        return
    names = imported_modules(path)
    assert not {n for n in names if n.startswith("clients.cli")}, f"{path} imports clients.cli"
    assert not {"click", "rich"} & {top(n) for n in names}, f"{path} imports click or rich"


def test_the_command_line_is_the_cli_package_alone() -> None:
    """The rule above exempts exactly the `clients/cli/` package: its modules, no others."""
    exempt = {p.relative_to(ROOT).as_posix() for p in sources("clients") if is_command_line(p)}
    assert exempt and all(p.startswith("clients/cli/") for p in exempt)
    assert "clients/sync.py" not in exempt and "clients/cli/__init__.py" in exempt


def test_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The check above can fail: a relay module importing replica.keys is caught."""
    module = tmp_path / "bad.py"
    module.write_text("from replica.keys import AccountKeys\nimport replica.wire\n")
    names = imported_modules(module)
    assert "replica.keys" in names and "replica.keys" not in RELAY_MAY_IMPORT


def test_public_names_are_sorted_and_complete() -> None:
    import replica

    exported = replica.__all__
    assert exported == sorted(exported, key=lambda n: (not n.isupper(), n))
    for name in exported:
        assert hasattr(replica, name), name
    public = {n for n in vars(replica) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(exported), public - set(exported)
