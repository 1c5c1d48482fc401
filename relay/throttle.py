"""Rate limits kept in the relay process: token buckets per caller.

Per process on purpose: behind several PostgreSQL-backed relay processes each enforces its
own share (the operator's load balancer spreads callers), and a bucket forgotten (the least
recently seen go first, for bounded memory) only starts full again. Failed-login counts must
be neither, so they live in the storage (`relay.gate`). The clock is injected.
"""

from __future__ import annotations

import math
from collections import OrderedDict
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
