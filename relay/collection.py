"""Tombstone collection on the relay (docs/tombstone-collection.md §2), the parts every
storage backend shares, as `relay.versions` is for pushes.

A run deletes the stored tombstones that every device of the account has acknowledged
pulling (the lowest of their last acks, the *floor*), each only while it is its key's sole
version: a tombstone beside a concurrent edit stays until a write resolves them. The run
takes a seq of the account's, so devices meet it in order, once, and keeps the dots it
deleted: as markers, sent on the page that ends at the run, and as ghosts, which refuse a
re-push of anything they covered. Both go once every device has pulled past the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from replica.wire import PageEntry, VersionVector, dominates


class Candidate(NamedTuple):
    """A stored tombstone a run may delete."""

    seq: int
    key: bytes
    node: int
    hlc: int
    vector: bytes
    size: int


def ack_floor(acks: Iterable[int | None]) -> int | None:
    """The seq every device has pulled up to: None while one of them has not acknowledged
    anything (a device that never said how far it pulled holds every tombstone back)."""
    values = list(acks)
    if not values or None in values:
        return None
    return min(value for value in values if value is not None)


def haunted(ghosts: Sequence[VersionVector], node: int, hlc: int) -> bool:
    """Whether a pushed version is one a run deleted, or one that such a tombstone covered:
    either way every device has moved past it, and storing it again would bring it back."""
    return any(dominates(vector, (node, hlc)) for vector in ghosts)


def page_end(
    entries: Sequence[PageEntry], has_more: bool, run: int | None, head: int, cursor: int
) -> tuple[int, bool]:
    """A page's next cursor and whether more follows it. The page stops at its last entry
    while versions before the next run (or the head) remain; it ends at the run and carries
    its markers once it reaches it; without a run, it ends at the head."""
    if has_more:
        return entries[-1].seq, True
    if run is not None:
        return run, run < head
    return max(head, cursor), False
