"""Local writes: a new version of a record, sealed and stored in one transaction.

The clock, the node id and the record's siblings are read inside the same `BEGIN IMMEDIATE`
transaction that stores the version, so two processes on one file cannot collide. Which
siblings a write replaces is its causal context (docs/architecture.md §4); the new vector is theirs merged
plus the new dot. Every sibling is opened first: a write that could clobber unreadable data is
refused (fail closed). Device-local collections (drafts) keep one version per record in their
own table and never leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica import clock
from replica.asides import Row
from replica.blind import blind_of
from replica.core import Core
from replica.envelope import Identity, Opened, seal
from replica.errors import InvalidArgumentError, ItemLimitError, ProtocolError, StaleContextError
from replica.events import ChangeEvent
from replica.merge import local_vector
from replica.record import Context, Record, record_from_siblings
from replica.schema import DEFAULT_PROFILE, PROFILES_COLLECTION, Collection
from replica.store import NewVersion
from replica.wire import MAX_VECTOR_ENTRIES, VersionVector, encode_vector, parse_header


@dataclass(frozen=True)
class _Write:
    """One local write: the record, where it is stored, and what it becomes."""

    identity: Identity
    key: bytes
    scope: bytes
    spec: Collection
    document: Any
    deleted: bool
    awaits: bytes | None = None
    """The journal this write's entry is deferred to (replica/journal.py), if any."""


def write_record(
    core: Core,
    identity: Identity,
    document: Any,
    *,
    deleted: bool,
    context: Context | None,
    if_unchanged: bool,
    awaits: bytes | None = None,
) -> Context:
    """Store a new version of `identity`; return the record's context after the write."""
    spec, _ = core.resolve(identity.collection, identity.id, identity.profile)
    if identity.collection != PROFILES_COLLECTION:
        check_profile(core, identity.profile)
    key = core.record_key(identity)
    scope = core.scope(identity.profile, identity.collection)
    write = _Write(identity, key, scope, spec, document, deleted, awaits)
    if spec.policy == "local":
        if awaits is not None:
            raise InvalidArgumentError(
                f"a write to the local collection {spec.name!r} cannot defer a journal entry",
                hint="defer entries of synced records only",
            )
        return _write_local(core, write, context, if_unchanged)
    with core.write_transaction():
        now = core.options.wall_clock_ms()
        core.release_due(now)
        siblings = core.open_siblings(key, scope)
        replaced = _replaced(core, siblings, context, if_unchanged)
        if spec.max_items is not None and not deleted:
            _check_item_limit(core, spec, siblings, scope)
        new_context = _seal_and_store(core, write, siblings, replaced, now)
        core.publish([ChangeEvent("changed", "local", *_names(identity))])
    return new_context


def _names(identity: Identity) -> tuple[str, str, str]:
    return identity.profile, identity.collection, identity.id


def check_profile(core: Core, profile: str) -> None:
    """Writes go only to profiles that exist (created with `Replica.create_profile`)."""
    if profile == DEFAULT_PROFILE:
        return
    key = core.keys().record_key(DEFAULT_PROFILE, PROFILES_COLLECTION, profile)
    rows = core.store.versions_of(key)
    scope = core.scope(DEFAULT_PROFILE, PROFILES_COLLECTION)
    if not rows or record_from_siblings(core.open_rows(key, rows, scope), None).deleted:
        raise InvalidArgumentError(
            f"profile {profile!r} does not exist", hint="create it with create_profile"
        )


def _replaced(
    core: Core, siblings: list[Opened], context: Context | None, if_unchanged: bool
) -> list[Opened]:
    current = frozenset(o.header.dot for o in siblings)
    if context is not None and not _is_context(context):
        raise InvalidArgumentError(
            f"context must be a set of (node, hlc) pairs as get() returns, got {type(context).__name__}",
            hint="pass record.context",
        )
    if context is None:
        if if_unchanged:
            raise InvalidArgumentError(
                "if_unchanged needs the context the record was read with",
                hint="pass context=record.context from get()",
            )
        return siblings
    if if_unchanged and current != context:
        raise StaleContextError(
            f"record changed since it was read: {len(current - context)} new sibling(s)",
            hint="read it again and reapply the change",
        )
    node = core.node()
    if any(o.header.node == node and o.header.dot not in context for o in siblings):
        # A device's writes to one record must form a causal chain, or a later write's
        # vector would cover an earlier one it never saw (see replica.merge).
        raise StaleContextError(
            "record was written on this device since it was read", hint="read it again"
        )
    return [o for o in siblings if o.header.dot in context]


def _is_context(value: object) -> bool:
    return isinstance(value, (set, frozenset)) and all(
        isinstance(dot, tuple) and len(dot) == 2 and all(type(x) is int for x in dot)
        for dot in value
    )


