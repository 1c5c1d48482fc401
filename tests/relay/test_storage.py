"""The shared storage suite: every backend behind `relay.storage.Storage` must pass it alike
(specs/protocol.md §5): receipts, compaction that keeps every sibling, pages in seq order,
account isolation, accounts, devices, tokens, invites and the quota."""

from __future__ import annotations

import hashlib
import random
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo

import relay.postgres
import relay.sqlite
from relay import dialect
from relay.dialect import Types
from relay.errors import AccountExistsError, ForbiddenError, QuotaExceededError
from relay.memory import MemoryRelay
from relay.storage import Device, LoginFailures, Storage, TokenRecord, VersionRules
from replica.wire import MAX_HLC, KdfParams, PushBatch, parse_header
from tests.conftest import FakeClock
from tests.relay.conftest import (
    HLC,
    NOW_MS,
    StorageFactory,
    account_record,
    envelope,
    fresh_schema,
    postgres_url,
    register,
)

KEY = b"k" * 16


@pytest.fixture
def storage(make_storage: StorageFactory) -> Storage:
    s = make_storage()
    register(s, "a")
    return s


def pull_all(s: Storage, account: str) -> list[bytes]:
    out: list[bytes] = []
    cursor = 0
    while True:
        page = s.pull(account, cursor)
        out.extend(e.envelope for e in page.entries)
        cursor = page.next_cursor
        if not page.has_more:
            return out


def test_stored_versions_get_consecutive_sequence_numbers(storage: Storage) -> None:
    batch = PushBatch([envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(4)])
    result = storage.push("a", batch)
    assert [(x.status, x.seq) for x in result.receipts] == [("stored", i) for i in range(1, 5)]
    assert result.state.head == 4 and storage.state("a") == result.state


def test_a_repeated_push_is_idempotent_and_a_changed_body_is_refused(storage: Storage) -> None:
    e = envelope(KEY, 1, HLC, {1: HLC})
    first = storage.push("a", PushBatch([e])).receipts[0]
    again = storage.push("a", PushBatch([e])).receipts[0]
    assert first == again and first.seq == 1
    other = storage.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})])).receipts[0]
    assert (other.status, other.code) == ("refused", "identity_conflict")
    assert storage.state("a").head == 1


def test_an_account_nobody_signs_for_takes_no_second_sealing_of_a_version(
    storage: Storage,
) -> None:
    """A version-1 account's pushes are unsigned (an operator may take them): one sealing
    under a higher key epoch, from anyone holding a token, must not replace the real version
    (the re-sealing rule is for signed pushes: tests/relay/test_signed_push.py)."""
    real = envelope(KEY, 1, HLC, {1: HLC}, epoch=0)
    storage.push("a", PushBatch([real]))
    for epoch in (1, 2**32 - 1):
        shadow = envelope(KEY, 1, HLC, {1: HLC}, b"J" * 44, epoch=epoch)
        (receipt,) = storage.push("a", PushBatch([shadow])).receipts
        assert (receipt.status, receipt.code) == ("refused", "identity_conflict")
    assert pull_all(storage, "a") == [real] and storage.state("a").head == 1


def test_a_dominated_version_is_superseded_and_a_dominating_one_replaces(
    make_storage: StorageFactory,
) -> None:
    old = envelope(KEY, 1, HLC, {1: HLC})
    new = envelope(KEY, 2, HLC + 5, {1: HLC, 2: HLC + 5})
    s = make_storage()
    register(s, "a")
    s.push("a", PushBatch([new]))
    assert s.push("a", PushBatch([old])).receipts[0].status == "superseded"
    s2 = make_storage()
    register(s2, "a")
    s2.push("a", PushBatch([old, new]))
    assert s2.stored_versions("a") == 1
    assert [parse_header(e).dot for e in pull_all(s2, "a")] == [(2, HLC + 5)]


