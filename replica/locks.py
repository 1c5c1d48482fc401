"""Freshness locks, decided purely: does a lock hold this inbound version back, and until when?

An automatic lock follows each local write for `freshness_window_s` and holds only inbound
versions concurrent with that local version — stale ones, written without seeing it; a version
that dominates it was written by someone who saw the edit and applies at once. An explicit
lock on a record, a collection of a profile, or a whole profile holds every inbound version in
its scope. Locks live in the replica file with an expiry, so a crash cannot leave one behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replica.wire import Dot, Header, dominates

LockKind = Literal["auto", "record", "collection", "profile"]
EXPLICIT_KINDS: tuple[LockKind, ...] = ("record", "collection", "profile")


@dataclass(frozen=True, slots=True)
class Lock:
    """A lock row: `target` is a record key, a scope key or a profile key, by `kind`."""

    id: int
    kind: LockKind
    target: bytes
    expires_ms: int
    dot: Dot | None = None


@dataclass(frozen=True, slots=True)
class Targets:
    """The three things a lock can name, for one inbound version."""

    record: bytes
    scope: bytes
    profile: bytes


def held_until(locks: list[Lock], targets: Targets, header: Header) -> int | None:
    """The expiry of the latest lock that holds `header` back, or None to apply it now."""
    until: int | None = None
    for lock in locks:
        if lock.kind == "auto":
            holds = lock.target == targets.record and not _descends(header, lock.dot)
        elif lock.kind == "record":
            holds = lock.target == targets.record
        elif lock.kind == "collection":
            holds = lock.target == targets.scope
        else:
            holds = lock.target == targets.profile
        if holds and (until is None or lock.expires_ms > until):
            until = lock.expires_ms
    return until


def _descends(header: Header, dot: Dot | None) -> bool:
    return dot is not None and dominates(header.vector, dot)
