"""Convergence: several replicas and the reference relay, under partitions, duplicated,
reordered and dropped pages, clock skew, freshness locks and restarts, end identical — and equal
to the independent reference model in tests/replica/model.py.

Examples: 300 under CI (50 steps each); set SEALSYNC_CONVERGENCE_EXAMPLES for more.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from relay.memory import MemoryRelay
from replica import (
    Collection,
    DegradedError,
    FeedResetError,
    ItemLimitError,
    Page,
    PageEntry,
    Replica,
    ReplicaOptions,
    Schema,
    StaleContextError,
)
from replica.indexed import rebuild
from tests.conftest import FakeClock
from tests.replica.helpers import tomb_mismatches
from tests.replica.model import Model

DAY_MS = 24 * 3600 * 1000
SKEWS_MS = [-DAY_MS, -3600_000, -60_000, 0, 0, 60_000, 3600_000, DAY_MS]
IDS = ["a", "b", "c"]
COLLECTIONS = ["notes", "threads", "personas"]
SCHEMA = Schema(  # every collection indexed by "v": blind indexes are kept exact throughout
    (
        Collection("notes", "lww", index="v"),
        Collection(
            "threads", "lww", tiebreak="message_count", index="v", created_field="message_count"
        ),
        Collection("personas", "per_item", max_items=2, index="v"),
    )
)
REPLICAS = 3
EXAMPLES = int(
    os.environ.get("SEALSYNC_CONVERGENCE_EXAMPLES", "300" if os.environ.get("CI") else "60")
)

_ACCOUNT: dict[str, Any] = {}


def shared_account() -> tuple[bytes, bytes]:
    """One account for every example (Argon2id once per process)."""
    if not _ACCOUNT:
        folder = Path(tempfile.mkdtemp(prefix="sealsync-account-"))
        replica, _ = Replica.create(folder / "first.db", SCHEMA, "convergence passphrase")
        _ACCOUNT.update(bundle=replica.key_bundle(), key=replica.unlock_key())
        replica.close()
        shutil.rmtree(folder)
    return _ACCOUNT["bundle"], _ACCOUNT["key"]


class Device:
    """One replica with its own skewed wall clock."""

    def __init__(self, folder: Path, name: str, true_clock: FakeClock, window_s: float) -> None:
        self.path = folder / f"{name}.db"
        self.true_clock = true_clock
        self.skew_ms = 0
        bundle, key = shared_account()
        self.key = key
        self.options = ReplicaOptions(
            freshness_window_s=window_s, synchronous="normal", wall_clock_ms=self.now_ms
        )
        self.replica = Replica.join(self.path, bundle, options=self.options)
        self.replica.unlock_with_key(key)
        self.session = self.replica.sync_session(max_batch_count=4)
        self.locks: list[int] = []
        self.feed_cursor = self.replica.feed_head()
        self.feed_state: dict[bytes, frozenset[tuple[int, int]]] = {}

    def now_ms(self) -> int:
        return self.true_clock() + self.skew_ms

    def reopen(self) -> None:
        self.replica.close()
        self.replica = Replica.open(self.path, options=self.options)
        self.replica.unlock_with_key(self.key)
        self.session = self.replica.sync_session(max_batch_count=4)


class ConvergenceMachine(RuleBasedStateMachine):
    contexts = Bundle("contexts")

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="sealsync-conv-"))
        self.clock = FakeClock()
        self.relay = MemoryRelay(clock_ms=self.clock, page_size=3)
        self.model = Model({"threads": "message_count"})
        self.devices: list[Device] = []
        self.rng = random.Random(0)
        self.tampered = False

    @initialize(window_s=st.sampled_from([0.0, 10.0]))
    def make_devices(self, window_s: float) -> None:
        self.devices = [Device(self.folder, f"r{i}", self.clock, window_s) for i in range(REPLICAS)]

    def teardown(self) -> None:
        for device in self.devices:
            device.replica.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- local writes -------------------------------------------------------------------------

    def _write(
        self,
        device: Device,
        collection: str,
        id: str,
        document: Any,
        context: frozenset[tuple[int, int]] | None,
        if_unchanged: bool,
    ) -> None:
        replica = device.replica
        replica.release_due()
        try:
            before = replica.get(collection, id)
        except DegradedError:  # a forged copy latched it: reads and writes refuse until repair
            assert self.tampered
            return
        current = set() if before is None else set(before.context)
        try:
            if document is None:
                after = replica.delete(collection, id, context=context, if_unchanged=if_unchanged)
            else:
                after = replica.put(
                    collection, id, document, context=context, if_unchanged=if_unchanged
                )
        except (StaleContextError, ItemLimitError):
            return
        (new_dot,) = [d for d in after if d not in current]
        replaced = sorted(current if context is None else current & set(context))
        self.model.write(
            ("default", collection, id),
            new_dot[0],
            new_dot[1],
            replaced,
            document is None,
            document,
        )

    @rule(
        target=contexts,
        device=st.integers(0, REPLICAS - 1),
        collection=st.sampled_from(COLLECTIONS),
        id=st.sampled_from(IDS),
        value=st.integers(0, 3),
        count=st.none() | st.integers(0, 3),
    )
    def put(self, device: int, collection: str, id: str, value: int, count: int | None) -> Any:
        document: dict[str, Any] = {"v": value}
        if count is not None:
            document["message_count"] = count
        self._write(self.devices[device], collection, id, document, None, False)
        try:
            record = self.devices[device].replica.get(collection, id)
        except DegradedError:
            return (device, collection, id, None)
        return (device, collection, id, None if record is None else record.context)

    @rule(
        device=st.integers(0, REPLICAS - 1),
        collection=st.sampled_from(COLLECTIONS),
        id=st.sampled_from(IDS),
    )
    def delete(self, device: int, collection: str, id: str) -> None:
        self._write(self.devices[device], collection, id, None, None, False)

    @rule(
        read=consumes(contexts),
        value=st.integers(0, 3),
        if_unchanged=st.booleans(),
        delete=st.booleans(),
    )
    def write_with_context(self, read: Any, value: int, if_unchanged: bool, delete: bool) -> None:
        device, collection, id, context = read
        if context is None:
            return
        document = None if delete else {"v": value}
        self._write(self.devices[device], collection, id, document, context, if_unchanged)

    # -- locks, clocks, restarts --------------------------------------------------------------

    @rule(
        device=st.integers(0, REPLICAS - 1),
        kind=st.sampled_from(["record", "collection", "profile"]),
        collection=st.sampled_from(COLLECTIONS),
        id=st.sampled_from(IDS),
        duration_s=st.sampled_from([1.0, 30.0, 600.0]),
    )
    def lock(self, device: int, kind: str, collection: str, id: str, duration_s: float) -> None:
        d = self.devices[device]
        lock_id = d.replica.lock_scope(
            collection=None if kind == "profile" else collection,
            id=id if kind == "record" else None,
            duration_s=duration_s,
        )
        d.locks.append(lock_id)

    @precondition(lambda self: any(d.locks for d in self.devices))
    @rule(pick=st.integers(0, 100))
    def release(self, pick: int) -> None:
        holders = [d for d in self.devices if d.locks]
        d = holders[pick % len(holders)]
        lock_id = d.locks.pop(pick % len(d.locks))
        try:
            d.replica.release_lock(lock_id)
        except Exception as exc:  # an expired lock is gone already: that is fine
            assert "no lock" in str(exc)

    @rule(device=st.integers(0, REPLICAS - 1), skew=st.sampled_from(SKEWS_MS))
    def skew(self, device: int, skew: int) -> None:
        self.devices[device].skew_ms = skew

    @rule(ms=st.sampled_from([1, 500, 11_000, 120_000, 400_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(device=st.integers(0, REPLICAS - 1))
    def accept_held(self, device: int) -> None:
        self.devices[device].replica.accept_held()

    @rule(device=st.integers(0, REPLICAS - 1))
    def reopen(self, device: int) -> None:
        self.devices[device].reopen()

    # -- sync ---------------------------------------------------------------------------------

    @rule(device=st.integers(0, REPLICAS - 1))
    def push(self, device: int) -> None:
        push_all(self.devices[device], self.relay)

    @rule(
        device=st.integers(0, REPLICAS - 1),
        mode=st.sampled_from(["normal", "duplicate", "reorder", "drop", "tamper"]),
        seed=st.integers(0, 9),
    )
    def pull(self, device: int, mode: str, seed: int) -> None:
        d = self.devices[device]
        pages = fetch_pages(self.relay, d.session.cursor)
        rng = random.Random(seed)
        if mode == "duplicate":
            pages = [p for p in pages for _ in (0, 1)]
        elif mode == "reorder":
            rng.shuffle(pages)
        elif mode == "drop" and pages:
            pages.pop(rng.randrange(len(pages)))
        elif mode == "tamper":  # a hostile relay slips a forged copy in before a real one
            pages = [tampered(page, rng) for page in pages]
            self.tampered = True
        for page in pages:
            d.session.apply_page(page)

    # -- invariants and the final check --------------------------------------------------------

    @invariant()
    def blind_indexes_equal_a_rebuild(self) -> None:
        """After every step, each replica's blind index is what a rebuild from its stored
        versions computes (rebuild changes nothing; it runs in a transaction rolled back)."""
        for device in self.devices:
            core = device.replica._core
            with core.mutex, pytest.raises(_RolledBack), core.store.transaction():
                assert rebuild(core) == 0, device.path
                raise _RolledBack

    @invariant()
    def change_feeds_name_exactly_the_records_that_changed(self) -> None:
        """Each replica's feed, followed from the previous step's cursor, names exactly the
        records whose siblings changed in this step, once each (a reset: follow anew)."""
        for device in self.devices:
            replica = device.replica
            now = sibling_dots(replica)
            try:
                page = replica.changes(device.feed_cursor, limit=10_000)
            except FeedResetError:  # a repair removed a record: read everything again
                device.feed_cursor, device.feed_state = replica.feed_head(), now
                continue
            assert not page.more
            keys = [change.key for change in page.changes]
            changed = {
                k
                for k in now.keys() | device.feed_state.keys()
                if now.get(k) != device.feed_state.get(k)
            }
            assert len(keys) == len(set(keys)) and set(keys) == changed, device.path
            device.feed_cursor, device.feed_state = page.cursor, now

    @invariant()
    def every_version_says_whether_it_is_a_tombstone(self) -> None:
        """Each stored version's `tomb` column is its envelope's `deleted` flag, whichever
        write, merge or release stored it."""
        for device in self.devices:
            assert tomb_mismatches(device.replica) == [], device.path

    @invariant()
    def relay_holds_only_siblings(self) -> None:
        for key_versions in self.relay._account("default-account").by_key.values():
            for a in key_versions:
                for b in key_versions:
                    assert a is b or b.vector.get(a.node, 0) < a.hlc

    def quiesce_and_compare(self) -> None:
        for d in self.devices:
            d.skew_ms = 0
            d.locks.clear()
        self.clock.advance(2 * DAY_MS)  # every lock and every drift hold has ended
        for _ in range(3):
            for d in self.devices:
                d.replica.release_due()
                push_all(d, self.relay)
            for d in self.devices:
                for page in fetch_pages(self.relay, d.session.cursor):
                    d.session.apply_page(page)
                d.replica.release_due()
        for d in self.devices:
            if d.replica.status().degraded:  # latched by a forged copy: repair re-pulls
                assert self.tampered
                d.replica.repair()
                for page in fetch_pages(self.relay, d.session.cursor):
                    d.session.apply_page(page)
        for d in self.devices:
            status = d.replica.status()
            assert status.dirty == 0 and status.held_for_lock == 0 and status.held_for_drift == 0
            assert status.degraded == 0 and (status.quarantined == 0 or self.tampered)
        for record in sorted(self.model.records()):
            expected = self.model.siblings(record)
            visible = self.model.visible(record)
            for d in self.devices:
                got = d.replica.get(record[1], record[2])
                assert got is not None, record
                assert got.context == frozenset(v.dot for v in expected), (record, d.path)
                assert (got.node, got.hlc, got.deleted, got.document) == (
                    visible.node,
                    visible.hlc,
                    visible.deleted,
                    visible.document,
                )
                others = {(v.node, v.hlc, v.deleted, _freeze(v.document)) for v in expected}
                others.discard(
                    (visible.node, visible.hlc, visible.deleted, _freeze(visible.document))
                )
                conflicts = {(c.node, c.hlc, c.deleted, _freeze(c.document)) for c in got.conflicts}
                assert conflicts == others, (record, d.path)
        for d in self.devices:
            check_indexed_reads(d.replica, self.model)


def read_rows(replica: Replica, sql: str) -> list[Any]:
    """`sql` on the replica's own connection: a connection opened for each check (and its
    schema parsed) once took these checks most of their time."""
    core = replica._core
    with core.mutex:
        return core.store.db.execute(sql).fetchall()


def sibling_dots(replica: Replica) -> dict[bytes, frozenset[tuple[int, int]]]:
    """Each stored record's sibling dots, read from the file (no key needed)."""
    rows = read_rows(replica, "SELECT key, node, hlc FROM versions")
    dots: dict[bytes, set[tuple[int, int]]] = {}
    for key, node, hlc in rows:
        dots.setdefault(key, set()).add((node, hlc))
    return {key: frozenset(value) for key, value in dots.items()}


