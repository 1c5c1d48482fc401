"""Export and import (specs/chat.md §9): a profile's chats, or one chat, as normalized,
decrypted, versioned JSON; and such a file brought in, read under hard ceilings
(chat/limits.py) and never at the cost of anything here.

An export holds what the chat store shows: each record's visible version, deleted records
left out, drafts never (they are this device's). Keys are sorted, chats by creation, then
id, messages by their place, thumbnails in base64 as stored: the same data always gives the same file
but for `exported_at`. A record that cannot be read stops the export with its error: an
export never quietly leaves data out.

An import writes in one transaction, all of it or nothing. It never deletes, and never
replaces a record this replica holds (a deleted one included): an identical one is skipped,
a differing one reported and left, or, `as_copies`, imported under a new id derived from its
own id and content, so that importing a file twice changes nothing either way.
"""

from __future__ import annotations

import datetime
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from chat.errors import NoSuchChatError
from chat.ids import check_id
from chat.limits import EXPORT_FORMAT, ReadExport, ReadThread
from chat.models import Message, Persona, Setting, Thread, build, parse, to_document
from chat.schema import ACTIVE_PERSONA, MESSAGES, PERSONAS, SETTINGS, THREADS
from replica import REGISTER_ID, InvalidArgumentError, Record, Replica

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ENCODER = msgspec.json.Encoder(order="sorted")


def export_profile(replica: Replica, profile: str, *, thread: str | None = None) -> bytes:
    """The chats of `profile` (or the one chat `thread`) as an export file's bytes; an
    error for a profile or a chat that is not there (never an empty file in its place)."""
    if profile not in replica.profiles():
        raise InvalidArgumentError(f"no profile {profile!r}")
    if thread is None:
        threads = replica.scan(THREADS, profile=profile)
    else:
        record = replica.get(THREADS, check_id("chat", thread), profile=profile)
        if record is None or record.deleted:
            raise NoSuchChatError(f"no chat {thread}")
        threads = [record]
    chats = sorted(
        (_exported_thread(replica, profile, r) for r in threads),
        key=lambda t: (t["created_ms"], t["id"]),
    )
    personas: list[dict[str, Any]] = []
    active = None
    if thread is None:
        personas = [
            {"id": r.id, **to_document(parse(Persona, r.document, f"persona {r.id}"))}
            for r in sorted(replica.scan(PERSONAS, profile=profile), key=lambda r: r.id)
        ]
        register = replica.get(ACTIVE_PERSONA, REGISTER_ID, profile=profile)
        if register is not None and not register.deleted and isinstance(register.document, dict):
            active = register.document.get("persona")
    document = {
        "sealsync_export": EXPORT_FORMAT,
        "scope": "profile" if thread is None else "chat",
        "profile": profile,
        "exported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "active_persona": active,
        "personas": personas,
        "threads": chats,
    }
    return _ENCODER.encode(document)


def _exported_thread(replica: Replica, profile: str, record: Record) -> dict[str, Any]:
    document = to_document(parse(Thread, record.document, f"chat {record.id}"))
    where = {"thread": record.id}  # a record some sibling of which is in this chat: its
    messages = [  # visible version is the one exported, and may be another chat's
        to_document(parse(Message, r.document, f"message {r.id}")) | {"id": r.id}
        for r in replica.scan(MESSAGES, profile=profile, where=where)
    ]
    messages = [m for m in messages if m["thread"] == record.id]
    for message in messages:
        del message["thread"]
    settings = [
        parse(Setting, r.document, f"setting {r.id}")
        for r in replica.scan(SETTINGS, profile=profile, where=where)
    ]
    return {
        "id": record.id,
        **document,
        "messages": sorted(messages, key=lambda m: (m["at"], m["id"])),
        "settings": {s.name: s.value for s in settings if s.thread == record.id},
    }


@dataclass
class ImportReport:
    """Per kind of record (chat, message, setting, persona, active persona): how many were
    added, found identical here, and imported as copies; and each that differs from what
    is here and was left (`kind id`)."""

    added: Counter[str] = field(default_factory=Counter)
    identical: Counter[str] = field(default_factory=Counter)
    copied: Counter[str] = field(default_factory=Counter)
    differing: list[str] = field(default_factory=list)


Write = tuple[str, str, dict[str, Any]]
"""(collection, id, document)."""


def import_export(
    replica: Replica, read: ReadExport, *, profile: str, as_copies: bool = False
) -> ImportReport:
    """Bring what `read` holds into `profile` (made if it does not exist), in one
    transaction; nothing here is replaced or deleted."""
    report = ImportReport()
    writes: list[Write] = []
    for persona_id, document in read.personas:
        stored = to_document(build(Persona, **document))
        _plan(replica, profile, report, writes, (PERSONAS, persona_id, stored), as_copies)
    for thread in read.threads:
        _plan_thread(replica, profile, report, writes, thread, as_copies)
    if read.active_persona is not None:
        active = (ACTIVE_PERSONA, REGISTER_ID, {"persona": read.active_persona})
        _plan(replica, profile, report, writes, active, as_copies=False)
    with replica.batch():
        if profile not in replica.profiles():
            replica.create_profile(profile)
        for collection, record_id, document in writes:
            replica.put(collection, record_id, document, profile=profile)
    return report


def _plan_thread(
    replica: Replica,
    profile: str,
    report: ImportReport,
    writes: list[Write],
    thread: ReadThread,
    as_copies: bool,
) -> None:
    stored = to_document(build(Thread, **thread.document))
    thread_id = _plan(replica, profile, report, writes, (THREADS, thread.id, stored), as_copies)
    if thread_id is None:
        return  # a chat that differs, left: its messages and settings are left with it
    for message_id, document in thread.messages:
        message = to_document(build(Message, **{**document, "thread": thread_id}))
        moved = message_id if thread_id == thread.id else _copy_id(message_id, message)
        _plan(replica, profile, report, writes, (MESSAGES, moved, message), as_copies)
    for name, value in thread.settings.items():
        setting = to_document(build(Setting, thread=thread_id, name=name, value=value))
        write = (SETTINGS, f"{thread_id}/{name}", setting)
        _plan(replica, profile, report, writes, write, as_copies=False)


def _plan(
    replica: Replica,
    profile: str,
    report: ImportReport,
    writes: list[Write],
    write: Write,
    as_copies: bool,
) -> str | None:
    """Plan one record's write; the id it is written under, None when it is left."""
    collection, record_id, document = write
    kind = collection.removeprefix("chat.").rstrip("s")
    here = replica.get(collection, record_id, profile=profile)
    if here is None:
        report.added[kind] += 1
        writes.append(write)
        return record_id
    if not here.deleted and here.document == document:
        report.identical[kind] += 1
        return record_id
    if not as_copies:
        report.differing.append(f"{kind} {record_id}")
        return None
    copy = _copy_id(record_id, document)
    copied = replica.get(collection, copy, profile=profile)
    if copied is None:
        report.copied[kind] += 1
        writes.append((collection, copy, document))
    else:
        report.identical[kind] += 1
    return copy


def _copy_id(record_id: str, document: dict[str, Any]) -> str:
    """The id a differing record is imported as a copy under: its own id's time, then 16
    characters of a hash of its id and content (the same copy on every import)."""
    digest = hashlib.sha256(record_id.encode() + msgspec.msgpack.encode(document)).digest()
    number = int.from_bytes(digest[:10], "big")
    tail = "".join(_ALPHABET[(number >> shift) & 31] for shift in range(75, -1, -5))
    return record_id[:10] + tail
