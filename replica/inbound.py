"""Merging versions that arrive from elsewhere: pulled pages and released held versions.

For each envelope, in order (specs/merge.md §9): drop it if a stored sibling already covers
the dot its fixed header claims (a duplicate or a stale version: nothing is parsed or opened
for it); parse the header (malformed → quarantine); hold it, within a bound, while the
replica is locked or its key epoch is unknown; refuse it (quarantine, not degraded) if it is
sealed under a key epoch a rotation retired and that rotation's frontier does not vouch for it;
open it (damage → quarantine and mark the record degraded); from here on it is
authenticated: hold it for drift if its hlc is too far ahead; spot a clone (our own node id
on a version we never held); hold it if its collection is undeclared (or device-local) here;
hold it if a freshness lock protects its record; else merge it. Nothing is ever dropped that
is not covered by a version that stays.

This is the replica's hot path (bench: replica.merge): siblings are loaded for a whole page in
one query without their envelopes, decisions are made in memory, and the outcome is written
with one `executemany` per table. Callers run it inside one store transaction, so a page is
applied whole or not at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from replica import clock
from replica.asides import HeldVersion, Row
from replica.blind import Blind, BlindMemo, blind_of
from replica.envelope import Identity, Opened, open_envelope, profile_key, scope_key
from replica.errors import EnvelopeError, ProtocolError, StoreError, UnknownEpochError
from replica.events import ChangeEvent
from replica.locks import LockIndex, Targets
from replica.merge import Sibling, add_uncovered, is_covered_dot
from replica.opener import Opener
from replica.options import ReplicaOptions
from replica.schema import Collection, Schema
from replica.store import NewVersion, Store
from replica.wire import Dot, Header, RelayState, decode_vector, parse_header, peek_dot

MAX_UNVERIFIED_HELD_BYTES = 256 * 1024 * 1024
QUARANTINE_PREFIX_BYTES = 4096

Added = tuple[Header, bytes, Blind | None, bool]
"""A version a page merged: its header, envelope, blind index entry, and whether it is a
tombstone."""


@dataclass
class InboundContext:
    """What merging needs from an open replica; `opener` is None while it is locked."""

    store: Store
    opener: Opener | None
    schema: Schema
    node: int
    options: ReplicaOptions
    want_events: bool = True
    to_push: frozenset[tuple[bytes, int, int]] = frozenset()
    """Identities a reseed marked for pushing: they stay marked wherever they end up."""
    seqs: Sequence[int] | None = None
    """A pulled page's: each envelope's seq, on the relay `relay` (the rule for retired key
    epochs, specs/replica.md §7.1); None for versions released from holds."""
    relay: RelayState | None = None


@dataclass
class InboundResult:
    merged: int = 0
    superseded: int = 0
    quarantined: int = 0
    untrusted: int = 0
    """Versions under a retired key epoch, beyond its frontier: refused, kept in quarantine."""
    held: Counter[str] = field(default_factory=Counter)
    events: list[ChangeEvent] = field(default_factory=list)
    max_hlc: int = 0
    per_item_scopes: set[tuple[str, str]] = field(default_factory=set)
    """(profile, collection) of per_item collections that merged a version."""


class _Stored(Sibling, frozen=True, gc=False):
    """A sibling as loaded from the file, with the id of the row that holds it (one Struct per
    loaded row, instead of a dict keyed by a dot tuple: a page loads one per record)."""

    rowid: int
    blind: bytes | None
    created: int | None


class _Record(msgspec.Struct, gc=False):
    """One record's siblings as the page is folded into them."""

    siblings: Sequence[Sibling | Header]
    stored: list[_Stored]
    """The siblings in the file before the page. `_load_records` hands the same list in as
    `siblings`; `_fold` replaces `siblings` by a new list and never changes this one."""
    scope: bytes | None = None
    added: dict[Dot, Added] | None = None
    """Versions this page merged (None: nothing yet, the usual case)."""
    identity: Identity | None = None
    changed: int = 0
    """The sequence number of this record's change (replica/feed.py), once it has one."""


