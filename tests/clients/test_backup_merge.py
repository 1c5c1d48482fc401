"""A backup merged into a live replica (`restore --merge`, replica/restore.py): as if pulled,
so nothing newer is replaced, concurrent edits become siblings, a second merge changes
nothing, what the backup's device had not pushed is pushed from here, a damaged envelope is
quarantined as a pulled one would be, and another account's backup is refused unwritten."""

from __future__ import annotations

import datetime
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from clients.backup import backup_replica, forget_backups, merge_backup_into
from clients.manifest import read_manifest
from clients.retention import KeepPolicy
from clients.verify import verify_backup
from replica import Replica
from replica.errors import InvalidArgumentError, StoreError
from tests.clients.test_backup_verify import _change_an_envelope, rewrite_manifest
from tests.clients.test_cli import Cli, dump
from tests.conftest import SCHEMA, FakeClock, ReplicaFactory


def assert_refused_unchanged(
    live: Replica, backup: Path, refusal: str, *, unverified: bool = False
) -> None:
    """Merging `backup` into `live` is refused with `refusal`, and the file is unchanged."""
    before = dump(live.path)
    with pytest.raises(StoreError, match=refusal):
        merge_backup_into(live, backup, unverified=unverified)
    assert dump(live.path) == before


def backup_of(replica: Replica, folder: Path) -> Path:
    return backup_replica(replica.path, folder, datetime.datetime.now(datetime.UTC))


