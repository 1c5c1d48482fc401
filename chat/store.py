"""The chat store: conversations on one replica profile (specs/chat.md is normative).

Every operation is one replica transaction, and operations on one chat are serialized
across threads and processes on the file: a single-transaction operation waits while a slow
job holds the chat's lease (`chat:ID`); a job takes that lease, works outside any
transaction, and writes its result in one transaction that checks it still holds it. A turn
holds `turn:ID`, so a second turn of the chat is refused (`TurnBusyError`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from chat.base import ChatBase, turn_lease
from chat.errors import NoSuchChatError, TurnBusyError
from chat.ids import check_id
from chat.jobs import Jobs
from chat.models import Message, Thread, build, parse, to_document
from chat.preferences import BUILTIN_PERSONAS, Preferences
from chat.reconcile import Reconciling
from chat.reshape import Reshaping
from chat.schema import MESSAGES, THREADS
from chat.search import Searching
from chat.undo import Undoing
from replica import Lease, LeaseBusyError, Record

DEFAULT_TITLE = "New chat"
PAGE_MESSAGES = 120


@dataclass(frozen=True)
class ChatView:
    """A chat and what the blind index says of its messages (none opened)."""

    id: str
    thread: Thread
    messages: int
    first_message_ms: int | None
    last_message_ms: int | None
    bytes: int = 0
    """The size of its messages' stored versions, when asked (`chats(with_bytes=True)`)."""

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
    damaged: int = 0
    """Messages of the chat that cannot be read (left out): the chat is read-only."""


class ChatStore(Reshaping, Jobs, Preferences, Reconciling, Searching, Undoing, ChatBase):
    """The chats of one profile of a replica whose schema declares `chat.with_chat(...)`."""

    # -- chats ---------------------------------------------------------------------------------

    def new_chat(self, title: str = DEFAULT_TITLE, *, persona: str | None = None) -> str:
        """A new chat's id (never touches another chat)."""
        if persona is not None and persona not in BUILTIN_PERSONAS:
            check_id("persona", persona)
        now = self._now_ms()
        thread = build(Thread, title=title, persona=persona, created_ms=now, updated_ms=now)
        thread_id = self._new_id()
        with self._operation(thread_id, undo="new chat"):
            self._write(THREADS, thread_id, to_document(thread), before=None)
        return thread_id

    def chat(self, thread: str) -> ChatView | None:
        record = self.replica.get(THREADS, check_id("chat", thread), profile=self.profile)
        if record is None or record.deleted:
            return None
        return self._view(thread, parse(Thread, record.document, f"chat {thread}"))

    def chats(self, *, archived: bool = False, with_bytes: bool = False) -> list[ChatView]:
        """The chats, most recently active first (archived ones only if asked); with their
        messages' sizes if asked (that reads their rows, not only the index)."""
        views = [
            self._view(r.id, thread, with_bytes)
            for r in self.replica.scan(THREADS, profile=self.profile)
            if (thread := parse(Thread, r.document, f"chat {r.id}")).archived == archived
        ]
        return sorted(views, key=lambda v: (v.active_ms, v.id), reverse=True)

    def _view(self, thread: str, document: Thread, with_bytes: bool = False) -> ChatView:
        where = {"thread": thread}
        stats = self.replica.index_stats(
            MESSAGES, where=where, profile=self.profile, with_bytes=with_bytes
        )
        first, last = stats.first_created, stats.last_created
        return ChatView(
            thread,
            document,
            stats.records,
            None if first is None else first // 1000,
            None if last is None else last // 1000,
            stats.bytes,
        )

    def rename(self, thread: str, title: str) -> None:
        self._change_thread(thread, "rename", title=title)

    def archive(self, thread: str, archived: bool = True) -> None:
        self._change_thread(thread, "archive" if archived else "unarchive", archived=archived)

    def set_persona(self, thread: str, persona: str | None) -> None:
        """Give a chat a persona (an id, `default`, or None: the active one). A persona
        deleted later shows as the default (`persona()`)."""
        if persona is not None and persona not in BUILTIN_PERSONAS:
            check_id("persona", persona)
        self._change_thread(thread, "persona", persona=persona)

    def _change_thread(self, thread: str, operation: str, **fields: Any) -> None:
        with self._operation(check_id("chat", thread), undo=operation):
            record, current = self._thread(thread)
            self._put_thread(thread, current, record, **fields)

    def delete(self, thread: str) -> int:
        """Delete the chat and every message of it held here; how many messages."""
        with self._operation(check_id("chat", thread), undo="delete", lifts_damage=True):
            record, _ = self._thread(thread)
            records = self._message_records(thread)
            self._delete_all(records)
            self._delete_preferences(thread)
            self._write(THREADS, thread, None, before=record, context=record.context)
        return len(records)

    def clear(self, thread: str) -> int:
        """Delete every message of the chat, keep the chat; how many messages."""
        with self._operation(check_id("chat", thread), undo="clear", lifts_damage=True):
            record, current = self._thread(thread)
            records = self._message_records(thread)
            self._delete_all(records)
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
        with self._operation(thread, lease, appends=True) as operation:
            last = operation.last_at
            if last is None:
                self._check_thread(thread)  # a deleted chat takes no message, nor a malformed one
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
            self._write(MESSAGES, message_id, to_document(message), before=None, entry_later=thread)
            operation.appended_at = at
        return message_id

    def edit(self, thread: str, message: str, content: str) -> None:
        """Replace a message's content (it keeps its place)."""
        check_id("message", message)
        with self._operation(check_id("chat", thread), undo="edit"):
            record, current = self._message(thread, message)
            edited = build(
                Message, **{**to_document(current), "content": content, "edited_ms": self._now_ms()}
            )
            self._write(
                MESSAGES, message, to_document(edited), before=record, context=record.context
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
            skip_degraded=True,
        )
        damaged = self.replica.index_degraded(
            MESSAGES, where={"thread": thread}, profile=self.profile
        )
        views = [
            MessageView(r.id, parse(Message, r.document, f"message {r.id}")) for r in page.records
        ]
        views = [v for v in views if v.message.thread == thread]
        return MessagePage(views[::-1], page.resume, damaged)

    # -- turns ---------------------------------------------------------------------------------

    @contextmanager
    def turn(self, thread: str, *, ttl_s: float = 60.0) -> Iterator[Turn]:
        """One turn of the chat (a question and its answers): refused with `TurnBusyError`
        while another turn of it runs, in any process; a crashed turn's lease runs out."""
        try:
            lease = self.replica.lease(turn_lease(check_id("chat", thread)), ttl_s=ttl_s)
        except LeaseBusyError as exc:
            raise TurnBusyError(f"chat {thread} is answering already: {exc}") from None
        with lease:
            yield Turn(self, thread, self._new_id())


@dataclass(frozen=True)
class Turn:
    store: ChatStore
    thread: str
    id: str

    def append(self, role: str, content: str, *, thumbnails: Sequence[bytes] = ()) -> str:
        return self.store.append(self.thread, role, content, turn=self.id, thumbnails=thumbnails)
