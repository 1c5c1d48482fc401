"""Relay rollback through the command line against a real relay process (docs/architecture.md §8.4,
specs/protocol.md §4.6): the relay's database wiped in one run and restored from an older copy
in another. A device finds it and stops (`error:` + `hint:` naming `--reseed`, the replica
unchanged); `sync --reseed` gives the relay back its full state — registering the account
again when the relay lost it; the other devices follow on their next sync (after `login` when
their tokens went with the relay); a device that joins afterwards gets everything; no device
loses anything, written before the rollback or after it and not yet pushed."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from clients.cli import main
from clients.device import load_settings, sidecar_path
from replica import Replica
from tests.clients.test_cli import PASSPHRASE, Cli, assert_user_error, dump, listed_accounts
from tests.relay.server import RelayProcess

DB_FILES = ("", "-wal", "-shm")
WRITES = {
    "a": [("threads", "t1", '{"title": "from a", "message_count": 1}'),
          ("messages", "m1", '{"text": "hello"}'), ("messages", "m2", '{"text": "to delete"}')],
    "b": [("threads", "t1", '{"title": "from b", "message_count": 2}'),
          ("messages", "m3", '{"text": "from b"}')],
}  # fmt: skip
"""Written and synced before the rollback: t1 is a concurrent edit (two siblings)."""


def contents(path: Path) -> list[tuple[Any, ...]]:
    """Every thread and message the replica holds: tombstones and siblings included."""
    with Replica.open(path) as replica:
        replica.unlock(PASSPHRASE)
        return [
            (collection, r.id, r.document, r.deleted, r.hlc, r.node,
             sorted((v.hlc, v.node, v.deleted, str(v.document)) for v in r.conflicts))
            for collection in ("threads", "messages")
            for r in replica.scan(collection, include_deleted=True)
        ]  # fmt: skip


def ids(path: Path) -> set[str]:
    return {row[1] for row in contents(path) if not row[3]}


def start_fleet(cli: Cli, relay: RelayProcess, a: Path, b: Path) -> str:
    """Device a makes the account, b joins; both write, and sync until they agree. Returns
    the recovery key."""
    created = cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    for name, path in (("a", a), ("b", b)):
        for collection, id, doc in WRITES[name]:
            cli.ok(path, "put", collection, id, doc)
    cli.ok(a, "rm", "messages", "m2")
    for path in (a, b, a):
        cli.ok(path, "sync")
    return created.stdout.splitlines()[-1]


def login_with_recovery_key(cli: Cli, replica: Path, recovery_key: str, *flags: str) -> Result:
    env = {"SEALSYNC_RECOVERY_KEY": recovery_key, "XDG_CONFIG_HOME": str(cli.home / "config")}
    args = ["--replica", str(replica), "login", "--recovery-key", *flags]
    return cli.runner.invoke(main, args, env=env)


def copy_database(source: Path, target: Path) -> None:
    """The relay's SQLite files as they are on disk (the relay stopped): what an operator's
    file backup holds. Stale -wal/-shm files of the target go first."""
    for suffix in DB_FILES:
        Path(f"{target}{suffix}").unlink(missing_ok=True)
        if Path(f"{source}{suffix}").exists():
            shutil.copy(f"{source}{suffix}", f"{target}{suffix}")


def assert_all_equal(*paths: Path) -> list[tuple[Any, ...]]:
    first = contents(paths[0])
    for path in paths[1:]:
        assert contents(path) == first, path
    return first


@pytest.mark.slow
def test_a_wiped_relay_is_found_reseeded_followed_and_joined_with_nothing_lost(
    cli: Cli, tmp_path: Path
) -> None:
    a, b, c = (tmp_path / f"{name}.db" for name in "abc")
    db = tmp_path / "relay.db"
    with RelayProcess(db, tmp_path / "relay.log") as relay:
        recovery_key = start_fleet(cli, relay, a, b)
        synced = assert_all_equal(a, b)
        cli.ok(a, "put", "messages", "m4", '{"text": "a, not pushed before the wipe"}')
        cli.ok(b, "put", "messages", "m5", '{"text": "b, not pushed before the wipe"}')

        relay.stop()
        for suffix in DB_FILES:
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        relay.start()

        before = dump(a)
        found = cli(a, "sync", "--retry-for", "1")
        assert_user_error(found, "does not have account 'ann'", "sync --reseed", "--invite")
        wrong = cli(a, "sync", "--reseed", passphrase="not the passphrase")
        assert_user_error(wrong, "does not unlock")
        assert dump(a) == before  # and the relay still lacks the account:
        assert_user_error(cli(a, "sync", "--retry-for", "1"), "does not have account")
        sidecar = sidecar_path(a).read_bytes()
        assert_user_error(cli(a, "login"), "does not take this device's secret", "--reseed")
        assert sidecar_path(a).read_bytes() == sidecar and dump(a) == before

        reseeded = cli.ok(a, "sync", "--reseed")
        assert "registered it again" in reseeded.stdout
        session_a = load_settings(a).session
        assert session_a is not None and session_a.access_token not in reseeded.output

        before = dump(b)
        lost = cli(b, "sync", "--retry-for", "1")
        assert_user_error(lost, "does not take this device's session", "sealsync login")
        assert dump(b) == before
        sidecar = sidecar_path(b).read_bytes()
        typo = ("B" if recovery_key[0] == "A" else "A") + recovery_key[1:]
        mistyped = login_with_recovery_key(cli, b, typo)
        assert_user_error(mistyped, "recovery key")
        assert sidecar_path(b).read_bytes() == sidecar and dump(b) == before
        # a registered the account again: b cannot tell it from a revoked device that kept
        # the keys, and asks the person first
        asked = login_with_recovery_key(cli, b, recovery_key)
        assert_user_error(asked, "registered account 'ann' again", "--trust-account")
        assert dump(b) == before
        logged_in = login_with_recovery_key(cli, b, recovery_key, "--trust-account")
        assert logged_in.exit_code == 0, logged_in.output
        assert "logged in" in logged_in.stdout and "was reseeded" in logged_in.stderr
        cli.ok(b, "sync")  # follows the new account on its own: pushes everything it holds
        cli.ok(a, "sync")
        cli.ok(c, "join", "--relay", relay.url, "--account", "ann")

        final = assert_all_equal(a, b, c)
    assert [row for row in synced if row not in final] == []  # siblings, tombstone included
    assert ids(c) == {"t1", "m1", "m3", "m4", "m5"}
    assert any(row[1] == "t1" and len(row[6]) == 1 for row in final)


@pytest.mark.slow
def test_a_relay_restored_from_an_older_copy_is_found_reseeded_and_followed(
    cli: Cli, tmp_path: Path
) -> None:
    a, b, c, d = (tmp_path / f"{name}.db" for name in "abcd")
    db, older = tmp_path / "relay.db", tmp_path / "older" / "relay.db"
    older.parent.mkdir()
    with RelayProcess(db, tmp_path / "relay.log") as relay:
        start_fleet(cli, relay, a, b)
        relay.stop()
        copy_database(db, older)
        relay.start()
        cli.ok(a, "put", "messages", "m4", '{"text": "a, pushed after the copy"}')
        cli.ok(a, "sync")
        cli.ok(b, "put", "messages", "m5", '{"text": "b, pushed after the copy"}')
        cli.ok(b, "sync")
        cli.ok(a, "sync")
        synced = assert_all_equal(a, b)
        backup = cli.ok(b, "backup", "--to", str(tmp_path / "backups"))
        (backup_file,) = (tmp_path / "backups").glob("*.db")
        assert str(backup_file) in backup.stdout.replace("\n", "")

        relay.stop()
        copy_database(older, db)
        relay.start()

        before = dump(a)
        found = cli(a, "sync", "--retry-for", "1")
        assert_user_error(found, "restored from an older copy", "sync --reseed")
        assert dump(a) == before
        cli.ok(a, "sync", "--reseed")
        cli.ok(b, "sync")  # sees the new epoch and reseeds on its own
        cli.ok(a, "sync")

        # a replica restored from a backup at a new path has no relay settings: `login`
        cli.ok(d, "restore", str(backup_file))
        assert_user_error(cli(d, "sync"), "no relay settings", "sealsync login")
        assert_user_error(cli(d, "login"), "no relay settings", "--relay")
        wrong = cli(d, "login", "--relay", relay.url, "--account", "ann", passphrase="wrong")
        assert_user_error(wrong, "does not unlock")
        assert not sidecar_path(d).exists()
        logged_in = cli.ok(d, "login", "--relay", relay.url, "--account", "ann")
        assert "was reseeded" in logged_in.stderr
        cli.ok(d, "sync")
        cli.ok(c, "join", "--relay", relay.url, "--account", "ann")

        final = assert_all_equal(a, b, c, d)
    assert [row for row in synced if row not in final] == []
    assert ids(c) == {"t1", "m1", "m3", "m4", "m5"}


DAY_MS = 24 * 3600 * 1000


def age(db: Path, table: str, columns: str, where: str, days: int) -> None:
    """Move `columns` of `table`'s rows matching `where` `days` back in time: what that long
    away leaves in a relay's database or a replica's meta."""
    with sqlite3.connect(db) as conn:
        moved = ", ".join(f"{column} = {column} - {days * DAY_MS}" for column in columns.split())
        assert conn.execute(f"UPDATE {table} SET {moved} WHERE {where}").rowcount == 1


@pytest.mark.slow
@pytest.mark.parametrize("way_back", ["sync --adopt", "login"])
def test_a_device_away_past_the_horizon_adopts_a_wiped_relay_instead_of_bringing_back(
    cli: Cli, tmp_path: Path, way_back: str
) -> None:
    """Device b was away 100 days, past the relay's tombstone horizon (90), while a deleted
    thread `gone` and a run collected it without b. The relay is then wiped and a reseeds
    it. b still holds `gone`: its `sync --reseed` is refused before anything is sent (it
    would bring `gone` back everywhere), as is an adoption before any device reseeded;
    then `sync --adopt`, or a `login` that finds the relay reseeded, takes the relay as it
    is, and `gone` is set aside there, not pushed."""
    a, b, c = (tmp_path / f"{name}.db" for name in "abc")
    db = tmp_path / "relay.db"
    with RelayProcess(db, tmp_path / "relay.log") as relay:
        cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
        cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
        cli.ok(a, "put", "threads", "kept", '{"title": "kept"}')
        cli.ok(a, "put", "threads", "gone", '{"title": "deleted while b was away"}')
        cli.ok(a, "sync")
        cli.ok(b, "sync")
        session_b = load_settings(b).session
        assert session_b is not None
        age(db, "devices", "ack_ms created_ms", f"id = '{session_b.device_id}'", 100)
        age(b, "meta", "value", "name = 'acked_ms'", 100)
        cli.ok(a, "rm", "threads", "gone")
        collect = ["relay", "collect", "--db", str(db), "--horizon-days", "90", "--json"]
        for run in range(2):  # a run, then its release once a passed it
            cli.ok(a, "sync")
            if run == 1:  # a acked the run, b did not: runs wait for b, unless left out
                session_a = load_settings(a).session
                assert session_a is not None
                waits_for = listed_accounts(relay)["ann"]["held_back_by"]
                assert waits_for == session_b.device_id
                horizon = listed_accounts(relay, "--horizon-days", "90")["ann"]["held_back_by"]
                runs_own = listed_accounts(relay, env={"SEALSYNC_RELAY_COLLECT": "true"})
                assert horizon == runs_own["ann"]["held_back_by"] == session_a.device_id
            assert cli.runner.invoke(main, collect).exit_code == 0
        cli.ok(a, "sync")

        relay.stop()
        for suffix in DB_FILES:
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        relay.start()
        before = dump(b)
        nothing = cli(b, "sync", "--adopt")  # no device reseeded the relay yet
        assert_user_error(nothing, "nothing to adopt", "sync --reseed")
        refused = cli(b, "sync", "--reseed")
        assert_user_error(refused, "beyond the relay's tombstone horizon", "--adopt")
        assert dump(b) == before  # and the relay was left without the account:
        assert "registered it again" in cli.ok(a, "sync", "--reseed").stdout
        if way_back == "login":
            logged_in = cli.ok(b, "login", "--trust-account")
            assert "sets aside (see `sealsync aside`) what the relay lacks" in logged_in.stderr
            cli.ok(b, "sync")
        else:
            cli.ok(b, "sync", "--adopt", "--trust-account")
        cli.ok(a, "sync")
        cli.ok(c, "join", "--relay", relay.url, "--account", "ann")
        for device in (a, b, c):
            assert sorted(ids(device)) == ["kept"], device
        assert [v["id"] for v in cli.json_objects(b, "aside")] == ["gone"]


@pytest.mark.slow
def test_a_relay_restored_from_a_copy_older_than_a_collection_run_is_not_reseeded_onto(
    cli: Cli, tmp_path: Path
) -> None:
    """The relay's copy was taken while thread `gone` was live; `gone` was then deleted and a
    run collected its tombstone, which a and b applied. Restored from that copy, the relay
    holds `gone` live again, and a device joining it gets it and pushes there, lifting the
    copy's head past the run's seq (its pages still say it never ran one). a says so, and
    its `sync --reseed` and `sync --adopt` are refused: either would bring `gone` back
    everywhere. The operator's way out keeps `gone` gone: the account deleted, a recently
    synced device reseeds it, and the device that synced with the copy adopts the relay,
    setting aside what it had from the copy."""
    a, b, c, late = (tmp_path / f"{name}.db" for name in ("a", "b", "c", "late"))
    db, older = tmp_path / "relay.db", tmp_path / "older" / "relay.db"
    older.parent.mkdir()
    with RelayProcess(db, tmp_path / "relay.log") as relay:
        cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
        cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
        cli.ok(a, "put", "threads", "kept", '{"title": "kept"}')
        cli.ok(a, "put", "threads", "gone", '{"title": "deleted after the copy"}')
        for path in (a, b):
            cli.ok(path, "sync")
        relay.stop()
        copy_database(db, older)
        relay.start()
        cli.ok(a, "rm", "threads", "gone")
        collect = ["relay", "collect", "--db", str(db), "--horizon-days", "90", "--json"]
        for _ in range(2):  # both devices ack the tombstone; the run; both apply its markers
            for path in (a, b):
                cli.ok(path, "sync")
            assert cli.runner.invoke(main, collect).exit_code == 0
        for i in range(6):
            cli.ok(a, "put", "threads", f"later{i}", '{"title": "after the run"}')
        for path in (a, b):
            cli.ok(path, "sync")
        assert "gone" not in {row[1] for row in contents(a) + contents(b)}

        relay.stop()
        copy_database(older, db)
        relay.start()
        cli.ok(late, "join", "--relay", relay.url, "--account", "ann")
        assert ids(late) == {"kept", "gone"}  # what the copy holds
        for i in range(3):
            cli.ok(late, "put", "threads", f"new{i}", '{"title": "on the copy"}')
        cli.ok(late, "sync")
        before = dump(a)
        found = cli(a, "sync", "--retry-for", "1")
        assert_user_error(found, "older than that run", "relay accounts --delete", "--adopt")
        for way_back in ("--reseed", "--adopt"):
            refused = cli(a, "sync", way_back)
            assert_user_error(refused, "bring that back", "--allow-resurrection")
        assert dump(a) == before

        deleted = ["relay", "accounts", "--db", str(db), "--delete", "ann", "--yes"]
        assert cli.runner.invoke(main, deleted).exit_code == 0
        assert "registered it again" in cli.ok(a, "sync", "--reseed").stdout
        cli.ok(b, "login", "--trust-account")
        cli.ok(late, "sync", "--adopt", "--trust-account")
        for path in (b, late, a):
            cli.ok(path, "sync")
        cli.ok(c, "join", "--relay", relay.url, "--account", "ann")
        for device in (a, b, c, late):
            assert ids(device) == {"kept"} | {f"later{i}" for i in range(6)}, device
        aside = {v["id"] for v in cli.json_objects(late, "aside")}
        assert aside == {"gone", "new0", "new1", "new2"}