def test_concurrent_versions_are_all_kept_and_served(storage: Storage) -> None:
    a = envelope(KEY, 1, HLC + 1, {1: HLC + 1})
    b = envelope(KEY, 2, HLC + 2, {2: HLC + 2})
    storage.push("a", PushBatch([a, b]))
    assert storage.stored_versions("a") == 2
    c = envelope(KEY, 3, HLC + 3, {1: HLC + 1, 3: HLC + 3})  # saw a, not b
    storage.push("a", PushBatch([c]))
    assert {parse_header(e).dot for e in pull_all(storage, "a")} == {(2, HLC + 2), (3, HLC + 3)}


def test_one_bad_envelope_never_blocks_the_rest(storage: Storage) -> None:
    ahead = (NOW_MS + 6 * 60_000) << 16
    batch = PushBatch(
        [
            b"garbage",
            envelope(KEY, 1, ahead, {1: ahead}),
            envelope(b"x" * 16, 1, HLC, {1: HLC}),
        ]
    )
    receipts = storage.push("a", batch).receipts
    assert [(x.status, x.code) for x in receipts] == [
        ("refused", "malformed"),
        ("refused", "clock_ahead"),
        ("stored", None),
    ]


@pytest.mark.parametrize("entry", [MAX_HLC, (NOW_MS + 6 * 60_000) << 16], ids=["MAX_HLC", "6 min"])
def test_a_vector_entry_ahead_of_the_relay_clock_is_refused_and_compacts_nothing(
    storage: Storage, entry: int
) -> None:
    """A forged header, its own dot in bounds, whose vector covers every stored version of
    the key from far in the future: stored, it would make the relay delete them all and
    supersede the owner's next writes. Refused like a future hlc; nothing stored changes."""
    storage.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC}), envelope(KEY, 2, HLC, {2: HLC})]))
    before = (pull_all(storage, "a"), storage.state("a"), storage.accounts())
    forged = envelope(KEY, 3, HLC + 1, {1: entry, 2: entry, 3: HLC + 1})
    receipts = storage.push("a", PushBatch([forged])).receipts
    assert [(r.status, r.code) for r in receipts] == [("refused", "clock_ahead")]
    assert (pull_all(storage, "a"), storage.state("a"), storage.accounts()) == before


def test_pages_come_in_seq_order_with_a_cursor_that_resumes(storage: Storage) -> None:
    pushed = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(7)]
    storage.push("a", PushBatch(pushed))
    seen: list[bytes] = []
    cursor = 0
    while True:
        page = storage.pull("a", cursor)
        assert page.cursor == cursor and len(page.entries) <= 3
        seen.extend(e.envelope for e in page.entries)
        cursor = page.next_cursor
        if not page.has_more:
            break
    assert seen == pushed and cursor == 7
    assert storage.pull("a", cursor).entries == []
    assert len(storage.pull("a", 0, limit=2).entries) == 2


def test_compacted_versions_leave_gaps_that_pages_step_over(storage: Storage) -> None:
    versions = [envelope(KEY, 1, HLC + i, {1: HLC + i}) for i in range(5)]
    for e in versions:
        storage.push("a", PushBatch([e]))
    page = storage.pull("a", 0)
    assert [e.seq for e in page.entries] == [5] and not page.has_more and page.next_cursor == 5


def test_accounts_never_see_each_other(storage: Storage) -> None:
    register(storage, "bob", "d2")
    storage.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    assert storage.pull("bob", 0).entries == [] and storage.state("bob").head == 0
    assert storage.state("a").account_epoch != storage.state("bob").account_epoch
    assert storage.devices("bob") == [Device("d2", "laptop", NOW_MS)]
    assert not storage.revoke_device("bob", "d1")  # a's device, asked for through bob
    assert not storage.rename_device("bob", "d1", "stolen")
    assert [d.name for d in storage.devices("a")] == ["laptop"]


def test_reseed_gives_a_new_epoch_and_keeps_the_data(storage: Storage) -> None:
    storage.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    before = storage.state("a")
    after = storage.reseed("a")
    assert after.account_epoch != before.account_epoch
    assert (after.storage_id, after.head) == (before.storage_id, before.head)
    assert len(pull_all(storage, "a")) == 1


