"""The chat store: conversations on one replica profile (specs/chat.md is normative).

Every operation is one replica transaction, and operations on one chat are serialized
across threads and processes on the file: a single-transaction operation waits while a slow
job holds the chat's lease (`chat:ID`); a job takes that lease, works outside any
transaction, and writes its result in one transaction that checks it still holds it. A turn
holds `turn:ID`, so a second turn of the chat is refused (`TurnBusyError`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from chat.errors import NoSuchChatError, TurnBusyError
from chat.ids import check_id, new_id
from chat.models import Message, Thread, build, parse, to_document
from chat.schema import MESSAGES, THREADS, check_declared
from replica import DEFAULT_PROFILE, IndexStats, Lease, LeaseBusyError, Record, Replica

DEFAULT_TITLE = "New chat"
PAGE_MESSAGES = 120
_POLL_S = 0.02


@dataclass(frozen=True)
class ChatView:
    """A chat and what the blind index says of its messages (none opened)."""

    id: str
    thread: Thread
    messages: int
    first_message_ms: int | None
    last_message_ms: int | None

    @property
    def active_ms(self) -> int:
        """When the chat last changed: its record, or its latest message."""
        return max(self.thread.updated_ms, self.last_message_ms or 0)


@dataclass(frozen=True)
class MessageView:
    id: str
    message: Message


@dataclass(frozen=True)
class MessagePage:
    """Messages of one chat, oldest first; `older` reads the page before (None: none)."""

    messages: list[MessageView]
    older: bytes | None


class ChatStore:
    """The chats of one profile of a replica whose schema declares `chat.with_chat(...)`."""

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

    # -- serializing per chat ----------------------------------------------------------------

    @contextmanager
    def _operation(self, thread: str, lease: Lease | None = None) -> Iterator[None]:
        """One transaction on chat `thread`: with `lease` (a job's), if it still holds it;
        else once no job holds the chat (waiting up to `wait_s`)."""
        deadline = time.monotonic() + self._wait_s
        while True:
            with self.replica.batch():
                if lease is not None:
                    lease.check()
                if lease is not None or self.replica.lease_is_free(_chat_lease(thread)):
                    yield
                    return
            if time.monotonic() > deadline:
                raise LeaseBusyError(
                    f"chat {thread} stayed busy with a job for {self._wait_s} s",
                    hint="try again once the job ends",
                )
            time.sleep(_POLL_S)

    def job(self, thread: str, *, ttl_s: float = 30.0) -> Lease:
        """The chat's lease for slow work (a summary, a bulk change): other operations on the
        chat wait until it is given back; pass it to the final write (`lease=`)."""
        return self.replica.lease(
            _chat_lease(check_id("chat", thread)), ttl_s=ttl_s, wait_s=self._wait_s
        )

    # -- chats ---------------------------------------------------------------------------------

    def new_chat(self, title: str = DEFAULT_TITLE, *, persona: str | None = None) -> str:
        """A new chat's id (never touches another chat)."""
        now = self._now_ms()
        thread = build(Thread, title=title, persona=persona, created_ms=now, updated_ms=now)
        thread_id = self._new_id()
        self.replica.put(THREADS, thread_id, to_document(thread), profile=self.profile)
        return thread_id

    def chat(self, thread: str) -> ChatView | None:
        record = self.replica.get(THREADS, check_id("chat", thread), profile=self.profile)
        if record is None or record.deleted:
            return None
        return self._view(thread, parse(Thread, record.document, f"chat {thread}"))

    def chats(self, *, archived: bool = False) -> list[ChatView]:
        """The chats, most recently active first (archived ones only if asked)."""
        views = [
            self._view(r.id, thread)
            for r in self.replica.scan(THREADS, profile=self.profile)
            if (thread := parse(Thread, r.document, f"chat {r.id}")).archived == archived
        ]
        return sorted(views, key=lambda v: (v.active_ms, v.id), reverse=True)

    def _view(self, thread: str, document: Thread) -> ChatView:
        stats = self._stats(thread)
        first, last = stats.first_created, stats.last_created
        return ChatView(
            thread,
            document,
            stats.records,
            None if first is None else first // 1000,
            None if last is None else last // 1000,
        )

    def _stats(self, thread: str) -> IndexStats:
        return self.replica.index_stats(MESSAGES, where={"thread": thread}, profile=self.profile)

    def rename(self, thread: str, title: str) -> None:
        self._change_thread(thread, title=title)

    def archive(self, thread: str, archived: bool = True) -> None:
        self._change_thread(thread, archived=archived)

    def _change_thread(self, thread: str, **fields: Any) -> None:
        with self._operation(check_id("chat", thread)):
            record, current = self._thread(thread)
            self._put_thread(thread, current, record, **fields)

    def _thread(self, thread: str) -> tuple[Record, Thread]:
        record = self.replica.get(THREADS, thread, profile=self.profile)
        if record is None or record.deleted:
            raise NoSuchChatError(f"no chat {thread}")
        return record, parse(Thread, record.document, f"chat {thread}")

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
        self.replica.put(
            THREADS, thread, to_document(updated), profile=self.profile, context=record.context
        )

    def delete(self, thread: str) -> int:
        """Delete the chat and every message of it held here; how many messages."""
        with self._operation(check_id("chat", thread)):
            record, _ = self._thread(thread)
            records = self._message_records(thread)
            for message in records:
                self.replica.delete(
                    MESSAGES, message.id, profile=self.profile, context=message.context
                )
            self.replica.delete(THREADS, thread, profile=self.profile, context=record.context)
        return len(records)

    def clear(self, thread: str) -> int:
        """Delete every message of the chat, keep the chat; how many messages."""
        with self._operation(check_id("chat", thread)):
            record, current = self._thread(thread)
            records = self._message_records(thread)
            for message in records:
                self.replica.delete(
                    MESSAGES, message.id, profile=self.profile, context=message.context
                )
            self._put_thread(thread, current, record, message_count=0)
        return len(records)

    # -- messages ------------------------------------------------------------------------------

    def append(
        self,
        thread: str,
        role: str,
        content: str,
        *,
        turn: str | None = None,
        thumbnails: Sequence[bytes] = (),
        lease: Lease | None = None,
    ) -> str:
        """Add a message at the end of the chat; its id. The chat's record is not written
        (appends of two devices never conflict there): the blind index counts messages."""
        check_id("chat", thread)
        now = self._now_ms()
        with self._operation(thread, lease):
            self._thread(thread)  # a deleted chat takes no message, a malformed one none either
            where = {"thread": thread}
            last = self.replica.last_created(MESSAGES, where=where, profile=self.profile)
            at = now * 1000 if last is None else max(now * 1000, last + 1)
            message_id = self._new_id()
            message = build(
                Message,
                thread=thread,
                at=at,
                role=role,
                content=content,
                turn=check_id("turn", turn) if turn is not None else message_id,
                thumbnails=list(thumbnails),
                created_ms=now,
            )
            self.replica.put(MESSAGES, message_id, to_document(message), profile=self.profile)
        return message_id

    def edit(self, thread: str, message: str, content: str) -> None:
        """Replace a message's content (it keeps its place)."""
        check_id("message", message)
        with self._operation(check_id("chat", thread)):
            record, current = self._message(thread, message)
            edited = build(
                Message, **{**to_document(current), "content": content, "edited_ms": self._now_ms()}
            )
            self.replica.put(
                MESSAGES, message, to_document(edited), profile=self.profile, context=record.context
            )

    def _message(self, thread: str, message: str) -> tuple[Record, Message]:
        record = self.replica.get(MESSAGES, message, profile=self.profile)
        if record is None or record.deleted:
            raise NoSuchChatError(f"no message {message}")
        parsed = parse(Message, record.document, f"message {message}")
        if parsed.thread != thread:
            raise NoSuchChatError(f"message {message} is not in chat {thread}")
        return record, parsed

    def messages(
        self, thread: str, *, limit: int = PAGE_MESSAGES, before: bytes | None = None
    ) -> MessagePage:
        """The chat's last `limit` messages (or those before `before`), oldest first."""
        page = self.replica.scan_page(
            MESSAGES,
            where={"thread": check_id("chat", thread)},
            profile=self.profile,
            newest_first=True,
            limit=limit,
            after=before,
        )
        views = [
            MessageView(r.id, parse(Message, r.document, f"message {r.id}")) for r in page.records
        ]
        views = [v for v in views if v.message.thread == thread]
        return MessagePage(views[::-1], page.resume)

    def _message_records(self, thread: str) -> list[Record]:
        return self.replica.scan(MESSAGES, profile=self.profile, where={"thread": thread})

    # -- turns ---------------------------------------------------------------------------------

    @contextmanager
    def turn(self, thread: str, *, ttl_s: float = 60.0) -> Iterator[Turn]:
        """One turn of the chat (a question and its answers): refused with `TurnBusyError`
        while another turn of it runs, in any process; a crashed turn's lease runs out."""
        try:
            lease = self.replica.lease(_turn_lease(check_id("chat", thread)), ttl_s=ttl_s)
        except LeaseBusyError as exc:
            raise TurnBusyError(f"chat {thread} is answering already: {exc}") from None
        with lease:
            yield Turn(self, thread, self._new_id())

    def _new_id(self) -> str:
        return new_id(self._now_ms(), os.urandom)


@dataclass(frozen=True)
class Turn:
    store: ChatStore
    thread: str
    id: str

    def append(self, role: str, content: str, *, thumbnails: Sequence[bytes] = ()) -> str:
        return self.store.append(self.thread, role, content, turn=self.id, thumbnails=thumbnails)


def _chat_lease(thread: str) -> str:
    return f"chat:{thread}"


def _turn_lease(thread: str) -> str:
    return f"turn:{thread}"