def one_sequence_number_per_record(replica: Replica) -> bool:
    """Every row of a record carries its latest change's number, and no two records share
    one: so a feed read from any cursor lists each record once."""
    per_key = read_rows(
        replica, "SELECT count(DISTINCT changed), min(changed) FROM versions GROUP BY key"
    )
    numbers = [number for _, number in per_key]
    return all(count == 1 for count, _ in per_key) and len(set(numbers)) == len(numbers)


class _RolledBack(Exception):
    pass


def check_indexed_reads(replica: Replica, model: Model) -> None:
    """`scan(where=)` finds a record under each value a live sibling holds, and only those,
    in either order (test_blind_index.py checks the order itself)."""
    for collection in COLLECTIONS:
        for value in range(4):
            found = replica.scan(collection, where={"v": value}, include_deleted=True)
            expected = {
                record[2]
                for record in model.records()
                if record[1] == collection
                and any(not v.deleted and v.document["v"] == value for v in model.siblings(record))
            }
            assert {r.id for r in found} == expected, (collection, value)
            newest_first = replica.scan(
                collection, where={"v": value}, include_deleted=True, newest_first=True
            )
            assert sorted(r.id for r in newest_first) == sorted(r.id for r in found)


def tampered(page: Page, rng: random.Random) -> Page:
    """The page with a bit-flipped copy of one of its envelopes placed before the original."""
    if not page.entries:
        return page
    index = rng.randrange(len(page.entries))
    entry = page.entries[index]
    data = bytearray(entry.envelope)
    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    entries = list(page.entries)
    entries.insert(index, PageEntry(entry.seq, bytes(data)))
    return msgspec.structs.replace(page, entries=entries)


def _freeze(document: Any) -> Any:
    return None if document is None else tuple(sorted(document.items()))


ACCOUNT_NAME = "default-account"


def push_all(device: Device, relay: MemoryRelay) -> None:
    device.session.restart()
    while (batch := device.session.next_batch()) is not None:
        device.session.acknowledge(batch, relay.push(ACCOUNT_NAME, batch))


def fetch_pages(relay: MemoryRelay, cursor: int) -> list[Page]:
    pages = []
    while True:
        page = relay.pull(ACCOUNT_NAME, cursor)
        pages.append(page)
        if not page.has_more:
            return pages
        cursor = page.next_cursor


class ConvergenceTest(ConvergenceMachine):
    def teardown(self) -> None:
        try:
            if self.devices:
                self.quiesce_and_compare()
        finally:
            super().teardown()


ConvergenceTest.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None
)
test_convergence = pytest.mark.slow(ConvergenceTest.TestCase)
