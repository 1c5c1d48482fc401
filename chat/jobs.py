"""Write-last jobs (specs/chat.md §4): slow work on a chat whose result lands in one
transaction, or not at all.

A job takes the chat's lease (other operations on the chat wait; other chats go on), reads
what it needs, does its slow part outside any transaction (a model writing a summary), and
writes everything in one transaction that checks it still holds the lease. Until that
commit nothing has changed: a job that fails or is killed leaves the chat as it was, and
its lease runs out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chat.base import ChatBase
from chat.ids import check_id
from chat.models import Message, build, parse, to_document
from chat.schema import MESSAGES
from replica import InvalidArgumentError

Summarize = Callable[[Sequence[Message]], str]


class Jobs(ChatBase):
    """`compress` and `archive_chats` of `ChatStore`."""

    def compress(
        self, thread: str, summarize: Summarize, *, keep_last: int = 2, ttl_s: float = 30.0
    ) -> int:
        """Replace every message but the last `keep_last` turns by one summary message
        that `summarize(messages)` writes (slowly, outside any transaction); how many
        messages it replaced. The chat's lease lives `ttl_s` past a crash."""
        if keep_last < 0:
            raise InvalidArgumentError(f"keep_last must be 0 or more, got {keep_last}")
        with self.job(check_id("chat", thread), ttl_s=ttl_s) as lease:
            records = self._message_records(thread)
            parsed = [(r, parse(Message, r.document, f"message {r.id}")) for r in records]
            turns = list(dict.fromkeys(m.turn for _, m in parsed))
            kept = set(turns[len(turns) - keep_last :]) if keep_last else set()
            old = [(r, m) for r, m in parsed if m.turn not in kept]
            if not old:
                return 0
            summary = summarize([m for _, m in old])  # the slow part: no transaction open
            first = old[0][1]
            document = build(
                Message,
                thread=thread,
                at=first.at,
                role="system",
                content=summary,
                turn=first.turn,
                created_ms=self._now_ms(),
            )
            with self._operation(thread, lease, undo="compress"):
                self._thread(thread)
                self._delete_all([r for r, _ in old])
                self._write(MESSAGES, self._new_id(), to_document(document), before=None)
        return len(old)

    def archive_chats(self, threads: Sequence[str], archived: bool = True) -> None:
        """Archive (or bring back) several chats in one transaction: all of them, or none."""
        for thread in threads:
            check_id("chat", thread)
        with self.replica.batch():
            for thread in threads:
                with self._operation(thread, undo="archive" if archived else "unarchive"):
                    record, current = self._thread(thread)
                    self._put_thread(thread, current, record, archived=archived)
