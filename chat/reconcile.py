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
from replica import DegradedError, FeedResetError, Record

RECOVERED_TITLE = "Recovered chat"
_CURSOR_ID = "reconcile"


class Reconciling(ChatBase):
    """`reconcile` of `ChatStore`."""

    def reconcile(self) -> int:
        """Bring back every deleted chat that has a live message; how many. Run it after
        each sync: it reads only what changed since it last ran. While versions are held
        (a freshness lock, clock drift), the chats it found wait for a later run: a held
        tombstone would make a message look live that its chat's delete saw."""
        state = self._state()
        touched, cursor, news = self._touched_chats(state.get("cursor"))
        touched |= {t for t in state.get("pending", []) if isinstance(t, str)}
        held = self.replica.held_counts()
        revived = 0
        if held.get("lock", 0) or held.get("drift", 0):
            pending = sorted(touched)
        else:
            revived = sum(self._revive_readable(thread) for thread in sorted(touched))
            pending = []
        if news or pending != state.get("pending", []):  # not for its own last write alone
            document = {"cursor": cursor, "pending": pending}
            self.replica.put(STATE, _CURSOR_ID, document, profile=self.profile)
        return revived

    def _state(self) -> dict[str, Any]:
        record = self.replica.get(STATE, _CURSOR_ID, profile=self.profile)
        document = None if record is None or record.deleted else record.document
        return document if isinstance(document, dict) else {}

    def _touched_chats(self, cursor: object) -> tuple[set[str], str, bool]:
        try:
            return self._follow(cursor if isinstance(cursor, str) else None)
        except FeedResetError:  # another history: look at everything again
            return self._follow(None)

    def _follow(self, cursor: str | None) -> tuple[set[str], str, bool]:
        """The chats changes after `cursor` touched, the cursor after them, and whether
        anything changed but this store's own state record."""
        touched: set[str] = set()
        news = False
        while True:
            page = self.replica.changes(cursor)
            for change in page.changes:
                identity = change.identity
                if identity is not None and identity.collection == STATE:
                    continue  # its own cursor, written last time
                news = True
                if identity is None or identity.profile != self.profile:
                    continue
                if identity.collection == THREADS:
                    touched.add(identity.id)
                elif identity.collection == MESSAGES:
                    touched |= self._threads_of(identity.id)
            cursor = page.cursor
            if not page.more:
                return touched, cursor, news

    def _threads_of(self, message: str) -> set[str]:
        record = self.replica.get(MESSAGES, message, profile=self.profile)
        if record is None or record.deleted:
            return set()
        return {parse(Message, record.document, f"message {message}").thread}

    def _revive_readable(self, thread: str) -> bool:
        """`_revive`, but a chat with an unreadable message is left for repair."""
        try:
            return self._revive(thread)
        except DegradedError:
            return False

    def _revive(self, thread: str) -> bool:
        """A deleted chat with a live message comes back. So does an absent one once this
        file dropped what its relay collected: its delete may have been collected
        everywhere while a message written concurrently was still on its way (before, or
        while versions wait to be opened, absent means not here yet: a chat's record is
        pushed before its messages)."""
        with self._operation(thread):
            record = self.replica.get(THREADS, thread, profile=self.profile)
            if record is None and not self._absent_means_gone():
                return False
            if record is not None and not record.deleted:
                return False
            live = [
                r
                for r in self._message_records(thread)
                if parse(Message, r.document, f"message {r.id}").thread == thread
            ]
            if not live:
                return False
            document = self._last_live_document(thread, record, live)
            context = None if record is None else record.context
            self.replica.put(THREADS, thread, document, profile=self.profile, context=context)
        return True

    def _absent_means_gone(self) -> bool:
        held = self.replica.held_counts()
        unopened = held.get("sealed", 0) or held.get("epoch", 0)
        return not unopened and self.replica.saw_collection()

    def _last_live_document(self, thread: str, record: Record | None, live: list[Record]) -> Any:
        now = self._now_ms()
        known = [] if record is None else [v for v in record.conflicts if not v.deleted]
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
