"""Bringing back chats that a delete on one device and an append on another left with
live messages (specs/chat.md §7: append vs delete).

A delete writes tombstones for the chat and for the messages its device held; a message
appended elsewhere meanwhile stays live when the two meet, under a chat that is deleted. So
after a sync, `reconcile` follows the change feed (from a cursor kept on this device) to the
chats it touched, and writes each deleted chat with a live message back: with the newest
live document the device still has of it (a concurrent sibling, or its history), else as
"Recovered chat". Every device that reconciles converges on one of these versions.
"""

from __future__ import annotations

from typing import Any

from chat.base import ChatBase
from chat.models import Message, Thread, build, parse, to_document
from chat.schema import MESSAGES, STATE, THREADS
from replica import FeedResetError, Record

RECOVERED_TITLE = "Recovered chat"
_CURSOR_ID = "reconcile"


class Reconciling(ChatBase):
    """`reconcile` of `ChatStore`."""

    def reconcile(self) -> int:
        """Bring back every deleted chat that has a live message; how many. Run it after
        each sync: it reads only what changed since it last ran."""
        touched, cursor = self._touched_chats()
        revived = sum(self._revive(thread) for thread in sorted(touched))
        self.replica.put(STATE, _CURSOR_ID, {"cursor": cursor}, profile=self.profile)
        return revived

    def _touched_chats(self) -> tuple[set[str], str]:
        record = self.replica.get(STATE, _CURSOR_ID, profile=self.profile)
        document = None if record is None else record.document
        cursor = document.get("cursor") if isinstance(document, dict) else None
        try:
            return self._follow(cursor if isinstance(cursor, str) else None)
        except FeedResetError:  # another history: look at everything again
            return self._follow(None)

    def _follow(self, cursor: str | None) -> tuple[set[str], str]:
        touched: set[str] = set()
        while True:
            page = self.replica.changes(cursor)
            for change in page.changes:
                identity = change.identity
                if identity is None or identity.profile != self.profile:
                    continue
                if identity.collection == THREADS:
                    touched.add(identity.id)
                elif identity.collection == MESSAGES:
                    touched |= self._threads_of(identity.id)
            cursor = page.cursor
            if not page.more:
                return touched, cursor

    def _threads_of(self, message: str) -> set[str]:
        record = self.replica.get(MESSAGES, message, profile=self.profile)
        if record is None or record.deleted:
            return set()
        return {parse(Message, record.document, f"message {message}").thread}

    def _revive(self, thread: str) -> bool:
        with self._operation(thread):
            record = self.replica.get(THREADS, thread, profile=self.profile)
            if record is None or not record.deleted:
                return False  # live, or not here yet (its record is on its way)
            live = [
                r
                for r in self._message_records(thread)
                if parse(Message, r.document, f"message {r.id}").thread == thread
            ]
            if not live:
                return False
            document = self._last_live_document(thread, record, live)
            self.replica.put(
                THREADS, thread, document, profile=self.profile, context=record.context
            )
        return True

    def _last_live_document(self, thread: str, record: Record, live: list[Record]) -> Any:
        now = self._now_ms()
        known = [v for v in record.conflicts if not v.deleted]
        known += [v for v in self.replica.history(THREADS, thread, profile=self.profile)]
        for version in sorted(known, key=lambda v: v.hlc, reverse=True):
            if not version.deleted:
                revived = parse(Thread, version.document, f"chat {thread}")
                fields = {**to_document(revived), "updated_ms": now, "message_count": len(live)}
                return to_document(build(Thread, **fields))
        first = min(parse(Message, r.document, f"message {r.id}").created_ms for r in live)
        recovered = build(
            Thread, title=RECOVERED_TITLE, created_ms=first, updated_ms=now, message_count=len(live)
        )
        return to_document(recovered)
