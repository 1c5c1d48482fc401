"""Undo, per chat, on this device (specs/chat.md §8; the log is chat/undolog.py).

Undoing an operation writes every record it wrote back to what that record showed before,
over this device's versions of it only: a version another device wrote meanwhile is never
replaced, so it stays (as the record, or as a sibling beside the undone state). A record
another device has taken over since (no version of this device's is left) is left alone.
An undo is a write like any other, and syncs.
"""

from __future__ import annotations

from typing import Any

from chat import undolog
from chat.base import ChatBase
from chat.errors import NothingToUndoError
from chat.ids import check_id


class Undoing(ChatBase):
    """`undo` of `ChatStore`."""

    def undo(self, thread: str) -> str:
        """Undo the chat's latest operation still in its log (the last 200 done here); the
        operation's name. `NothingToUndoError` when none is left."""
        with self._operation(check_id("chat", thread)):
            entry = undolog.pop(self.replica, self.profile, thread)
            if entry is None:
                raise NothingToUndoError(f"nothing left to undo in chat {thread}")
            if entry.too_large:
                return f"{entry.operation} (too large to keep: not undone)"
            node = self.replica.node
            for collection, id, before in reversed(entry.parts):
                self._restore(collection, id, before, node)
        return entry.operation

    def _restore(self, collection: str, id: str, before: Any, node: int) -> None:
        record = self.replica.get(collection, id, profile=self.profile)
        if record is None:
            return  # never stored here (a repair took it): nothing of ours to undo
        own = frozenset(dot for dot in record.context if dot[0] == node)
        if not own:
            return  # another device's version has taken the record over: it stays
        if before is not None:
            self.replica.put(collection, id, before, profile=self.profile, context=own)
        elif not record.deleted:
            self.replica.delete(collection, id, profile=self.profile, context=own)
