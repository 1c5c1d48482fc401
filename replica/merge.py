"""The merge decision, pure: which versions of a record survive, and which one is shown.

A record's state is its siblings: the versions no other known version dominates (docs/architecture.md §4).
Folding versions in with `merge_version` is a join — any order, any grouping, any number of
repeats gives the same siblings — because dominance follows causality: every vector is the
maximum of the vectors its write replaced plus its own dot, and a device's writes to one record
form a chain (the replica refuses a local write whose context skips the device's own sibling).

The visible sibling is the greatest by `(hlc, tiebreak, live, node)`; dots are unique, so the
order is total and every replica shows the same version. The decision reads only headers
(dots and vectors); the tiebreak needs documents and so runs on read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from replica.wire import Dot, VersionVector, merge_vectors


class Versioned(Protocol):
    """Anything with a dot and a vector: a parsed header, a test model's version."""

    @property
    def node(self) -> int: ...

    @property
    def hlc(self) -> int: ...

    @property
    def vector(self) -> VersionVector: ...


V = TypeVar("V", bound=Versioned)


class Sibling(msgspec.Struct, frozen=True, gc=False):
    """A stored version as merging sees it: its dot and its vector, nothing more (a msgspec
    Struct: one is built per stored sibling a merge loads, cheaply)."""

    node: int
    hlc: int
    vector: VersionVector


def is_covered(siblings: Iterable[Versioned], inbound: Versioned) -> bool:
    """True when a sibling is the inbound version itself or descends from it."""
    return is_covered_dot(siblings, (inbound.node, inbound.hlc))


def is_covered_dot(siblings: Iterable[Versioned], dot: tuple[bytes, int, int] | Dot) -> bool:
    """`is_covered` by a dot alone, or a (key, node, hlc) identity: all a header claims."""
    node, hlc = dot[-2], dot[-1]  # a sibling's vector holds its own dot: equality too
    for sibling in siblings:  # noqa: SIM110 (a generator costs more, once per inbound envelope)
        if sibling.vector.get(node, 0) >= hlc:
            return True
    return False


def merge_version(siblings: Sequence[V], inbound: V) -> tuple[list[V], list[V]]:
    """Join one version into a record's siblings: (siblings after, siblings it replaced).

    The inbound version is dropped when a sibling covers it (a duplicate or a stale version);
    otherwise it replaces exactly the siblings it dominates, and concurrent ones stay.
    """
    if is_covered(siblings, inbound):
        return list(siblings), []
    return add_uncovered(siblings, inbound)


def add_uncovered(siblings: Sequence[V], inbound: V) -> tuple[list[V], list[V]]:
    """`merge_version` for a version the caller already knows no sibling covers."""
    vector = inbound.vector
    kept: list[V] = []
    replaced: list[V] = []
    for sibling in siblings:
        (replaced if vector.get(sibling.node, 0) >= sibling.hlc else kept).append(sibling)
    kept.append(inbound)
    return kept, replaced


def siblings_of(versions: Iterable[V]) -> list[V]:
    """The siblings of any set of versions, by folding `merge_version`."""
    siblings: list[V] = []
    for version in versions:
        siblings, _ = merge_version(siblings, version)
    return siblings


def local_vector(replaced: Iterable[Versioned], node: int, hlc: int) -> VersionVector:
    """A local write's vector: the maximum of the replaced siblings' vectors, plus its dot."""
    vector = merge_vectors([v.vector for v in replaced])
    vector[node] = hlc
    return vector


def tiebreak_value(document: Any, field: str | None) -> tuple[int, int]:
    """The policy's tiebreak as a sortable pair: absent, null or non-integer counts lowest."""
    if field is None or not isinstance(document, dict):
        return (0, 0)
    value = document.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        return (1, value)
    return (0, 0)


def visible_key(
    hlc: int, node: int, deleted: bool, document: Any, tiebreak: str | None
) -> tuple[Any, ...]:
    """The total order that picks the visible sibling (greatest wins)."""
    return (hlc, tiebreak_value(document, tiebreak), 0 if deleted else 1, node)