def _load_records(store: Store, keys: Sequence[bytes]) -> dict[bytes, _Record]:
    records: dict[bytes, _Record] = {}
    for rowid, key, node, hlc, vector, blind, created in store.sibling_rows(keys):
        sibling = _Stored(node, hlc, decode_vector(vector), rowid, blind, created)
        record = records.get(key)
        if record is None:
            stored = [sibling]
            records[key] = _Record(stored, stored)
        else:
            record.stored.append(sibling)  # the same list as its siblings until a fold
    return records


def _fold(
    record: _Record,
    header: Header,
    envelope: bytes,
    scope: bytes,
    identity: Identity,
    blind: Blind | None,
    tomb: bool,
) -> None:
    """Merge a version no sibling covers into its record (specs/merge.md §4 step 2)."""
    record.scope = scope
    record.identity = identity
    siblings = record.siblings
    if len(siblings) == 1 and header.vector.get(siblings[0].node, 0) >= siblings[0].hlc:
        record.siblings = [header]  # add_uncovered's result when it replaces the one sibling
    else:
        record.siblings, _ = add_uncovered(siblings, header)
    if record.added is None:
        record.added = {(header.node, header.hlc): (header, envelope, blind, tomb)}
    else:
        record.added[header.node, header.hlc] = (header, envelope, blind, tomb)


