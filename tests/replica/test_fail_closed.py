"""Fail closed (docs/architecture.md §6.1): for every kind of damage, reads raise the typed error, nothing
returns empty or default, overwrites are refused, the rest of a page merges, and repair
quarantines exactly the damaged rows, byte for byte, and nothing else."""

from __future__ import annotations

import hashlib
import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from relay.memory import MemoryRelay
from replica import (
    DegradedError,
    Page,
    PageEntry,
    RelayState,
    RepairRefusedError,
    Replica,
    StoreError,
)
from replica.envelope import Identity, opaque_key, seal
from replica.keys import AccountInfo, AccountKeys
from replica.migrations import SCHEMA_VERSION
from replica.wire import MAX_ENVELOPE_BYTES, node_to_i64, parse_header, system_clock_ms
from tests.conftest import Account, FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes, page_of, undo_formats_6_to_10
from tests.replica.test_sync_session import sync

Damage = Callable[[bytes, dict[str, bytes]], bytes]
IDS = ["r1", "r2", "r3", "r4"]


def flip_bit(envelope: bytes, _: dict[str, bytes]) -> bytes:
    position = len(envelope) - 30
    return envelope[:position] + bytes([envelope[position] ^ 0x04]) + envelope[position + 1 :]


def truncate(envelope: bytes, _: dict[str, bytes]) -> bytes:
    return envelope[:-9]


def relabel(offset: int, size: int, delta: int) -> Damage:
    """Change one header field (the row's columns are changed to match by `damage_row`)."""

    def damage(envelope: bytes, _: dict[str, bytes]) -> bytes:
        value = int.from_bytes(envelope[offset : offset + size], "big") + delta
        return envelope[:offset] + value.to_bytes(size, "big") + envelope[offset + size :]

    return damage


def moved_from(name: str) -> Damage:
    """Another record's envelope in this record's row."""
    return lambda _envelope, others: others[name]


def sealed_as_r2(keys: AccountKeys, envelope: bytes, document: object, nonce: bytes) -> bytes:
    """A version of notes/r2 sealed under `keys`, with the dot and vector of `envelope`."""
    header = parse_header(envelope)
    return seal(
        keys,
        Identity("default", "notes", "r2"),
        hlc=header.hlc,
        node=header.node,
        vector=header.vector,
        deleted=False,
        document=document,
        nonce=nonce,
    )


def resealed_under_other_key(account_id: bool) -> Damage:
    """Sealed for this record by another key (same account id) or another account entirely,
    then relabelled to this record's opaque key so only authentication can tell."""

    def damage(envelope: bytes, others: dict[str, bytes]) -> bytes:
        info = AccountInfo(others["account_id"] if account_id else b"\x07" * 16, 0)
        stranger = AccountKeys.v1(b"\x42" * 32, info)
        forged = sealed_as_r2(stranger, envelope, {"forged": True}, b"\x00" * 12)
        return forged[:6] + parse_header(envelope).key + forged[22:]

    return damage


def sealed_at_epoch_1_relabelled_to_0(envelope: bytes, others: dict[str, bytes]) -> bytes:
    """Sealed for this record with the account's id at epoch 1 under a key derived from the
    account's own unlock key, then labelled epoch 0 (a known epoch, so only authentication can
    tell)."""
    keys = AccountKeys.v1(others["unlock_key"], AccountInfo(others["account_id"], 1))
    genuine = sealed_as_r2(keys, envelope, {"id": "r2"}, b"\x01" * 12)
    assert parse_header(genuine).epoch == 1
    return genuine[:2] + struct.pack(">I", 0) + genuine[6:]


