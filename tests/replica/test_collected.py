"""A replica drops the tombstones its relay collected, as its pull passes the run
(replica/collected.py, docs/tombstone-collection.md §4): only versions it holds as
tombstones, only from the page that was next, with what they covered, and its change feed
sends a follower that could have missed one back to read everything again."""

from __future__ import annotations

import pytest

from replica import FeedResetError, Replica
from replica.asides import HeldVersion, Row
from replica.errors import ProtocolError
from replica.sync import Applied
from replica.wire import CollectedRun, Page, peek_dot
from replica.wiremarks import MarkedDot, pack_markers
from tests.conftest import ReplicaFactory
from tests.replica.helpers import STATE, apply, dirty_envelopes, page_of


def run_page(replica: Replica, dots: list[MarkedDot], *, cursor: int | None = None) -> Applied:
    """The page that ends at a run naming `dots`, starting at `cursor` (default: the
    replica's own, so the page is the next one)."""
    session = replica.sync_session()
    at = session.cursor if cursor is None else cursor
    page = Page(at, [], at + 1, False, STATE, CollectedRun(at + 1, pack_markers(dots)), at + 1)
    return session.apply_page(page)


def dots(envelopes: list[bytes]) -> list[MarkedDot]:
    found = [peek_dot(e) for e in envelopes]
    return [d for d in found if d is not None]


def test_the_tombstones_a_run_names_are_dropped_with_their_bytes(
    make_replica: ReplicaFactory,
) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    for i in range(5):
        a.put("notes", f"n{i}", {"text": "x" * 300})
    apply(b, dirty_envelopes(a))
    a.delete("notes", "n0")
    a.delete("notes", "n1")
    tombs = dirty_envelopes(a)
    apply(b, tombs)
    assert b.status().tombstones == 2
    applied = run_page(b, dots(tombs))
    assert applied.collected == 2
    status = b.status()
    assert (status.tombstones, status.records) == (0, 3)
    assert (status.collected, status.collected_bytes) == (2, sum(len(t) for t in tombs))
    assert b.get("notes", "n0") is None and b.get("notes", "n2") is not None
    assert run_page(a, dots(tombs)).collected == 2  # the writer drops its own too
    assert [r.id for r in a.scan("notes")] == [r.id for r in b.scan("notes")]


def test_a_marker_never_drops_a_live_version_nor_one_not_known_yet(
    make_replica: ReplicaFactory,
) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    a.put("notes", "live", {"text": "kept"})
    live = dirty_envelopes(a)
    apply(b, live)
    unknown = [(b"u" * 16, 1, 1)]
    applied = run_page(b, dots(live) + unknown)
    assert applied.collected == 0
    assert (b.status().collect_refused, b.status().collected) == (1, 0)
    assert b.get("notes", "live") is not None


def test_only_the_page_that_was_next_applies_its_run(make_replica: ReplicaFactory) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    a.put("notes", "n", {})
    a.delete("notes", "n")
    tomb = dirty_envelopes(a)
    apply(b, tomb)
    cursor = b.sync_session().cursor
    stale = run_page(b, dots(tomb), cursor=cursor - 1)  # a duplicate of an earlier page
    assert (stale.collected, stale.cursor_advanced, b.status().tombstones) == (0, False, 1)
    assert run_page(b, dots(tomb)).collected == 1


def test_held_versions_the_tombstone_covers_and_its_history_go_with_it(
    make_replica: ReplicaFactory,
) -> None:
    """A held version (here of a key epoch this device lacks) whose release the tombstone
    would have dropped goes with it; a concurrent one stays."""
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    c = make_replica("c", freshness_window_s=0)
    a.put("versioned", "v", {"n": 1})
    (first,) = dirty_envelopes(a)
    apply(c, [first])
    c.put("versioned", "v", {"by": "c"})  # concurrent with a's delete below
    (concurrent,) = dirty_envelopes(c)
    a.put("versioned", "v", {"n": 2})
    a.delete("versioned", "v")
    tomb = dirty_envelopes(a)
    assert len(a.history("versioned", "v")) == 2
    apply(b, tomb)
    with b._core.mutex, b._core.write_transaction():  # held as if sealed under a later epoch
        b._core.store.hold(
            [
                HeldVersion(Row(*dot, envelope), "epoch", None, None)
                for dot, envelope in ((peek_dot(first), first), (peek_dot(concurrent), concurrent))
                if dot
            ]
        )
    assert b.status().held_other == {"epoch": 2}
    assert run_page(b, dots(tomb)).collected == 1
    assert b.status().held_other == {"epoch": 1}  # c's, which the tombstone does not cover
    assert run_page(a, dots(tomb)).collected == 1
    assert a.history("versioned", "v") == []


def test_a_follower_behind_a_dropped_tombstone_reads_everything_again(
    make_replica: ReplicaFactory,
) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    a.put("notes", "n", {})
    apply(b, dirty_envelopes(a))
    before = b.feed_head()
    a.delete("notes", "n")
    tomb = dirty_envelopes(a)
    apply(b, tomb)
    after = b.feed_head()
    run_page(b, dots(tomb))
    assert b.changes(after).changes == []  # it saw the delete: nothing to read again
    with pytest.raises(FeedResetError, match="tombstone the relay collected"):
        b.changes(before)


def test_markers_that_are_not_whole_refuse_the_page(make_replica: ReplicaFactory) -> None:
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    a.put("notes", "n", {})
    a.delete("notes", "n")
    apply(b, dirty_envelopes(a))
    session = b.sync_session()
    at = session.cursor
    page = Page(at, [], at + 1, False, STATE, CollectedRun(at + 1, b"\0" * 31))
    with pytest.raises(ProtocolError, match="not a multiple"):
        session.apply_page(page)
    assert (session.cursor, b.status().tombstones) == (at, 1)


def test_a_stale_page_from_before_a_run_brings_back_nothing_it_collected(
    make_replica: ReplicaFactory,
) -> None:
    """A page served before the run (replayed by a relay, or held by another process) may
    hold a version the collected tombstone replaced: once the run passed here, only its
    entries after the run merge; the next page still merges whole."""
    a, b = make_replica("a", freshness_window_s=0), make_replica("b", freshness_window_s=0)
    a.put("notes", "n", {"v": 1})
    (written,) = dirty_envelopes(a)
    a.delete("notes", "n")
    (tomb,) = dirty_envelopes(a)
    apply(b, [written, tomb])
    assert run_page(b, dots([tomb])).collected == 1
    cursor = b.sync_session().cursor
    b.sync_session().apply_page(page_of([written], cursor - 3))  # seqs up to the run's
    assert b.get("notes", "n") is None and b.status().records == 0
    a.put("notes", "later", {"v": 2})
    (later,) = dirty_envelopes(a)
    b.sync_session().apply_page(page_of([later], cursor, last_run=cursor))  # the run's seq
    assert b.get("notes", "later") is not None