def _check_item_limit(core: Core, spec: Collection, siblings: list[Opened], scope: bytes) -> None:
    """`max_items` bounds local additions only; merges never drop an item."""
    if siblings and not record_from_siblings(siblings, spec.tiebreak).deleted:
        return
    live = core.count_live(scope, spec.tiebreak)
    if spec.max_items is not None and live >= spec.max_items:
        raise ItemLimitError(
            f"collection {spec.name!r} holds {live} items, max_items {spec.max_items}",
            hint="delete an item first",
        )


def _seal_and_store(
    core: Core, write: _Write, siblings: list[Opened], replaced: list[Opened], now: int
) -> Context:
    """Seal the new version over the `replaced` siblings and store it in their place."""
    store = core.store
    node = core.node()
    hlc = clock.tick(store.get_int("clock"), now)
    vector = local_vector([o.header for o in replaced], node, hlc)
    if len(vector) > MAX_VECTOR_ENTRIES:
        raise InvalidArgumentError(
            f"record was written by {len(vector)} devices, bound {MAX_VECTOR_ENTRIES}",
            hint="copy it to a new record id",
        )
    envelope = _sealed(core, write, node, hlc, vector)
    key = write.key
    replaced_dots = {o.header.dot for o in replaced}
    if write.spec.history and replaced:
        old = [r for r in store.versions_of(key) if (r.node, r.hlc) in replaced_dots]
        store.add_history(old, now, write.spec.history)
    store.delete_versions([Row(key, node_, hlc_, b"") for node_, hlc_ in replaced_dots])
    seq = store.take_seqs(1)
    store.insert_versions(
        [_new_version(core, write, node, hlc, encode_vector(vector), envelope, seq)]
    )
    kept = {o.header.dot for o in siblings} - replaced_dots
    if kept:  # siblings that stay are part of the record that changed (replica/feed.py)
        store.set_changed([(seq, key)])
    store.set_meta("clock", hlc)
    window_s = core.options.freshness_window_s
    creates_unique = write.spec.unique_ids and not siblings  # nothing can be stale against it
    if window_s > 0 and not creates_unique:
        store.replace_auto_lock(key, now, now + int(window_s * 1000), (node, hlc))
    return frozenset(kept | {(node, hlc)})


def _new_version(
    core: Core, write: _Write, node: int, hlc: int, vector: bytes, envelope: bytes, seq: int
) -> NewVersion:
    """The new version's row: to push, with its blind index entry and its change's seq."""
    entry = blind_of(
        core.keys(), write.scope, write.spec, write.document, write.deleted, hlc, core.blind_memo()
    )
    blind, created = entry or (None, None)
    return NewVersion(
        write.key,
        node,
        hlc,
        write.scope,
        vector,
        envelope,
        dirty=True,
        tomb=write.deleted,
        blind=blind,
        created=created,
        changed=seq,
        awaits=write.awaits,
    )


def _sealed(core: Core, write: _Write, node: int, hlc: int, vector: VersionVector) -> bytes:
    return seal(
        core.keys(),
        write.identity,
        hlc=hlc,
        node=node,
        vector=vector,
        deleted=write.deleted,
        document=write.document,
        nonce=core.options.random_bytes(12),
    )


# -- device-local records (never synced) ----------------------------------------------------------


def _write_local(core: Core, write: _Write, context: Context | None, if_unchanged: bool) -> Context:
    """One version per record, never synced; fails closed and honours contexts like the rest."""
    with core.write_transaction():
        current = _local_opened(core, write.key, write.scope)  # DegradedError if unreadable
        _replaced(core, current, context, if_unchanged)
        now = core.options.wall_clock_ms()
        hlc = clock.tick(core.store.get_int("clock"), now)
        node = core.node()
        envelope = _sealed(core, write, node, hlc, {node: hlc})
        core.store.put_local(write.key, write.scope, envelope, core.store.take_seqs(1))
        core.store.set_meta("clock", hlc)
        core.publish([ChangeEvent("changed", "local", *_names(write.identity))])
    return frozenset({(node, hlc)})


def get_local(core: Core, key: bytes, scope: bytes) -> Record | None:
    envelope = core.store.get_local(key)
    if envelope is None:
        return None
    return record_from_siblings(core.open_rows(key, [local_row(key, envelope)], scope), None)


def scan_local(core: Core, scope: bytes, include_deleted: bool) -> list[Record]:
    records = []
    for key, envelope in core.store.local_in_scope(scope):
        record = record_from_siblings(core.open_rows(key, [local_row(key, envelope)], scope), None)
        if include_deleted or not record.deleted:
            records.append(record)
    return records


def _local_opened(core: Core, key: bytes, scope: bytes) -> list[Opened]:
    """The device-local record's one version, opened (or DegradedError); empty if absent."""
    envelope = core.store.get_local(key)
    return [] if envelope is None else core.open_rows(key, [local_row(key, envelope)], scope)


def local_row(key: bytes, envelope: bytes) -> Row:
    """A local record's row: its dot comes from its own header (or none if that is damaged)."""
    try:
        header = parse_header(envelope)
    except ProtocolError:
        return Row(key, 0, 0, envelope)
    return Row(key, header.node, header.hlc, envelope)
