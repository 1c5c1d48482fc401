"""Tombstone collection on the relay (docs/tombstone-collection.md §2, specs/protocol.md §4.8):
a run deletes the declared tombstones every device has acknowledged, each while it is its
key's sole version, takes a seq, and keeps markers (sent on the page that ends at it) and
ghosts (refusing a re-push of what it covered) until every device has pulled past it. On
every storage backend, the memory reference included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.errors import NotFoundError, ResyncRequiredError
from relay.signing import Pusher
from relay.storage import AccountSummary, Device, Storage
from replica.errors import InvalidArgumentError, ProtocolError
from replica.generations import PushSigner, sign_push
from replica.wire import CollectedRun, Page, PushBatch, tombstone_bits
from replica.wiremarks import MARKER, pack_markers, unpack_markers
from tests.conftest import FakeClock
from tests.relay.conftest import HLC, NOW_MS, StorageFactory, envelope
from tests.relay.owners import signed_account

A, B, C, K = b"a" * 16, b"b" * 16, b"c" * 16, b"k" * 16


class Bob:
    """Account "bob" (version 2) whose devices sign their pushes, each with its counter."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.opened, signer = signed_account(storage)
        self.state = signer.state
        self.counters: dict[str, int] = {}

    def push(
        self,
        envelopes: list[bytes],
        *,
        tombs: list[bool] | None = None,
        ack: int | None = None,
        device: str = "d1",
    ) -> list[str]:
        self.counters[device] = self.counters.get(device, 0) + 1
        bits = tombstone_bits(tombs if tombs is not None else [False] * len(envelopes))
        batch = sign_push(
            PushBatch(envelopes, ack=ack, tombstones=bits),
            self.opened.secrets.signing_key,
            1,
            self.counters[device],
            PushSigner("bob", device, self.state),
        )
        result = self.storage.push("bob", batch, Pusher.of(device, batch))
        return [receipt.status for receipt in result.receipts]

    def ack(self, cursor: int, device: str = "d1") -> None:
        assert self.push([], ack=cursor, device=device) == []

    def summary(self, horizon_ms: int | None = None) -> AccountSummary:
        (bob,) = self.storage.accounts("bob", horizon_ms=horizon_ms)
        return bob

    def pull(self, cursor: int) -> Page:
        return self.storage.pull("bob", cursor)


def version(key: bytes, tick: int, node: int = 7, vector: dict[int, int] | None = None) -> bytes:
    return envelope(key, node, HLC + tick, vector or {node: HLC + tick})


def markers(page: Page) -> list[tuple[bytes, int, int]]:
    return [] if page.collected is None else unpack_markers(page.collected)


def test_a_run_deletes_the_acknowledged_sole_tombstones_and_takes_a_seq(
    make_storage: StorageFactory,
) -> None:
    bob = Bob(make_storage())
    live, tomb, later = version(A, 1), version(B, 2), version(C, 3)
    assert bob.push([live, tomb, later], tombs=[False, True, True]) == ["stored"] * 3
    before = bob.summary()
    bob.ack(2)  # the third, a tombstone too, was not acknowledged
    report = bob.storage.collect("bob")
    assert (report.ack_floor, report.run, report.versions, report.bytes) == (2, 4, 1, len(tomb))
    after = bob.summary()
    assert (after.versions, after.head, after.tombstones) == (2, 4, 1)
    assert after.stored_bytes == before.stored_bytes - len(tomb)
    assert (after.collected, after.collected_bytes) == (1, len(tomb))
    page = bob.pull(0)
    assert [e.envelope for e in page.entries] == [live, later]
    assert markers(page) == [(B, 7, HLC + 2)]
    assert (page.next_cursor, page.has_more) == (4, False)
    past = bob.pull(4)
    assert (past.entries, past.collected, past.next_cursor) == ([], None, 4)
    again = bob.storage.collect("bob")  # nothing more at or below the floor
    assert (again.run, again.versions, again.released) == (None, 0, 0)
    assert bob.summary().head == 4


def test_nothing_is_collected_until_every_device_has_acknowledged(
    make_storage: StorageFactory,
) -> None:
    bob = Bob(make_storage())
    bob.push([version(B, 1)], tombs=[True])
    assert bob.storage.collect("bob").ack_floor is None  # d1 has said nothing yet
    assert bob.summary().held_back_by == "d1"
    bob.storage.add_device("bob", Device("d2", "phone", NOW_MS), [])
    bob.ack(1)
    held = bob.storage.collect("bob")
    assert (held.ack_floor, held.run) == (None, None)  # the phone has not acknowledged
    assert bob.summary().held_back_by == "d2"
    bob.ack(0, device="d2")
    assert bob.storage.collect("bob").ack_floor == 0  # nor pulled the tombstone yet
    assert (bob.summary().versions, bob.summary().held_back_by) == (1, "d2")
    bob.storage.revoke_device("bob", "d2")  # a revoked device holds nothing back
    assert bob.storage.collect("bob").run == 2
    assert (bob.summary().versions, bob.summary().held_back_by) == (0, "d1")