def test_over_quota_the_whole_batch_rolls_back(make_storage: StorageFactory) -> None:
    s = make_storage(max_account_bytes=250)
    register(s, "a")
    small = envelope(b"1" * 16, 1, HLC, {1: HLC})  # 118 bytes
    s.push("a", PushBatch([small]))
    batch = PushBatch([envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in (2, 3)])
    with pytest.raises(QuotaExceededError):
        s.push("a", batch)
    assert s.state("a").head == 1 and pull_all(s, "a") == [small]
    assert s.push("a", PushBatch([batch.envelopes[0]])).receipts[0].seq == 2  # fits alone


def test_over_quota_an_account_can_still_resend_and_shrink(make_storage: StorageFactory) -> None:
    s = make_storage()
    register(s, "a")
    first = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in (1, 2)]  # 118 B each
    s.push("a", PushBatch(first))
    lowered = make_storage(max_account_bytes=150, reopen=s)  # the operator lowered the quota
    assert [r.seq for r in lowered.push("a", PushBatch(first)).receipts] == [1, 2]
    smaller = envelope(b"\1" * 16, 1, HLC + 3, {1: HLC + 3}, body=b"x" * 40)  # replaces seq 1
    assert lowered.push("a", PushBatch([smaller])).receipts[0].seq == 3
    with pytest.raises(QuotaExceededError):  # but it may not grow
        lowered.push("a", PushBatch([envelope(b"n" * 16, 1, HLC + 4, {1: HLC + 4})]))
    (summary,) = lowered.accounts()
    assert summary.head == 3 and summary.stored_bytes == len(smaller) + len(first[1])


def test_accounts_exist_once_and_are_deleted_whole(storage: Storage) -> None:
    with pytest.raises(AccountExistsError):
        register(storage, "a", "d9")
    storage.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    token_hash = hashlib.sha256(b"a/d1").digest()
    assert storage.token(token_hash) is not None
    assert storage.delete_account("a") and not storage.delete_account("a")
    assert storage.account("a") is None and storage.token(token_hash) is None
    register(storage, "a")  # the name is free again, with nothing of the old account
    assert pull_all(storage, "a") == [] and storage.state("a").head == 0


def test_key_bundle_is_replaced_only_by_compare_and_set(storage: Storage) -> None:
    kdf = KdfParams(b"t" * 16, iterations=4)
    assert storage.put_key_bundle("a", 1, b"new", kdf, b"h" * 32) == 2
    assert storage.put_key_bundle("a", 1, b"lost", kdf, b"x" * 32) is None
    record = storage.account("a")
    assert record is not None
    assert (record.bundle, record.bundle_version, record.kdf, record.auth_hash) == (
        b"new",
        2,
        kdf,
        b"h" * 32,
    )


def test_devices_are_added_renamed_and_revoked_with_their_tokens(storage: Storage) -> None:
    token = TokenRecord(b"t" * 32, "a", "d2", "refresh", NOW_MS + 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [token])
    assert storage.token(b"t" * 32) == token
    assert storage.rename_device("a", "d2", "old phone")
    assert [(d.id, d.name) for d in storage.devices("a")] == [
        ("d1", "laptop"),
        ("d2", "old phone"),
    ]
    assert not storage.is_revoked_token(b"t" * 32)
    assert storage.revoke_device("a", "d2") and not storage.revoke_device("a", "d2")
    assert storage.token(b"t" * 32) is None and [d.id for d in storage.devices("a")] == ["d1"]
    assert storage.is_revoked_token(b"t" * 32)  # its device is told so
    assert not storage.is_revoked_token(hashlib.sha256(b"a/d1").digest())  # d1's, live
    assert not storage.is_revoked_token(b"u" * 32)
    storage.delete_account("a")
    assert not storage.is_revoked_token(b"t" * 32)


def test_a_device_that_ends_its_own_access_is_not_told_it_was_revoked(storage: Storage) -> None:
    token = TokenRecord(b"t" * 32, "a", "d2", "access", NOW_MS + 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [token])
    assert storage.revoke_device("a", "d2", own=True)
    assert storage.token(b"t" * 32) is None and not storage.is_revoked_token(b"t" * 32)


