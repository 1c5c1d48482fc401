"""Files and folders sealsync makes are its owner's alone, whatever the umask: a replica and
the WAL and shared memory SQLite makes beside it, a relay database, a backup folder. They
hold only ciphertext, but also which records exist, their sizes and when they changed, and a
relay's holds every account's auth-key hashes (issue 12: they were made 0644)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from clients.cli import main
from relay.sqlite import SQLiteStorage
from relay.storage import VersionRules
from replica import Replica
from tests.conftest import SCHEMA, Account, FakeClock
from tests.relay.conftest import register


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The usual umask, which would make files 0644 and folders 0755."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def with_side_files(path: Path) -> list[Path]:
    return [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))]


def test_a_new_replica_and_its_side_files_are_owner_only(tmp_path: Path, account: Account) -> None:
    path = tmp_path / "r.db"
    with Replica.join(path, account.bundle) as replica:
        replica.unlock_with_key(account.key)
        replica.put("notes", "n", {"text": "x"})
        assert {p.name: mode(p) for p in with_side_files(path)} == {
            p.name: 0o600 for p in with_side_files(path)
        }


def test_a_created_replica_is_owner_only_too(tmp_path: Path) -> None:
    """Replica.create takes the same path as join (one Argon2id run, at the floor's cost)."""
    path = tmp_path / "new.db"
    replica, _ = Replica.create(path, SCHEMA, "correct horse battery staple")
    replica.close()
    assert mode(path) == 0o600


def test_a_new_relay_database_and_its_side_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    storage = SQLiteStorage(path, VersionRules(FakeClock()))
    try:
        register(storage, "a")
        assert [mode(p) for p in with_side_files(path)] == [0o600, 0o600, 0o600]
    finally:
        storage.close()


def test_folders_the_command_line_makes_are_owner_only(tmp_path: Path, account: Account) -> None:
    replica = tmp_path / "r.db"
    Replica.join(replica, account.bundle).close()
    folder = tmp_path / "made" / "backups"
    result = CliRunner().invoke(main, ["--replica", str(replica), "backup", "--to", str(folder)])
    assert result.exit_code == 0, result.output
    assert mode(folder) == 0o700
    relay_db = tmp_path / "relay-data" / "relay.db"
    made = CliRunner().invoke(main, ["relay", "invite", "--db", str(relay_db)])
    assert made.exit_code == 0, made.output
    assert (mode(relay_db.parent), mode(relay_db)) == (0o700, 0o600)
