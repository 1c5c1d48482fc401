"""A full resync never brings back what a collection took, and never drops what the relay
still has (replica/resync.py, specs/replica.md §2): the paths a review found, step by step,
on the memory relay of `tests/replica/test_collection.py`'s machine."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from relay.errors import ResyncRequiredError
from relay.signing import Pusher
from replica import (
    RESYNC_LEASE,
    LeaseBusyError,
    Replica,
    SyncSession,
    backup_replica_file,
    restore,
)
from tests.replica.helpers import undo_format_12
from tests.replica.test_collection import DAY_MS, HORIZON_MS, NAME, REPLICAS, CollectionMachine


def sync(machine: CollectionMachine, *devices: int) -> None:
    for device in devices:
        machine.sync(device, lose_answer=False, mode="next")


def run_and_release(machine: CollectionMachine, *devices: int) -> None:
    """A run, then its release, every device in `devices` syncing before each."""
    for _ in range(2):
        sync(machine, *devices, *devices)
        machine.collect()
    assert machine.collected and not machine.relay._account(NAME).runs.seqs


def leave_d2_out(machine: CollectionMachine) -> None:
    """Device 2 falls silent past the horizon; the others sync on."""
    machine.advance(HORIZON_MS + DAY_MS)
    sync(machine, 0, 1)


def flag_d2(machine: CollectionMachine) -> None:
    """Device 2 left out, then a run (of record x, written and deleted meanwhile) flags it."""
    leave_d2_out(machine)
    machine.put(0, "x", 1)
    sync(machine, 0)
    machine.delete(0, "x")
    sync(machine, 0, 1, 0, 1)
    machine.collect()
    assert "d2" in machine.relay._account(NAME).runs.resync


def test_a_whole_restore_never_pushes_what_its_device_pushed_after_the_backup(
    tmp_path: Path,
) -> None:
    """Record b was written and backed up before its push; then pushed, deleted elsewhere,
    collected and released. The restored file holds b dirty, above the backup's mark of
    what was offered: written under the old node id, it is set aside, not pushed."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        sync(machine, *range(REPLICAS))
        machine.put(2, "c", 3)
        sync(machine, 2)  # the mark of what was offered is set
        machine.put(2, "b", 2)
        backup = tmp_path / "d2-backup.db"
        backup_replica_file(machine.devices[2].path, backup)
        sync(machine, 2, 1)
        machine.delete(1, "b")
        run_and_release(machine, 2, 1, 0)
        device = machine.devices[2]
        device.replica.close()
        shutil.copy(backup, device.path)
        device.reopen()
        device.replica.take_new_node_id()  # what `restore` does
        device.session.sign_above(1_000)
        sync(machine, 2, 2, 0)
        assert device.replica.get("notes", "b") is None
        assert [v.id for v in device.replica.set_aside()] == ["b"]
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
        machine.quiesce_and_compare()
        device.session.reseed()  # pushes everything it holds, but not what it set aside
        sync(machine, 2, 0)
        assert machine.devices[0].replica.get("notes", "b") is None
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
    finally:
        machine.teardown()


def test_a_reseed_before_a_resync_pushes_nothing_another_device_wrote(tmp_path: Path) -> None:
    """A reseed marks every version, pulled ones too, to be pushed; the resync that follows
    sets aside what another node wrote and the relay no longer has."""
    machine = CollectionMachine()
    try:
        machine.put(2, "own", 1)
        sync(machine, 2, 0, 1, 2)
        machine.put(0, "p", 1)
        sync(machine, 0, 1, 2)
        leave_d2_out(machine)
        machine.delete(0, "p")
        run_and_release(machine, 0, 1)
        assert "d2" in machine.relay._account(NAME).runs.resync
        machine.devices[2].session.reseed()  # an epoch change met at the start of its round
        sync(machine, 2, 2, 0)
        assert machine.devices[2].replica.get("notes", "p") is None
        assert machine.devices[0].replica.get("notes", "p") is None
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
    finally:
        machine.teardown()


def test_a_resync_overtaken_by_a_run_past_its_grace_begins_again() -> None:
    """Device 2 pulled p in the first page of its resync, then slept past the grace; p was
    deleted and collected meanwhile. Its ending ack is refused, and the resync it then
    begins again drops p."""
    machine = CollectionMachine()
    try:
        machine.put(0, "p", 1)
        for i in range(6):
            machine.put(0, f"r{i}", i)
        sync(machine, 0, 1, 2)
        flag_d2(machine)
        device = machine.devices[2]
        device.session.begin_resync()
        page = machine.relay.pull(NAME, 0, device_id=device.id, resync=True)
        device.session.apply_page(page)  # p is on it
        machine.advance(DAY_MS + 3_600_000)
        machine.delete(0, "p")
        sync(machine, 0, 1, 0, 1)
        machine.collect()
        while page.has_more:
            page = machine.relay.pull(NAME, device.session.cursor, device_id="d2", resync=True)
            device.session.apply_page(page)
        assert device.session.finish_resync() is not None
        with pytest.raises(ResyncRequiredError):
            device.ack()  # a run overtook it
        sync(machine, 2)  # so it begins again
        assert "d2" not in machine.relay._account(NAME).runs.resync
        assert device.replica.get("notes", "p") is None
        machine.a_device_past_a_run_holds_nothing_it_covered()
        machine.quiesce_and_compare()
    finally:
        machine.teardown()


