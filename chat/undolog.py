"""The per-chat undo log, on this device (specs/chat.md §8).

An entry is one operation: its name and, for each record it wrote, the document that record
showed before (None: absent or deleted). The log is the engine's journal `CHAT` of the local
collection `chat.undo`, which keeps the newest `MAX_UNDO` entries: an operation adds one row
(specs/replica.md §13.2). An entry too large for one document is kept as a marker that says so.
An append, a chat's most frequent operation, adds none: its message is written with the entry
deferred, and the chat's next other operation (an undo included) logs it first (`settle`).
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


def keep(replica: Replica, profile: str, thread: str, operation: str, parts: list[Any]) -> None:
    """Add an entry, dropping the oldest past `MAX_UNDO` (inside the caller's transaction)."""
    entry: dict[str, Any] = {"operation": operation, "parts": [list(p) for p in parts]}
    one_new_record = len(parts) == 1 and parts[0][2] is None  # an append: nothing to measure
    if not one_new_record and len(msgspec.msgpack.encode(entry)) > MAX_ENTRY_BYTES:
        entry = {"operation": operation, "parts": [], "oversized": True}
    replica.journal_push(UNDO, thread, entry, keep=MAX_UNDO, profile=profile)


def settle(replica: Replica, profile: str, thread: str) -> None:
    """Log the chat's appends, whose entries were deferred (chat/store.py `append`), before
    any other operation logs its own or an undo takes the newest (inside the caller's
    transaction)."""
    for write in replica.journal_deferred(UNDO, thread, keep=MAX_UNDO, profile=profile):
        keep(replica, profile, thread, "append", [(write.collection, write.id, None)])


def pop(replica: Replica, profile: str, thread: str) -> Entry | None:
    """Take the newest entry off the chat's log (inside the caller's transaction)."""
    popped = replica.journal_pop(UNDO, thread, profile=profile)
    document = None if popped is None else popped.document
    if not isinstance(document, dict):
        return None
    parts = [tuple(p) for p in document.get("parts", [])]
    return Entry(str(document.get("operation")), parts, bool(document.get("oversized")))