def test_a_tombstone_beside_a_concurrent_version_stays(make_storage: StorageFactory) -> None:
    """A delete concurrent with an edit: both stay until a write resolves them."""
    bob = Bob(make_storage())
    assert bob.push([version(K, 1), version(K, 2, node=8)], tombs=[True, False]) == ["stored"] * 2
    bob.ack(2)
    report = bob.storage.collect("bob")
    assert (report.ack_floor, report.run) == (2, None)
    assert bob.summary().versions == 2


def test_a_page_ends_at_a_run_and_carries_its_markers(make_storage: StorageFactory) -> None:
    bob = Bob(make_storage(page_size=3))
    lives = [version(bytes([i]) * 16, i) for i in range(1, 5)]
    bob.push([*lives, version(K, 5)], tombs=[False] * 4 + [True])
    bob.ack(5)
    assert bob.pull(0).last_run == 0  # never collected: a resync sets nothing aside
    assert bob.storage.collect("bob").run == 6
    after = [version(bytes([i]) * 16, i) for i in range(7, 9)]
    bob.push(after)
    first = bob.pull(0)  # three of the four versions before the run, no markers yet
    assert ([e.seq for e in first.entries], first.collected) == ([1, 2, 3], None)
    assert (first.next_cursor, first.has_more) == (3, True)
    second = bob.pull(3)
    assert [e.seq for e in second.entries] == [4]
    assert (markers(second), second.next_cursor, second.has_more) == ([(K, 7, HLC + 5)], 6, True)
    third = bob.pull(6)
    assert ([e.seq for e in third.entries], third.collected) == ([7, 8], None)
    assert (third.next_cursor, third.has_more) == (8, False)
    assert {page.last_run for page in (first, second, third)} == {6}


def test_ghosts_refuse_what_a_run_collected_until_every_device_passed_it(
    make_storage: StorageFactory,
) -> None:
    bob = Bob(make_storage())
    edit = version(K, 1)
    tomb = version(K, 2)  # the same writer, later: it covers the edit
    bob.push([edit])
    bob.push([tomb], tombs=[True])
    bob.ack(2)
    assert bob.storage.collect("bob").run == 3
    # a reseed or a restored device sending what the run covered: never stored again
    assert bob.push([tomb, edit], tombs=[True, False]) == ["superseded", "superseded"]
    revived = version(K, 4)  # a new write after the delete is a new version
    assert bob.push([revived]) == ["stored"]
    assert bob.summary().versions == 1
    bob.ack(4)  # past the run: its markers and ghosts go
    report = bob.storage.collect("bob")
    assert (report.released, report.run) == (1, None)
    assert bob.pull(0).collected is None
    other_tomb = version(A, 5)
    bob.push([other_tomb], tombs=[True])
    bob.ack(5)
    assert bob.storage.collect("bob").run == 6
    bob.ack(6)
    assert bob.storage.collect("bob").released == 1
    assert bob.push([other_tomb], tombs=[True]) == ["stored"]  # nothing remembers it now


def test_a_run_takes_at_most_its_limit_and_the_next_run_the_rest(
    make_storage: StorageFactory,
) -> None:
    bob = Bob(make_storage())
    bob.push([version(A, 1), version(B, 2)], tombs=[True, True])
    bob.ack(2)
    first, second = bob.storage.collect("bob", limit=1), bob.storage.collect("bob", limit=1)
    assert (first.run, first.versions, second.run, second.versions) == (3, 1, 4, 1)
    one, two = bob.pull(0), bob.pull(3)
    assert (markers(one), one.next_cursor, one.has_more) == ([(A, 7, HLC + 1)], 3, True)
    assert (markers(two), two.next_cursor, two.has_more) == ([(B, 7, HLC + 2)], 4, False)


def test_bad_runs_are_refused(make_storage: StorageFactory) -> None:
    storage = make_storage()
    Bob(storage)
    for limit in (0, 10_001):
        with pytest.raises(InvalidArgumentError, match="a run collects"):
            storage.collect("bob", limit=limit)
    with pytest.raises(NotFoundError):
        storage.collect("nobody")


# -- the markers themselves --------------------------------------------------------------------

DOTS = st.lists(
    st.tuples(
        st.binary(min_size=16, max_size=16), st.integers(0, 2**64 - 1), st.integers(1, 2**63 - 1)
    ),
    max_size=50,
)


@given(DOTS)
def test_markers_round_trip(dots: list[tuple[bytes, int, int]]) -> None:
    run = CollectedRun(3, pack_markers(dots))
    assert len(run.markers) == MARKER.size * len(dots)
    assert unpack_markers(run) == dots