class _Merger:
    """One call of `merge_inbound`: accumulates decisions, then writes them in batches."""

    def __init__(self, ctx: InboundContext, now_ms: int, source: str) -> None:
        self.ctx = ctx
        self.now_ms = now_ms
        self.source = source
        self.max_drift_ms = ctx.options.max_drift_ms
        self.latest_hlc = clock.latest_hlc(now_ms, self.max_drift_ms)
        """An inbound hlc above this is ahead of the wall clock by more than the bound."""
        self.result = InboundResult()
        self.clock = ctx.store.get_int("clock")
        self.locks: LockIndex | None = None
        """The active locks of the page's records and of every scope and profile (set by
        `run`); None when none is (the usual case): nothing to check per version."""
        self.holds: list[HeldVersion] = []
        self.scope_cache: dict[tuple[str, str], bytes] = {}
        self.blinds: BlindMemo = {}
        """Blind keys of the values this call met (replica/blind.py)."""
        self.records: dict[bytes, _Record] = {}
        self.unverified_bytes: int | None = None
        self.suspects: list[tuple[bytes, Dot | None, str]] = []
        self.retired = {} if ctx.opener is None else ctx.opener.keys.retired_epochs

    def run(self, envelopes: Sequence[bytes]) -> InboundResult:
        dots = [peek_dot(envelope) for envelope in envelopes]
        keys = [d[0] for d in dots if d is not None]
        records = self.records = _load_records(self.ctx.store, keys)
        locks = LockIndex(self.ctx.store.active_locks(self.now_ms, keys))
        self.locks = locks if locks else None
        result = self.result
        for index, (envelope, dot) in enumerate(zip(envelopes, dots, strict=True)):
            record = None if dot is None else records.get(dot[0])
            if record is not None and dot is not None and is_covered_dot(record.siblings, dot):
                result.superseded += 1  # known already: no need to parse or open it
                continue
            try:
                header = parse_header(envelope)
            except ProtocolError as exc:
                self._quarantine(None, envelope, f"malformed header: {exc}")
                continue
            self._consider(header, envelope, record, index)
        self._write()
        return self.result

    def _consider(
        self, header: Header, envelope: bytes, record: _Record | None, index: int
    ) -> None:
        opener = self.ctx.opener
        if opener is None:
            self._hold_unverified(header, envelope, "sealed")
            return
        if self.retired and not self._trusted_epoch(header, index):
            self._refuse_untrusted(header, envelope)
            return
        try:
            opened = open_envelope(opener.keys, envelope, header)  # not cached: see Opener
        except UnknownEpochError:
            self._hold_unverified(header, envelope, "epoch")
            return
        except EnvelopeError as exc:
            self._quarantine(header.key, envelope, str(exc), header.dot)
            return
        self._accept(opener, opened, envelope, record)

    def _accept(
        self, opener: Opener, opened: Opened, envelope: bytes, record: _Record | None
    ) -> None:
        """An authenticated version that no sibling covers: hold it or merge it."""
        header, identity = opened.header, opened.identity
        hlc = header.hlc
        # Only an authenticated version can tell us how far ahead peers' clocks run, or that
        # this file was copied: a header alone is the relay's word.
        self.result.max_hlc = max(self.result.max_hlc, hlc)
        scope = self.scope_cache.get((identity.profile, identity.collection))
        if scope is None:
            scope = self._cache_scope(opener, identity.profile, identity.collection)
        if hlc > self.latest_hlc:  # ahead by more than the drift bound; drift before locks
            release = clock.hlc_ms(hlc) - self.max_drift_ms
            self._hold(header, envelope, "drift", release, scope, identity)
            return
        if header.node == self.ctx.node and not self._known_own(header):
            self._change_node()
        collection = self.ctx.schema.get(identity.collection)
        if collection is None or not collection.is_synced:
            # Undeclared here, or device-local here but synced by its writer: keep it verbatim
            # until a schema that syncs it is declared (never degrade this device's own draft).
            self._hold(header, envelope, "collection", None, scope)
            return
        # What clock.observe gives for an hlc within the drift bound (and parse_header
        # bounded it by MAX_HLC): one comparison, not three calls, per version.
        self.clock = max(self.clock, hlc)
        if self.locks is not None and self._held_by_lock(
            self.locks, opener, header, envelope, scope, identity
        ):
            return
        blind = None if collection.index is None else self._blind(opener, scope, collection, opened)
        self._merge(record, header, envelope, scope, identity, blind, opened.deleted)
        if collection.max_items is not None:
            self.result.per_item_scopes.add((identity.profile, identity.collection))
        self.result.merged += 1

    def _merge(
        self,
        record: _Record | None,
        header: Header,
        envelope: bytes,
        scope: bytes,
        identity: Identity,
        blind: Blind | None,
        tomb: bool,
    ) -> None:
        """Fold the version into its record; a record new here is this version alone (no
        sibling work: the usual case of a device joining)."""
        if record is None:
            added = {(header.node, header.hlc): (header, envelope, blind, tomb)}
            self.records[header.key] = _Record([header], [], scope, added, identity)
        else:
            _fold(record, header, envelope, scope, identity, blind, tomb)

    def _blind(
        self, opener: Opener, scope: bytes, collection: Collection, opened: Opened
    ) -> Blind | None:
        document, deleted, hlc = opened.document, opened.deleted, opened.header.hlc
        return blind_of(opener.keys, scope, collection, document, deleted, hlc, self.blinds)

    def _held_by_lock(
        self,
        locks: LockIndex,
        opener: Opener,
        header: Header,
        envelope: bytes,
        scope: bytes,
        identity: Identity,
    ) -> bool:
        """Hold the version if a freshness lock protects its record (specs/merge.md §10)."""
        profile = profile_key(opener.keys, identity.profile) if locks.has_profile_locks else b""
        until = locks.held_until(Targets(header.key, scope, profile), header)
        if until is None:
            return False
        self._hold(header, envelope, "lock", until, scope, identity)
        return True

    def _known_own(self, header: Header) -> bool:
        """A version with our node id is ours if we hold it (covered ones never get here)."""
        return self.ctx.store.has_identity(header.key, header.node, header.hlc)

    def _change_node(self) -> None:
        """This file was copied: take a new node id so two devices never write as one."""
        new = self.ctx.options.new_node_id(avoid=self.ctx.node)
        self.ctx.node = new
        self.ctx.store.set_node(new, self.ctx.options.random_bytes(16).hex())
        self.result.events.append(ChangeEvent("node_changed", "remote", None, None, None, "clone"))

    def _cache_scope(self, opener: Opener, profile: str, collection: str) -> bytes:
        """The scope key of a (profile, collection) not yet in `scope_cache` (an HMAC)."""
        scope = self.scope_cache[(profile, collection)] = scope_key(
            opener.keys, profile, collection
        )
        return scope

    def _hold(
        self,
        header: Header,
        envelope: bytes,
        reason: str,
        release_ms: int | None,
        scope: bytes | None,
        identity: Identity | None = None,
    ) -> None:
        row = Row(header.key, header.node, header.hlc, envelope)
        repush = (header.key, header.node, header.hlc) in self.ctx.to_push
        self.holds.append(HeldVersion(row, reason, release_ms, scope, repush))
        self.result.held[reason] += 1
        if self.ctx.want_events:
            event = ChangeEvent("held", "remote", None, None, None, reason)
            if identity is not None:
                event = ChangeEvent(
                    "held", "remote", identity.profile, identity.collection, identity.id, reason
                )
            self.result.events.append(event)

    def _hold_unverified(self, header: Header, envelope: bytes, reason: str) -> None:
        """Hold what cannot be authenticated yet, within a bound: past it, the page is refused
        (nothing applied, the cursor stays) rather than let a relay fill the disk."""
        if self.unverified_bytes is None:
            self.unverified_bytes = self.ctx.store.unverified_held_bytes()
        self.unverified_bytes += len(envelope)
        if self.unverified_bytes > MAX_UNVERIFIED_HELD_BYTES:
            raise StoreError(
                f"{self.unverified_bytes} bytes of versions that cannot be verified yet are "
                f"held, bound {MAX_UNVERIFIED_HELD_BYTES}",
                hint="unlock the replica (or learn the new key epoch) before pulling more",
            )
        self._hold(header, envelope, reason, None, None)

    def _quarantine(
        self, key: bytes | None, envelope: bytes, reason: str, dot: Dot | None = None
    ) -> None:
        """Keep a pulled envelope that fails to open (its first 4 KiB: the relay keeps the
        rest); its record is latched degraded when the batch is written (`_latch`)."""
        if len(envelope) > QUARANTINE_PREFIX_BYTES:
            reason = f"{reason} (first {QUARANTINE_PREFIX_BYTES} of {len(envelope)} bytes kept)"
            envelope = envelope[:QUARANTINE_PREFIX_BYTES]
        self.ctx.store.quarantine(self.source, key, envelope, reason, self.now_ms)
        if key is not None:
            self.suspects.append((key, dot, reason))
        self.result.quarantined += 1

    def _trusted_epoch(self, header: Header, index: int) -> bool:
        """A version under a current key epoch is; under one a rotation retired, only one the
        rotation's frontier vouches for (`Frontier.trusts`): a revoked device keeps the old
        keys, and could otherwise mint versions that dominate every later write."""
        frontier = self.retired.get(header.epoch)
        if frontier is None:
            return True
        seqs = self.ctx.seqs
        seq = None if seqs is None else seqs[index]
        return frontier.trusts(header.vector, seq, self.ctx.relay)

    def _refuse_untrusted(self, header: Header, envelope: bytes) -> None:
        """Keep aside, in quarantine, a version `_trusted_epoch` refuses; its record is not
        degraded: the version is refused for what it is, and nothing of the record is missing."""
        reason = f"sealed under retired key epoch {header.epoch}, beyond the rotation frontier"
        kept = envelope[:QUARANTINE_PREFIX_BYTES]
        self.ctx.store.quarantine(self.source, header.key, kept, reason, self.now_ms)
        self.result.untrusted += 1

    def _latch(self) -> None:
        """Mark degraded the records of envelopes that failed to open — unless a genuine
        copy of that very version merged in the same batch (a forgery sent just before it)."""
        store = self.ctx.store
        for key, dot, reason in self.suspects:
            record = self.records.get(key)
            if record is not None and dot is not None and is_covered_dot(record.siblings, dot):
                continue
            store.mark_degraded(key, store.scope_of(key), reason)

    def _write(self) -> None:
        """Write what the batch decided: each changed record once, one statement per table."""
        store = self.ctx.store
        inserts: list[NewVersion] = []
        deletes: list[Row] = []
        replacements: list[tuple[int, NewVersion]] = []
        reindexed: list[tuple[int, NewVersion]] = []
        changed: list[tuple[int, bytes]] = []
        seq = store.take_seqs(sum(1 for r in self.records.values() if r.added))
        for key, record in self.records.items():
            if not record.added:
                continue
            if self.ctx.want_events:
                self._announce(record)
            record.changed, seq = seq, seq + 1
            replacement = self._in_place(key, record)
            if replacement is None:
                gone, new = self._difference(key, record)
                if len(record.stored) > len(gone):  # siblings stay: they take the number too
                    changed.append((record.changed, key))
                if len(gone) != 1 or len(new) != 1:
                    deletes.extend(Row(key, s.node, s.hlc, b"") for s in gone)
                    inserts.extend(new)
                    continue
                replacement = gone[0], new[0]  # one version replaced by one: update in place
            old, version = replacement
            same = old.blind == version.blind and old.created == version.created
            (replacements if same else reindexed).append((old.rowid, version))
        self._keep_history()
        store.delete_versions(deletes)
        store.replace_versions(replacements, index=False)
        store.replace_versions(reindexed, index=True)
        store.insert_versions(inserts)
        store.set_changed(changed)
        store.hold(self.holds)
        store.set_meta("clock", self.clock)
        self._latch()

    def _announce(self, record: _Record) -> None:
        identity = record.identity
        if identity is not None:
            event = ChangeEvent(
                "changed", "remote", identity.profile, identity.collection, identity.id
            )
            self.result.events.append(event)

    def _in_place(self, key: bytes, record: _Record) -> tuple[_Stored, NewVersion] | None:
        """(stored version, new one) when the batch replaced the record's one stored version by
        one version: the common merge, written over the old row without any set arithmetic."""
        siblings, stored, added = record.siblings, record.stored, record.added
        if len(siblings) != 1 or len(stored) != 1 or added is None or len(added) != 1:
            return None
        ((header, envelope, blind, tomb),) = added.values()
        if siblings[0] is not header:
            return None
        return stored[0], self._new_version(key, record, header, envelope, blind, tomb)

    def _difference(self, key: bytes, record: _Record) -> tuple[list[_Stored], list[NewVersion]]:
        """The stored versions the batch replaced, and the versions it added that stay."""
        assert record.added is not None
        if not record.stored and len(record.added) == 1 and len(record.siblings) == 1:
            ((header, envelope, blind, tomb),) = record.added.values()  # a record new here
            return [], [self._new_version(key, record, header, envelope, blind, tomb)]
        final = {(s.node, s.hlc) for s in record.siblings}
        stored = {(s.node, s.hlc) for s in record.stored}
        gone = [s for s in record.stored if (s.node, s.hlc) not in final]
        new = [self._new_version(key, record, *record.added[dot]) for dot in final - stored]
        return gone, new

    def _new_version(
        self,
        key: bytes,
        record: _Record,
        header: Header,
        envelope: bytes,
        blind: Blind | None,
        tomb: bool,
    ) -> NewVersion:
        assert record.scope is not None
        to_push = self.ctx.to_push
        dirty = bool(to_push) and (key, header.node, header.hlc) in to_push
        entry, created = blind or (None, None)
        return NewVersion(
            key,
            header.node,
            header.hlc,
            record.scope,
            header.vector_bytes,
            envelope,
            dirty,
            tomb,
            entry,
            created,
            record.changed,
        )

    def _keep_history(self) -> None:
        """Replaced versions of collections declared with `history` move to the history table
        (read before the batch deletes or overwrites their rows)."""
        schema, store = self.ctx.schema, self.ctx.store
        if not any(c.history for c in schema.collections):
            return
        for key, record in self.records.items():
            if not record.added or record.identity is None:
                continue
            collection = schema.get(record.identity.collection)
            if collection is None or collection.history == 0:
                continue
            gone = {(s.node, s.hlc) for s in record.stored} - {
                (s.node, s.hlc) for s in record.siblings
            }
            if gone:
                old = [r for r in store.versions_of(key) if (r.node, r.hlc) in gone]
                store.add_history(old, self.now_ms, collection.history)


def merge_inbound(
    ctx: InboundContext, envelopes: Sequence[bytes], now_ms: int, source: str = "pull"
) -> InboundResult:
    """Merge envelopes into the replica inside the caller's transaction."""
    return _Merger(ctx, now_ms, source).run(envelopes)