def test_a_device_id_with_nul_is_no_device(storage: Storage) -> None:
    assert not storage.rename_device("a", "d1\0", "stolen")
    assert not storage.revoke_device("a", "\0")
    assert storage.devices("a") == [Device("d1", "laptop", NOW_MS)]


def pair(tag: bytes, device: str = "d3", until_ms: int = NOW_MS + 10_000) -> list[TokenRecord]:
    return [
        TokenRecord(tag + b"a" * 31, "a", device, "access", until_ms),
        TokenRecord(tag + b"r" * 31, "a", device, "refresh", until_ms),
    ]


def add_tablet(storage: Storage) -> TokenRecord:
    """Device d3 of account a, with the one refresh token a login gave it."""
    old = TokenRecord(b"o" * 32, "a", "d3", "refresh", NOW_MS + 10_000)
    storage.add_device("a", Device("d3", "tablet", NOW_MS), [old])
    return old


def test_a_spent_refresh_token_works_again_only_in_its_grace_and_until_its_successor_is_used(
    make_storage: StorageFactory,
) -> None:
    clock = FakeClock(NOW_MS)
    storage = make_storage(clock=clock)
    register(storage, "a")
    old = add_tablet(storage)
    grace_until = NOW_MS + 300
    first, second, third = pair(b"1"), pair(b"2"), pair(b"3")

    assert storage.replace_token(old.hash, first, grace_until)
    assert storage.token(old.hash) == replace(old, kind="spent", expires_ms=grace_until)
    # the reply was lost: the same token again replaces the successors that never arrived
    clock.advance(100)
    assert storage.replace_token(old.hash, second, grace_until + 100)
    assert [storage.token(t.hash) for t in first] == [None, None]
    assert [storage.token(t.hash) for t in second] == second
    assert storage.token(old.hash) == replace(old, kind="spent", expires_ms=grace_until)
    # the device used its successor: the old token's replay is refused, and as a copy of it
    # is loose, every token of the device goes: it logs in again, the copy holds nothing
    clock.advance(1)
    assert storage.replace_token(second[1].hash, third, clock() + 300)
    assert [storage.token(t.hash) for t in third] == third
    assert not storage.replace_token(old.hash, pair(b"4"), clock() + 300)
    assert storage.token(pair(b"4")[1].hash) is None
    assert [storage.token(t.hash) for t in (*third, old, second[1])] == [None] * 4


def test_a_spent_token_past_its_grace_is_refused_and_ends_its_devices_tokens(
    make_storage: StorageFactory,
) -> None:
    clock = FakeClock(NOW_MS)
    storage = make_storage(clock=clock)
    register(storage, "a")
    old = add_tablet(storage)
    first = pair(b"1")
    assert storage.replace_token(old.hash, first, NOW_MS + 300)
    clock.advance(301)  # the grace is over, the successors were never used
    assert not storage.replace_token(old.hash, pair(b"2"), clock() + 300)
    assert [storage.token(t.hash) for t in (*first, old)] == [None] * 3
    assert not storage.replace_token(first[1].hash, pair(b"3"), clock() + 300)


def test_the_order_of_spends_survives_a_shorter_grace_or_a_clock_stepped_back(
    storage: Storage,
) -> None:
    old = add_tablet(storage)
    first, second = pair(b"1"), pair(b"2")
    assert storage.replace_token(old.hash, first, NOW_MS + 300)
    assert storage.replace_token(first[1].hash, second, NOW_MS + 100)  # a shorter grace now
    spent = storage.token(first[1].hash)
    assert spent is not None and spent.expires_ms > NOW_MS + 300  # still after the first spend
    assert [storage.token(t.hash) for t in second] == second
    assert not storage.replace_token(old.hash, pair(b"3"), NOW_MS + 300)  # out of turn
    assert [storage.token(t.hash) for t in second] == [None, None]


