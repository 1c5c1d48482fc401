"""Every stored version says whether it is a tombstone (`versions.tomb`, format 10), so
what deleting keeps is counted without a key, and a tombstone can later be collected
without opening anything (docs/tombstone-collection.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from replica import Replica
from replica import tombs as tombs_module
from tests.conftest import Account, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes, tomb_mismatches, undo_format_10


def tomb_column(path: Path) -> dict[int, int]:
    """Row id → `tomb` (-1 for NULL)."""
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT id, coalesce(tomb, -1) FROM versions").fetchall())


def test_writes_merges_and_conflicts_store_the_deleted_flag_with_each_version(
    make_replica: ReplicaFactory,
) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    for i in range(4):
        a.put("notes", f"n{i}", {"i": i})
    a.delete("notes", "n0")
    a.delete("notes", "n1")
    a.put("notes", "n1", {"back": True})  # revived over its tombstone: one live row again
    apply(b, dirty_envelopes(a))
    b.put("notes", "n2", {"edited on": "b"})  # concurrent with a's delete below
    a.delete("notes", "n2")
    apply(b, dirty_envelopes(a))
    apply(a, dirty_envelopes(b))
    for replica in (a, b):
        assert tomb_mismatches(replica) == []
        assert sorted(tomb_column(replica.path).values()) == [0, 0, 0, 1, 1], replica.path
        status = replica.status()
        assert status.tombstones == 2 and status.unclassified == 0
        assert status.conflicts == 1  # n2: b's edit and a's delete, both kept


def test_status_counts_tombstones_and_their_bytes_while_locked(
    make_replica: ReplicaFactory, account: Account
) -> None:
    replica = make_replica()
    for i in range(5):
        replica.put("notes", f"n{i}", {"text": "x" * 500})
    for i in range(3):
        replica.delete("notes", f"n{i}")
    path = replica.path
    replica.close()
    with sqlite3.connect(path) as db:
        (expected,) = db.execute(
            "SELECT sum(length(envelope)) FROM versions WHERE tomb = 1"
        ).fetchone()
    locked = Replica.open(path)
    try:
        status = locked.status()
        assert status.locked and status.tombstones == 3 and status.tombstone_bytes == expected
        assert 0 < expected < 3 * 500  # a tombstone keeps no document
    finally:
        locked.close()


def as_format_9(path: Path, damaged: int | None = None) -> None:
    """Lay the file out as format 9 did (no `tomb` column), damaging row `damaged`."""
    with sqlite3.connect(path) as db:
        undo_format_10(db)
        if damaged is not None:
            (envelope,) = db.execute(
                "SELECT envelope FROM versions WHERE id = ?", (damaged,)
            ).fetchone()
            broken = envelope[:-20] + bytes([envelope[-20] ^ 1]) + envelope[-19:]
            db.execute("UPDATE versions SET envelope = ? WHERE id = ?", (broken, damaged))
        db.execute("PRAGMA user_version=9")


def test_a_file_of_format_9_learns_its_tombstones_at_its_next_unlock(
    make_replica: ReplicaFactory, account: Account, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk by chunk (3 rows here), past an unreadable row, which stays unclassified and
    never refuses the unlock; repair then quarantines it."""
    monkeypatch.setattr(tombs_module, "CHUNK_ROWS", 3)
    replica = make_replica()
    for i in range(10):
        replica.put("notes", f"n{i}", {"i": i})
    for i in range(0, 10, 3):
        replica.delete("notes", f"n{i}")
    dirty_envelopes(replica)  # pushed, by a protocol that could not say which are tombstones
    path = replica.path
    replica.close()
    damaged = 5  # n4's row: a live note
    as_format_9(path, damaged)

    upgraded = Replica.open(path)
    try:
        status = upgraded.status()
        assert (status.tombstones, status.unclassified) == (0, 10)
        upgraded.unlock_with_key(account.key)
        status = upgraded.status()
        assert (status.tombstones, status.unclassified) == (4, 1)
        assert status.dirty == 4  # the tombstones go once more, to be declared
        assert tomb_column(path)[damaged] == -1
        upgraded.repair()
        assert upgraded.status().unclassified == 0
        assert tomb_mismatches(upgraded) == []
    finally:
        upgraded.close()
    with sqlite3.connect(path) as db:  # the partial index is empty once all are known
        assert db.execute("SELECT count(*) FROM versions WHERE tomb IS NULL").fetchone() == (0,)
