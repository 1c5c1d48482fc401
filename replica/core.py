"""The shared state of an open replica and the internals every operation needs.

`Replica` (the public API), `write`, `held`, `sync` and `repair` all work through one `Core`:
the store, the keys (absent while locked), the schema, the mutex that makes the API
thread-safe, and the two rules every write transaction follows — degraded latches found inside
it are persisted even if it rolls back, and subscribers hear of its changes only once it commits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

from replica.asides import HeldRow, Row
from replica.blind import BlindMemo
from replica.bundles import AnyBundle, KeyChange, generation_of, parse_bundle, sealed_schema
from replica.envelope import Identity, Opened, scope_key
from replica.errors import (
    DegradedError,
    EnvelopeError,
    InvalidArgumentError,
    ReplicaClosedError,
    ReplicaLockedError,
    StoreError,
    UnknownEpochError,
    WrongKeyError,
)
from replica.events import ChangeEvent, Subscribers
from replica.frontier import frontier_of
from replica.guard import StoreMutex
from replica.inbound import InboundContext, InboundResult, merge_inbound
from replica.keys import AccountKeys, open_local_schema, seal_local_schema
from replica.limits import check_name
from replica.opener import Opener
from replica.options import ReplicaOptions
from replica.record import record_from_siblings
from replica.reseal import own_under_retired, reseal_own
from replica.schema import REGISTER_ID, Collection, Schema, schema_from_bytes, schema_to_bytes
from replica.store import Store
from replica.tombs import classify_unknown
from replica.wire import RelayState

DegradedMark = tuple[bytes, bytes | None, str]
RESEALED_FOR = "resealed_for"
"""Meta: the key generation whose retired epochs this file's pending writes were re-sealed
from (specs/replica.md §7.1)."""
MAX_MEMO_ENTRIES = 4096
"""Past this many, a per-handle memo of derived keys is emptied (it only saves HMACs)."""
T = TypeVar("T")


class Core:
    """One open replica file's state; every method expects the caller to hold `mutex`."""

    def __init__(self, store: Store, options: ReplicaOptions) -> None:
        self.store = store
        self.options = options
        self.mutex = StoreMutex(store)
        self.opener: Opener | None = None
        self.subscribers = Subscribers()
        self.lock_listeners: list[weakref.WeakMethod[Callable[[], None]]] = []
        """Methods told when the keys are dropped (`Replica.on_lock`), held weakly."""
        self.closed = False
        self._degraded_pending: list[DegradedMark] = []
        self._pending_events: list[ChangeEvent] = []
        self._scopes: dict[tuple[str, str], bytes] = {}
        self._blind_memo: BlindMemo = {}
        self._derived: dict[tuple[str, ...], Any] = {}
        self._released_in = 0
        """The write transaction (`Store.transactions`) that last merged what was due."""
        self._schema: Schema | None = None
        """Set with the opener: the file keeps the schema sealed (`unlock`)."""

    # -- transactions and events ----------------------------------------------------------------

    @contextmanager
    def write_transaction(self) -> Iterator[None]:
        """A write transaction; when the outermost one ends, degraded latches found inside it
        are persisted (even on rollback) and its events published (only on commit)."""
        outermost = not self.store.in_transaction
        queued = len(self._pending_events)
        committed = False
        try:
            with self.store.transaction():
                yield
            committed = True
        finally:
            if not committed:  # a rolled-back savepoint's events never happened
                del self._pending_events[queued:]
            if outermost:
                events, self._pending_events = self._pending_events, []
                self._persist_degraded()
                if committed:
                    self.subscribers.publish(events)

    def _persist_degraded(self) -> None:
        if self._degraded_pending:
            pending, self._degraded_pending = self._degraded_pending, []
            with self.store.transaction():
                for key, scope, reason in pending:
                    self.store.mark_degraded(key, scope, reason)

    def publish(self, events: list[ChangeEvent]) -> None:
        """Tell subscribers now, or when the enclosing write transaction commits."""
        if self.store.in_transaction:
            self._pending_events.extend(events)
        else:
            self.subscribers.publish(events)

    # -- keys, identity, schema -----------------------------------------------------------------

    def is_closed(self) -> bool:
        """Closed by the app, or by the store: after a failure its file could not be opened
        again."""
        return self.closed or self.store.closed

    def check_open(self) -> None:
        if self.closed:
            raise ReplicaClosedError("the replica is closed")
        if self.store.closed:  # after a failure, its file could not be opened again
            raise ReplicaClosedError(
                f"the replica at {self.store.path} was closed: after a failure, its file "
                "could not be opened again",
                hint="open it again",
            )

    def opener_or_raise(self) -> Opener:
        self.check_open()
        if self.opener is None:
            raise ReplicaLockedError("the replica is locked", hint="unlock it first")
        return self.opener

    def keys(self) -> AccountKeys:
        return self.opener_or_raise().keys

    def node(self) -> int:
        return self.store.get_int("node")

    def bundle(self) -> AnyBundle:
        self.check_open()
        data = self.store.get_bytes("bundle")
        if data is None:
            raise StoreError(f"{self.store.path} holds no key bundle")
        return parse_bundle(data)

    @property
    def schema(self) -> Schema:
        """The declared collections: sealed in the file, so known only while unlocked."""
        self.opener_or_raise()
        assert self._schema is not None, "unlock sets it with the opener"
        return self._schema

    def unlock(self, keys: AccountKeys) -> None:
        """Take the keys, and the schema they open (sealing a clear one first); on failure
        the keys are dropped and the replica stays locked. This device's versions under an
        epoch a rotation retired are re-sealed under the newest one (replica/reseal.py)."""
        try:
            schema = self._load_schema(keys)
            if keys.retired_epochs:
                self._reseal(keys, everything=self.store.get_int(RESEALED_FOR) < keys.generation)
        except BaseException:
            keys.drop()
            raise
        self.opener = Opener(keys, self.options.cache_entries)
        self._schema = schema
        self._classify_tombs(keys)

    def _classify_tombs(self, keys: AccountKeys) -> None:
        """Say which versions stored by an earlier format are tombstones (replica/tombs.py).
        A disk that refuses it does not refuse the unlock: reads need no writes, and the next
        unlock goes on where this one stopped."""
        try:
            classify_unknown(self.store, keys)
        except StoreError:
            if self.store.closed:
                raise

    def _reseal(self, keys: AccountKeys, *, everything: bool) -> None:
        """Re-seal this device's versions under retired epochs (replica/reseal.py): all of
        them at the first unlock with a generation that retires epochs, so a crash after
        taking the keys is mended at the next; its pending ones at every other unlock, for
        another process that still held the older keys may have written since."""
        node, pending_only = self.node(), not everything
        if pending_only and not own_under_retired(self.store, keys, node, pending_only=True):
            return  # the usual unlock: no write lock taken
        with self.write_transaction():
            reseal_own(self.store, keys, node, self.options.random_bytes, pending_only=pending_only)
            if everything:
                self.store.set_meta(RESEALED_FOR, keys.generation)

    def reseal_pending(self) -> None:
        """`_reseal` of the pending writes, at the start of each push pass too: a process
        that still held the older keys may have written since this one was unlocked. Not
        while locked: nothing can be sealed then (the next unlock does it)."""
        if self.opener is not None and self.opener.keys.retired_epochs:
            self._reseal(self.opener.keys, everything=False)

    def key_change(self, device: str, *, through_folder: bool = False) -> KeyChange:
        """Who changes the account's keys now, and what this file knew then (its frontier)."""
        now_ms = self.options.wall_clock_ms()
        frontier = frontier_of(self.store, through_folder=through_folder)
        return KeyChange(frontier, device, now_ms, self.options.random_bytes)

    def store_schema(self, schema: Schema, keys: AccountKeys) -> None:
        sealed = seal_local_schema(keys, schema_to_bytes(schema), self.options.random_bytes)
        self.store.set_meta("schema", sealed)
        self._schema = schema
        self._derived.clear()  # a journal's collection may be another policy now

    def _load_schema(self, keys: AccountKeys) -> Schema:
        """The file's sealed schema (another process may have declared it since). A file
        without one seals, once, the schema a join or an older format left in clear, or else
        the bundle's, and scrubs the clear copy from the file and its WAL."""
        sealed = self.store.get_bytes("schema")
        if sealed is not None:
            return self._open_schema(keys, sealed)
        if not self._schema_to_seal(keys):  # none anywhere: no write lock taken
            return Schema(())
        with self.write_transaction():
            sealed = self.store.get_bytes("schema")
            if sealed is not None:  # another process sealed it meanwhile
                return self._open_schema(keys, sealed)
            schema = schema_from_bytes(self._schema_to_seal(keys))
            self.store_schema(schema, keys)
            self.store.scrub_meta("clear_schema")
        self.store.checkpoint_truncate()
        return schema

    def _schema_to_seal(self, keys: AccountKeys) -> bytes:
        """A join's or an older format's clear schema, else the bundle's (empty: none)."""
        clear = self.store.get_bytes("clear_schema")
        if clear is not None:
            return clear
        return sealed_schema(self.bundle(), keys) or b""

    def _open_schema(self, keys: AccountKeys, sealed: bytes) -> Schema:
        try:
            return schema_from_bytes(open_local_schema(keys, sealed))
        except WrongKeyError:
            raise StoreError(
                f"the schema sealed in {self.store.path} does not open with this account's key",
                hint="the file is damaged: restore it from a backup, or join the account again",
            ) from None

    def resolve(self, collection: str, id: str, profile: str) -> tuple[Collection, Identity]:
        """Validate a record's names against the bounds and the schema."""
        check_name("collection", collection)
        check_name("id", id)
        check_name("profile", profile)
        spec = self.schema.require(collection)
        if spec.policy == "register" and id != REGISTER_ID:
            raise InvalidArgumentError(
                f"collection {collection!r} is a register: its only id is {REGISTER_ID!r}, "
                f"got {id!r}"
            )
        return spec, Identity(profile, collection, id)

    def scope(self, profile: str, collection: str) -> bytes:
        """The local index key of a collection in a profile (cached: an HMAC per call adds up)."""
        scope = self._scopes.get((profile, collection))
        if scope is None:
            scope = self._scopes[(profile, collection)] = scope_key(
                self.keys(), profile, collection
            )
        return scope

    def blind_memo(self) -> BlindMemo:
        """The value keys this handle computed (replica/blind.py), while its keys are held;
        emptied past `MAX_MEMO_ENTRIES` entries."""
        if len(self._blind_memo) > MAX_MEMO_ENTRIES:
            self._blind_memo.clear()
        return self._blind_memo

    def derived(self, names: tuple[str, ...], derive: Callable[[], T]) -> T:
        """What `derive` makes of the keys for `names` (a lease's key, a journal's), computed
        once while the keys are held: the HMACs of a chat operation add up."""
        if names not in self._derived:
            if len(self._derived) > MAX_MEMO_ENTRIES:
                self._derived.clear()
            self._derived[names] = derive()
        value: T = self._derived[names]
        return value

    def record_key(self, identity: Identity) -> bytes:
        return self.keys().record_key(identity.profile, identity.collection, identity.id)

    def forget_keys(self) -> None:
        if self.opener is not None:
            self.opener.keys.drop()
            self.opener.forget()
            self.opener = None
        self._schema = None
        self._scopes.clear()
        self._blind_memo.clear()
        self._derived.clear()
        listeners, self.lock_listeners = self.lock_listeners, []
        for reference in listeners:
            listener = reference()
            if listener is not None:  # an app's cache of what it decrypted: drop it too
                listener()
                self.lock_listeners.append(reference)

    # -- reading versions, failing closed -------------------------------------------------------

    def open_rows(self, key: bytes, rows: list[Row], scope: bytes | None) -> list[Opened]:
        """Open every sibling, or latch the record degraded (persisted) and raise."""
        if self.store.is_degraded(key):
            raise DegradedError(
                "a record is degraded: one of its versions cannot be opened",
                hint="run repair to quarantine the unreadable versions",
            )
        opener = self.opener_or_raise()
        try:
            return [opener.open_row(row) for row in rows]
        except (EnvelopeError, UnknownEpochError) as exc:
            if isinstance(exc, UnknownEpochError):
                self.refuse_stale_keys()
            self.mark_degraded(key, scope, str(exc))
            raise DegradedError(
                f"a record cannot be opened: {exc}", hint="run repair to quarantine it"
            ) from exc

    def refuse_stale_keys(self) -> None:
        """Raise when another process took newer keys into this file since this one was
        unlocked: what these keys cannot open then is not damaged (it was re-sealed under
        the new epoch), and must be neither latched degraded nor signed for."""
        if generation_of(self.bundle()) != self.keys().generation:
            raise ReplicaLockedError(
                "the account's keys in this file changed since it was unlocked (another "
                "process upgraded them, or took newer ones)",
                hint="unlock the replica again (restart `sync --watch`)",
            )

    def count_live(self, scope: bytes, tiebreak: str | None) -> int:
        """How many records of a scope show a document (not a tombstone). A degraded record
        counts as live: it may well be, and counting never raises (merges call this)."""
        live = 0
        for key, rows in rows_by_key(self.store.versions_in_scope(scope)):
            try:
                live += not record_from_siblings(self.open_rows(key, rows, scope), tiebreak).deleted
            except DegradedError:
                live += 1
        return live

    def open_siblings(self, key: bytes, scope: bytes) -> list[Opened]:
        return self.open_rows(key, self.store.versions_of(key), scope)

    def mark_degraded(self, key: bytes, scope: bytes | None, reason: str) -> None:
        """Latch a record degraded; inside a transaction that is about to roll back, later."""
        self._degraded_pending.append((key, scope, reason))
        if not self.store.in_transaction:
            self._persist_degraded()

    # -- inbound versions and held ones ---------------------------------------------------------

    def merge(
        self,
        envelopes: list[bytes],
        *,
        now_ms: int | None,
        source: str,
        accept_drift: bool = False,
        to_push: frozenset[tuple[bytes, int, int]] = frozenset(),
        seqs: list[int] | None = None,
        relay: RelayState | None = None,
    ) -> InboundResult:
        """Merge inbound envelopes inside the caller's transaction; a pulled page's with the
        envelopes' `seqs` and the `relay` state they came with."""
        now = self.options.wall_clock_ms() if now_ms is None else now_ms
        options = self.options
        if accept_drift:
            options = replace(options, max_drift_ms=1 << 62)
        ctx = InboundContext(
            self.store,
            self.opener,
            Schema(()) if self.opener is None else self.schema,  # locked: all held sealed first
            self.node(),
            options,
            want_events=bool(self.subscribers),
            to_push=to_push,
            seqs=seqs,
            relay=relay,
        )
        result = merge_inbound(ctx, envelopes, now, source)
        if ctx.want_events:
            result.events.extend(self._over_limit(result.per_item_scopes))
        return result

    def _over_limit(self, scopes: set[tuple[str, str]]) -> list[ChangeEvent]:
        """Tell the app when a merge left a per_item set over its bound (nothing is dropped)."""
        events = []
        for profile, name in sorted(scopes):
            spec = self.schema.get(name)
            live = self.count_live(self.scope(profile, name), spec.tiebreak if spec else None)
            if spec is not None and spec.max_items is not None and live > spec.max_items:
                reason = f"{live} items, max_items {spec.max_items}"
                events.append(ChangeEvent("over_limit", "remote", profile, name, None, reason))
        return events

    def merge_held(self, rows: list[HeldRow], now: int | None, accept_drift: bool = False) -> None:
        """Take held rows out and merge them again, keeping a reseed's push marks."""
        self.store.unhold(rows)
        to_push = frozenset((r.key, r.node, r.hlc) for r in rows if r.repush)
        result = self.merge(
            [r.envelope for r in rows],
            now_ms=now,
            source="held",
            accept_drift=accept_drift,
            to_push=to_push,
        )
        self.publish(released_events(result))

    def recheck_held(self, reasons: tuple[str, ...], now: int | None = None) -> None:
        """Take held versions of these reasons out and merge them again: what still needs
        holding is held again, the rest merges as if it had just arrived."""
        if self.opener is None:
            return
        with self.write_transaction():
            rows = self.store.held_rows(reasons)
            if rows:
                self.merge_held(rows, now)

    def release_due(self, now: int | None = None, *, every_time: bool = False) -> None:
        """Merge held versions whose lock ended or whose time came: once per write transaction
        unless `every_time` (the reads and writes of a batch each ask; the next transaction,
        or a rollback of part of this one, asks again)."""
        if self.opener is None:  # locked or closed: nothing can be opened, so nothing merges
            return
        if self.store.in_transaction and not every_time:
            if self._released_in == self.store.transactions:
                return
            self._released_in = self.store.transactions
        now = self.options.wall_clock_ms() if now is None else now
        due = self.store.next_release_ms()
        if due is not None and due <= now:
            self.recheck_held(("drift", "lock"), now)


def rows_by_key(rows: Iterator[Row]) -> Iterator[tuple[bytes, list[Row]]]:
    """Group rows sorted by key into (key, rows) runs."""
    current: list[Row] = []
    for row in rows:
        if current and row.key != current[0].key:
            yield current[0].key, current
            current = []
        current.append(row)
    if current:
        yield current[0].key, current


def released_events(result: InboundResult) -> list[ChangeEvent]:
    """A held version that merges is announced as released, not as a plain change."""
    return [
        ChangeEvent("released", e.origin, e.profile, e.collection, e.id)
        if e.kind == "changed"
        else e
        for e in result.events
    ]
