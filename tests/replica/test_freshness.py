"""Freshness locks and drift holds (docs/architecture.md §3, §5; specs/replica.md §held)."""

from __future__ import annotations

import tracemalloc

import pytest

from replica import (
    ChangeEvent,
    Collection,
    InvalidArgumentError,
    Record,
    Replica,
    Schema,
    StaleContextError,
)
from replica.clock import hlc_ms
from tests.conftest import FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes

WINDOW_S = 10


def shared(record: Record | None) -> tuple[object, ...]:
    assert record is not None
    return (record.context, record.document, tuple(c.document for c in record.conflicts))


def run_scenario(make_replica: ReplicaFactory, window_s: float) -> dict[str, object]:
    """A edits a record; B, whose clock runs a minute ahead and who has not seen A's edit,
    writes the same record with a higher hlc; A pulls B's version inside the window."""
    clock = FakeClock()
    ahead = FakeClock(clock.now_ms + 60_000)
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=window_s)
    b = make_replica("b", wall_clock_ms=lambda: ahead.now_ms, freshness_window_s=window_s)
    a.put("notes", "n", {"v": "base"})
    apply(b, dirty_envelopes(a))
    a.put("notes", "n", {"v": "local edit"})
    b.put("notes", "n", {"v": "stale remote"})
    local, remote = dirty_envelopes(a), dirty_envelopes(b)
    clock.advance(1000)
    apply(a, remote)
    during = a.get("notes", "n")
    clock.advance(WINDOW_S * 1000 + 1)
    a.release_due()
    after = a.get("notes", "n")
    return {"a": a, "b": b, "during": during, "after": after, "local": local, "clock": clock}


def test_a_stale_inbound_version_waits_out_the_window(make_replica: ReplicaFactory) -> None:
    locked = run_scenario(make_replica, WINDOW_S)
    control = run_scenario(make_replica, 0)
    during, control_during = locked["during"], control["during"]
    assert isinstance(during, Record) and isinstance(control_during, Record)
    assert during.document == {"v": "local edit"} and during.conflicts == ()
    assert control_during.document == {"v": "stale remote"}  # higher hlc wins at once
    assert hlc_ms(control_during.hlc) > hlc_ms(during.hlc)
    after, control_after = locked["after"], control["after"]
    assert isinstance(after, Record) and isinstance(control_after, Record)
    assert after.document == control_after.document == {"v": "stale remote"}
    assert [c.document for c in after.conflicts] == [{"v": "local edit"}]
    assert [c.document for c in control_after.conflicts] == [{"v": "local edit"}]


def test_a_version_that_saw_the_local_edit_applies_inside_the_window(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=WINDOW_S)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=WINDOW_S)
    a.put("notes", "n", {"v": "local edit"})
    apply(b, dirty_envelopes(a))
    clock.advance(100)
    b.put("notes", "n", {"v": "b saw it"})
    apply(a, dirty_envelopes(b))
    got = a.get("notes", "n")
    assert got is not None and got.document == {"v": "b saw it"} and got.conflicts == ()
    assert a.status().held_for_lock == 0


