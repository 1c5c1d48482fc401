"""Indexed reads and the rebuild of blind indexes (replica/blind.py says what they hold).

`scan(where=)` reads the record keys under one value's blind key from the index in creation
order, then opens only those records, each from all its siblings, failing closed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from replica.asides import Row
from replica.blind import blind_of, indexable, memoized_value_key
from replica.core import Core
from replica.envelope import open_envelope
from replica.errors import (
    DegradedError,
    EnvelopeError,
    InvalidArgumentError,
    UnknownEpochError,
)
from replica.record import Record, record_from_siblings
from replica.schema import Collection, Schema


@dataclass(frozen=True)
class ScanPage:
    """One page of an indexed read; pass `resume` back as `after` for the next (None: done)."""

    records: list[Record]
    resume: bytes | None


def where_key(core: Core, spec: Collection, scope: bytes, where: Mapping[str, Any]) -> bytes:
    """The blind key `where` asks for, or a clear error naming what is wrong with it."""
    if spec.index is None:
        raise InvalidArgumentError(
            f"collection {spec.name!r} declares no index", hint="declare Collection(index=...)"
        )
    if len(where) != 1 or spec.index not in where:
        raise InvalidArgumentError(
            f"where must name exactly the indexed field {spec.index!r} of {spec.name!r}, "
            f"got {sorted(where)}"
        )
    value = indexable(where[spec.index])
    if value is None:
        kind = type(where[spec.index]).__name__
        raise InvalidArgumentError(f"where {spec.index}= takes a string or an integer, got {kind}")
    return memoized_value_key(core.keys(), scope, spec.index, value, core.blind_memo())


@dataclass(frozen=True)
class IndexStats:
    """What the index knows of one value's records without opening them: how many (with a
    live sibling under the value), the first and last `created` (None: none), and, if asked,
    the bytes of all their stored versions."""

    records: int
    first_created: int | None
    last_created: int | None
    bytes: int


def _parse_resume(after: bytes | None) -> tuple[int, bytes] | None:
    if after is None:
        return None
    try:
        created, key = msgspec.msgpack.decode(after, type=tuple[int, bytes])
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        raise InvalidArgumentError(
            f"after is not a resume point a scan returned: {exc}", hint="pass ScanPage.resume"
        ) from None
    return created, key


def ordered_keys(
    core: Core, blind: bytes, *, newest_first: bool, limit: int | None, after: bytes | None
) -> tuple[list[bytes], bytes | None]:
    """Up to `limit` distinct record keys under `blind`, in creation order from `after`,
    and the resume point after the last (None when nothing follows)."""
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit must be at least 1, got {limit}")
    position = start = _parse_resume(after)
    store = core.store
    keys: list[bytes] = []
    seen: set[bytes] = set()
    while limit is None or len(keys) < limit:
        asked = 1000 if limit is None else limit - len(keys)
        rows = store.blind_keys(blind, position, newest_first, asked)
        for created, key in rows:
            position = (created, key)
            if key in seen:  # two siblings of one record under one value
                continue
            seen.add(key)
            if start is None or not store.blind_listed_before(blind, key, start, newest_first):
                keys.append(key)  # else an earlier page listed it, at its first entry
        if len(rows) < asked:
            return keys, None
    more = core.store.blind_keys(blind, position, newest_first, 1)
    assert position is not None
    return keys, msgspec.msgpack.encode(position) if more else None


def open_records(
    core: Core,
    spec: Collection,
    scope: bytes,
    rows_of_keys: Iterable[tuple[bytes, list[Row]]],
    *,
    include_deleted: bool,
    skip_degraded: bool,
) -> list[Record]:
    """The records of `rows_of_keys` (each key with all its stored siblings), in that order;
    an unreadable one raises `DegradedError` unless `skip_degraded`."""
    records = []
    for key, rows in rows_of_keys:
        if not rows:
            continue
        try:
            opened = core.open_rows(key, rows, scope)
        except DegradedError:
            if skip_degraded:
                continue
            raise
        record = record_from_siblings(opened, spec.tiebreak)
        if include_deleted or not record.deleted:
            records.append(record)
    return records


def changed_indexes(old: Schema, new: Schema) -> list[str]:
    """The collections whose index entries `new` computes otherwise than `old` did."""

    def index_of(schema: Schema, name: str) -> tuple[str | None, str | None]:
        spec = schema.get(name)
        return (None, None) if spec is None else (spec.index, spec.created_field)

    names = {c.name for c in (*old.collections, *new.collections)}
    return sorted(n for n in names if index_of(old, n) != index_of(new, n))


def rebuild(core: Core, scopes: Iterable[bytes] | None = None) -> int:
    """Recompute, inside the caller's transaction, the entry of every stored version (of
    `scopes`, or all); how many changed. A version that does not open keeps the entry it
    has (what is known of unreadable data is never erased), and its record is latched."""
    keys, schema, store = core.keys(), core.schema, core.store
    updates: list[tuple[bytes | None, int | None, int]] = []
    for rowid, row, scope, old in store.rows_for_index(scopes):
        try:
            opened = open_envelope(keys, row.envelope)
        except (EnvelopeError, UnknownEpochError) as exc:
            core.mark_degraded(row.key, scope, str(exc))
            continue
        header = opened.header
        if (header.key, header.node, header.hlc) != (row.key, row.node, row.hlc):
            core.mark_degraded(row.key, scope, "a stored envelope does not belong to its row")
            continue
        spec = schema.get(opened.identity.collection)
        new = None
        if spec is not None:
            new = blind_of(keys, scope, spec, opened.document, opened.deleted, header.hlc)
        if new != old:
            updates.append((*(new or (None, None)), rowid))
    store.set_blind(updates)
    return len(updates)
