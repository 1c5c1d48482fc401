"""The sans-I/O sync session (specs/protocol.md §batches): bounded batches, receipts that clear
dirty only when confirmed, atomic pages, and rollback detection with reseed."""

from __future__ import annotations

import pytest

from relay.memory import MemoryRelay
from relay.signing import Pusher
from replica import (
    Page,
    ProtocolError,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
    Replica,
    RollbackError,
    SyncSession,
)
from replica import sync as sync_module
from replica.envelope import open_envelope
from replica.wire import CollectedRun, ErrorCode, pack_markers, parse_header, tombstone_flags
from tests.conftest import FakeClock, ReplicaFactory
from tests.replica.helpers import STATE, dirty_envelopes, page_of

ACCOUNT = "acct"


def test_batches_are_bounded_by_count_and_bytes(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with replica.batch():
        for i in range(25):
            replica.put("notes", f"n{i:02}", {"text": "x" * 300})
    by_count = replica.sync_session(max_batch_count=10)
    sizes = []
    while (batch := by_count.next_batch()) is not None:
        sizes.append(len(batch.envelopes))
    assert sizes == [10, 10, 5]
    first = replica.sync_session().next_batch()
    assert first is not None
    one = len(first.envelopes[0])
    by_bytes = replica.sync_session(max_batch_bytes=one * 3)
    batch = by_bytes.next_batch()
    assert batch is not None and len(batch.envelopes) == 3


def test_only_confirmed_versions_stop_being_dirty(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    for i in range(3):
        replica.put("notes", f"n{i}", {"i": i})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None
    receipts = [
        Receipt("stored", seq=1),
        Receipt("superseded"),
        Receipt("refused", code=ErrorCode.CLOCK_AHEAD),
    ]
    result = session.acknowledge(batch, PushResult(receipts, STATE))
    assert (result.stored, result.superseded, result.refused_by_code) == (1, 1, {"clock_ahead": 1})
    # superseded on the relay's word alone: nothing here supersedes it, so it stays dirty
    assert replica.status().dirty == session.count_dirty() == 2
    assert session.next_batch() is None  # a version is offered once per pass
    session.restart()
    again = session.next_batch()
    assert again is not None and again.envelopes == batch.envelopes[1:]


def test_receipts_must_match_the_batch(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("notes", "n", {})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None
    with pytest.raises(ProtocolError, match="1 envelopes"):
        session.acknowledge(batch, PushResult([], STATE))
    assert replica.status().dirty == 1


def test_an_answer_is_verified_as_acknowledge_would_without_writing(
    make_replica: ReplicaFactory,
) -> None:
    """What a pipelining driver checks before it sends the next batch: the same refusals as
    `acknowledge`, nothing saved (the versions stay dirty, the state is not adopted)."""
    replica = make_replica()
    replica.put("notes", "n", {})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None
    stored = [Receipt("stored", seq=1)]
    session.verify_answer(batch, PushResult(stored, RelayState("s1", "e1", 1)))  # first contact
    session.verify_answer(batch, PushResult(stored, RelayState("s2", "e2", 0)))  # still none kept
    with pytest.raises(ProtocolError, match="1 envelopes"):
        session.verify_answer(batch, PushResult([], STATE))
    assert replica.status().dirty == 1

    session.acknowledge(batch, PushResult(stored, RelayState("s1", "e1", 1)))
    for state, reason in [
        (RelayState("s2", "e1", 1), "storage_id"),
        (RelayState("s1", "e2", 1), "account_epoch"),
        (RelayState("s1", "e1", 0), "head"),
    ]:
        with pytest.raises(RollbackError) as refused:
            session.verify_answer(batch, PushResult(stored, state))
        assert refused.value.reason == reason
    session.verify_answer(batch, PushResult(stored, RelayState("s1", "e1", 7)))


def test_a_page_merges_atomically_and_advances_the_cursor(make_replica: ReplicaFactory) -> None:
    writer, reader = make_replica("w"), make_replica("r")
    for i in range(4):
        writer.put("notes", f"n{i}", {"i": i})
    written = writer.sync_session().next_batch()
    assert written is not None
    envelopes = written.envelopes
    session = reader.sync_session()
    applied = session.apply_page(page_of(envelopes[:2]))
    assert applied.cursor_advanced and session.cursor == 2 and applied.merged == 2
    stale = session.apply_page(page_of(envelopes[2:], cursor=7))  # not the next page
    assert not stale.cursor_advanced and session.cursor == 2 and stale.merged == 2
    assert len(reader.scan("notes")) == 4


def test_first_contact_adopts_then_a_new_storage_id_is_a_rollback(
    make_replica: ReplicaFactory,
) -> None:
    session = make_replica().sync_session()
    session.check_relay_state(RelayState("s1", "e1", 5))
    session.check_relay_state(RelayState("s1", "e1", 9))
    with pytest.raises(RollbackError, match="storage changed from s1 to s2") as wiped:
        session.check_relay_state(RelayState("s2", "e1", 9))
    with pytest.raises(RollbackError, match="account epoch changed") as reseeded:
        session.check_relay_state(RelayState("s1", "e2", 9))
    assert (wiped.value.reason, reseeded.value.reason) == ("storage_id", "account_epoch")


def test_a_head_below_what_was_seen_is_a_rollback(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    session = replica.sync_session()
    state = RelayState("s", "e", 10)
    session.apply_page(Page(0, [], 10, False, state))
    with pytest.raises(RollbackError, match="below sequence 10") as restored:
        session.apply_page(Page(10, [], 10, False, RelayState("s", "e", 4)))
    assert restored.value.reason == "head"
    assert session.cursor == 10


def test_a_head_below_a_collection_run_this_file_applied_is_a_copy_older_than_the_run(
    make_replica: ReplicaFactory,
) -> None:
    """Such a copy may still hold what the run's tombstones were the last to cover: the
    rollback says so (`before_run`), apart from one that only lost later seqs (`head`)."""
    replica = make_replica()
    session = replica.sync_session()
    run = CollectedRun(6, pack_markers([]))
    session.apply_page(Page(0, [], 8, False, RelayState("s", "e", 8), run, 6))
    assert session.run_missing_from(RelayState("s", "e", 5)) == 6
    assert session.run_missing_from(RelayState("s", "e", 6)) == 0
    assert session.run_missing_from(RelayState("s", "other", 5)) == 0  # a reseed's new epoch
    assert session.run_missing_from(RelayState("s", "e", 9), 0) == 6  # pushes lifted its head
    assert session.run_missing_from(RelayState("s", "e", 9), 6) == 0
    with pytest.raises(RollbackError, match="older than that run") as before_run:
        session.apply_page(Page(8, [], 8, False, RelayState("s", "e", 5)))
    assert before_run.value.reason == "before_run"
    with pytest.raises(RollbackError, match="older than that run") as lifted:
        session.apply_page(Page(8, [], 9, False, RelayState("s", "e", 9), None, 0))
    assert lifted.value.reason == "before_run"
    with pytest.raises(RollbackError, match="below sequence 8") as after_run:
        session.apply_page(Page(8, [], 8, False, RelayState("s", "e", 7), None, 6))
    assert after_run.value.reason == "head"
    assert session.cursor == 8


def test_rollback_detected_through_the_reference_relay_then_reseed_restores_it(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    a = make_replica("a", wall_clock_ms=clock)
    b = make_replica("b", wall_clock_ms=clock)
    a.put("notes", "n1", {"v": 1})
    sync(a, relay)
    sync(b, relay)
    old = relay.snapshot()
    a.put("notes", "n2", {"v": 2})
    sync(a, relay)
    sync(b, relay)
    relay.restore(old)  # the relay comes back from an older copy: head below what was seen
    with pytest.raises(RollbackError):
        sync(b, relay)
    relay.reseed(ACCOUNT)
    session = b.sync_session()
    session.reseed()
    assert b.status().dirty == b.status().records
    sync(b, relay)
    with pytest.raises(RollbackError, match="account epoch changed"):
        sync(a, relay)
    a.sync_session().reseed()
    sync(a, relay)
    c = make_replica("c", wall_clock_ms=clock)
    sync(c, relay)
    for replica in (a, b, c):
        assert sorted(r.id for r in replica.scan("notes")) == ["n1", "n2"]


def test_relay_wipe_is_detected_and_nothing_reads_as_deleted(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    a = make_replica("a", wall_clock_ms=clock)
    a.put("notes", "n1", {"v": 1})
    sync(a, relay)
    relay.wipe()
    with pytest.raises(RollbackError, match="storage changed"):
        sync(a, relay)
    assert [r.id for r in a.scan("notes")] == ["n1"]
    a.sync_session().reseed()
    sync(a, relay)
    assert relay.stored_versions(ACCOUNT) == 1


def test_acknowledged_identities_match_the_pushed_envelopes(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    replica = make_replica(wall_clock_ms=clock)
    replica.put("notes", "n", {})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None
    result = relay.push(ACCOUNT, batch)
    session.acknowledge(batch, result)
    header = parse_header(batch.envelopes[0])
    record = replica.get("notes", "n")
    assert record is not None and record.hlc == header.hlc
    assert replica.status().dirty == 0


def test_a_push_right_after_the_cursor_passes_over_the_devices_own_versions(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    a = make_replica("a", wall_clock_ms=clock)
    b = make_replica("b", wall_clock_ms=clock)
    b.put("notes", "from-b", {"v": 1})
    sync(b, relay)  # seq 1: a has not seen it
    session = a.sync_session()
    for round_ in range(2):
        for i in range(3):
            a.put("notes", f"a{round_}{i}", {"i": i})
        while (batch := session.next_batch()) is not None:
            session.acknowledge(batch, relay.push(ACCOUNT, batch))
        session.restart()
        # seqs 2..4 leave a gap at b's seq 1: stay; seqs 5..7 follow the cursor (4): pass
        assert session.cursor == [0, 7][round_]
        page = relay.pull(ACCOUNT, session.cursor)
        session.apply_page(page)
        assert session.cursor == [4, 7][round_] and len(page.entries) == [4, 0][round_]
    assert a.get("notes", "from-b") is not None


def push_and_pull(session: SyncSession, relay: MemoryRelay) -> None:
    while (batch := session.next_batch()) is not None:
        session.acknowledge(batch, relay.push(ACCOUNT, batch))
    while True:
        page = relay.pull(ACCOUNT, session.cursor)
        session.apply_page(page)
        if not page.has_more:
            return


def sync(replica: Replica, relay: MemoryRelay) -> None:
    push_and_pull(replica.sync_session(), relay)


def test_a_reseed_pushes_held_versions_even_after_they_are_released(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    lock = a.lock_scope(collection="notes")
    b.put("notes", "only-on-b", {"v": 1})
    sync(b, relay)
    sync(a, relay)
    assert a.status().held_for_lock == 1
    b.close()  # b is gone for good: a's held copy is the only one left
    relay.wipe()
    with pytest.raises(RollbackError):
        sync(a, relay)
    a.sync_session().reseed()
    a.release_lock(lock)  # the held version merges after the reseed marked it
    sync(a, relay)
    c = make_replica("c", wall_clock_ms=clock)
    sync(c, relay)
    got = c.get("notes", "only-on-b")
    assert got is not None and got.document == {"v": 1}


class DroppingRelay(MemoryRelay):
    """While `dropping`, a relay that drops every write it is sent and answers each one
    `superseded`; then an honest one."""

    dropping = True

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        if not self.dropping:
            return super().push(name, batch, pusher)
        return PushResult([Receipt("superseded") for _ in batch.envelopes], self.state(name))


def sync_round(replica: Replica, relay: MemoryRelay) -> int:
    """One pass, as the driver runs it; how many versions the relay's `superseded` left
    unconfirmed."""
    session = replica.sync_session()
    push_and_pull(session, relay)
    return session.settle_superseded()


def test_a_relay_that_calls_every_write_superseded_loses_none_of_them(
    make_replica: ReplicaFactory,
) -> None:
    """A lying relay cannot make a write vanish: without a version here that supersedes it,
    the write stays dirty, is pushed again every pass and counted unconfirmed, and reaches
    the other devices once the relay stores it."""
    laptop, phone = make_replica("laptop"), make_replica("phone")
    relay = DroppingRelay(clock_ms=FakeClock())
    laptop.put("notes", "n", {"text": "kept"})
    for _ in range(3):
        assert sync_round(laptop, relay) == 1
        assert laptop.status().dirty == 1
    relay.dropping = False
    assert sync_round(laptop, relay) == 0 and laptop.status().dirty == 0
    sync_round(phone, relay)
    record = phone.get("notes", "n")
    assert record is not None and record.document == {"text": "kept"}


def test_a_write_superseded_by_a_version_it_then_pulls_stops_being_pushed(
    make_replica: ReplicaFactory,
) -> None:
    """The honest case: the laptop's reply was lost, the phone edited over its write, and the
    laptop's retry is `superseded`. The pull brings the phone's version, which supersedes the
    write here too: it leaves the dirty set, and nothing is counted unconfirmed."""
    laptop, phone = make_replica("laptop"), make_replica("phone")
    relay = MemoryRelay(clock_ms=FakeClock())
    laptop.put("notes", "n", {"v": 1})
    batch = laptop.sync_session().next_batch()
    assert batch is not None
    relay.push(ACCOUNT, batch)  # stored; the answer never reached the laptop
    sync_round(phone, relay)
    seen = phone.get("notes", "n")
    assert seen is not None
    phone.put("notes", "n", {"v": 2}, context=seen.context)
    sync_round(phone, relay)
    assert sync_round(laptop, relay) == 0
    record = laptop.get("notes", "n")
    assert laptop.status().dirty == 0 and record is not None and record.document == {"v": 2}


def signed_counters(replica: Replica, batches: int) -> tuple[list[int], int]:
    """The counters of `batches` batches signed by one new session, and how many write
    transactions signing them took."""
    session = replica.sync_session(max_batch_count=1)
    session.check_relay_state(STATE)
    store = replica._core.store  # the file's write transactions, counted
    before = store.transactions
    counters = [session.sign(PushBatch([b"e"]), ACCOUNT, "device").counter for _ in range(batches)]
    return counters, store.transactions - before


def test_signing_takes_counters_a_block_at_a_time_and_never_twice(
    make_replica: ReplicaFactory,
) -> None:
    """A push costs one transaction per batch, its acknowledgement: signing 100 batches
    writes the file twice (a block of 64 counters, then another), not 100 times. Two
    sessions on one file, one after the other or side by side, never sign with one
    counter, and each signs in increasing order."""
    replica = make_replica()
    counters, transactions = signed_counters(replica, 100)
    assert transactions == 2 and counters == sorted(set(counters))
    first, second = replica.sync_session(), replica.sync_session()
    for session in (first, second):
        session.check_relay_state(STATE)
    side_by_side = [
        s.sign(PushBatch([b"e"]), ACCOUNT, "device").counter for s in (first, second) * 70
    ]
    assert len(set(side_by_side + counters)) == len(side_by_side) + len(counters)
    assert side_by_side[0::2] == sorted(side_by_side[0::2]) > counters
    assert side_by_side[1::2] == sorted(side_by_side[1::2])


def test_a_batch_says_which_envelopes_are_tombstones_and_signing_acks_the_cursor(
    make_replica: ReplicaFactory,
) -> None:
    """`tombstones` is read from the rows (nothing is opened to push); the ack is the pull
    cursor as the batch is signed: every version up to it is here."""
    a, b = make_replica("a"), make_replica("b")
    for i in range(5):
        a.put("notes", f"n{i}", {"i": i})
    for i in (1, 4):
        a.delete("notes", f"n{i}")
    batch = a.sync_session().next_batch()
    assert batch is not None and len(batch.envelopes) == 5
    keys = a._core.keys()
    deleted = [open_envelope(keys, envelope).deleted for envelope in batch.envelopes]
    assert (
        tombstone_flags(len(batch.envelopes), batch.tombstones) == deleted
        and sorted(deleted) == [False] * 3 + [True] * 2
    )
    session = b.sync_session()
    session.apply_page(page_of(batch.envelopes, 0))
    session.check_relay_state(STATE)
    b.put("notes", "mine", {"by": "b"})
    pushed = session.next_batch()
    assert pushed is not None and pushed.tombstones == b""
    assert session.sign(pushed, ACCOUNT, "device").ack == session.cursor == 5


def test_a_reading_device_acks_what_it_pulled_at_most_every_ack_interval(
    make_replica: ReplicaFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ack_due` offers an empty batch (its signature acks the cursor) once the cursor passed
    the last ack this session signed, and no sooner than `ACK_EVERY_S` after it."""
    writer, reader = make_replica("w"), make_replica("r")
    for i in range(3):
        writer.put("notes", f"n{i}", {"i": i})
    envelopes = dirty_envelopes(writer)
    session = reader.sync_session()
    session.check_relay_state(STATE)
    assert session.ack_due() is None  # nothing pulled
    session.apply_page(page_of(envelopes[:2], 0))
    due = session.ack_due()
    assert due is not None and due.envelopes == []
    assert session.sign(due, ACCOUNT, "device").ack == 2
    session.apply_page(page_of(envelopes[2:], 2))
    assert session.ack_due() is None  # acked a moment ago
    monkeypatch.setattr(sync_module, "ACK_EVERY_S", 0.0)
    again = session.ack_due()
    assert again is not None and session.sign(again, ACCOUNT, "device").ack == 3
    assert session.ack_due() is None  # nothing pulled since
    reader.lock()
    session.apply_page(page_of([writer_envelope(writer)], 3))
    assert session.ack_due() is None  # a locked replica signs nothing


def writer_envelope(writer: Replica) -> bytes:
    writer.put("notes", "later", {"i": 9})
    (envelope,) = dirty_envelopes(writer)
    return envelope


def test_an_ack_the_relay_took_is_not_offered_again_by_the_next_session(
    make_replica: ReplicaFactory,
) -> None:
    """Each `sealsync sync` is a new session: the file remembers the cursor the relay last
    took (meta `acked_cursor`), so a device acks when its cursor moved (its own pushes move
    it too), not at every run; a reseed forgets it with the cursor."""
    writer, reader = make_replica("w"), make_replica("r")
    for i in range(2):
        writer.put("notes", f"n{i}", {"i": i})
    envelopes = dirty_envelopes(writer)
    session = reader.sync_session()
    session.check_relay_state(STATE)
    session.apply_page(page_of(envelopes, 0))
    due = session.ack_due()
    assert due is not None
    session.acknowledge(due, PushResult([], STATE))  # this session signed no ack yet
    assert reader.sync_session().ack_due() is not None
    session.acknowledge(session.sign(due, ACCOUNT, "device"), PushResult([], STATE))
    assert reader.sync_session().ack_due() is None  # the relay has 2 already
    later = reader.sync_session()
    later.apply_page(page_of([writer_envelope(writer)], 2))
    assert later.ack_due() is not None
    later.reseed()  # a wiped relay: its seqs start again, and so do the acks it took
    again = reader.sync_session()
    again.check_relay_state(STATE)
    again.apply_page(page_of(envelopes[:1], 0))
    assert again.ack_due() is not None


def test_a_device_that_syncs_acks_at_least_daily_even_when_nothing_moved(
    make_replica: ReplicaFactory,
) -> None:
    """A relay's collection horizon leaves out a device silent for longer: one that syncs
    says so once a day (`KEEPALIVE_MS`), its cursor moved or not."""
    clock = FakeClock()
    writer, reader = make_replica("w"), make_replica("r", wall_clock_ms=clock)
    writer.put("notes", "n", {})
    session = reader.sync_session()
    session.check_relay_state(STATE)
    session.apply_page(page_of(dirty_envelopes(writer), 0))
    due = session.ack_due()
    assert due is not None
    session.acknowledge(session.sign(due, ACCOUNT, "device"), PushResult([], STATE))
    clock.advance(sync_module.KEEPALIVE_MS - 1)
    assert reader.sync_session().ack_due() is None
    clock.advance(1)
    assert reader.sync_session().ack_due() is not None


def offered_mark(replica: Replica) -> int:
    return int(replica._core.store.get_int("offered_through"))


def test_a_batch_refused_outright_is_not_offered_unless_an_attempt_went_unanswered(
    make_replica: ReplicaFactory,
) -> None:
    """`push_refused` puts the mark of what was offered back below the refused batch; not
    once a push of the pass went unanswered (it may have been stored)."""
    replica = make_replica()
    session = replica.sync_session()
    session.apply_page(Page(0, [], 0, False, STATE))
    replica.put("notes", "n", {"v": 1})
    for unanswered in (False, True):  # the first pass puts it back; the second cannot
        session.restart()
        batch = session.next_batch()
        assert batch is not None
        session.sign(batch, "ann", "device")
        assert offered_mark(replica) > 0
        if unanswered:
            session.push_outcome_unknown()
        session.push_refused()
        assert (offered_mark(replica) > 0) is unanswered