DAMAGES: dict[str, Damage] = {
    "flipped bit": flip_bit,
    "truncated": truncate,
    "relabelled hlc": relabel(22, 8, 1),
    "relabelled node": relabel(30, 8, 1),
    "relabelled vector": relabel(48, 8, 1),
    "relabelled epoch (known)": sealed_at_epoch_1_relabelled_to_0,
    "relabelled key": relabel(6, 16, 1),
    "moved to another record": moved_from("r3"),
    "moved to another collection": moved_from("threads/r2"),
    "moved to another profile": moved_from("work/r2"),
    "moved to another account": resealed_under_other_key(account_id=False),
    "wrong key": resealed_under_other_key(account_id=True),
}


def row_digests(path: Path) -> dict[tuple[bytes, int, int], str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT key, node, hlc, envelope FROM versions").fetchall()
    return {(k, n, h): hashlib.sha256(e).hexdigest() for k, n, h, e in rows}


def damage_row(path: Path, key: bytes, damage: Damage, others: dict[str, bytes]) -> bytes:
    """Damage the stored row of `key`; keep the row's columns in step with a relabelled
    header (a careful attacker), unless the header no longer parses."""
    with sqlite3.connect(path) as db:
        node, hlc, envelope = db.execute(
            "SELECT node, hlc, envelope FROM versions WHERE key = ?", (key,)
        ).fetchone()
        damaged = damage(envelope, others)
        try:
            header = parse_header(damaged)
            if header.key == key:
                node, hlc = node_to_i64(header.node), header.hlc
        except Exception:
            pass
        db.execute(
            "UPDATE versions SET node = ?, hlc = ?, envelope = ? WHERE key = ?",
            (node, hlc, damaged, key),
        )
    return damaged


@pytest.fixture
def populated(make_replica: ReplicaFactory, account: Account) -> tuple[Replica, dict[str, bytes]]:
    replica = make_replica("victim", freshness_window_s=0)
    replica.create_profile("work")
    for id in IDS:
        replica.put("notes", id, {"id": id})
    replica.put("threads", "r2", {"id": "thread"})
    replica.put("notes", "r2", {"id": "work"}, profile="work")
    keys = replica._core.keys()
    others = {"account_id": keys.account_id, "unlock_key": replica.unlock_key()}
    with sqlite3.connect(replica.path) as db:
        for name, identity in {
            "r3": Identity("default", "notes", "r3"),
            "threads/r2": Identity("default", "threads", "r2"),
            "work/r2": Identity("work", "notes", "r2"),
        }.items():
            key = opaque_key(keys.index_key, identity)
            others[name] = db.execute(
                "SELECT envelope FROM versions WHERE key = ?", (key,)
            ).fetchone()[0]
    return replica, others


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_row_fails_closed_and_repair_quarantines_exactly_it(
    populated: tuple[Replica, dict[str, bytes]], kind: str
) -> None:
    replica, others = populated
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "r2"))
    replica._core.opener_or_raise().forget()
    before = row_digests(replica.path)
    damaged = damage_row(replica.path, key, DAMAGES[kind], others)
    damaged_digests = row_digests(replica.path)

    for _ in range(2):  # the latch holds: the second read raises too
        with pytest.raises(DegradedError):
            replica.get("notes", "r2")
    refused: list[Callable[[], object]] = [
        lambda: replica.scan("notes"),
        lambda: replica.conflicts("notes", "r2"),
        lambda: replica.history("notes", "r2"),
        lambda: replica.put("notes", "r2", {"id": "overwrite"}),
        lambda: replica.delete("notes", "r2"),
        lambda: replica.update("notes", "r2", lambda _: {"id": "overwrite"}),
    ]
    for call in refused:
        with pytest.raises(DegradedError):
            call()
    assert row_digests(replica.path) == damaged_digests  # nothing was written over it
    assert sorted(r.id for r in replica.scan("notes", skip_degraded=True)) == ["r1", "r3", "r4"]
    intact = replica.get("notes", "r1")
    assert intact is not None and intact.document == {"id": "r1"}
    replica.put("notes", "r1", {"id": "still writable"})
    assert replica.status().degraded == 1

    before_repair = row_digests(replica.path)
    diagnosis = replica.diagnose()
    assert [f.row.envelope for f in diagnosis.findings] == [damaged]
    assert diagnosis.verdict == diagnosis.findings[0].damage and not diagnosis.healthy
    report = replica.repair()
    assert report.quarantined == 1 and report.unlatched_records == 1
    with sqlite3.connect(replica.path) as db:
        quarantined = db.execute("SELECT source, envelope FROM quarantine").fetchall()
    assert quarantined == [("versions", damaged)]
    assert row_digests(replica.path) == {k: v for k, v in before_repair.items() if k[0] != key}
    assert len(before_repair) == len(before)
    assert replica.get("notes", "r2") is None
    assert replica.status().degraded == 0 and replica.diagnose().verdict == "healthy"


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_envelope_in_a_page_is_quarantined_and_the_rest_merges(
    make_replica: ReplicaFactory, kind: str
) -> None:
    clock = FakeClock()
    writer = make_replica("w", wall_clock_ms=clock)
    writer.create_profile("work")
    for id in IDS:
        writer.put("notes", id, {"id": id})
    writer.put("threads", "r2", {"id": "thread"})
    writer.put("notes", "r2", {"id": "work"}, profile="work")
    envelopes = dirty_envelopes(writer)
    keys = writer._core.keys()
    by_identity = {}
    for envelope in envelopes:
        opened = writer._core.opener_or_raise().open(envelope)
        by_identity[opened.identity] = envelope
    others = {
        "account_id": keys.account_id,
        "unlock_key": writer.unlock_key(),
        "r3": by_identity[Identity("default", "notes", "r3")],
        "threads/r2": by_identity[Identity("default", "threads", "r2")],
        "work/r2": by_identity[Identity("work", "notes", "r2")],
    }
    target = by_identity[Identity("default", "notes", "r2")]
    damaged = DAMAGES[kind](target, others)
    if damaged == others.get("r3") or damaged in others.values():
        page = [e for e in envelopes if e != target]  # a moved envelope is just a duplicate
        expected_quarantine = 0
    else:
        page = [damaged if e == target else e for e in envelopes]
        expected_quarantine = 1
    reader = make_replica("r", wall_clock_ms=clock)
    apply(reader, page)
    assert reader.status().quarantined == expected_quarantine
    assert sorted(r.id for r in reader.scan("notes", skip_degraded=True)) == ["r1", "r3", "r4"]
    assert reader.get("threads", "r2") is not None
    if expected_quarantine:
        with sqlite3.connect(reader.path) as db:
            assert db.execute("SELECT envelope FROM quarantine").fetchall() == [(damaged,)]


