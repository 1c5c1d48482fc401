"""What reads return: a record's visible version with its causal context, and its siblings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.envelope import Opened
from replica.merge import visible_key
from replica.wire import Dot

Context = frozenset[Dot]
"""The dots of the siblings a reader saw; pass it back to `put` to replace exactly those."""


@dataclass(frozen=True, slots=True)
class Version:
    """One sibling of a record."""

    node: int
    hlc: int
    deleted: bool
    document: Any


@dataclass(frozen=True, slots=True)
class Record:
    """A record as `get` and `scan` return it: the visible sibling and what else is there.

    `document` is None when the visible version is a tombstone (`deleted`). `conflicts` are
    the other siblings, most significant first; a write whose context covers them resolves them.
    """

    profile: str
    collection: str
    id: str
    document: Any
    deleted: bool
    hlc: int
    node: int
    context: Context
    conflicts: tuple[Version, ...]


def record_from_siblings(siblings: list[Opened], tiebreak: str | None) -> Record:
    """Pick the visible sibling by the total order of `merge.visible_key`."""
    ranked = sorted(
        siblings,
        key=lambda o: visible_key(o.header.hlc, o.header.node, o.deleted, o.document, tiebreak),
        reverse=True,
    )
    top = ranked[0]
    others = tuple(
        Version(o.header.node, o.header.hlc, o.deleted, None if o.deleted else o.document)
        for o in ranked[1:]
    )
    return Record(
        profile=top.identity.profile,
        collection=top.identity.collection,
        id=top.identity.id,
        document=None if top.deleted else top.document,
        deleted=top.deleted,
        hlc=top.header.hlc,
        node=top.header.node,
        context=frozenset(o.header.dot for o in siblings),
        conflicts=others,
    )
