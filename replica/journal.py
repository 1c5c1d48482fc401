"""Journals: bounded, ordered logs of sealed documents that stay on this device
(specs/replica.md §13.2).

An app that logs each of its operations (the chat store's undo) would otherwise keep the log
as records: an entry, and a record saying where the log starts and ends, read and rewritten
at every push. A journal is a row per entry, numbered in the order pushed and stored side by
side with the journal's other entries, so a push is one seal and one insert onto the
journal's newest page, and a pop reads the newest row. Each row carries the journal's
*floor* at its push (the lowest number it keeps: the newest `keep`); the newest row's floor
bounds the journal, removing a row hands its floor to the row below, and the rows below the
floor, never given back, are deleted every `SWEEP_EVERY` pushes.

A journal is named within a `local` collection. Each entry is sealed as a record of the
reserved collection `sealsync.journal` whose id names the journal (its key in the file) and
the entry's place, and is opened only as that record: no record's envelope passes for an
entry, and the file cannot move an entry to another journal or place unnoticed. Entries
never sync, are not in the change feed, and an entry that cannot be opened fails closed
(`DegradedError`) until `repair` quarantines it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.asides import Row
from replica.core import Core
from replica.envelope import Identity, seal
from replica.errors import InvalidArgumentError, ProtocolError
from replica.limits import check_document, check_name
from replica.schema import JOURNAL_COLLECTION
from replica.wire import parse_header
from replica.write import check_profile

MAX_KEEP = 100_000
SWEEP_EVERY = 16
"""A push deletes the rows that fell out of the journal every 16th time, not each time: the
oldest row lies on a page of its own, and a commit's cost grows with the pages it writes."""


@dataclass(frozen=True)
class JournalEntry:
    """An entry taken off a journal: its place in the journal's order, and its document."""

    seq: int
    document: Any


def push(core: Core, profile: str, collection: str, name: str, document: Any, keep: int) -> int:
    """Add `document` as the journal's newest entry, keeping its newest `keep`; its seq."""
    check_document(document)
    _check_keep(keep)
    log, scope = _journal(core, profile, collection, name)
    check_profile(core, profile)
    if not core.store.in_transaction:
        with core.write_transaction():
            return _push(core, profile, log, scope, document, keep)
    # Inside the caller's transaction no savepoint is needed: the sweep that may follow the
    # one insert only deletes rows already below the floor.
    return _push(core, profile, log, scope, document, keep)


def _check_keep(keep: object) -> None:
    if type(keep) is not int or not 1 <= keep <= MAX_KEEP:
        raise InvalidArgumentError(f"keep must be an integer in 1..{MAX_KEEP}, got {keep!r}")


def _push(core: Core, profile: str, log: bytes, scope: bytes, document: Any, keep: int) -> int:
    head = core.store.journal_head(log)
    # at or above the floor: a repair may have taken the newest rows, and kept the floor
    seq = 1 if head is None else max(head[0] + 1, head[1])
    floor = max(1 if head is None else head[1], seq - keep + 1)
    identity = entry_identity(profile, log, seq)
    node = core.node()
    envelope = seal(
        core.keys(),
        identity,
        hlc=seq,
        node=node,
        vector={node: seq},
        deleted=False,
        document=document,
        nonce=core.options.random_bytes(12),
    )
    core.store.journal_push(log, seq, floor, core.record_key(identity), scope, envelope)
    if seq % SWEEP_EVERY == 0:
        core.store.journal_sweep(log, floor)
    return seq


def pop(core: Core, profile: str, collection: str, name: str) -> JournalEntry | None:
    """Take the journal's newest entry off it; None when it is empty."""
    log, scope = _journal(core, profile, collection, name)
    check_profile(core, profile)
    with core.write_transaction():
        head = core.store.journal_newest(log)
        if head is None or head[0] < head[1]:  # every row left fell below the floor
            return None
        seq, _, envelope = head
        key = core.record_key(entry_identity(profile, log, seq))
        (opened,) = core.open_rows(key, [journal_row(key, seq, envelope)], scope)
        core.store.journal_remove(log, seq)
    return JournalEntry(seq, opened.document)


@dataclass(frozen=True)
class DeferredWrite:
    """A write made with `deferred_entry=` (`Replica.put`): the record it wrote."""

    collection: str
    id: str


def deferred_log(core: Core, profile: str, collection: str, name: str) -> bytes:
    """The key of the journal a write defers its entry to (its names checked)."""
    return _journal(core, profile, collection, name)[0]


def deferred(
    core: Core, profile: str, collection: str, name: str, keep: int
) -> list[DeferredWrite]:
    """Hand over, once, the writes whose entry in the journal is deferred, oldest first: the
    newest `keep` (older ones would fall out of a journal that keeps `keep`). A row another
    device's version replaced in place since (a merge) still names its record: the write
    was made here, and counts among the journal's entries (undoing it finds nothing of this
    device's left to undo)."""
    _check_keep(keep)
    log, _ = _journal(core, profile, collection, name)
    with core.write_transaction():
        awaiting = core.store.awaiting(log, keep)
        if awaiting:
            core.store.clear_awaiting(log)
        handed = []
        for row, scope in awaiting:
            (opened,) = core.open_rows(row.key, [row], scope)
            handed.append(DeferredWrite(opened.identity.collection, opened.identity.id))
    return handed


def entry_identity(profile: str, log: bytes, seq: int) -> Identity:
    """What an entry is sealed as: the journal's key and the entry's place, in a collection
    no record can be of."""
    return Identity(profile, JOURNAL_COLLECTION, entry_id(log, seq))


def entry_id(log: bytes, seq: int) -> str:
    return f"{log.hex()}/{seq}"


def journal_row(key: bytes, seq: int, envelope: bytes) -> Row:
    """An entry's row: its place as the dot's hlc (the header says where it was sealed for),
    its node from its header (0 if that is damaged)."""
    try:
        node = parse_header(envelope).node
    except ProtocolError:
        node = 0
    return Row(key, node, seq, envelope)


def count(core: Core, profile: str, collection: str, name: str) -> int:
    log, _ = _journal(core, profile, collection, name)
    return core.store.journal_count(log)


def _journal(core: Core, profile: str, collection: str, name: str) -> tuple[bytes, bytes]:
    """The journal's key in the file and its collection's scope, once its names are valid
    (remembered while the keys are held: a chat operation pushes to one again and again)."""
    if not all(type(value) is str for value in (profile, collection, name)):
        return _named(core, profile, collection, name)  # raises, naming the value
    return core.derived(
        ("journal", profile, collection, name), lambda: _named(core, profile, collection, name)
    )


def _named(core: Core, profile: str, collection: str, name: str) -> tuple[bytes, bytes]:
    check_name("journal name", name)
    spec, identity = core.resolve(collection, name, profile)
    if spec.policy != "local":
        raise InvalidArgumentError(
            f"journals live in local collections; {collection!r} is {spec.policy!r}",
            hint="declare a Collection(name, 'local') for it",
        )
    return core.record_key(identity), core.scope(profile, collection)
