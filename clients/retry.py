"""Sending a request again after an unknown outcome: exponential backoff with jitter.

The sync requests are idempotent (a push of the same bytes answers the same receipts, a pull
is a read; a reseed checks the relay's state before each try, `SyncDriver.reseed`), so a
timeout or a dropped answer is simply sent again — within bounds, so a relay
that stays down surfaces as an error instead of a hang. Sleep, randomness and the clock are
injected: tests run the policy without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from clients.errors import RelayClientError, RelayRefusedError

log = logging.getLogger(f"sealsync.{__name__}")
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How often and how long to retry. The delay before retry n (from 0) is "equal jitter":
    half of min(max_delay_s, first_delay_s · 2ⁿ) fixed, the other half random, so waits grow
    and devices that failed together do not come back together."""

    first_delay_s: float = 0.1
    max_delay_s: float = 5.0
    max_attempts: int = 12
    max_elapsed_s: float = 120.0

    def delay_s(self, retry: int, random: Callable[[], float]) -> float:
        ceiling = min(self.max_delay_s, self.first_delay_s * 2.0**retry)
        return ceiling / 2 + random() * ceiling / 2


class Retrier:
    """Runs calls under a `Backoff`; counts the retries it made (for sync reports)."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        sleep: Callable[[float], None],
        random: Callable[[], float],
        clock: Callable[[], float],
    ) -> None:
        self.backoff = backoff
        self.retries = 0
        self._sleep = sleep
        self._random = random
        self._clock = clock

    def call(self, what: Callable[[], T]) -> T:
        """`what()`, again after each retryable error, until it answers or the bounds are
        reached; then the last error is raised as it was."""
        started = self._clock()
        attempt = 1
        while True:
            try:
                return what()
            except RelayClientError as exc:
                delay = self._delay_after(exc, attempt, started)
                if delay is None:
                    raise
                log.info("retrying in %.2f s after: %s", delay, exc)
                self.retries += 1
                attempt += 1
                self._sleep(delay)

    def _delay_after(self, exc: RelayClientError, attempt: int, started: float) -> float | None:
        if not exc.retryable or attempt >= self.backoff.max_attempts:
            return None
        delay = self.backoff.delay_s(attempt - 1, self._random)
        if isinstance(exc, RelayRefusedError) and exc.retry_after_s is not None:
            delay = max(delay, exc.retry_after_s)  # the relay said how long
        if self._clock() - started + delay > self.backoff.max_elapsed_s:
            return None
        return delay