def test_a_revoked_device_keeps_no_token_and_gets_none_by_refresh(storage: Storage) -> None:
    refresh = TokenRecord(b"r" * 32, "a", "d2", "refresh", NOW_MS + 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [refresh])
    assert storage.revoke_device("a", "d2")
    successor = TokenRecord(b"s" * 32, "a", "d2", "refresh", NOW_MS + 2)
    assert not storage.replace_token(refresh.hash, [successor], NOW_MS + 300)
    assert storage.token(refresh.hash) is None and storage.token(successor.hash) is None
    # nor through another device's refresh token: a successor needs a live device
    laptop = TokenRecord(b"l" * 32, "a", "d1", "refresh", NOW_MS + 1)
    storage.add_device("a", Device("d3", "tablet", NOW_MS), [laptop])
    assert not storage.replace_token(laptop.hash, [successor], NOW_MS + 300)
    assert storage.token(successor.hash) is None and storage.token(laptop.hash) == laptop


def test_invites_are_single_use_and_expire(make_storage: StorageFactory) -> None:
    s = make_storage()
    s.add_invite(b"i" * 32, NOW_MS + 10)
    s.add_invite(b"e" * 32, NOW_MS - 1)
    device = Device("d1", "laptop", NOW_MS)
    s.create_account(account_record("x"), device, [], b"i" * 32, NOW_MS)
    for name, invite in (("y", b"i" * 32), ("z", b"e" * 32), ("w", b"u" * 32)):
        with pytest.raises(ForbiddenError):
            s.create_account(account_record(name), device, [], invite, NOW_MS)
        assert s.account(name) is None
    assert [a.name for a in s.accounts()] == ["x"]


def test_a_bad_invite_is_refused_alike_for_taken_and_free_names(
    make_storage: StorageFactory,
) -> None:
    s = make_storage()
    register(s, "taken")
    s.add_invite(b"i" * 32, NOW_MS + 10)
    device = Device("d2", "laptop", NOW_MS)
    for name in ("taken", "free"):
        with pytest.raises(ForbiddenError):
            s.create_account(account_record(name), device, [], b"u" * 32, NOW_MS)
    with pytest.raises(AccountExistsError):
        s.create_account(account_record("taken"), device, [], b"i" * 32, NOW_MS)
    s.create_account(account_record("free"), device, [], b"i" * 32, NOW_MS)  # still usable
    assert [a.name for a in s.accounts()] == ["free", "taken"]


def test_the_summary_of_one_account_is_its_line_of_all(make_storage: StorageFactory) -> None:
    s = make_storage()
    for name in ("a", "b"):
        register(s, name)
    s.push("b", PushBatch([envelope(b"k" * 16, 1, HLC, {1: HLC})]))
    everyone = s.accounts()
    assert s.accounts("b") == [everyone[1]] and everyone[1].versions == 1
    assert s.accounts("nobody") == []


def test_account_summaries_count_what_is_stored(storage: Storage) -> None:
    storage.push(
        "a", PushBatch([envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(3)])
    )
    (summary,) = storage.accounts()
    assert (summary.name, summary.devices, summary.versions, summary.head) == ("a", 1, 3, 3)
    assert summary.stored_bytes == sum(len(e) for e in pull_all(storage, "a"))


def test_listeners_hear_each_new_head(storage: Storage) -> None:
    heard: list[tuple[str, int]] = []
    storage.listen(lambda account, head: heard.append((account, head)))
    e = envelope(KEY, 1, HLC, {1: HLC})
    storage.push("a", PushBatch([e]))
    storage.push("a", PushBatch([e]))  # a duplicate moves no head: nothing to hear
    assert heard == [("a", 1)]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=12), st.randoms())
def test_storage_stays_the_siblings_of_everything_pushed(
    make_storage: StorageFactory, nodes: list[int], rnd: random.Random
) -> None:
    """Devices write one key, each seeing only its own past: whatever the arrival order, the
    relay keeps exactly each device's latest version (the undominated ones)."""
    envelopes = [envelope(KEY, node, HLC + i, {node: HLC + i}) for i, node in enumerate(nodes)]
    latest = {node: HLC + i for i, node in enumerate(nodes)}
    rnd.shuffle(envelopes)
    s = make_storage()
    try:
        register(s, "a")
        for e in envelopes:
            s.push("a", PushBatch([e]))
        assert {parse_header(e).dot for e in pull_all(s, "a")} == set(latest.items())
        assert s.stored_versions("a") == len(latest)
    finally:
        s.close()  # one example's connections are not kept for the next (PostgreSQL's cap)


