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


class LockIndex:
    """Active locks by what they name, so each inbound version checks only its own three."""

    def __init__(self, locks: list[Lock]) -> None:
        self._by_target: dict[bytes, list[Lock]] = {}
        for lock in locks:
            self._by_target.setdefault(lock.target, []).append(lock)
        self.has_profile_locks = any(lock.kind == "profile" for lock in locks)

    def __bool__(self) -> bool:
        return bool(self._by_target)

    def held_until(self, targets: Targets, header: Header) -> int | None:
        """The expiry of the latest lock that holds `header` back, or None to apply it now."""
        until: int | None = None
        for target in (targets.record, targets.scope, targets.profile):
            for lock in self._by_target.get(target, ()):
                if lock.kind == "auto" and _descends(header, lock.dot):
                    continue  # its writer saw the local edit: not stale
                if _names(lock, targets) and (until is None or lock.expires_ms > until):
                    until = lock.expires_ms
        return until


def _names(lock: Lock, targets: Targets) -> bool:
    """A lock holds a version only through the target of its own kind."""
    if lock.kind in ("auto", "record"):
        return lock.target == targets.record
    if lock.kind == "collection":
        return lock.target == targets.scope
    return lock.target == targets.profile


def _descends(header: Header, dot: Dot | None) -> bool:
    return dot is not None and dominates(header.vector, dot)