def test_a_merge_keeps_what_is_newer_and_makes_concurrent_edits_siblings(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    clock = FakeClock()
    source, live = make_replica("source"), make_replica("live", wall_clock_ms=clock)
    for n in range(30):
        source.put("notes", f"n{n}", {"text": f"from the backup {n}"})
    source.put("drafts", "d", {"text": "this device's alone"})
    backup = backup_of(source, tmp_path / "set")
    live.put("notes", "n1", {"text": "written here, never synced"})  # concurrent with n1
    merged, verdict = merge_backup_into(live, backup)
    assert verdict.state == "ok" and merged.read == 30 and merged.merged == 29
    assert merged.held == {"lock": 1}  # n1 was just edited here: its freshness lock holds
    assert live.get("notes", "n7").document == {"text": "from the backup 7"}  # type: ignore[union-attr]
    assert live.get("notes", "n1").document == {"text": "written here, never synced"}  # type: ignore[union-attr]
    assert live.get("drafts", "d") is None  # a backup carries no device-local record
    assert live.status().dirty == 30  # the backup's device never pushed them: this one will
    clock.advance(11_000)  # past the freshness window (10 s)
    live.release_due()
    assert len(live.conflicts("notes", "n1")) == 1  # concurrent edits: both kept
    live.put("notes", "n2", {"text": "edited after the merge"})
    again, _ = merge_backup_into(live, backup)
    assert (again.merged, again.superseded) == (0, 30)  # nothing twice
    assert live.get("notes", "n2").document == {"text": "edited after the merge"}  # type: ignore[union-attr]


def test_a_merge_takes_only_the_profile_or_collection_asked(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    source, live = make_replica("source"), make_replica("live")
    source.create_profile("work")
    live.create_profile("work")  # without a profile, a collection is merged in those known here
    for profile in ("default", "work"):
        source.put("notes", "n", {"text": profile}, profile=profile)
        source.put("threads", "t", {"title": profile}, profile=profile)
    backup = backup_of(source, tmp_path / "set")
    merged, _ = merge_backup_into(live, backup, profile="work", collection="notes")
    assert merged.merged == 1
    assert live.get("notes", "n", profile="work").document == {"text": "work"}  # type: ignore[union-attr]
    assert live.get("notes", "n") is None and live.get("threads", "t", profile="work") is None
    merged, _ = merge_backup_into(live, backup, collection="threads")  # every profile's
    assert merged.merged == 2
    with pytest.raises(InvalidArgumentError, match="not declared"):
        merge_backup_into(live, backup, collection="no such collection")


def test_another_accounts_backup_is_refused_and_nothing_is_written(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    other.put("notes", "n", {"text": "not yours"})
    backup = backup_of(other, tmp_path / "set")
    other.close()
    live = make_replica("live")
    live.put("notes", "mine", {"text": "kept"})
    assert_refused_unchanged(live, backup, "another account's backup")


def test_a_planted_envelope_is_quarantined_like_a_pulled_one(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    """A backup whose manifest was written again to pass `verify` still goes through every
    check a pulled version does: the changed envelope is quarantined, the rest merged."""
    source, live = make_replica("source"), make_replica("live")
    for n in range(10):
        source.put("notes", f"n{n}", {"text": f"{n}"})
    backup = backup_of(source, tmp_path / "set")
    source.close()
    _change_an_envelope(backup)
    rewrite_manifest(backup)
    live.close()
    result = cli(live.path, "restore", str(backup), "--merge")
    assert result.exit_code == 3, result.output
    assert "10 versions read, 9 merged" in result.stdout and "1 quarantined" in result.stdout
    assert "sealsync diagnose" in result.stderr


def test_restore_merge_on_the_command_line(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    source, live = make_replica("source"), make_replica("live")
    source.put("notes", "n", {"text": "from the backup"})
    backup = backup_of(source, tmp_path / "set")
    live.close()
    merged = cli.ok(live.path, "restore", str(backup), "--merge", "--collection", "notes")
    assert "1 versions read, 1 merged" in merged.stdout
    assert cli.json_object(live.path, "get", "notes", "n")["doc"] == {"text": "from the backup"}
    for wrong in (("--merge", "--force"), ("--profile", "work")):
        result = cli(live.path, "restore", str(backup), *wrong)
        assert result.exit_code == 2, result.output
    exists = cli(live.path, "restore", str(backup))
    assert exists.exit_code == 1 and "--merge" in exists.stderr


def test_a_profile_backup_holds_that_profile_only_and_keeps_its_name_out(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    source, live = make_replica("source"), make_replica("live")
    source.create_profile("Private Diary")
    source.put("notes", "mine", {"text": "private"}, profile="Private Diary")
    source.put("notes", "shared", {"text": "everyone's"})
    source.close()
    folder = tmp_path / "set"
    done = cli.ok(source.path, "backup", "--to", str(folder), "--profile", "Private Diary")
    (backup,) = folder.glob("*-profile-*.db")
    assert str(backup) in done.stdout and "Diary" not in backup.read_bytes().decode("latin-1")
    assert verify_backup(backup).state == "ok"
    manifest = read_manifest(backup.with_suffix(".json"))
    assert manifest.scope.startswith("profile-") and manifest.rows["versions"] == 2  # + its entry
    cli.ok(source.path, "backup", "--to", str(folder))  # all profiles: a group of its own
    forgot = forget_backups(folder, KeepPolicy(last=1), dry_run=True)
    assert forgot.removed == [] and len(forgot.kept) == 2
    merged, _ = merge_backup_into(live, backup)  # the profile's own entry comes with it
    assert merged.merged == 2 and live.get("notes", "shared") is None
    assert "Private Diary" in live.profiles()
    assert live.get("notes", "mine", profile="Private Diary") is not None
    with closing(sqlite3.connect(backup)) as db:  # restored in place, it pulls the rest again
        assert db.execute("SELECT count(*) FROM meta WHERE name = 'cursor'").fetchone() == (0,)
    missing = cli(source.path, "backup", "--to", str(folder), "--profile", "nobody")
    assert missing.exit_code == 1 and "no profile 'nobody'" in missing.stderr


def _plant(backup: Path, statement: str, *args: object) -> None:
    """Change the backup's rows, then write its manifest again to match."""
    with closing(sqlite3.connect(backup)) as db, db:
        db.execute(statement, args)
    rewrite_manifest(backup)


def test_a_held_row_of_the_wrong_type_is_damage_and_nothing_is_merged(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    source, live = make_replica("source"), make_replica("live")
    source.put("notes", "n", {"text": "from the backup"})
    backup = backup_of(source, tmp_path / "set")
    _plant(
        backup,
        "INSERT INTO held (key, node, hlc, digest, envelope, reason) "
        "VALUES (?, 1, 1, x'00', 'not an envelope', 'drift')",
        b"k" * 16,
    )
    assert verify_backup(backup).problems == ("held holds 1 row(s) of the wrong types",)
    assert_refused_unchanged(live, backup, "wrong types", unverified=True)


def test_another_accounts_held_rows_are_refused_too(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    other.put("notes", "n", {"text": "not yours"})
    backup = backup_of(other, tmp_path / "set")
    other.close()
    _plant(
        backup,
        "INSERT INTO held (key, node, hlc, digest, envelope, reason, scope) SELECT key, node,"
        " hlc, x'00', envelope, 'collection', scope FROM versions WHERE ? = 1",
        1,
    )
    _plant(backup, "DELETE FROM versions WHERE ? = 1", 1)
    live = make_replica("live")
    assert_refused_unchanged(live, backup, "another account's backup")


def test_a_whole_restore_over_a_replica_refuses_another_accounts_backup(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    other.put("notes", "n", {"text": "not yours"})
    theirs = backup_of(other, tmp_path / "theirs")
    other.close()
    mine = make_replica("mine")
    mine.put("notes", "kept", {"text": "mine"})
    ours = backup_of(mine, tmp_path / "ours")
    mine.close()
    before = dump(mine.path)
    refused = cli(mine.path, "restore", str(theirs), "--force")
    assert refused.exit_code == 1 and "another account's backup" in refused.stderr
    assert dump(mine.path) == before
    cli.ok(mine.path, "restore", str(ours), "--force")  # this account's: replaced as asked
    assert cli.json_object(mine.path, "get", "notes", "kept")["doc"] == {"text": "mine"}
