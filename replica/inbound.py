"""Merging versions that arrive from elsewhere: pulled pages and released held versions.

For each envelope, in order: parse the header (malformed → quarantine); spot a clone (our own
node id on a version we never wrote); hold it for drift if its hlc is too far ahead; hold it
while the replica is locked; open it (unknown epoch → hold; damage → quarantine and mark the
record degraded); hold it if its collection is undeclared; drop it if a sibling already covers
it; hold it if a freshness lock protects its record; else merge it by `merge.merge_version`.
Nothing is ever dropped that is not covered by a version that stays.

Callers run this inside one store transaction, so a page is applied whole or not at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from replica import clock
from replica.envelope import Opened, profile_key, scope_key
from replica.errors import EnvelopeError, ProtocolError, UnknownEpochError
from replica.events import ChangeEvent
from replica.locks import Lock, Targets, held_until
from replica.merge import is_covered, merge_version
from replica.opener import Opener
from replica.options import ReplicaOptions
from replica.schema import Schema
from replica.store import Row, Store
from replica.wire import Header, parse_header


@dataclass
class InboundContext:
    """What merging needs from an open replica; `opener` is None while it is locked."""

    store: Store
    opener: Opener | None
    schema: Schema
    node: int
    options: ReplicaOptions


@dataclass
class InboundResult:
    merged: int = 0
    superseded: int = 0
    quarantined: int = 0
    held: Counter[str] = field(default_factory=Counter)
    events: list[ChangeEvent] = field(default_factory=list)
    clone_of_node: int | None = None
    max_hlc: int = 0


@dataclass(slots=True)
class _Record:
    """One record's siblings as the page is folded into them."""

    siblings: list[Header]
    envelopes: dict[tuple[int, int], bytes]
    scope: bytes | None
    original: frozenset[tuple[int, int]]
    pinned: int = 0


def _load_records(store: Store, keys: Sequence[bytes]) -> dict[bytes, _Record]:
    records: dict[bytes, _Record] = {}
    scopes = _scopes_of(store, keys)
    for key, rows in store.versions_of_many(keys).items():
        siblings, envelopes, pinned = [], {}, 0
        for row in rows:
            try:
                header = parse_header(row.envelope)
            except ProtocolError:
                pinned += 1  # unreadable: never merged over, never dropped; repair decides
                continue
            if (header.key, header.node, header.hlc) != (row.key, row.node, row.hlc):
                pinned += 1
                continue
            siblings.append(header)
            envelopes[header.dot] = row.envelope
        dots = frozenset(envelopes)
        records[key] = _Record(siblings, envelopes, scopes.get(key), dots, pinned)
    return records