def test_an_envelope_of_an_unknown_epoch_is_held_not_quarantined(
    make_replica: ReplicaFactory,
) -> None:
    writer, reader = make_replica("w"), make_replica("r")
    writer.put("notes", "n", {})
    (envelope,) = dirty_envelopes(writer)
    future = envelope[:2] + struct.pack(">I", 7) + envelope[6:]
    apply(reader, [future])
    status = reader.status()
    assert status.held_other == {"epoch": 1} and status.quarantined == 0 and status.degraded == 0


def test_repair_refuses_when_most_rows_are_undecryptable(
    populated: tuple[Replica, dict[str, bytes]],
) -> None:
    replica, others = populated
    keys = replica._core.keys()
    damage = resealed_under_other_key(account_id=True)
    with sqlite3.connect(replica.path) as db:
        rows = db.execute("SELECT key FROM versions").fetchall()
    for (key,) in rows:
        damage_row(replica.path, key, damage, others)
    del keys
    replica._core.opener_or_raise().forget()
    with pytest.raises(RepairRefusedError, match="key mismatch"):
        replica.repair()
    assert replica.status().quarantined == 0
    report = replica.repair(force=True)
    assert report.quarantined == len(rows)


def dirty_identities(replica: Replica) -> set[tuple[bytes, int, int]]:
    with sqlite3.connect(replica.path) as db:
        rows = db.execute("SELECT key, node, hlc FROM versions WHERE dirty = 1").fetchall()
    db.close()
    return {(bytes(k), n, h) for k, n, h in rows}


