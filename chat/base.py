"""What every chat operation stands on: serializing per chat, and reading and writing a
chat's records (specs/chat.md §4). `ChatStore` (chat/store.py) is built on it.

Every write of a chat's records goes through `_write`, which notes in the open operation's
journal what the record showed before; the operation ends by storing the journal as an undo
entry (chat/undo.py) in its own transaction. An append's entry is deferred instead
(`entry_later`, chat/undolog.py `settle`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from chat import undolog
from chat.errors import NoSuchChatError
from chat.ids import check_id, new_id
from chat.models import Thread, build, parse, to_document
from chat.schema import MESSAGES, THREADS, UNDO, check_declared
from replica import (
    DEFAULT_PROFILE,
    ChangeMark,
    DegradedError,
    IndexStats,
    InvalidArgumentError,
    Lease,
    LeaseBusyError,
    Record,
    Replica,
)

_CHECKED_CHATS = 1024
"""Chats `_check_thread` remembers (a cache: it starts over past this many)."""
_POLL_S = 0.02
Part = tuple[str, str, Any]
"""An undo journal's note: (collection, record id, the document it showed before or None)."""


@dataclass
class Operation:
    """One chat operation in its transaction: the chat's last message place, when known
    without reading it (after this store's own append), and the new message's place."""

    last_at: int | None = None
    appended_at: int | None = None


@dataclass(frozen=True)
class Appended:
    """This store's last append: its chat, the file's change mark as it ended, and the
    message's place."""

    thread: str
    mark: ChangeMark
    at: int


