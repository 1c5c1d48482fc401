"""`backup` and `restore` with real files and a real relay: a whole snapshot taken while
locked, never a partial file, a restore that writes as a new node and syncs on."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from clients.cli import main
from replica import Replica
from tests.clients.test_cli import Cli, assert_user_error, dump, listed_accounts
from tests.relay.server import RelayProcess


def node_of(path: Path) -> int:
    with Replica.open(path) as replica:
        return replica.node


@pytest.mark.slow
def test_a_backup_taken_while_locked_restores_as_a_new_node_that_syncs(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t1", '{"title": "before the backup"}')
    cli.ok(a, "put", "drafts", "d1", '{"text": "this device only"}')
    cli.ok(a, "sync")
    folder = tmp_path / "backups"
    made = cli(a, "backup", "--to", str(folder), passphrase="")  # never asks for it
    assert made.exit_code == 0, made.output
    (copy,) = folder.glob("*.db")
    beside = [copy.with_suffix(".json"), copy.with_suffix(".rows")]
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in [copy, *beside])
    assert str(copy) in made.stdout.replace("\n", "")
    assert {p.stat().st_mode & 0o777 for p in [copy, *beside]} == {0o600}
    with sqlite3.connect(copy) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    (listed,) = cli.json_objects(a, "backup", "ls", str(folder))
    assert (listed["name"], listed["manifest"]) == (copy.name, True)
    (verdict,) = cli.json_objects(a, "backup", "verify", str(folder))
    assert (verdict["state"], verdict["problems"]) == ("ok", [])

    restored = cli(b, "restore", str(copy), passphrase="")
    assert restored.exit_code == 0, restored.output
    assert node_of(b) != node_of(a)
    assert cli.json_object(b, "get", "threads", "t1")["doc"] == {"title": "before the backup"}
    missing = cli(b, "get", "drafts", "d1")  # device-local: not in the backup
    assert missing.exit_code == 1 and "not found" in missing.stderr, missing.output

    # the device loses its replica after more work: restore over it, then sync what is missing
    cli.ok(a, "put", "threads", "t2", '{"title": "after the backup"}')
    cli.ok(a, "sync")
    old_node = node_of(a)
    before = dump(a)
    assert_user_error(cli(a, "restore", str(copy)), "already exists", "--force")
    assert dump(a) == before
    cli.ok(a, "restore", str(copy), "--force")
    assert node_of(a) != old_node
    cli.ok(a, "sync")
    assert [r["id"] for r in cli.json_objects(a, "ls", "threads")] == ["t1", "t2"]
    cli.ok(a, "put", "threads", "t3", '{"title": "written by the restored file"}')
    cli.ok(a, "sync")
    assert cli.json_object(a, "get", "threads", "t3")["node"] == node_of(a) != old_node


def test_backup_and_restore_refuse_what_is_not_a_replica_and_leave_no_file(
    cli: Cli, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a replica" * 100)
    folder = tmp_path / "backups"
    assert_user_error(cli(junk, "backup", "--to", str(folder)), "not a")
    assert not folder.exists() or list(folder.iterdir()) == []
    target = tmp_path / "restored.db"
    assert_user_error(cli(target, "restore", str(junk)), "junk.db")
    assert_user_error(cli(target, "restore", str(tmp_path / "missing.db")), "no backup")
    assert list(tmp_path.glob("restored.db*")) == [] and list(tmp_path.glob(".restored*")) == []
    empty_sqlite = tmp_path / "empty.db"
    sqlite3.connect(empty_sqlite).close()
    assert_user_error(cli(target, "restore", str(empty_sqlite)))
    assert list(tmp_path.glob("restored.db*")) == [] and list(tmp_path.glob(".restored*")) == []


def backed_up_then_collected(cli: Cli, relay: RelayProcess, a: Path, b: Path, folder: Path) -> Path:
    """Device a writes `kept` and `gone`, b joins, a backs up (the copy, returned); b deletes
    `gone`, and a collection run takes it, then is released, both devices past it."""
    assert relay.db is not None
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "kept", '{"title": "kept"}')
    cli.ok(a, "put", "threads", "gone", '{"title": "deleted later"}')
    cli.ok(a, "sync")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "backup", "--to", str(folder))
    (copy,) = folder.glob("*.db")
    cli.ok(b, "rm", "threads", "gone")
    collect = ["relay", "collect", "--db", str(relay.db), "--json"]
    for _ in range(2):  # a run, then its release once both devices passed it
        for device in (b, a, b, a):
            cli.ok(device, "sync")
        assert cli.runner.invoke(main, collect).exit_code == 0
    return copy


def test_a_backup_older_than_a_collection_run_restores_without_what_it_collected(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """The backup holds a thread deleted and collected since, every device past the run: a
    restored file resyncs before it pushes (it took a new node id), so the thread is gone
    from it too instead of living on there, or coming back everywhere."""
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    copy = backed_up_then_collected(cli, relay, a, b, tmp_path / "backups")
    assert listed_accounts(relay)["ann"]["collected"] == 1
    cli.ok(a, "restore", str(copy), "--force")
    assert [r["id"] for r in cli.json_objects(a, "ls", "threads")] == ["gone", "kept"]
    cli.ok(a, "sync")
    cli.ok(b, "sync")
    for device in (a, b):
        assert [r["id"] for r in cli.json_objects(device, "ls", "threads")] == ["kept"]


@pytest.mark.slow
def test_a_whole_restore_on_a_relay_that_never_collected_pushes_what_the_backup_had_pending(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """Thread t1 was written, backed up and lost with the device before it was pushed. The
    restored file resyncs before it pushes, as every restored file does; the relay never
    collected anything, so nothing it lacks can have been collected: t1 is pushed, not set
    aside (nor is anything else)."""
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t0", '{"title": "synced"}')
    cli.ok(a, "sync")
    cli.ok(a, "put", "threads", "t1", '{"title": "not pushed before the backup"}')
    folder = tmp_path / "backups"
    cli.ok(a, "backup", "--to", str(folder))
    (copy,) = folder.glob("*.db")
    a.unlink()
    cli.ok(a, "restore", str(copy))
    cli.ok(a, "sync")
    assert cli.json(a, "aside") == []
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    assert [r["id"] for r in cli.json_objects(b, "ls", "threads")] == ["t0", "t1"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restore", "restore --merge"])
def test_a_backup_older_than_a_run_restored_after_a_wipe_brings_nothing_back(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, how: str
) -> None:
    """The backup holds `gone`, deleted and collected since; then the relay is wiped, and b
    reseeds it. The new relay never collected, but this account's history was collected on
    the old one: a file that forgot its relay (a reseed) never takes a relay's `last_run` of
    0 to cover its history, and sets what it lacks aside instead of pushing it."""
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    copy = backed_up_then_collected(cli, relay, a, b, tmp_path / "backups")
    relay.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{relay.db}{suffix}").unlink(missing_ok=True)
    relay.start()
    cli.ok(b, "sync", "--reseed")
    if how == "restore":
        cli.ok(a, "restore", str(copy), "--force")
        cli.ok(a, "login", "--trust-account")  # it finds the relay reseeded, and follows
        devices = [a, b]
    else:
        cli.ok(b, "restore", str(copy), "--merge")
        devices = [b]
    for device in [*devices, *devices]:
        cli.ok(device, "sync")
    for device in devices:
        assert [r["id"] for r in cli.json_objects(device, "ls", "threads")] == ["kept"]
    cli.ok(tmp_path / "c.db", "join", "--relay", relay.url, "--account", "ann")
    assert [r["id"] for r in cli.json_objects(tmp_path / "c.db", "ls", "threads")] == ["kept"]