def test_a_quarantined_version_that_opens_now_is_merged_again_by_repair(
    populated: tuple[Replica, dict[str, bytes]],
) -> None:
    """A repair forced under another key set r3 aside as undecryptable; with the right key
    back, the next repair merges it again (verified) and keeps only what still does not
    open. This device's own version is not taken for a copied file's."""
    replica, others = populated
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "r3"))
    forged = resealed_under_other_key(account_id=True)(others["r3"], others)
    header, node = parse_header(others["r3"]), replica.status().node
    sync(replica, MemoryRelay(clock_ms=system_clock_ms))  # everything pushed: nothing pending
    with replica._core.write_transaction():  # as `repair(force=True)` moved it
        store = replica._core.store
        store.quarantine("versions", key, others["r3"], "undecryptable: another key", 1, header.dot)
        store.db.execute("DELETE FROM versions WHERE key = ?", (key,))
        store.quarantine("pull", key, forged, "undecryptable: forged", 1)
    assert replica.get("notes", "r3") is None and replica.status().quarantined == 2
    report = replica.repair()
    assert (report.quarantined, report.readmitted) == (0, 1)
    record = replica.get("notes", "r3")
    assert record is not None and record.document == {"id": "r3"}
    assert replica.status().quarantined == 1 and replica.status().node == node
    assert (key, node_to_i64(header.node), header.hlc) in dirty_identities(replica)
    assert replica.repair().readmitted == 0  # the forgery stays


def test_clear_empties_a_degraded_collection(populated: tuple[Replica, dict[str, bytes]]) -> None:
    replica, others = populated
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "r2"))
    damage_row(replica.path, key, flip_bit, others)
    replica._core.opener_or_raise().forget()
    with pytest.raises(DegradedError):
        replica.get("notes", "r2")
    assert replica.clear("notes") == 3
    assert replica.scan("notes") == [] and replica.status().degraded == 0
    assert replica.status().quarantined == 1
    assert replica.get("threads", "r2") is not None


def test_a_header_with_an_hlc_beyond_63_bits_is_quarantined_not_a_crash(
    make_replica: ReplicaFactory,
) -> None:
    """A relay with no key must not be able to wedge a device's pulls (hlc columns are
    signed 64-bit integers)."""
    replica = make_replica()
    hlc = 1 << 63
    forged = (
        struct.pack(">BBI16sQQH", 1, 1, 0, b"k" * 16, hlc, 7, 1)
        + struct.pack(">QQ", 7, hlc)
        + bytes(60)
    )
    applied = replica.sync_session().apply_page(page_of_one(forged))
    assert applied.quarantined == 1 and applied.cursor_advanced
    replica.put("notes", "n", {"still": "works"})


def page_of_one(envelope: bytes) -> Page:
    return Page(0, [PageEntry(1, envelope)], 1, False, RelayState("s", "e", 1))


def test_repair_resets_the_cursor_so_dropped_versions_come_back(
    populated: tuple[Replica, dict[str, bytes]],
) -> None:
    replica, others = populated
    session = replica.sync_session()
    session.apply_page(Page(0, [], 40, False, RelayState("s", "e", 40)))
    assert session.cursor == 40
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "r2"))
    damage_row(replica.path, key, flip_bit, others)
    replica.repair()
    assert session.cursor == 0