class ChatBase:
    """A profile of a replica whose schema declares `chat.with_chat(...)`."""

    def __init__(
        self,
        replica: Replica,
        *,
        profile: str = DEFAULT_PROFILE,
        wait_s: float = 30.0,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        check_declared(replica.schema)
        self.replica = replica
        self.profile = profile
        self._wait_s = wait_s
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._journal = threading.local()
        self._appended: Appended | None = None
        self._checked: dict[str, tuple[tuple[int, int, bytes], ...]] = {}
        """Chats whose record `_check_thread` found live and well-formed, by version stamp."""
        self._corpus_lock = threading.Lock()
        """Guards the search cache (chat/search.py)."""
        self._corpus: Any = None
        self._locks = 0
        """How often the replica dropped its keys: a search that began before keeps
        nothing it read (chat/search.py)."""
        replica.on_lock(self._forget_decrypted)

    def _forget_decrypted(self) -> None:
        """The replica dropped its keys: so does this store's search cache. Called under the
        replica's mutex, so it takes no lock of its own (a search holds `_corpus_lock` while
        it waits for that mutex)."""
        self._locks += 1
        self._corpus = None

    # -- serializing per chat ----------------------------------------------------------------

    @contextmanager
    def _operation(
        self,
        thread: str,
        lease: Lease | None = None,
        *,
        undo: str | None = None,
        lifts_damage: bool = False,
        appends: bool = False,
    ) -> Iterator[Operation]:
        """One transaction on chat `thread`: with `lease` (a job's), if it still holds it;
        else once no job holds the chat (waiting up to `wait_s`). With `undo` (the
        operation's name), what its writes replaced is kept to undo it. A chat with an
        unreadable message is read-only (`DegradedError`), but to an operation that
        `lifts_damage` (clear, delete): it repairs the file first. Every operation but an
        append (which defers its undo entry) first logs the appends whose entries wait."""
        if lease is not None and lease.name != chat_lease(thread):
            raise InvalidArgumentError(f"lease {lease.name!r} is not chat {thread}'s job")
        deadline = time.monotonic() + self._wait_s
        while True:
            with self.replica.batch():
                operation = self._begin(thread, lease, lifts_damage)
                if operation is not None:
                    if not appends:
                        undolog.settle(self.replica, self.profile, thread)
                    with self._journaled(thread, undo):
                        yield operation
                    appended = None if lease is not None else self._marked(thread, operation)
            if operation is not None:
                self._appended = appended  # committed: what it checked and placed stands
                return
            if time.monotonic() > deadline:
                raise LeaseBusyError(
                    f"chat {thread} stayed busy with a job for {self._wait_s} s",
                    hint="try again once the job ends",
                )
            time.sleep(_POLL_S)

    def _begin(self, thread: str, lease: Lease | None, lifts_damage: bool) -> Operation | None:
        """The operation, once the chat is the caller's to change (None: a job holds it)."""
        if lease is not None:
            lease.check()
        last_at = self._unchanged_since_append(thread)
        if last_at is not None:  # checked then, and nothing changed since
            return Operation(last_at)
        if lease is None and not self.replica.lease_is_free(chat_lease(thread)):
            return None
        self._check_readable(thread, lifts_damage)
        return Operation()

    def _unchanged_since_append(self, thread: str) -> int | None:
        """The place of this store's last message if it was appended to `thread` and nothing
        changed the file since (the same change mark): that append found the chat live,
        well-formed, readable and free, and it still is; a chat is appended to again and
        again, and reads none of that again."""
        appended = self._appended
        if appended is None or appended.thread != thread:
            return None
        return appended.at if self.replica.change_mark() == appended.mark else None

    def _marked(self, thread: str, operation: Operation) -> Appended | None:
        """What an append leaves for the next one, its writes done (None: not an append).
        Not after a job's append: it checked its own lease, not that the chat is free."""
        if operation.appended_at is None:
            return None
        return Appended(thread, self.replica.change_mark(), operation.appended_at)

    def _check_readable(self, thread: str, repair: bool) -> None:
        where = {"thread": thread}
        if not self.replica.index_degraded(MESSAGES, where=where, profile=self.profile):
            return
        if not repair:
            raise DegradedError(
                f"chat {thread} has a message that cannot be read: it is read-only",
                hint="run sealsync repair, or clear or delete the chat",
            )
        self.replica.repair()  # quarantines the unreadable rows verbatim (fail closed)

    @contextmanager
    def _journaled(self, thread: str, undo: str | None) -> Iterator[None]:
        journal: list[Part] | None = None if undo is None else []
        self._journal.parts = journal
        try:
            yield
            if undo is not None and journal:
                self._journal.parts = None  # the log's own writes are not the operation's
                undolog.keep(self.replica, self.profile, thread, undo, journal)
        finally:
            self._journal.parts = None

    def _write(
        self,
        collection: str,
        id: str,
        document: Any,
        *,
        before: Record | None,
        context: frozenset[tuple[int, int]] | None = None,
        entry_later: str | None = None,
    ) -> None:
        """Write a chat record (`document` None: delete it) over `context`, noting in the
        open operation's journal what it showed before (`before`: as read; None: new). With
        `entry_later` (a chat), its undo entry is deferred to that chat's next operation
        (`undolog.settle`): an append's."""
        parts: list[Part] | None = getattr(self._journal, "parts", None)
        if parts is not None:
            shown = None if before is None or before.deleted else before.document
            parts.append((collection, id, shown))
        if document is None:
            self.replica.delete(collection, id, profile=self.profile, context=context)
        else:
            deferred = None if entry_later is None else (UNDO, entry_later)
            self.replica.put(
                collection,
                id,
                document,
                profile=self.profile,
                context=context,
                deferred_entry=deferred,
            )

    def job(self, thread: str, *, ttl_s: float = 30.0) -> Lease:
        """The chat's lease for slow work (a summary, a bulk change): other operations on the
        chat wait until it is given back; pass it to the final write (`lease=`)."""
        return self.replica.lease(
            chat_lease(check_id("chat", thread)), ttl_s=ttl_s, wait_s=self._wait_s
        )

    def _thread(self, thread: str) -> tuple[Record, Thread]:
        record = self.replica.get(THREADS, thread, profile=self.profile)
        if record is None or record.deleted:
            raise NoSuchChatError(f"no chat {thread}")
        return record, parse(Thread, record.document, f"chat {thread}")

    def _check_thread(self, thread: str) -> None:
        """`_thread`'s refusals (no chat, a deleted one, a malformed one) without opening
        the chat's record again while its versions are those last checked (an append reads
        no more of it: a chat's appends run many to one record)."""
        stamp = self.replica.version_stamp(THREADS, thread, profile=self.profile)
        if stamp and self._checked.get(thread) == stamp:
            return
        self._thread(thread)
        if len(self._checked) >= _CHECKED_CHATS:
            self._checked.clear()
        self._checked[thread] = stamp

    def _put_thread(self, thread: str, current: Thread, record: Record, **fields: Any) -> None:
        """Write the chat's record over the context read, with its message count now."""
        count = self._stats(thread).records
        document = {
            **to_document(current),
            "message_count": count,
            **fields,
            "updated_ms": self._now_ms(),
        }
        updated = build(Thread, **document)
        self._write(THREADS, thread, to_document(updated), before=record, context=record.context)

    def _stats(self, thread: str) -> IndexStats:
        return self.replica.index_stats(MESSAGES, where={"thread": thread}, profile=self.profile)

    def _message_records(self, thread: str) -> list[Record]:
        return self.replica.scan(MESSAGES, profile=self.profile, where={"thread": thread})

    def _delete_all(self, records: list[Record]) -> None:
        """Tombstones for `records` (messages), each over the context read."""
        for message in records:
            self._write(MESSAGES, message.id, None, before=message, context=message.context)

    def _new_id(self) -> str:
        return new_id(self._now_ms(), os.urandom)


def chat_lease(thread: str) -> str:
    return f"chat:{thread}"


def turn_lease(thread: str) -> str:
    return f"turn:{thread}"
