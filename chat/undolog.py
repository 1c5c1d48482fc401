"""The per-chat undo log, on this device only (specs/chat.md §8).

An entry is one operation: its name and, for each record it wrote, the document that record
showed before (None: absent or deleted). It is kept in the local collection `chat.undo`
(sealed like every record, never synced): the entries of a chat in a ring of `MAX_UNDO`
slots (`CHAT/SLOT`), and the chat's live range of sequence numbers in a record of its own
(`CHAT`), so the oldest entry is overwritten in place and the log never grows past the
ring. An entry too large for one record is kept as a marker that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from chat.schema import UNDO
from replica import Replica

MAX_UNDO = 200
MAX_ENTRY_BYTES = 900 * 1024
"""Below the replica's bound on a document (1 MiB), with room for the entry's own fields."""


@dataclass(frozen=True)
class Entry:
    operation: str
    parts: list[tuple[str, str, Any]]
    """(collection, record id, document before or None), in the order they were written."""
    too_large: bool


def _range(replica: Replica, profile: str, thread: str) -> tuple[int, int]:
    """(first, last) sequence numbers of the chat's live entries; first > last: none."""
    record = replica.get(UNDO, thread, profile=profile)
    document = None if record is None or record.deleted else record.document
    if not isinstance(document, dict):
        return 1, 0
    first, last = document.get("first"), document.get("last")
    if type(first) is not int or type(last) is not int:
        return 1, 0
    return first, last


def _slot(thread: str, seq: int) -> str:
    return f"{thread}/{seq % MAX_UNDO}"


def keep(replica: Replica, profile: str, thread: str, operation: str, parts: list[Any]) -> None:
    """Add an entry, dropping the oldest past `MAX_UNDO` (inside the caller's transaction)."""
    first, last = _range(replica, profile, thread)
    entry: dict[str, Any] = {"operation": operation, "parts": [list(p) for p in parts]}
    if len(msgspec.msgpack.encode(entry)) > MAX_ENTRY_BYTES:
        entry = {"operation": operation, "parts": [], "oversized": True}
    last += 1
    replica.put(UNDO, _slot(thread, last), entry, profile=profile)
    first = max(first, last - MAX_UNDO + 1)
    replica.put(UNDO, thread, {"first": first, "last": last}, profile=profile)


def pop(replica: Replica, profile: str, thread: str) -> Entry | None:
    """Take the newest entry off the chat's log (inside the caller's transaction)."""
    first, last = _range(replica, profile, thread)
    if first > last:
        return None
    record = replica.get(UNDO, _slot(thread, last), profile=profile)
    replica.put(UNDO, thread, {"first": first, "last": last - 1}, profile=profile)
    document = None if record is None or record.deleted else record.document
    if not isinstance(document, dict):
        return None
    parts = [tuple(p) for p in document.get("parts", [])]
    return Entry(str(document.get("operation")), parts, bool(document.get("oversized")))
