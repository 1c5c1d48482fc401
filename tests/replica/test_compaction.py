"""`Replica.compact` gives a file's free pages back to the disk (replica/compaction.py):
without a key, keeping every row, and refused whole while it cannot have the file."""

from __future__ import annotations

import sqlite3

import pytest

from replica import InvalidArgumentError, Replica, StoreError
from replica.compaction import file_bytes
from tests.conftest import Account, ReplicaFactory


def test_compact_gives_the_free_pages_back_and_keeps_every_record_while_locked(
    make_replica: ReplicaFactory, account: Account
) -> None:
    replica = make_replica(freshness_window_s=0)
    for i in range(400):
        replica.put("notes", f"n{i}", {"text": "x" * 2000})
    for i in range(390):
        replica.delete("notes", f"n{i}")
    kept = {r.id: r.document for r in replica.scan("notes")}
    path = replica.path
    replica.close()
    locked = Replica.open(path)  # no key: pages are copied as they are
    before = file_bytes(path)
    compacted = locked.compact()
    assert compacted.before == before and compacted.after == file_bytes(path) < before // 4
    assert locked.status().records == 400  # the tombstones are still records
    locked.unlock_with_key(account.key)
    assert {r.id: r.document for r in locked.scan("notes")} == kept
    locked.close()


def test_compact_is_refused_inside_a_batch_and_while_another_process_writes(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica(busy_timeout_s=0.2)
    replica.put("notes", "n", {"text": "kept"})
    with pytest.raises(InvalidArgumentError, match="inside batch"), replica.batch():
        replica.compact()
    other = sqlite3.connect(replica.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError, match="could not compact") as refused:
        replica.compact()
    assert refused.value.hint is not None and "other processes" in refused.value.hint
    other.execute("ROLLBACK")
    other.close()
    assert replica.get("notes", "n") is not None
    assert replica.compact().after <= file_bytes(replica.path)


def auto_vacuum(path: object) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("PRAGMA auto_vacuum").fetchone()[0])


def test_a_new_file_vacuums_incrementally_and_compact_converts_an_older_one(
    make_replica: ReplicaFactory, account: Account
) -> None:
    """A file made before incremental auto-vacuum (mode 0) keeps freed pages until
    `compact`, which converts it; a new file gives them back as a run collects."""
    replica = make_replica()
    replica.put("notes", "n", {"text": "kept"})
    path = replica.path
    replica.close()
    assert auto_vacuum(path) == 2  # incremental
    with sqlite3.connect(path, isolation_level=None) as db:  # laid out as older files were
        db.execute("PRAGMA auto_vacuum=NONE")
        db.execute("VACUUM")
    assert auto_vacuum(path) == 0
    with Replica.open(path) as older:
        older.compact()
        older.unlock_with_key(account.key)
        assert older.get("notes", "n").document == {"text": "kept"}  # type: ignore[union-attr]
    assert auto_vacuum(path) == 2