def test_a_damaged_draft_is_not_overwritten(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("drafts", "d", {"text": "unsent"})
    with sqlite3.connect(replica.path) as db:
        (envelope,) = db.execute("SELECT envelope FROM local").fetchone()
        db.execute("UPDATE local SET envelope = ?", (flip_bit(envelope, {}),))
    replica._core.opener_or_raise().forget()
    with pytest.raises(DegradedError):
        replica.put("drafts", "d", {"text": "overwrite"})
    with pytest.raises(DegradedError):
        replica.get("drafts", "d")
    assert replica.repair().quarantined == 1
    replica.put("drafts", "d", {"text": "new"})


def test_a_damaged_version_is_never_pushed(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.put("notes", "good", {})
    replica.put("notes", "bad", {})
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "bad"))
    damage_row(replica.path, key, truncate_header, {})
    session = replica.sync_session()
    pushed = [e for batch in iter(session.next_batch, None) for e in batch.envelopes]
    assert [parse_header(e).key for e in pushed] != [] and key not in {
        parse_header(e).key for e in pushed
    }
    assert replica.status().degraded == 1


def truncate_header(envelope: bytes, _: dict[str, bytes]) -> bytes:
    return envelope[:30]


def test_a_degraded_item_never_wedges_pulls_of_its_per_item_set(
    make_replica: ReplicaFactory,
) -> None:
    """Counting a per_item set for `over_limit` must not raise on an unreadable item."""
    clock = FakeClock()
    writer = make_replica("w", wall_clock_ms=clock)
    reader = make_replica("r", wall_clock_ms=clock)
    writer.put("personas", "p1", {})
    apply(reader, dirty_envelopes(writer))
    key = opaque_key(reader._core.keys().index_key, Identity("default", "personas", "p1"))
    damage_row(reader.path, key, flip_bit, {})
    reader._core.opener_or_raise().forget()
    reader.subscribe(lambda _: None)
    writer.put("personas", "p2", {})
    session = reader.sync_session()
    applied = session.apply_page(page_of(dirty_envelopes(writer), session.cursor))
    assert applied.merged == 1 and applied.cursor_advanced


