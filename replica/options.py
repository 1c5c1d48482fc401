"""Settings of an open replica, with named defaults; the wall clock and randomness are injected."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from replica.clock import DEFAULT_MAX_DRIFT_MS
from replica.errors import InvalidArgumentError
from replica.store import Synchronous
from replica.wire import system_clock_ms


@dataclass(frozen=True)
class ReplicaOptions:
    """How a replica behaves; every field has a default fit for an app on a laptop or phone.

    `freshness_window_s`: how long a local write protects its record from concurrent inbound
    versions (0 turns it off). `max_lock_s`: the longest an explicit lock may last.
    `max_drift_ms`: inbound versions further ahead of the wall clock are held for drift.
    `synchronous`: "full" survives power loss; "normal" survives only a crash of the process.
    """

    freshness_window_s: float = 10.0
    max_lock_s: float = 600.0
    max_drift_ms: int = DEFAULT_MAX_DRIFT_MS
    synchronous: Synchronous = "full"
    busy_timeout_s: float = 30.0
    cache_entries: int = 4096
    wall_clock_ms: Callable[[], int] = system_clock_ms
    random_bytes: Callable[[int], bytes] = os.urandom

    def new_node_id(self, avoid: int = 0) -> int:
        """A random, non-zero 64-bit node id other than `avoid`."""
        while True:
            node = int.from_bytes(self.random_bytes(8), "big")
            if node not in (0, avoid):
                return node

    def __post_init__(self) -> None:
        numbers = (self.freshness_window_s, self.max_lock_s, self.busy_timeout_s)
        if not all(math.isfinite(n) for n in numbers):
            raise InvalidArgumentError(
                f"freshness_window_s, max_lock_s and busy_timeout_s must be finite, got {numbers}"
            )
        if self.freshness_window_s < 0 or self.max_lock_s <= 0 or self.max_drift_ms < 0:
            raise InvalidArgumentError(
                "freshness_window_s and max_drift_ms must be ≥ 0 and max_lock_s > 0, got "
                f"{self.freshness_window_s}, {self.max_drift_ms}, {self.max_lock_s}"
            )
        if self.busy_timeout_s < 0 or self.cache_entries < 0:
            raise InvalidArgumentError(
                "busy_timeout_s and cache_entries must be ≥ 0, got "
                f"{self.busy_timeout_s}, {self.cache_entries}"
            )
        if self.synchronous not in ("full", "normal"):
            raise InvalidArgumentError(
                f"synchronous must be 'full' or 'normal', got {self.synchronous!r}"
            )
