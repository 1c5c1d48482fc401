"""Which backups `backup forget` keeps: restic's `forget --keep-*` rules, on backup times.

Backups are taken newest first. Each rule `(n, bucket)` keeps the newest backup of each of
the newest `n` buckets (the `last` rule: every backup is its own bucket; `daily`: the UTC
date; `weekly`: the ISO year and week; `monthly`: the year and month), and — while it still
has a count left when it reaches the oldest backup — the oldest too, so that a set younger
than the rule asks keeps its whole history. A backup is kept when any rule keeps it (as
restic's `ApplyPolicy`, internal/restic/snapshot_policy.go, does).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Bucket = Callable[[datetime.datetime, int], object]


@dataclass(frozen=True)
class KeepPolicy:
    last: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0

    def __post_init__(self) -> None:
        for name, count in self.counts():
            if type(count) is not int or count < 0:
                raise ValueError(f"--keep-{name} must be a whole number ≥ 0, got {count!r}")

    def counts(self) -> list[tuple[str, int]]:
        return [("last", self.last), ("daily", self.daily), ("weekly", self.weekly),
                ("monthly", self.monthly)]  # fmt: skip

    @property
    def empty(self) -> bool:
        return not any(count for _, count in self.counts())


BUCKETS: dict[str, Bucket] = {
    "last": lambda _, position: position,
    "daily": lambda taken, _: taken.date(),
    "weekly": lambda taken, _: taken.isocalendar()[:2],
    "monthly": lambda taken, _: (taken.year, taken.month),
}


def kept(times: Sequence[datetime.datetime], policy: KeepPolicy) -> list[bool]:
    """For each backup time (any order), whether `policy` keeps it; an empty policy keeps
    everything (it would otherwise remove the whole set)."""
    if policy.empty:
        return [True] * len(times)
    order = sorted(range(len(times)), key=lambda i: times[i], reverse=True)
    keep = [False] * len(times)
    for name, count in policy.counts():
        left, last = count, None
        for position, index in enumerate(order):
            if left == 0:
                break
            bucket = BUCKETS[name](times[index].astimezone(datetime.UTC), position)
            if bucket != last or position == len(order) - 1:
                keep[index] = True
                left, last = left - 1, bucket
    return keep
