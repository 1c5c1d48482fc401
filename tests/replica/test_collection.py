"""Tombstone collection never brings back what it took (docs/tombstone-collection.md §2-§4).

A hypothesis state machine: three replicas of one signed account on the memory relay
(pushes signed, so they declare tombstones and acks), writes and deletes over four records,
pushes, pulls (duplicated or reordered pages too), pushes whose answer is lost, reseeds
(everything pushed again, the cursor back to 0), reopened files, freshness locks, time
passing (an hour, or past the collection horizon: a device that did not sync meanwhile is
left out, and flagged to resync once a run passes it by), and collection runs. After every
step: no stored relay version, and no version of a device that pulled past a run (and is
not flagged to resync), is one a collected tombstone covered; at the end, after syncing
until quiet (flagged devices resync), every replica holds the same versions and nothing
collectible is left on the relay."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from relay.errors import ResyncRequiredError
from relay.memory import MemoryRelay
from relay.signing import Pusher
from relay.storage import AccountRecord
from relay.storage import Device as RelayDevice
from replica import InvalidArgumentError, Replica, ReplicaOptions, backup_replica_file
from replica.wire import Header, KdfParams, Page, bundle_version, dominates, node_from_i64
from tests.conftest import FakeClock
from tests.replica.test_convergence import shared_account
from tests.replica.test_convergence import sibling_dots as stored_dots

NAME = "acct"
IDS = ["a", "b", "c", "d"]
REPLICAS = 3
NOW_MS = 1_800_000_000_000
DAY_MS = 24 * 3600 * 1000
HORIZON_MS = 10 * DAY_MS
EXAMPLES = int(
    os.environ.get("SEALSYNC_COLLECTION_EXAMPLES", "150" if os.environ.get("CI") else "40")
)


def sibling_dots(replica: Replica) -> dict[bytes, frozenset[tuple[int, int]]]:
    """`stored_dots` with each node as the wire has it (the file stores it as a signed int)."""
    return {
        key: frozenset((node_from_i64(node), hlc) for node, hlc in dots)
        for key, dots in stored_dots(replica).items()
    }


class Device:
    """One replica, a device of the account, signing its pushes."""

    def __init__(self, folder: Path, index: int, relay: MemoryRelay, clock: FakeClock) -> None:
        self.id = f"d{index}"
        self.path = folder / f"{self.id}.db"
        self.relay = relay
        bundle, self.key = shared_account()
        self.options = ReplicaOptions(
            freshness_window_s=0, synchronous="normal", wall_clock_ms=clock
        )
        self.replica = Replica.join(self.path, bundle, options=self.options)
        self.replica.unlock_with_key(self.key)
        self.session = self.replica.sync_session(max_batch_count=3)
        self.session.check_relay_state(relay.state(NAME))
        self.locks: list[int] = []
        """Explicit freshness locks taken here and not released yet."""

    def unlock_all(self) -> None:
        """Release this device's locks: what they held merges now."""
        while self.locks:
            self.replica.release_lock(self.locks.pop())

    def reopen(self) -> None:
        self.replica.close()
        self.replica = Replica.open(self.path, options=self.options)
        self.replica.unlock_with_key(self.key)
        self.session = self.replica.sync_session(max_batch_count=3)

    def push(self, *, lose_answer: bool = False) -> None:
        self.session.restart()
        if not self.session.knows_relay_state():
            self.session.check_relay_state(self.relay.state(NAME))
        while (batch := self.session.next_batch()) is not None:
            signed = self.session.sign(batch, NAME, self.id)
            result = self.relay.push(NAME, signed, Pusher.of(self.id, signed))
            if lose_answer:
                return
            self.session.acknowledge(signed, result)
        self.session.settle_superseded()

    def ack(self) -> None:
        """What a sync round ends with: an empty signed push when the cursor passed the last
        ack the relay took (a new session, as each `sealsync sync` is: no interval to wait)."""
        self.session = session = self.replica.sync_session(max_batch_count=3)
        if (due := session.ack_due()) is not None:
            signed = session.sign(due, NAME, self.id)
            session.acknowledge(signed, self.relay.push(NAME, signed, Pusher.of(self.id, signed)))

    def resync(self) -> None:
        """What the driver does on `resync_required`: pull everything again, settle, ack;
        begun again when it was overtaken (here: by a run past the grace, refusing the ack)."""
        for _ in range(3):
            self.session.begin_resync()
            while True:
                page = self.relay.pull(NAME, self.session.cursor, device_id=self.id, resync=True)
                self.session.apply_page(page)
                if not page.has_more:
                    break
            if self.session.finish_resync() is None:
                continue
            try:
                self.ack()
                return
            except ResyncRequiredError:
                continue
        raise AssertionError("a resync was overtaken three times")

    def pages(self) -> list[Page]:
        pages, cursor = [], self.session.cursor
        while True:
            page = self.relay.pull(NAME, cursor, device_id=self.id)
            pages.append(page)
            if not page.has_more:
                return pages
            cursor = page.next_cursor


class CollectionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="sealsync-collect-"))
        self.clock = FakeClock(NOW_MS)
        self.relay = MemoryRelay(clock_ms=self.clock, page_size=3)
        bundle, _ = shared_account()
        record = AccountRecord(
            NAME, b"h" * 32, b"r" * 32, KdfParams(b"s" * 16), bundle, bundle_version(bundle), NOW_MS
        )
        self.relay.create_account(record, RelayDevice("d0", "d0", NOW_MS), [], None, NOW_MS)
        for index in range(1, REPLICAS):
            self.relay.add_device(NAME, RelayDevice(f"d{index}", f"d{index}", NOW_MS), [])
        self.devices = [Device(self.folder, i, self.relay, self.clock) for i in range(REPLICAS)]
        self.collected: list[tuple[int, Header]] = []
        """(run seq, header) of every tombstone a run deleted."""

    def teardown(self) -> None:
        for device in self.devices:
            device.replica.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(device=st.integers(0, REPLICAS - 1), id=st.sampled_from(IDS), value=st.integers(0, 3))
    def put(self, device: int, id: str, value: int) -> None:
        self.devices[device].replica.put("notes", id, {"v": value})

    @rule(device=st.integers(0, REPLICAS - 1), id=st.sampled_from(IDS))
    def delete(self, device: int, id: str) -> None:
        self.devices[device].replica.delete("notes", id)

    @rule(
        device=st.integers(0, REPLICAS - 1),
        lose_answer=st.booleans(),
        mode=st.sampled_from(["next", "twice", "reversed", "none"]),
    )
    def sync(self, device: int, lose_answer: bool, mode: str) -> None:
        """A sync round as the driver runs it: push (its answer perhaps lost), pull (pages
        perhaps duplicated, reversed, or none), settle what the relay called superseded,
        then the empty push that acks the cursor."""
        d = self.devices[device]
        if d.session.resync_needed:  # as the driver: before pushing anything
            d.resync()
            return
        try:
            d.push(lose_answer=lose_answer)
            pages = [] if mode == "none" else d.pages()
            if mode == "twice":
                pages = [page for page in pages for _ in (0, 1)]
            elif mode == "reversed":
                pages.reverse()
            for page in pages:
                d.session.apply_page(page)
            d.session.settle_superseded()
            d.ack()
        except ResyncRequiredError:
            d.resync()

    @rule(device=st.integers(0, REPLICAS - 1), id=st.sampled_from(IDS))
    def lock(self, device: int, id: str) -> None:
        """An app holds inbound versions of a record back while its user edits it."""
        d = self.devices[device]
        d.locks.append(d.replica.lock_scope(collection="notes", id=id, duration_s=600))

    @rule(device=st.integers(0, REPLICAS - 1))
    def unlock(self, device: int) -> None:
        self.devices[device].unlock_all()

    @rule(device=st.integers(0, REPLICAS - 1))
    def reseed(self, device: int) -> None:
        """A device pushes everything it holds again (as after a relay reseed)."""
        self.devices[device].session.reseed()

    @rule(device=st.integers(0, REPLICAS - 1))
    def reopen(self, device: int) -> None:
        self.devices[device].reopen()

    @rule(ms=st.sampled_from([3600 * 1000, HORIZON_MS + DAY_MS]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def collect(self) -> None:
        report = self.relay.collect(NAME, horizon_ms=HORIZON_MS)
        if report.run is not None:
            headers = self.relay._account(NAME).runs.headers[report.run]
            self.collected += [(report.run, header) for header in headers]

    @invariant()
    def the_relay_keeps_nothing_a_collected_tombstone_covered(self) -> None:
        stored = self.relay._account(NAME).by_key
        for _, header in self.collected:
            for version in stored.get(header.key, []):
                assert not dominates(header.vector, (version.node, version.hlc)), header

    @invariant()
    def a_device_past_a_run_holds_nothing_it_covered(self) -> None:
        flagged = self.relay._account(NAME).runs.resync
        for device in self.devices:
            if device.id in flagged:  # it resyncs before it pushes or pulls again
                continue
            cursor = device.session.cursor
            dots = sibling_dots(device.replica)
            for run, header in self.collected:
                if cursor < run:
                    continue
                for dot in dots.get(header.key, frozenset()):
                    assert not dominates(header.vector, dot), (device.id, run, header)

    def quiesce_and_compare(self) -> None:
        for device in self.devices:
            device.unlock_all()
        for _ in range(4):
            for device in self.devices:
                try:
                    device.push()
                    for page in device.pages():
                        device.session.apply_page(page)
                    device.ack()
                except ResyncRequiredError:
                    device.resync()
            self.collect()
        first = sibling_dots(self.devices[0].replica)
        for device in self.devices[1:]:
            assert sibling_dots(device.replica) == first, device.id
        account = self.relay._account(NAME)
        assert {k: {(v.node, v.hlc) for v in vs} for k, vs in account.by_key.items()} == {
            k: set(dots) for k, dots in first.items()
        }
        assert not account.runs.seqs  # every device pulled past every run: all released
        for device in self.devices:
            assert device.replica.status().dirty == 0, device.id


class CollectionTest(CollectionMachine):
    def teardown(self) -> None:
        try:
            self.quiesce_and_compare()
        finally:
            super().teardown()


CollectionTest.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None
)
test_collection = pytest.mark.slow(CollectionTest.TestCase)


def test_a_tombstone_whose_receipt_was_lost_is_not_stored_again_once_collected() -> None:
    """The ghost path, step by step: the device that deleted never heard the relay took its
    tombstone, so it pushes it again after every device acked it and a run collected it."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        machine.sync(0, lose_answer=False, mode="next")
        machine.delete(0, "a")
        machine.sync(0, lose_answer=True, mode="next")  # its ack passes the tombstone
        for device in range(1, REPLICAS):
            machine.sync(device, lose_answer=False, mode="next")
        machine.collect()
        assert len(machine.collected) == 1
        machine.sync(0, lose_answer=False, mode="none")  # the tombstone again: superseded
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
        machine.quiesce_and_compare()
    finally:
        machine.teardown()


def test_a_write_a_held_tombstone_covers_is_not_pushed_past_its_ghost() -> None:
    """Device 0's write reached the relay but not its answer; device 1 deleted over it, and
    device 0 holds that tombstone behind a lock while it pushes the write again
    (`superseded`). The held tombstone, opened before it was held, proves the write
    superseded here: pushed again after the run was released, it would bring the record
    back on every other device."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        machine.sync(0, lose_answer=True, mode="next")
        machine.sync(1, lose_answer=False, mode="next")
        machine.delete(1, "a")
        machine.sync(1, lose_answer=False, mode="next")
        machine.lock(0, "a")
        machine.sync(0, lose_answer=False, mode="next")  # the write superseded, T held
        assert machine.devices[0].replica.status().dirty == 0
        for _ in range(2):  # a run, then its release once every device passed it
            for device in range(REPLICAS):
                machine.sync(device, lose_answer=False, mode="next")
            machine.collect()
        assert len(machine.collected) == 1
        machine.sync(0, lose_answer=False, mode="next")
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
        machine.quiesce_and_compare()
    finally:
        machine.teardown()


def stale_run(machine: CollectionMachine, *, before: Callable[[], None]) -> None:
    """Device 2 stays silent past the horizon while `before` runs on the others, which
    sync again (so stay active); then device 1 deletes record "a", and a run collects it
    without device 2, which is flagged."""
    machine.advance(HORIZON_MS + DAY_MS)
    before()
    machine.delete(1, "a")
    for device in (1, 0, 1):
        machine.sync(device, lose_answer=False, mode="next")
    machine.collect()
    assert len(machine.collected) == 1
    assert machine.relay._account(NAME).runs.resync.keys() == {"d2"}


def test_a_device_back_after_the_horizon_drops_what_was_collected_meanwhile() -> None:
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        machine.sync(0, lose_answer=False, mode="next")
        machine.sync(2, lose_answer=False, mode="next")
        stale_run(machine, before=lambda: machine.sync(1, lose_answer=False, mode="next"))
        device = machine.devices[2]
        assert device.replica.get("notes", "a") is not None
        machine.put(2, "b", 2)  # written while away: never offered, so pushed
        machine.sync(2, lose_answer=False, mode="next")  # resync_required: it resyncs
        assert device.replica.get("notes", "a") is None
        assert machine.relay._account(NAME).runs.resync == {}
        machine.sync(2, lose_answer=False, mode="next")
        machine.sync(0, lose_answer=False, mode="next")
        assert machine.devices[0].replica.get("notes", "b") is not None
        machine.quiesce_and_compare()
    finally:
        machine.teardown()


def test_a_write_whose_answer_was_lost_before_the_device_went_stale_is_set_aside() -> None:
    """Device 2's write reached the relay, its answer did not; device 1 deleted over it and
    a run collected that while device 2 was away. Pushed again, it would bring the record
    back once the run is released: the resync sets it aside instead."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        machine.sync(0, lose_answer=False, mode="next")
        machine.sync(2, lose_answer=False, mode="next")
        machine.put(2, "a", 2)
        machine.sync(2, lose_answer=True, mode="none")

        def others_see_it() -> None:
            for device in (0, 1):
                machine.sync(device, lose_answer=False, mode="next")

        stale_run(machine, before=others_see_it)
        device = machine.devices[2]
        machine.sync(2, lose_answer=False, mode="next")
        status = device.replica.status()
        assert (status.dirty, status.held_other) == (0, {"collected": 1})
        assert device.replica.get("notes", "a") is None
        machine.quiesce_and_compare()
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
        (kept,) = device.replica.set_aside()
        assert (kept.collection, kept.id, kept.document, kept.deleted) == (
            "notes",
            "a",
            {"v": 2},
            False,
        )
        device.replica.take_aside("notes", "a")  # the person wants it back: a new write
        assert device.replica.set_aside() == [] and device.replica.status().held_other == {}
        with pytest.raises(InvalidArgumentError, match="nothing of notes/a is set aside"):
            device.replica.take_aside("notes", "a")
        machine.quiesce_and_compare()
        for other in machine.devices:
            record = other.replica.get("notes", "a")
            assert record is not None and record.document == {"v": 2}, other.id
    finally:
        machine.teardown()


def test_a_backup_merged_after_its_write_was_deleted_and_collected_sets_it_aside(
    tmp_path: Path,
) -> None:
    """Device 2's write reached the relay without its answer, and a backup of its file was
    taken then; device 1 deleted the record and a run collected and released it. Merged
    into device 0, the backup's write, which its device may have pushed, waits for the
    resync the merge asks for: the relay no longer has it, so it is set aside, not pushed."""
    machine = CollectionMachine()
    try:
        machine.put(0, "a", 1)
        for device in range(REPLICAS):
            machine.sync(device, lose_answer=False, mode="next")
        machine.put(2, "a", 2)
        machine.sync(2, lose_answer=True, mode="none")
        backup = tmp_path / "d2-backup.db"
        backup_replica_file(machine.devices[2].path, backup)
        machine.sync(1, lose_answer=False, mode="next")
        machine.delete(1, "a")  # after device 1 pulled device 2's write
        for _ in range(2):  # a run, then its release
            for device in (2, 1, 0, 2, 1, 0):
                machine.sync(device, lose_answer=False, mode="next")
            machine.collect()
        assert len(machine.collected) == 1 and not machine.relay._account(NAME).runs.seqs
        replica = machine.devices[0].replica
        replica.merge_backup(backup)
        assert replica.get("notes", "a") is not None
        assert (replica.status().dirty, replica.status().awaiting_resync) == (0, 1)
        machine.sync(0, lose_answer=False, mode="next")  # the resync the merge asked for
        assert replica.get("notes", "a") is None and replica.status().awaiting_resync == 0
        assert [(v.id, v.document) for v in replica.set_aside()] == [("a", {"v": 2})]
        machine.quiesce_and_compare()
        machine.the_relay_keeps_nothing_a_collected_tombstone_covered()
    finally:
        machine.teardown()