@st.composite
def batched_writes(draw: st.DrawFn) -> list[list[bytes]]:
    """Writes by 3 devices to 2 keys, each device sometimes knowing an earlier write of the
    key (so a later write may dominate one of the same batch); some envelopes sent twice,
    some versions again with other bytes, under the same key epoch or another (an identity
    conflict, or a later or earlier sealing); cut into batches of random sizes."""
    written: list[tuple[bytes, dict[int, int]]] = []
    for i in range(draw(st.integers(1, 16))):
        key, node = bytes([draw(st.integers(0, 1))]) * 16, draw(st.integers(1, 3))
        vector = {node: HLC + i}
        same_key = [v for k, v in written if k == key]
        if bool(same_key) and draw(st.booleans()):  # bool(): else mypy types the draw as a list
            seen = draw(st.sampled_from(same_key))
            vector = {n: max(seen.get(n, 0), vector.get(n, 0)) for n in {*seen, *vector}}
        written.append((key, vector))
    envelopes = [envelope(k, max(v, key=v.__getitem__), max(v.values()), v) for k, v in written]
    envelopes += draw(st.lists(st.sampled_from(envelopes), max_size=4))
    for k, v in draw(st.lists(st.sampled_from(written), max_size=3)):  # other bytes, same dot
        epoch = draw(st.integers(0, 2))
        envelopes.append(envelope(k, max(v, key=v.__getitem__), max(v.values()), v, epoch=epoch))
    envelopes = draw(st.permutations(envelopes))
    cuts = (
        sorted(draw(st.sets(st.integers(1, len(envelopes) - 1), max_size=4)))
        if len(envelopes) > 1
        else []
    )
    return [envelopes[a:b] for a, b in zip([0, *cuts], [*cuts, len(envelopes)], strict=True)]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(batched_writes())
def test_a_batch_decides_as_its_envelopes_pushed_one_by_one(
    make_storage: StorageFactory, monkeypatch: pytest.MonkeyPatch, batches: list[list[bytes]]
) -> None:
    """Backends decide a whole batch at once (one read of the stored versions of its keys,
    in chunks of keys on SQLite: one key per query here); the receipts and the pages are
    those of the reference pushing the same envelopes one at a time: later envelopes see
    earlier ones of their batch."""
    monkeypatch.setattr(relay.sqlite, "KEYS_PER_QUERY", 1)
    reference = MemoryRelay(clock_ms=FakeClock(NOW_MS), accept_unsigned_pushes=True)
    s = make_storage()
    try:
        register(reference, "a")
        register(s, "a")
        for batch in batches:
            expected = [reference.push("a", PushBatch([e])).receipts[0] for e in batch]
            assert s.push("a", PushBatch(batch)).receipts == expected
        assert pull_all(s, "a") == pull_all(reference, "a")
        assert s.state("a").head == reference.state("a").head
        assert s.accounts()[0].stored_bytes == reference.accounts()[0].stored_bytes
    finally:
        s.close()


def test_storage_stays_o_of_siblings_however_long_the_history(storage: Storage) -> None:
    """2,000 versions of 10 keys by 2 devices each (a chain per device): the relay keeps 20
    rows — the siblings — and its byte count is theirs, not the history's."""
    pushed = 0
    for round_ in range(100):
        batch = [
            envelope(
                bytes([k]) * 16,
                node,
                HLC + round_ * 100 + k * 3 + node,
                {node: HLC + round_ * 100 + k * 3 + node},
            )
            for k in range(10)
            for node in (1, 2)
        ]
        storage.push("a", PushBatch(batch))
        pushed += len(batch)
    served = pull_all(storage, "a")
    assert pushed == 2000 and storage.stored_versions("a") == len(served) == 20
    (summary,) = storage.accounts()
    assert summary.stored_bytes == sum(len(e) for e in served)
    assert summary.head == 2000  # every version got a seq; only the siblings kept theirs