def test_repair_then_re_pull_is_not_mistaken_for_a_copied_file(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    replica = make_replica(wall_clock_ms=clock, freshness_window_s=0)
    replica.put("notes", "mine", {"v": 1})
    sync(replica, relay)
    key = opaque_key(replica._core.keys().index_key, Identity("default", "notes", "mine"))
    damage_row(replica.path, key, flip_bit, {})
    replica._core.opener_or_raise().forget()
    node = replica.node
    replica.repair()
    sync(replica, relay)
    assert replica.node == node
    got = replica.get("notes", "mine")
    assert got is not None and got.document == {"v": 1}  # the relay's copy came back


def test_a_forged_copy_held_first_never_displaces_the_genuine_version(
    make_replica: ReplicaFactory, account: Account
) -> None:
    writer, reader = make_replica("w"), make_replica("r")
    writer.put("notes", "n", {"v": "genuine"})
    (genuine,) = dirty_envelopes(writer)
    forged = genuine[:-1] + bytes([genuine[-1] ^ 1])  # same identity, tag flipped
    reader.lock()  # a background sync still pulls while the app is locked
    apply(reader, [forged, genuine])
    assert reader.status().held_other == {"sealed": 2}
    reader.unlock_with_key(account.key)  # both are re-examined in one batch
    assert reader.status().degraded == 0  # the genuine copy merged: nothing to latch
    got = reader.get("notes", "n")
    assert got is not None and got.document == {"v": "genuine"}


def test_an_oversized_envelope_is_refused_and_only_its_prefix_kept(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    huge = struct.pack(">BBI16sQQH", 1, 1, 0, b"k" * 16, 5, 7, 1) + struct.pack(">QQ", 7, 5)
    huge += bytes(MAX_ENVELOPE_BYTES)
    applied = replica.sync_session().apply_page(page_of_one(huge))
    assert applied.quarantined == 1
    with sqlite3.connect(replica.path) as db:
        ((kept, reason),) = db.execute("SELECT envelope, reason FROM quarantine").fetchall()
    assert kept == huge[:4096] and f"of {len(huge)} bytes kept" in reason


def test_unverifiable_holds_are_bounded(
    make_replica: ReplicaFactory, account: Account, monkeypatch: pytest.MonkeyPatch
) -> None:
    import replica.inbound

    monkeypatch.setattr(replica.inbound, "MAX_UNVERIFIED_HELD_BYTES", 1000)
    writer, reader = make_replica("w"), make_replica("r")
    for i in range(8):
        writer.put("notes", f"n{i}", {"text": "x" * 200})
    envelopes = dirty_envelopes(writer)
    reader.lock()
    session = reader.sync_session()
    with pytest.raises(StoreError, match="cannot be verified yet"):
        session.apply_page(page_of(envelopes))
    assert session.cursor == 0 and reader.status().held_other == {}  # nothing half applied
    reader.unlock_with_key(account.key)
    session.apply_page(page_of(envelopes))
    assert len(reader.scan("notes")) == 8


def test_a_forged_held_copy_never_reaches_a_reseeded_relay(
    make_replica: ReplicaFactory, account: Account
) -> None:
    clock = FakeClock()
    relay = MemoryRelay(clock_ms=clock)
    writer = make_replica("w", wall_clock_ms=clock)
    reader = make_replica("r", wall_clock_ms=clock)
    writer.put("notes", "n", {"v": "genuine"})
    (genuine,) = dirty_envelopes(writer)
    writer.close()  # the reader's copy is the only one left
    forged = genuine[:-1] + bytes([genuine[-1] ^ 1])
    reader.lock()
    apply(reader, [forged, genuine])  # both held, unverified
    relay.wipe()
    session = reader.sync_session()
    session.reseed()
    assert session.next_batch() is None  # nothing unverified is pushed while locked
    reader.unlock_with_key(account.key)
    reader.repair()
    sync(reader, relay)
    fresh = make_replica("f", wall_clock_ms=clock)
    sync(fresh, relay)
    got = fresh.get("notes", "n")
    assert got is not None and got.document == {"v": "genuine"}
    assert fresh.status().quarantined == 0


def test_a_damaged_envelope_pulled_again_after_a_repair_adds_no_quarantine_row(
    make_replica: ReplicaFactory,
) -> None:
    """A repair resets the cursor, so the relay's damaged envelope comes back with the next
    pull: it is quarantined once, however often it comes (issue 12: a row each time)."""
    writer = make_replica("w")
    writer.put("notes", "n", {"text": "x"})
    (envelope,) = dirty_envelopes(writer)
    damaged = flip_bit(envelope, {})
    reader = make_replica("r")
    for _ in range(3):
        reader.sync_session().apply_page(page_of([damaged]))
        assert reader.repair().unlatched_records == 1
    assert reader.status().quarantined == 1
    with sqlite3.connect(reader.path) as db:
        assert db.execute("SELECT envelope FROM quarantine").fetchall() == [(damaged,)]


def test_a_replica_of_format_1_keeps_one_quarantine_row_per_envelope(
    make_replica: ReplicaFactory,
) -> None:
    """Opening a file of the first format brings it to the current one: duplicated
    quarantine rows (the same bytes, quarantined again) are kept once, the first."""
    replica = make_replica()
    path = replica.path
    replica.close()
    with sqlite3.connect(path) as db:  # as the first format laid the table out
        db.execute("DROP INDEX quarantine_by_digest")
        db.execute("ALTER TABLE quarantine DROP COLUMN digest")
        undo_formats_6_to_10(db)
        rows = [
            ("pull", b"same", "first", 1),
            ("pull", b"same", "again", 2),
            ("pull", b"b", "x", 3),
        ]
        db.executemany(
            "INSERT INTO quarantine (source, envelope, reason, at_ms) VALUES (?, ?, ?, ?)", rows
        )
        db.execute("PRAGMA user_version=1")
    Replica.open(path).close()
    with sqlite3.connect(path) as db:
        kept = db.execute("SELECT envelope, reason FROM quarantine ORDER BY id").fetchall()
        assert kept == [(b"same", "first"), (b"b", "x")]
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
