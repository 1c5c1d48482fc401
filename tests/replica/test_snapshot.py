"""Backups of a replica file: whole, taken while locked, and without device-local records."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from replica import Replica, StoreError, backup_replica_file, copy_replica_file
from tests.conftest import Account, ReplicaFactory


def local_envelopes(path: Path) -> list[bytes]:
    with closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT envelope FROM local")]


def test_a_backup_of_a_locked_replica_keeps_shared_records_and_drops_local_ones(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    replica = make_replica()
    for n in range(200):
        replica.put("threads", f"t{n}", {"title": f"thread {n}", "message_count": n})
    replica.put("drafts", "d1", {"text": "half-typed, this device only " * 20})
    source = replica.path
    drafts = local_envelopes(source)
    assert len(drafts) == 1
    replica.lock()

    reports: list[tuple[int, int]] = []
    target = tmp_path / "backup.db"
    target.touch()
    backup_replica_file(source, target, progress=lambda done, total: reports.append((done, total)))

    assert reports and reports[-1][0] == reports[-1][1] > 0
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    data = target.read_bytes()
    assert not any(envelope in data for envelope in drafts)  # overwritten, not just unlinked
    with closing(sqlite3.connect(target)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    with Replica.open(target) as restored:
        restored.unlock_with_key(account.key)
        assert len(restored.scan("threads")) == 200
        assert restored.get("drafts", "d1") is None
    replica.unlock_with_key(account.key)
    assert replica.get("drafts", "d1") is not None  # the source keeps its drafts


def test_a_copy_keeps_everything_and_refuses_what_is_not_sqlite(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    replica = make_replica()
    replica.put("drafts", "d1", {"text": "kept by a plain copy"})
    target = tmp_path / "copy.db"
    copy_replica_file(replica.path, target, read_only=True)
    with Replica.open(target) as copy:
        copy.unlock_with_key(account.key)
        assert copy.get("drafts", "d1") is not None

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 500)
    with pytest.raises(StoreError, match="could not be copied"):
        copy_replica_file(junk, tmp_path / "junk-copy.db", read_only=True)
    with pytest.raises(StoreError):
        backup_replica_file(junk, tmp_path / "junk-backup.db")
