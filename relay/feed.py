"""The live feed: "head is now N" hints per account, for Server-Sent Events subscribers.

Storage backends report new heads from whatever thread committed (or from PostgreSQL's
LISTEN thread); the hub hands them to the event loop and wakes that account's subscribers.
A hint only says "pull now": losing one is harmless, the next pull catches up. Hints from
several committing threads can arrive out of order, so a device must not read a hint's head
as the relay state (rollback detection uses the state in pull and push answers).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict


class HeadHub:
    """Subscribers per account, woken with the newest head; lives on one event loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: dict[str, set[asyncio.Queue[int]]] = defaultdict(set)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def publish_threadsafe(self, account: str, head: int) -> None:
        """Called by storage from any thread after a commit."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._publish, account, head)

    def _publish(self, account: str, head: int) -> None:
        for queue in self._subscribers.get(account, ()):
            if queue.full():  # one hint waits at most: the highest (they can race in)
                head = max(head, queue.get_nowait())
            queue.put_nowait(head)

    def subscribe(self, account: str) -> asyncio.Queue[int]:
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        self._subscribers[account].add(queue)
        return queue

    def unsubscribe(self, account: str, queue: asyncio.Queue[int]) -> None:
        subscribers = self._subscribers.get(account)
        if subscribers is not None:
            subscribers.discard(queue)
            if not subscribers:
                del self._subscribers[account]
