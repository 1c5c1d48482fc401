"""What a replica tells its subscribers, after the transaction that caused it has committed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(f"sealsync.{__name__}")

EventKind = Literal["changed", "held", "released", "node_changed", "over_limit"]


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One record changed (`origin` local or remote), was held, or was released; or a merge
    left a per_item collection over its `max_items` (`over_limit`, `id` None: merges never
    drop an item, so the app decides what to remove); or the node id changed (a copied file).

    `profile`, `collection` and `id` are None when a version was held before it could be
    opened (the replica was locked, or the key epoch is unknown).
    """

    kind: EventKind
    origin: Literal["local", "remote"]
    profile: str | None
    collection: str | None
    id: str | None
    reason: str | None = None


Subscriber = Callable[[ChangeEvent], None]


class Subscribers:
    """A thread-safe list of callbacks; a failing callback is logged and never breaks a write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Subscriber] = []

    def add(self, callback: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def __bool__(self) -> bool:
        """True when anyone listens (merging skips making events nobody would hear)."""
        return bool(self._callbacks)

    def publish(self, events: list[ChangeEvent]) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for event in events:
            for callback in callbacks:
                try:
                    callback(event)
                except Exception:  # the data is committed; a subscriber's bug must not undo it
                    log.exception("subscriber %r failed on a %s event", callback, event.kind)
