"""What every chat operation stands on: serializing per chat, and reading and writing a
chat's records (specs/chat.md §4). `ChatStore` (chat/store.py) is built on it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from chat.errors import NoSuchChatError
from chat.ids import check_id, new_id
from chat.models import Thread, build, parse, to_document
from chat.schema import MESSAGES, THREADS, check_declared
from replica import DEFAULT_PROFILE, IndexStats, Lease, LeaseBusyError, Record, Replica

_POLL_S = 0.02


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
                if lease is not None or self.replica.lease_is_free(chat_lease(thread)):
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
            chat_lease(check_id("chat", thread)), ttl_s=ttl_s, wait_s=self._wait_s
        )

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

    def _stats(self, thread: str) -> IndexStats:
        return self.replica.index_stats(MESSAGES, where={"thread": thread}, profile=self.profile)

    def _message_records(self, thread: str) -> list[Record]:
        return self.replica.scan(MESSAGES, profile=self.profile, where={"thread": thread})

    def _delete_all(self, records: list[Record]) -> None:
        """Tombstones for `records` (messages), each over the context read."""
        for message in records:
            self.replica.delete(MESSAGES, message.id, profile=self.profile, context=message.context)

    def _new_id(self) -> str:
        return new_id(self._now_ms(), os.urandom)


def chat_lease(thread: str) -> str:
    return f"chat:{thread}"


def turn_lease(thread: str) -> str:
    return f"turn:{thread}"
