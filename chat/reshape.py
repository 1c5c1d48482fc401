"""Operations that reshape a chat: fork, trim, and edit-and-retry (specs/chat.md §4).

Each is one transaction under the chat's serialization (`ChatBase._operation`). They read the
chat's visible messages in order, and write tombstones or copies over exactly the versions
they read, so anything another device wrote meanwhile stays (as a message, or a sibling).
"""

from __future__ import annotations

from chat.base import ChatBase
from chat.errors import NoSuchChatError
from chat.ids import check_id
from chat.models import ForkPoint, Message, Thread, build, parse, to_document
from chat.schema import MESSAGES, THREADS
from replica import InvalidArgumentError, Record

MessageRecord = tuple[Record, Message]


class Reshaping(ChatBase):
    """fork, trim and edit_and_retry of `ChatStore`."""

    def _in_order(self, thread: str) -> list[MessageRecord]:
        """The chat's visible messages, in their order (all of them: a reshape needs every one)."""
        records = self._message_records(thread)
        parsed = [(r, parse(Message, r.document, f"message {r.id}")) for r in records]
        return [(r, m) for r, m in parsed if m.thread == thread]

    def fork(self, thread: str, through: str) -> str:
        """A new chat holding copies (new ids) of the messages up to and including `through`,
        with `forked_from`; the source is not touched."""
        check_id("message", through)
        with self._operation(check_id("chat", thread), undo="fork"):
            _, source = self._thread(thread)
            messages = self._in_order(thread)
            ids = [r.id for r, _ in messages]
            if through not in ids:
                raise NoSuchChatError(f"no message {through} in chat {thread}")
            now = self._now_ms()
            fork_id = self._new_id()
            copy = build(
                Thread,
                **{
                    **to_document(source),
                    "title": source.title,
                    "forked_from": to_document(ForkPoint(thread=thread, message=through)),
                    "archived": False,
                    "created_ms": now,
                    "updated_ms": now,
                    "message_count": ids.index(through) + 1,
                },
            )
            self._write(THREADS, fork_id, to_document(copy), before=None)
            for _, message in messages[: ids.index(through) + 1]:
                moved = {**to_document(message), "thread": fork_id}
                self._write(MESSAGES, self._new_id(), moved, before=None)
        return fork_id

    def trim(self, thread: str, *, keep_first: int, keep_last: int) -> int:
        """Keep the first `keep_first` and the last `keep_last` turns of the chat (a turn: the
        messages sharing a turn id), delete the rest; how many messages it deleted."""
        if keep_first < 0 or keep_last < 0 or keep_first + keep_last < 1:
            raise InvalidArgumentError(
                f"trim keeps at least one turn: keep_first={keep_first}, keep_last={keep_last}"
            )
        with self._operation(check_id("chat", thread), undo="trim"):
            record, current = self._thread(thread)
            turns: dict[str, list[Record]] = {}
            for message_record, message in self._in_order(thread):
                turns.setdefault(message.turn, []).append(message_record)
            order = list(turns)
            dropped = order[keep_first : max(keep_first, len(order) - keep_last)]
            gone = [r for turn in dropped for r in turns[turn]]
            self._delete_all(gone)
            if gone:
                self._put_thread(thread, current, record)
        return len(gone)

    def edit_and_retry(self, thread: str, content: str) -> str:
        """Replace the content of the chat's latest user message and delete every message
        after it (the answers to retry); the message's id."""
        with self._operation(check_id("chat", thread), undo="edit and retry"):
            messages = self._in_order(thread)
            users = [i for i, (_, m) in enumerate(messages) if m.role == "user"]
            if not users:
                raise NoSuchChatError(f"chat {thread} has no user message to edit")
            record, message = messages[users[-1]]
            changes = {"content": content, "edited_ms": self._now_ms()}
            edited = build(Message, **{**to_document(message), **changes})
            self._write(
                MESSAGES, record.id, to_document(edited), before=record, context=record.context
            )
            self._delete_all([r for r, _ in messages[users[-1] + 1 :]])
        return record.id
