"""The in-memory reference relay (specs/protocol.md §reference relay): receipts, compaction
that keeps every sibling, pages in seq order, and the state that exposes wipes and rollbacks."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from relay.memory import MemoryRelay
from replica import PushBatch
from replica.wire import encode_header, parse_header
from tests.conftest import FakeClock

KEY = b"k" * 16
NOW_MS = 1_800_000_000_000
HLC = NOW_MS << 16


def envelope(key: bytes, node: int, hlc: int, vector: dict[int, int], body: bytes = b"") -> bytes:
    """A header the relay can read and an opaque body it never opens."""
    return encode_header(0, key, hlc, node, vector) + (body or os.urandom(44))


def relay() -> MemoryRelay:
    return MemoryRelay(clock_ms=FakeClock(NOW_MS), page_size=3)


def test_stored_versions_get_consecutive_sequence_numbers() -> None:
    r = relay()
    batch = PushBatch([envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(4)])
    result = r.push("a", batch)
    assert [(x.status, x.seq) for x in result.receipts] == [("stored", i) for i in range(1, 5)]
    assert result.state.head == 4


def test_a_repeated_push_is_idempotent_and_a_changed_body_is_refused() -> None:
    r = relay()
    e = envelope(KEY, 1, HLC, {1: HLC})
    first = r.push("a", PushBatch([e])).receipts[0]
    again = r.push("a", PushBatch([e])).receipts[0]
    assert first == again and first.seq == 1
    other = r.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})])).receipts[0]
    assert (other.status, other.code) == ("refused", "identity_conflict")
    assert r.state("a").head == 1


def test_a_dominated_version_is_superseded_and_a_dominating_one_replaces() -> None:
    r = relay()
    old = envelope(KEY, 1, HLC, {1: HLC})
    new = envelope(KEY, 2, HLC + 5, {1: HLC, 2: HLC + 5})
    r.push("a", PushBatch([new]))
    assert r.push("a", PushBatch([old])).receipts[0].status == "superseded"
    r2 = relay()
    r2.push("a", PushBatch([old, new]))
    assert r2.stored_versions("a") == 1
    page = r2.pull("a", 0)
    assert [parse_header(e.envelope).dot for e in page.entries] == [(2, HLC + 5)]


def test_concurrent_versions_are_all_kept_and_served() -> None:
    r = relay()
    a = envelope(KEY, 1, HLC + 1, {1: HLC + 1})
    b = envelope(KEY, 2, HLC + 2, {2: HLC + 2})
    r.push("a", PushBatch([a, b]))
    assert r.stored_versions("a") == 2
    c = envelope(KEY, 3, HLC + 3, {1: HLC + 1, 3: HLC + 3})  # saw a, not b
    r.push("a", PushBatch([c]))
    dots = {parse_header(e.envelope).dot for e in r.pull("a", 0).entries}
    assert dots == {(2, HLC + 2), (3, HLC + 3)}


def test_one_bad_envelope_never_blocks_the_rest() -> None:
    r = relay()
    ahead = (NOW_MS + 6 * 60_000) << 16
    batch = PushBatch(
        [
            b"garbage",
            envelope(KEY, 1, ahead, {1: ahead}),
            envelope(b"x" * 16, 1, HLC, {1: HLC}),
        ]
    )
    receipts = r.push("a", batch).receipts
    assert [(x.status, x.code) for x in receipts] == [
        ("refused", "malformed"),
        ("refused", "clock_ahead"),
        ("stored", None),
    ]


def test_pages_come_in_seq_order_with_a_cursor_that_resumes() -> None:
    r = relay()
    pushed = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(7)]
    r.push("a", PushBatch(pushed))
    seen: list[bytes] = []
    cursor = 0
    while True:
        page = r.pull("a", cursor)
        assert page.cursor == cursor and len(page.entries) <= 3
        seen.extend(e.envelope for e in page.entries)
        cursor = page.next_cursor
        if not page.has_more:
            break
    assert seen == pushed and cursor == 7
    assert r.pull("a", cursor).entries == []


def test_accounts_never_see_each_other() -> None:
    r = relay()
    r.push("alice", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    assert r.pull("bob", 0).entries == [] and r.state("bob").head == 0
    assert r.state("alice").account_epoch != r.state("bob").account_epoch


def test_wipe_restore_and_reseed_change_what_devices_see() -> None:
    r = relay()
    r.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    before = r.state("a")
    snapshot = r.snapshot()
    r.push("a", PushBatch([envelope(b"y" * 16, 1, HLC + 1, {1: HLC + 1})]))
    r.restore(snapshot)
    assert r.state("a") == before  # same storage id and epoch, head back to 1
    reseeded = r.reseed("a")
    assert reseeded.account_epoch != before.account_epoch
    r.restore(snapshot)  # a restore older than the reseed still shows another epoch
    assert r.state("a").account_epoch != reseeded.account_epoch
    r.wipe()
    assert r.state("a").storage_id != before.storage_id and r.state("a").head == 0


def pull_all(r: MemoryRelay, account: str) -> list[bytes]:
    out, cursor = [], 0
    while True:
        page = r.pull(account, cursor)
        out.extend(e.envelope for e in page.entries)
        cursor = page.next_cursor
        if not page.has_more:
            return out


@given(st.lists(st.integers(1, 3), min_size=1, max_size=15), st.randoms())
def test_storage_stays_the_siblings_of_everything_pushed(nodes: list[int], rnd: object) -> None:
    """Devices write one key, each seeing only its own past: whatever the arrival order, the
    relay keeps exactly each device's latest version (the undominated ones)."""
    envelopes = [envelope(KEY, node, HLC + i, {node: HLC + i}) for i, node in enumerate(nodes)]
    latest = {node: HLC + i for i, node in enumerate(nodes)}
    rnd.shuffle(envelopes)  # type: ignore[attr-defined]
    r = relay()
    for e in envelopes:
        r.push("a", PushBatch([e]))
    assert {parse_header(e).dot for e in pull_all(r, "a")} == set(latest.items())
    assert r.stored_versions("a") == len(latest)
