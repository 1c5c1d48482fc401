"""`Replica.version_stamp`: what names a record's versions, read without opening one, so an
app may keep what it checked of a record while the stamp stays the same."""

from __future__ import annotations

import sqlite3

import pytest

from replica.errors import DegradedError, InvalidArgumentError
from tests.conftest import FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes


def test_a_stamp_changes_with_every_write_and_merge_and_only_then(
    make_replica: ReplicaFactory,
) -> None:
    here = make_replica("here", freshness_window_s=0)  # nothing inbound held back
    there = make_replica("there")
    assert here.version_stamp("notes", "n") == ()
    here.put("notes", "n", {"text": "one"})
    first = here.version_stamp("notes", "n")
    assert len(first) == 1 and here.version_stamp("notes", "n") == first  # reads change nothing
    here.get("notes", "n")
    assert here.version_stamp("notes", "n") == first
    there.put("notes", "n", {"text": "concurrent"})
    apply(here, dirty_envelopes(there))
    merged = here.version_stamp("notes", "n")
    assert merged and merged != first  # a concurrent edit merged in
    here.delete("notes", "n")
    assert here.version_stamp("notes", "n") not in (first, merged)


def test_a_device_local_collection_has_no_stamp(make_replica: ReplicaFactory) -> None:
    with pytest.raises(InvalidArgumentError, match="device-local"):
        make_replica().version_stamp("drafts", "d")


def test_a_rolled_back_write_and_the_one_in_its_place_have_other_stamps(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica(wall_clock_ms=FakeClock())  # the same dot is drawn again
    replica.put("notes", "n", {"text": "kept"})
    inside = None
    with pytest.raises(RuntimeError), replica.batch():
        replica.put("notes", "n", {"text": "rolled back"})
        inside = replica.version_stamp("notes", "n")
        raise RuntimeError("the app's batch fails")
    replica.put("notes", "n", {"text": "in its place"})
    after = replica.version_stamp("notes", "n")
    assert inside is not None and [v[:2] for v in inside] == [v[:2] for v in after]
    assert inside != after


def test_a_degraded_record_has_no_stamp(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"text": "soon damaged"})
    with sqlite3.connect(replica.path) as db:
        ((envelope,),) = db.execute("SELECT envelope FROM versions").fetchall()
        damaged = envelope[:40] + bytes([envelope[40] ^ 1]) + envelope[41:]
        db.execute("UPDATE versions SET envelope = ?", (damaged,))
    with pytest.raises(DegradedError):
        replica.get("notes", "n")  # latched degraded
    with pytest.raises(DegradedError):
        replica.version_stamp("notes", "n")


def test_a_record_latched_degraded_with_no_version_left_has_no_stamp(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"text": "its key, latched"})
    with sqlite3.connect(replica.path) as db:
        ((key,),) = db.execute("SELECT key FROM versions").fetchall()
        db.execute("INSERT INTO degraded (key, reason) VALUES (?, 'forged')", (key,))
        db.execute("DELETE FROM versions")
    with pytest.raises(DegradedError):
        replica.get("notes", "n")
    with pytest.raises(DegradedError):
        replica.version_stamp("notes", "n")


def test_a_change_mark_stays_while_only_reads_happen_and_moves_with_any_write(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"text": "one"})
    with replica.batch():
        before = replica.change_mark()
    with replica.batch():
        replica.get("notes", "n")
        replica.scan("notes")
        assert replica.change_mark() == before
        replica.put("notes", "m", {"text": "two"})
        written = replica.change_mark()
    assert written != before
    with sqlite3.connect(replica.path) as db:  # another connection's commit: a clock tick
        db.execute("UPDATE meta SET value = value + 1 WHERE name = 'clock'")
    with replica.batch():
        assert replica.change_mark() not in (before, written)


def test_a_change_mark_is_read_inside_a_batch(make_replica: ReplicaFactory) -> None:
    with pytest.raises(InvalidArgumentError, match="inside batch"):
        make_replica().change_mark()