@given(DOTS, st.integers(1, MARKER.size - 1))
def test_markers_cut_short_are_a_protocol_error(
    dots: list[tuple[bytes, int, int]], cut: int
) -> None:
    with pytest.raises(ProtocolError, match="not a multiple"):
        unpack_markers(CollectedRun(3, pack_markers(dots) + b"\0" * cut))


DAY_MS = 24 * 3600 * 1000


def test_a_device_silent_past_the_horizon_holds_nothing_back_and_must_resync(
    make_storage: StorageFactory,
) -> None:
    """A lost phone: past the horizon it is left out of the floor, and once a run collects
    what it never pulled it is flagged; it then pulls everything again (from 0, asking
    for it) and ends that with an empty push acking the latest run."""
    clock = FakeClock(NOW_MS)
    bob = Bob(make_storage(clock=clock))
    bob.storage.add_device("bob", Device("d2", "phone", NOW_MS), [])
    bob.ack(0, device="d2")
    bob.push([version(B, 1)], tombs=[True])
    bob.ack(1)
    assert bob.storage.collect("bob", horizon_ms=90 * DAY_MS).run is None  # d2 is within it
    clock.advance(91 * DAY_MS)
    bob.ack(1)  # d1 stays active
    waits = (bob.summary().ack_floor, bob.summary().held_back_by)
    assert waits == (0, "d2")  # the accounts' view of a run with no horizon
    horizon = bob.summary(90 * DAY_MS)
    assert (horizon.ack_floor, horizon.held_back_by) == (1, "d1")  # d2 is left out
    report = bob.storage.collect("bob", horizon_ms=90 * DAY_MS)
    assert (report.ack_floor, report.run, report.flagged) == (1, 2, 1)
    assert (bob.summary().resyncing, bob.summary().held_back_by) == (1, "d1")  # d2 flagged
    with pytest.raises(ResyncRequiredError):
        bob.storage.pull("bob", 0, device_id="d2")
    with pytest.raises(ResyncRequiredError):
        bob.push([version(A, 3)], device="d2")
    assert bob.storage.pull("bob", 0, device_id="d1").next_cursor == 2  # d1 pulls as usual
    page = bob.storage.pull("bob", 0, device_id="d2", resync=True)
    assert (page.next_cursor, markers(page)) == (2, [(B, 7, HLC + 1)])
    resyncing = bob.summary(90 * DAY_MS)  # runs wait while it pulls everything again
    assert (resyncing.ack_floor, resyncing.held_back_by) == (None, "d2")
    with pytest.raises(ResyncRequiredError):
        bob.ack(1, device="d2")  # not past the run: still flagged
    bob.ack(2, device="d2")
    assert bob.summary().resyncing == 0
    assert bob.storage.pull("bob", 2, device_id="d2").entries == []
    assert bob.push([version(A, 3)], device="d2") == ["stored"]


def test_a_resync_under_way_holds_runs_back_and_a_device_added_after_a_run_resyncs(
    make_storage: StorageFactory,
) -> None:
    clock = FakeClock(NOW_MS)
    bob = Bob(make_storage(clock=clock))
    bob.push([version(B, 1)], tombs=[True])
    bob.ack(1)
    assert bob.storage.collect("bob").run == 2
    bob.storage.add_device("bob", Device("d2", "restored", NOW_MS), [])  # flagged at once
    assert bob.summary().resyncing == 1
    with pytest.raises(ResyncRequiredError):
        bob.storage.pull("bob", 0, device_id="d2")
    bob.push([version(C, 3)], tombs=[True])
    bob.ack(3)
    bob.storage.pull("bob", 0, device_id="d2", resync=True)  # its resync begins
    held = bob.storage.collect("bob")
    assert (held.ack_floor, held.run) == (None, None)  # none while it pulls everything
    clock.advance(DAY_MS + 1)  # a resync that long has stopped: runs go on
    assert bob.storage.collect("bob").run == 4
    with pytest.raises(ResyncRequiredError):
        bob.ack(3, device="d2")  # the run it would miss came meanwhile
    with pytest.raises(ResyncRequiredError):
        bob.ack(4, device="d2")  # the run overtook its resync: it begins again
    bob.storage.pull("bob", 0, device_id="d2", resync=True)
    bob.ack(4, device="d2")
    assert bob.summary().resyncing == 0


def test_a_horizon_is_within_its_bounds(make_storage: StorageFactory) -> None:
    bob = Bob(make_storage())
    for horizon in (0, -1, 11 * 365 * DAY_MS):
        with pytest.raises(InvalidArgumentError, match="horizon"):
            bob.storage.collect("bob", horizon_ms=horizon)
        with pytest.raises(InvalidArgumentError, match="horizon"):
            bob.storage.accounts(horizon_ms=horizon)
