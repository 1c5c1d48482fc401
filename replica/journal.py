"""Journals: bounded, ordered logs of sealed documents that stay on this device
(specs/replica.md §13.2).

An app that logs each of its operations (the chat store's undo) would otherwise keep the log
as records: an entry, and a record saying where the log starts and ends, read and rewritten
at every push. A journal is a row per entry in the order pushed, so a push is one seal and
two statements (add; drop what is past the newest `keep`) and a pop reads the newest row.

A journal is named within a `local` collection. Each entry is sealed as the record
`name/seq` of that collection would be, and opened only as that record: the file cannot move
an entry to another journal or place unnoticed. Entries never sync, are not in the change
feed, and an entry that cannot be opened fails closed (`DegradedError`) until `repair`
quarantines it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.core import Core
from replica.envelope import Identity, seal
from replica.errors import InvalidArgumentError
from replica.limits import MAX_ID_CHARS, check_document, check_name
from replica.write import check_profile, local_row

MAX_NAME_CHARS = MAX_ID_CHARS - 21
"""A name leaves room for "/" and an entry's sequence number in the entry's record id."""
MAX_KEEP = 100_000


@dataclass(frozen=True)
class JournalEntry:
    """An entry taken off a journal: its place in the file's order, and its document."""

    seq: int
    document: Any


def push(core: Core, profile: str, collection: str, name: str, document: Any, keep: int) -> int:
    """Add `document` as the journal's newest entry, keeping its newest `keep`; its seq."""
    check_document(document)
    if type(keep) is not int or not 1 <= keep <= MAX_KEEP:
        raise InvalidArgumentError(f"keep must be an integer in 1..{MAX_KEEP}, got {keep!r}")
    log, scope = _journal(core, profile, collection, name)
    check_profile(core, profile)
    if not core.store.in_transaction:
        with core.write_transaction():
            return _push(core, Identity(profile, collection, name), log, scope, document, keep)
    # Inside the caller's transaction no savepoint is needed: an entry added but not yet
    # trimmed (a failed second statement) is trimmed by the next push.
    return _push(core, Identity(profile, collection, name), log, scope, document, keep)


def _push(core: Core, journal: Identity, log: bytes, scope: bytes, document: Any, keep: int) -> int:
    seq = core.store.journal_next_seq()
    identity = Identity(journal.profile, journal.collection, _entry_id(journal.id, seq))
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
    core.store.journal_push(log, core.record_key(identity), scope, seq, envelope, keep)
    return seq


def pop(core: Core, profile: str, collection: str, name: str) -> JournalEntry | None:
    """Take the journal's newest entry off it; None when it is empty."""
    log, scope = _journal(core, profile, collection, name)
    with core.write_transaction():
        newest = core.store.journal_newest(log)
        if newest is None:
            return None
        seq, envelope = newest
        key = core.record_key(Identity(profile, collection, _entry_id(name, seq)))
        (opened,) = core.open_rows(key, [local_row(key, envelope)], scope)
        core.store.journal_delete(seq)
    return JournalEntry(seq, opened.document)


def count(core: Core, profile: str, collection: str, name: str) -> int:
    log, _ = _journal(core, profile, collection, name)
    return core.store.journal_count(log)


def _journal(core: Core, profile: str, collection: str, name: str) -> tuple[bytes, bytes]:
    """The journal's key in the file and its collection's scope, once its names are valid."""
    check_name("journal name", name)
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgumentError(
            f"journal name {name[:40]!r} has {len(name)} characters, bound {MAX_NAME_CHARS}"
        )
    spec, identity = core.resolve(collection, name, profile)
    if spec.policy != "local":
        raise InvalidArgumentError(
            f"journals live in local collections; {collection!r} is {spec.policy!r}",
            hint="declare a Collection(name, 'local') for it",
        )
    return core.record_key(identity), core.scope(profile, collection)


def _entry_id(name: str, seq: int) -> str:
    return f"{name}/{seq}"