def _scopes_of(store: Store, keys: Sequence[bytes]) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), 500):
        chunk = unique[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.update(
            store.db.execute(
                f"SELECT key, scope FROM versions WHERE key IN ({marks})", chunk
            ).fetchall()
        )
    return found


class _Merger:
    """One call of `merge_inbound`: accumulates decisions, then writes them in batches."""

    def __init__(self, ctx: InboundContext, now_ms: int, source: str) -> None:
        self.ctx = ctx
        self.now_ms = now_ms
        self.source = source
        self.result = InboundResult()
        self.clock = ctx.store.get_int("clock")
        self.locks: list[Lock] = ctx.store.active_locks(now_ms)
        self.holds: list[tuple[Row, str, int | None, bytes | None]] = []
        self.scope_cache: dict[tuple[str, str], bytes] = {}
        self.records: dict[bytes, _Record] = {}
        self.opened: dict[bytes, Opened] = {}

    def run(self, envelopes: Sequence[bytes]) -> InboundResult:
        headers: list[tuple[Header, bytes]] = []
        for envelope in envelopes:
            try:
                headers.append((parse_header(envelope), envelope))
            except ProtocolError as exc:
                self._quarantine(None, envelope, f"malformed header: {exc}", None)
        self.records = _load_records(self.ctx.store, [h.key for h, _ in headers])
        for header, envelope in headers:
            self._consider(header, envelope)
        self._write()
        return self.result

    def _consider(self, header: Header, envelope: bytes) -> None:
        record = self.records.get(header.key)
        if clock.is_ahead(header.hlc, self.now_ms, self.ctx.options.max_drift_ms):
            release = clock.hlc_ms(header.hlc) - self.ctx.options.max_drift_ms
            self._hold(header, envelope, "drift", release, None)
            return
        opener = self.ctx.opener
        if opener is None:
            self._hold(header, envelope, "sealed", None, None)
            return
        try:
            opened = opener.open(envelope, header)
        except UnknownEpochError:
            self._hold(header, envelope, "epoch", None, None)
            return
        except EnvelopeError as exc:
            self._quarantine(header.key, envelope, str(exc), record)
            return
        # Only an authenticated version can tell us this file was copied, or how far ahead
        # peers' clocks run: a header alone is the relay's word.
        self.result.max_hlc = max(self.result.max_hlc, header.hlc)
        if header.node == self.ctx.node and not self._known_own(header, record):
            self._change_node()
        identity = opened.identity
        scope = self._scope(opener, identity.profile, identity.collection)
        collection = self.ctx.schema.get(identity.collection)
        if collection is None:
            self._hold(header, envelope, "collection", None, scope)
            return
        if not collection.is_synced:
            self._quarantine(
                header.key, envelope, "a device-local collection arrived from a peer", record
            )
            return
        if record is not None and is_covered(record.siblings, header):
            self.result.superseded += 1
            return
        targets = Targets(header.key, scope, profile_key(opener.keys, identity.profile))
        until = held_until(self.locks, targets, header)
        self.clock = clock.observe(
            self.clock, header.hlc, self.now_ms, self.ctx.options.max_drift_ms
        )
        if until is not None:
            self._hold(header, envelope, "lock", until, scope, opened)
            return
        self._merge(header, envelope, scope, record, opened)

    def _known_own(self, header: Header, record: _Record | None) -> bool:
        """Our own node's version is ours if a sibling covers it or we hold it."""
        if record is not None and is_covered(record.siblings, header):
            return True
        return self.ctx.store.has_identity(header.key, header.node, header.hlc)

    def _change_node(self) -> None:
        """This file was copied: take a new node id so two devices never write as one."""
        old = self.ctx.node
        new = old
        while new in (old, 0):
            new = int.from_bytes(self.ctx.options.random_bytes(8), "big")
        self.ctx.node = new
        self.ctx.store.set_meta("node", str(new))
        self.result.clone_of_node = old
        self.result.events.append(ChangeEvent("node_changed", "remote", None, None, None, "clone"))

    def _scope(self, opener: Opener, profile: str, collection: str) -> bytes:
        scope = self.scope_cache.get((profile, collection))
        if scope is None:
            scope = scope_key(opener.keys, profile, collection)
            self.scope_cache[(profile, collection)] = scope
        return scope

    def _merge(
        self, header: Header, envelope: bytes, scope: bytes, record: _Record | None, opened: Opened
    ) -> None:
        if record is None:
            record = _Record([], {}, scope, frozenset())
            self.records[header.key] = record
        record.siblings, _ = merge_version(record.siblings, header)
        record.envelopes[header.dot] = envelope
        record.scope = record.scope or scope
        self.opened[header.key] = opened
        self.result.merged += 1

    def _hold(
        self,
        header: Header,
        envelope: bytes,
        reason: str,
        release_ms: int | None,
        scope: bytes | None,
        opened: Opened | None = None,
    ) -> None:
        row = Row(header.key, header.node, header.hlc, envelope)
        self.holds.append((row, reason, release_ms, scope))
        self.result.held[reason] += 1
        event = ChangeEvent("held", "remote", None, None, None, reason)
        if opened is not None:
            i = opened.identity
            event = ChangeEvent("held", "remote", i.profile, i.collection, i.id, reason)
        self.result.events.append(event)

    def _quarantine(
        self, key: bytes | None, envelope: bytes, reason: str, record: _Record | None
    ) -> None:
        store = self.ctx.store
        store.quarantine(self.source, key, envelope, reason, self.now_ms)
        if key is not None:
            store.mark_degraded(key, record.scope if record else None, reason)
        self.result.quarantined += 1

    def _write(self) -> None:
        store = self.ctx.store
        inserts: list[tuple[Row, bytes, bool]] = []
        deletes: list[Row] = []
        for key, record in self.records.items():
            final = frozenset(h.dot for h in record.siblings)
            if final == record.original:
                continue
            for dot in record.original - final:
                deletes.append(Row(key, dot[0], dot[1], record.envelopes[dot]))
            for dot in final - record.original:
                assert record.scope is not None
                inserts.append(
                    (Row(key, dot[0], dot[1], record.envelopes[dot]), record.scope, False)
                )
            opened = self.opened.get(key)
            if opened is not None:
                i = opened.identity
                self.result.events.append(
                    ChangeEvent("changed", "remote", i.profile, i.collection, i.id)
                )
        self._keep_history(deletes)
        store.delete_versions(deletes)
        store.insert_versions(inserts)
        store.hold(self.holds)
        store.set_meta("clock", self.clock)

    def _keep_history(self, deletes: list[Row]) -> None:
        depth_by_key = {}
        for key, opened in self.opened.items():
            collection = self.ctx.schema.get(opened.identity.collection)
            if collection is not None and collection.history > 0:
                depth_by_key[key] = collection.history
        for key, depth in depth_by_key.items():
            self.ctx.store.add_history([r for r in deletes if r.key == key], self.now_ms, depth)


def merge_inbound(
    ctx: InboundContext, envelopes: Sequence[bytes], now_ms: int, source: str = "pull"
) -> InboundResult:
    """Merge envelopes into the replica inside the caller's transaction."""
    return _Merger(ctx, now_ms, source).run(envelopes)