def test_a_resync_another_process_overtook_changes_nothing_and_begins_again() -> None:
    """Two processes of one file resync at once (the driver's lease prevents it; this is
    what the session does without it): the one whose pages another's pull overtook drops
    nothing the relay still has."""
    machine = CollectionMachine()
    try:
        for i in range(9):
            machine.put(0, f"r{i}", i)
        sync(machine, *range(REPLICAS))
        flag_d2(machine)
        device = machine.devices[2]
        other = Replica.open(device.path, options=device.options)
        try:
            other.unlock_with_key(device.key)
            first, second = device.session, other.sync_session(max_batch_count=3)
            first.begin_resync()
            first.apply_page(machine.relay.pull(NAME, 0, device_id="d2", resync=True))
            pull_to_the_head(machine, second)
            assert second.finish_resync() is not None
            pull_to_the_head(machine, first, begin=False)
            assert first.finish_resync() is None  # overtaken: nothing settled
        finally:
            other.close()
        assert all(device.replica.get("notes", f"r{i}") is not None for i in range(9))
    finally:
        machine.teardown()


def pull_to_the_head(
    machine: CollectionMachine, session: SyncSession, *, begin: bool = True
) -> None:
    """A resync's pulls, as device 2, to the head (begun here unless `begin` is false)."""
    if begin:
        session.begin_resync()
    while True:
        page = machine.relay.pull(NAME, session.cursor, device_id="d2", resync=True)
        session.apply_page(page)
        if not page.has_more:
            return


def test_a_merge_waits_for_a_resync_of_the_file_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resync settles what it saw; a backup merged meanwhile (its writes waiting for a
    verdict) would be settled unseen. So a merge takes the resync's lease: while a resync
    holds it, the merge waits, then refuses, writing nothing."""
    machine = CollectionMachine()
    try:
        machine.put(2, "b", 1)
        backup = tmp_path / "d2-backup.db"
        backup_replica_file(machine.devices[2].path, backup)
        replica = machine.devices[0].replica
        monkeypatch.setattr(restore, "MERGE_WAIT_S", 0.2)
        with replica.lease(RESYNC_LEASE):  # as the driver holds it over a resync
            with pytest.raises(LeaseBusyError):
                replica.merge_backup(backup)
            assert replica.get("notes", "b") is None
        assert replica.merge_backup(backup).merged == 1
    finally:
        machine.teardown()


def test_a_write_landing_while_a_batch_is_signed_is_pushed_by_a_later_resync() -> None:
    """Device 2 chose y for a batch; z was written before the batch was signed. The mark of
    what was offered is y's hlc, not the clock: z, never offered, is pushed by the resync a
    run without device 2 asks for, not set aside."""
    machine = CollectionMachine()
    try:
        sync(machine, *range(REPLICAS))
        device = machine.devices[2]
        machine.put(2, "y", 1)
        device.session.restart()
        batch = device.session.next_batch()
        assert batch is not None
        machine.put(2, "z", 2)
        signed = device.session.sign(batch, NAME, device.id)
        device.session.acknowledge(
            signed, machine.relay.push(NAME, signed, Pusher.of(device.id, signed))
        )
        flag_d2(machine)
        sync(machine, 2, 2, 0)
        assert device.replica.set_aside() == []
        assert machine.devices[0].replica.get("notes", "z") is not None
        machine.quiesce_and_compare()
    finally:
        machine.teardown()


def test_a_file_that_signed_pushes_before_the_mark_was_kept_counts_all_it_wrote_offered() -> None:
    """Migration 11: a file of format 10 that signed pushes has no `offered_through`; all
    it wrote so far may have reached the relay, so the mark becomes its clock. A file that
    never signed one gets none."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        sync(machine, 0)
        for device in machine.devices[:2]:  # device 0 signed a push, device 1 never did
            device.replica.close()
            with sqlite3.connect(device.path) as db:
                db.execute("DELETE FROM meta WHERE name = 'offered_through'")
                undo_format_12(db)
                db.execute("PRAGMA user_version = 10")
            device.reopen()
        with sqlite3.connect(machine.devices[0].path) as db:
            meta = dict(db.execute("SELECT name, value FROM meta"))
        assert meta["offered_through"] == meta["clock"] > 0
        with sqlite3.connect(machine.devices[1].path) as db:
            assert (
                db.execute("SELECT 1 FROM meta WHERE name = 'offered_through'").fetchone() is None
            )
    finally:
        machine.teardown()