def test_pages_stop_at_the_byte_bound_but_hold_at_least_one_envelope(
    make_storage: StorageFactory,
) -> None:
    s = make_storage(page_size=10, max_page_bytes=250)
    register(s, "a")
    small = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(3)]  # 100 B
    large = envelope(b"L" * 16, 1, HLC + 9, {1: HLC + 9}, body=b"x" * 400)
    s.push("a", PushBatch([*small, large, small[0]]))
    first = s.pull("a", 0)
    assert [e.seq for e in first.entries] == [1, 2] and first.has_more and first.next_cursor == 2
    second = s.pull("a", 2)
    assert [e.seq for e in second.entries] == [3] and second.has_more
    third = s.pull("a", 3)  # alone over the bound, still served
    assert [e.envelope for e in third.entries] == [large] and not third.has_more
    assert third.next_cursor == 4


def test_concurrent_pushes_to_several_accounts_stay_consecutive_and_isolated(
    make_storage: StorageFactory,
) -> None:
    """Many threads push to three accounts at once (SQLite commits them in groups): every
    account's seqs are consecutive, and one account refused over its quota harms no other."""
    s = make_storage(max_account_bytes=20_000)
    for name in ("a", "b", "c"):
        register(s, name, f"d-{name}")
    refused: list[str] = []

    def pusher(index: int) -> None:
        name = "abc"[index % 3]
        for i in range(15):
            hlc = HLC + index * 1000 + i
            size = 2000 if name == "c" else 40  # c soon runs out of quota
            e = envelope(bytes([index, i]) * 8, index + 1, hlc, {index + 1: hlc}, b"x" * size)
            try:
                s.push(name, PushBatch([e]))
            except QuotaExceededError:
                refused.append(name)

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused and set(refused) == {"c"}
    for name in ("a", "b", "c"):
        seqs, cursor = [], 0
        while True:
            page = s.pull(name, cursor)
            seqs += [e.seq for e in page.entries]
            cursor = page.next_cursor
            if not page.has_more:
                break
        assert seqs == list(range(1, len(seqs) + 1)) and s.state(name).head == len(seqs) > 0
    assert s.state("a").head == s.state("b").head == 60


def test_a_refresh_clears_the_devices_expired_tokens(storage: Storage) -> None:
    expired = TokenRecord(b"x" * 32, "a", "d1", "access", NOW_MS - 1)
    live = TokenRecord(b"l" * 32, "a", "d1", "access", NOW_MS + 10)
    old = TokenRecord(b"o" * 32, "a", "d1", "refresh", NOW_MS + 10)
    other = TokenRecord(b"t" * 32, "a", "d2", "access", NOW_MS - 1)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [other])
    assert storage.replace_token(hashlib.sha256(b"a/d1").digest(), [expired, live, old], NOW_MS + 5)
    new = TokenRecord(b"n" * 32, "a", "d1", "refresh", NOW_MS + 20)
    assert storage.replace_token(old.hash, [new], NOW_MS + 5)
    assert storage.token(expired.hash) is None  # expired, of the refreshing device: gone
    assert storage.token(live.hash) == live and storage.token(new.hash) == new
    assert storage.token(other.hash) == other  # another device's tokens are its own business


def test_failed_logins_are_counted_per_name_and_address_and_forgotten_after_the_window(
    storage: Storage,
) -> None:
    for name, address, at_ms in [("bob", "a", 1000), ("bob", "a", 2000), ("bob", "b", 3000)]:
        storage.add_login_failure(name, address, at_ms, forget_before_ms=0)
    storage.add_login_failure("eve", "a", 3000, forget_before_ms=0)
    assert storage.login_failures("bob", "a", 0) == LoginFailures(2, 3, 1000)
    assert storage.login_failures("bob", "a", 1000) == LoginFailures(1, 2, 2000)  # after since
    assert storage.login_failures("bob", "c", 0) == LoginFailures(0, 3, None)
    storage.clear_login_failures("bob", "a")
    assert storage.login_failures("bob", "a", 0) == LoginFailures(0, 1, None)
    storage.add_login_failure("carol", "a", 5000, forget_before_ms=3000)  # past every window
    assert storage.login_failures("bob", "b", 0) == LoginFailures(0, 0, None)
    assert storage.login_failures("eve", "a", 0) == LoginFailures(0, 0, None)
    assert storage.login_failures("carol", "a", 0) == LoginFailures(1, 1, 5000)


