"""Rate limits kept in the relay process: token buckets per caller, and failed-login counts.

Per process on purpose: behind several PostgreSQL-backed relay processes each enforces its
own share (the operator's load balancer spreads callers). The clock is injected.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable

_MAX_TRACKED = 100_000
"""Callers remembered at most; the least recently seen are forgotten first (bounded memory)."""


class TokenBuckets:
    """`rate` requests per second with bursts of `burst`, per caller key."""

    def __init__(self, rate: float, burst: int, clock_ms: Callable[[], int]) -> None:
        self._rate, self._burst, self._clock_ms = rate, burst, clock_ms
        self._buckets: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def take(self, caller: str) -> int | None:
        """None when the request may go ahead, else the seconds to wait (Retry-After)."""
        now = self._clock_ms()
        tokens, last = self._buckets.pop(caller, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - last) * self._rate / 1000)
        if tokens < 1:
            self._remember(caller, tokens, now)
            return max(1, math.ceil((1 - tokens) / self._rate))
        self._remember(caller, tokens - 1, now)
        return None

    def _remember(self, caller: str, tokens: float, now: int) -> None:
        self._buckets[caller] = (tokens, now)
        while len(self._buckets) > _MAX_TRACKED:
            self._buckets.popitem(last=False)


class LoginFailures:
    """At most `limit` failed logins per account name within a sliding window; unknown names
    are counted exactly like known ones, so the answers do not tell them apart."""

    def __init__(self, limit: int, window_s: int, clock_ms: Callable[[], int]) -> None:
        self._limit, self._window_ms, self._clock_ms = limit, window_s * 1000, clock_ms
        self._failures: OrderedDict[str, deque[int]] = OrderedDict()

    def wait_s(self, account: str) -> int | None:
        """None when a login may be tried, else the seconds until one may."""
        failures = self._recent(account)
        if len(failures) < self._limit:
            return None
        return max(1, math.ceil((failures[0] + self._window_ms - self._clock_ms()) / 1000))

    def failed(self, account: str) -> None:
        self._recent(account).append(self._clock_ms())
        self._failures.move_to_end(account)
        while len(self._failures) > _MAX_TRACKED:
            self._failures.popitem(last=False)

    def succeeded(self, account: str) -> None:
        self._failures.pop(account, None)

    def _recent(self, account: str) -> deque[int]:
        failures = self._failures.setdefault(account, deque())
        horizon = self._clock_ms() - self._window_ms
        while failures and failures[0] <= horizon:
            failures.popleft()
        return failures