def test_explicit_scope_locks_hold_everything_until_released(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    events: list[ChangeEvent] = []
    a.subscribe(events.append)
    by_kind = {
        "record": a.lock_scope(collection="notes", id="n1"),
        "collection": a.lock_scope(collection="threads"),
    }
    b.put("notes", "n1", {"v": 1})
    b.put("notes", "n2", {"v": 2})
    b.put("threads", "t", {"v": 3})
    apply(a, dirty_envelopes(b))
    assert a.get("notes", "n1") is None and a.get("threads", "t") is None
    assert a.get("notes", "n2") is not None
    assert a.status().held_for_lock == 2
    assert {(e.kind, e.id, e.reason) for e in events if e.kind == "held"} == {
        ("held", "n1", "lock"),
        ("held", "t", "lock"),
    }
    a.release_lock(by_kind["record"])
    assert a.get("notes", "n1") is not None and a.get("threads", "t") is None
    assert ("released", "n1") in {(e.kind, e.id) for e in events}
    clock.advance(601_000)  # past the collection lock's maximum duration
    assert a.get("threads", "t") is not None
    assert a.status().held_for_lock == 0


def test_a_profile_lock_holds_the_whole_profile(make_replica: ReplicaFactory) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    lock = a.lock_scope(duration_s=5)
    b.put("notes", "n", {})
    b.put("threads", "t", {})
    apply(a, dirty_envelopes(b))
    assert a.status().held_for_lock == 2
    a.release_lock(lock)
    assert a.status().held_for_lock == 0 and a.get("threads", "t") is not None


def test_a_local_edit_during_a_lock_stays_a_conflict_and_nothing_is_lost(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    lock = a.lock_scope(collection="notes")
    b.put("notes", "n", {"v": "remote"})
    apply(a, dirty_envelopes(b))
    clock.advance(10)
    a.put("notes", "n", {"v": "local"})
    a.release_lock(lock)
    got = a.get("notes", "n")
    assert got is not None and got.document == {"v": "local"}
    assert [c.document for c in got.conflicts] == [{"v": "remote"}]


def test_versions_far_ahead_are_held_for_drift_until_time_or_acceptance(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    future = FakeClock(clock.now_ms + 3_600_000)
    a = make_replica("a", wall_clock_ms=clock)
    b = make_replica("b", wall_clock_ms=future)
    b.put("notes", "far", {"v": 1})
    b.put("notes", "later", {"v": 2})
    apply(a, dirty_envelopes(b))
    assert a.get("notes", "far") is None and a.status().held_for_drift == 2
    assert a.accept_held() == 2
    far = a.get("notes", "far")
    assert far is not None and far.document == {"v": 1}
    a.put("notes", "mine", {})
    mine = a.get("notes", "mine")
    assert mine is not None and mine.hlc > far.hlc  # the clock observed the accepted versions

    c = make_replica("c", wall_clock_ms=clock)
    b.put("notes", "third", {"v": 3})
    apply(c, dirty_envelopes(b))
    assert c.status().held_for_drift == 1
    clock.advance(3_600_000 - 5 * 60_000 + 1000)  # now within the drift bound
    got = c.get("notes", "third")
    assert got is not None and got.document == {"v": 3}


def test_creating_a_record_of_a_unique_ids_collection_takes_no_lock_and_editing_one_does(
    make_replica: ReplicaFactory,
) -> None:
    """No other device can hold a version of a record with a freshly drawn id, so its
    creation takes no freshness lock; an edit still does. The collision here cannot happen
    with real unique ids: it shows which writes lock."""
    clock = FakeClock()
    ahead = FakeClock(clock.now_ms + 60_000)
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=WINDOW_S)
    b = make_replica("b", wall_clock_ms=lambda: ahead.now_ms, freshness_window_s=WINDOW_S)
    schema = Schema((*a.schema.collections, Collection("events", "lww", unique_ids=True)))
    a.declare(schema)
    b.declare(schema)
    a.put("events", "created", {"v": "a"})
    b.put("events", "created", {"v": "b"})
    a.put("events", "edited", {"v": "a"})
    apply(b, dirty_envelopes(a))
    a.put("events", "edited", {"v": "a edit"})
    b.put("events", "edited", {"v": "b edit"})
    apply(a, dirty_envelopes(b))
    assert a.status().held_for_lock == 1  # the edit's version from b waits out the window
    created, edited = a.get("events", "created"), a.get("events", "edited")
    assert created is not None and created.document == {"v": "b"}  # merged at once
    assert edited is not None and edited.document == {"v": "a edit"}


def test_unique_ids_are_refused_where_ids_are_not_the_writers() -> None:
    for policy in ("register", "local"):
        with pytest.raises(InvalidArgumentError, match="unique_ids needs policy lww or per_item"):
            Collection("c", policy, unique_ids=True)


def held_then_due(make_replica: ReplicaFactory, clock: FakeClock) -> Replica:
    """A replica holding another device's version of notes/n under a 5 s record lock."""
    a = make_replica("a", wall_clock_ms=clock, freshness_window_s=0)
    b = make_replica("b", wall_clock_ms=clock, freshness_window_s=0)
    a.put("notes", "x", {"v": 0})
    a.lock_scope(collection="notes", id="n", duration_s=5)
    b.put("notes", "n", {"v": "remote"})
    apply(a, dirty_envelopes(b))
    assert a.status().held_for_lock == 1
    return a


def test_a_batch_releases_what_is_due_again_after_a_write_in_it_rolled_back(
    make_replica: ReplicaFactory,
) -> None:
    """A batch releases due holds once, at its first read or write; a write whose savepoint
    rolls back takes that release with it, so the next read releases again."""
    clock = FakeClock()
    a = held_then_due(make_replica, clock)
    clock.advance(6000)
    with a.batch():
        with pytest.raises(StaleContextError):
            a.put("notes", "x", {"v": 1}, context=frozenset(), if_unchanged=True)
        assert a.get("notes", "n") is not None
    assert a.status().held_for_lock == 0


def test_release_due_inside_a_batch_releases_what_came_due_since_its_first_read(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    a = held_then_due(make_replica, clock)
    with a.batch():
        assert a.get("notes", "n") is None  # held: the lock is on
        clock.advance(6000)
        a.release_due()
        assert a.get("notes", "n") is not None


def merge_peak_bytes(make_replica: ReplicaFactory, name: str, recent_writes: int) -> int:
    """Python's peak allocation while a page of one other device's version merges into a
    replica whose last `recent_writes` writes each still hold their automatic lock."""
    clock = FakeClock()
    here = make_replica(name, wall_clock_ms=clock, freshness_window_s=WINDOW_S)
    other = make_replica(f"{name}-other", wall_clock_ms=clock)
    for start in range(0, recent_writes, 1000):
        with here.batch():
            for i in range(start, min(start + 1000, recent_writes)):
                here.put("notes", f"n{i}", {"v": i})
    other.put("notes", "from-elsewhere", {"v": 1})
    page = dirty_envelopes(other)
    tracemalloc.start()
    try:
        apply(here, page)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert here.get("notes", "from-elsewhere") is not None
    return peak


def test_a_page_reads_its_own_records_locks_not_every_recent_writes(
    make_replica: ReplicaFactory,
) -> None:
    """A device that just wrote many records holds as many automatic locks; a page reads
    only those of its own records (and every scope's and profile's), so merging it costs no
    more memory after 20,000 fresh writes than after 20."""
    few = merge_peak_bytes(make_replica, "few", 20)
    many = merge_peak_bytes(make_replica, "many", 20_000)
    assert many < few * 1.5 + 64 * 1024, (few, many)
