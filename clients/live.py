"""`HeadFeed`: follows the relay's live feed in a background thread and says when to pull.

Heads on the feed are hints only (specs/protocol.md §6.2): they may arrive out of order and
are never relay state; the sync round reads the state from the relay's answers. A broken
feed is reopened with backoff and resumed with Last-Event-ID; while it is down, `is_up` is
False so the sync driver polls instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from clients.errors import RelayClientError
from clients.http import RelayClient
from clients.retry import Backoff

log = logging.getLogger(f"sealsync.{__name__}")

MAX_BACKOFF_STEP = 16
"""Retry counts past this add nothing: the delay is at its ceiling long before."""


class HeadFeed:
    """One daemon thread reading GET /v1/events; `take_hint` waits for "pull now"."""

    def __init__(
        self, client: RelayClient, *, backoff: Backoff, random: Callable[[], float]
    ) -> None:
        self.last_event_id: int | None = None
        self._client = client
        self._backoff = backoff
        self._random = random
        self._hinted = threading.Event()
        self._up = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sealsync-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop reconnecting. A read in progress ends at the next event or heartbeat; the
        thread is a daemon, so it never holds the process open meanwhile."""
        self._closed.set()

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    def take_hint(self, timeout_s: float) -> bool:
        """True if a head arrived since the last call (waiting up to `timeout_s` for one)."""
        if self._hinted.wait(timeout_s):
            self._hinted.clear()
            return True
        return False

    def _follow(self) -> None:
        try:
            self._follow_until_closed()
        finally:  # whatever ends the thread, the driver must fall back to polling
            self._up.clear()

    def _follow_until_closed(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                with self._client.events(self.last_event_id) as heads:
                    self._up.set()
                    failures = 0
                    for head in heads:
                        self._note(head)
                        if self._closed.is_set():
                            return
            except RelayClientError as exc:
                self._up.clear()
                log.info("live feed down (%s); polling until it is back", exc)
                failures += 1
            # ended by the relay (a token expired) or broken: reopen, after a pause
            self._closed.wait(self._backoff.delay_s(min(failures, MAX_BACKOFF_STEP), self._random))

    def _note(self, head: int) -> None:
        if self.last_event_id is None or head > self.last_event_id:
            self.last_event_id = head  # resume after the highest head heard
        self._hinted.set()