def first_schema_statements(types: Types) -> list[str]:
    """The DDL of the first relay schema, as a database made then holds it."""
    return [st for st in dialect.SCHEMA.format(**types._asdict()).split(";") if st.strip()]


def assert_upgraded(storage: Storage) -> None:
    """A storage opened on a first-schema database keeps its id and counts failed logins;
    closed after."""
    try:
        storage.add_login_failure("bob", "a", NOW_MS, forget_before_ms=0)
        assert storage.login_failures("bob", "a", 0).from_address == 1
        assert storage.storage_id == "s" * 32
    finally:
        storage.close()


def test_a_sqlite_relay_of_the_first_schema_opens_and_counts_failed_logins(
    tmp_path: Path,
) -> None:
    """A relay file made before failed logins were stored is brought up to date on open."""
    path = tmp_path / "relay.db"
    with sqlite3.connect(path) as db:
        for statement in first_schema_statements(relay.sqlite.TYPES):
            db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('storage_id', ?), ('secret', ?)", (b"s" * 32, b"k"))
        db.execute("PRAGMA user_version=1")
    assert_upgraded(relay.sqlite.SQLiteStorage(path, VersionRules(FakeClock(NOW_MS))))
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (dialect.SCHEMA_VERSION,)


def test_a_postgres_relay_of_the_first_schema_opens_and_counts_failed_logins() -> None:
    url = postgres_url()
    with fresh_schema() as schema:
        with psycopg.connect(make_conninfo(url, options=f"-c search_path={schema}")) as db:
            db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            for statement in first_schema_statements(relay.postgres.TYPES):
                db.execute(sql.SQL(statement))
            db.execute(
                "INSERT INTO meta VALUES ('schema_version', '1'), ('storage_id', %s),"
                " ('secret', %s)",
                (b"s" * 32, b"k"),
            )
        rules = VersionRules(FakeClock(NOW_MS))
        assert_upgraded(relay.postgres.PostgresStorage(url, rules, schema=schema))


def test_a_device_logging_in_again_keeps_its_entry_and_only_its_new_tokens(
    storage: Storage,
) -> None:
    register(storage, "b")
    storage.add_device("a", Device("d2", "phone", NOW_MS), [])
    new = [TokenRecord(b"n" * 32, "a", "d1", "access", NOW_MS + 10_000)]
    assert storage.token(hashlib.sha256(b"a/d1").digest()) is not None
    assert storage.renew_device("a", "d1", new)
    assert [d.id for d in storage.devices("a")] == ["d1", "d2"]
    assert storage.token(new[0].hash) is not None
    assert storage.token(hashlib.sha256(b"a/d1").digest()) is None  # its old token ended
    assert not storage.renew_device("b", "d2", [])  # a's device, asked for through b
    assert not storage.renew_device("a", "nope", []) and not storage.renew_device("a", "\0", [])
    assert [d.id for d in storage.devices("b")] == ["d1"]


def test_a_bundle_change_can_end_every_other_devices_tokens(storage: Storage) -> None:
    phone = TokenRecord(b"p" * 32, "a", "d2", "access", NOW_MS + 10_000)
    storage.add_device("a", Device("d2", "phone", NOW_MS), [phone])
    laptop = hashlib.sha256(b"a/d1").digest()
    kdf = KdfParams(b"n" * 16)
    assert storage.put_key_bundle("a", 9, b"lost", kdf, b"h" * 32, only_device="d1") is None
    assert storage.token(phone.hash) is not None  # a lost compare-and-set ends nothing
    assert storage.put_key_bundle("a", 1, b"new", kdf, b"h" * 32, only_device="d1") == 2
    assert storage.token(phone.hash) is None and storage.token(laptop) is not None
    assert [d.id for d in storage.devices("a")] == ["d1", "d2"]  # logged out, still listed
