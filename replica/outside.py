"""Merging versions that come from outside any relay (a backup file, a shared folder): a
page at a time, each in its own transaction, through the merge pulled pages take
(specs/merge.md §9), so every rule applied to what arrives from elsewhere applies here too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from replica.core import Core

Identity = tuple[bytes, int, int]
"""A version's (opaque key, node, hlc)."""


@dataclass
class Merged:
    """What merging versions from outside did, summed over pages."""

    read: int = 0
    merged: int = 0
    superseded: int = 0
    """Already here, or older than what is here."""
    held: Counter[str] = field(default_factory=Counter)
    quarantined: int = 0
    untrusted: int = 0

    def add(self, other: Merged) -> None:
        self.read += other.read
        self.merged += other.merged
        self.superseded += other.superseded
        self.held.update(other.held)
        self.quarantined += other.quarantined
        self.untrusted += other.untrusted


def merge_outside(
    core: Core, envelopes: Sequence[bytes], source: str, to_push: frozenset[Identity] = frozenset()
) -> Merged:
    """Merge one page in one transaction; the versions of `to_push` stay marked to push."""
    with core.mutex, core.write_transaction():
        result = core.merge(list(envelopes), now_ms=None, source=source, to_push=to_push)
        core.publish(result.events)
    return Merged(
        len(envelopes),
        result.merged,
        result.superseded,
        Counter(result.held),
        result.quarantined,
        result.untrusted,
    )
