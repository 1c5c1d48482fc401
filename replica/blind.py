"""Blind indexes: a collection's records found by one field's value without opening the rest.

A collection declared with `index="thread"` keeps, in two columns of each stored version
(specs/replica.md §2), `blind`: HMAC(blind key, scope ‖ lp(field) ‖ MessagePack(value))[:16]
of that version's value of the field, and `created`: the order of indexed reads, the
document's `created_field` integer, else the version's hlc. Each sibling carries its own
entry, so a record whose siblings name two threads is found under both; a tombstone, or a
document without a string or integer there, has none. An entry is written in the statement
that stores its version (a local write, a merge, a release from hold), goes with it (a
replaced or quarantined version), and is recomputed by `rebuild` (repair, and a declared
schema that changes an index). The blind key derives from the index key, which no rotation
changes. Nothing of it leaves the device; the file shows which versions share a value.
"""

from __future__ import annotations

from typing import Any

import msgspec

from replica.keys import AccountKeys, length_prefixed
from replica.schema import Collection

Blind = tuple[bytes, int]
"""A version's index entry: the value's blind key and the version's creation order."""
_INT64 = (-(1 << 63), (1 << 63) - 1)
BlindMemo = dict[tuple[bytes, str, str | int], bytes]
"""Value keys already computed, by (scope, field, value)."""


def indexable(value: object) -> str | int | None:
    """A string or an integer as every device decodes it (an enum member of either is its
    plain value: what MessagePack carries), else None; never a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return str(value)
    return int(value) if isinstance(value, int) else None


def value_key(keys: AccountKeys, scope: bytes, field: str, value: str | int) -> bytes:
    """The blind key of one value of an indexed field, in one scope (profile, collection)."""
    return keys.blind_key(scope + length_prefixed(field) + msgspec.msgpack.encode(value))


def blind_of(
    keys: AccountKeys,
    scope: bytes,
    spec: Collection,
    document: Any,
    deleted: bool,
    hlc: int,
    memo: BlindMemo | None = None,
) -> Blind | None:
    """The index entry of a version of `spec`'s records; None when it has none. `memo`
    keeps value keys across calls (a merged page holds many messages of few threads)."""
    if spec.index is None or deleted or not isinstance(document, dict):
        return None
    value = indexable(document.get(spec.index))
    if value is None:
        return None
    created = document.get(spec.created_field) if spec.created_field else None
    created = indexable(created)
    if type(created) is not int or not _INT64[0] <= created <= _INT64[1]:
        created = hlc
    if memo is None:
        return value_key(keys, scope, spec.index, value), created
    return memoized_value_key(keys, scope, spec.index, value, memo), created


def memoized_value_key(
    keys: AccountKeys, scope: bytes, field: str, value: str | int, memo: BlindMemo
) -> bytes:
    """`value_key` through `memo` (a merged page holds many messages of few threads, and a
    chat's reads and writes ask for one thread's key again and again)."""
    blind = memo.get((scope, field, value))
    if blind is None:
        blind = memo[scope, field, value] = value_key(keys, scope, field, value)
    return blind
