"""The replica: an app's encrypted, offline-first copy of its account's data (DESIGN §6).

Synchronous and thread-safe: one connection per `Replica`, guarded by a re-entrant mutex;
several processes may open one file, serialized by SQLite's write lock. Every write reads the
clock, the node id and the record's siblings inside one `BEGIN IMMEDIATE` transaction, so two
processes cannot collide on a dot. Reads decrypt through a bounded cache and fail closed: a
record whose envelope does not open is degraded and its reads and overwrites raise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from replica import clock
from replica.envelope import Identity, Opened, opaque_key, scope_key, seal
from replica.errors import (
    DegradedError,
    EnvelopeError,
    InvalidArgumentError,
    ItemLimitError,
    ProtocolError,
    ReplicaClosedError,
    ReplicaLockedError,
    StaleContextError,
    StoreError,
    UnknownEpochError,
)
from replica.events import ChangeEvent, Subscriber, Subscribers
from replica.inbound import InboundContext, InboundResult, merge_inbound, profile_key
from replica.keys import (
    AccountInfo,
    AccountKeys,
    KeyBundle,
    LoginKeys,
    NewAccount,
    bundle_from_bytes,
    bundle_to_bytes,
    change_passphrase,
    new_account,
    open_info,
    unlock_with_account_key,
    unlock_with_passphrase,
    unlock_with_recovery_key,
    with_info,
)
from replica.limits import check_document, check_name
from replica.merge import local_vector
from replica.opener import Opener
from replica.options import ReplicaOptions
from replica.record import Context, Record, Version, record_from_siblings
from replica.schema import (
    DEFAULT_PROFILE,
    PROFILES_COLLECTION,
    REGISTER_ID,
    Collection,
    Schema,
    schema_from_bytes,
    schema_to_bytes,
)
from replica.status import Status, read_status
from replica.store import Row, Store
from replica.sync import SyncSession
from replica.wire import KdfParams, parse_header

HELD_RECHECK_ON_UNLOCK = ("sealed", "epoch")


class Replica:
    """One device's replica file. Make one with `create`, `join` or `open`; then `unlock`."""

    def __init__(self, store: Store, options: ReplicaOptions) -> None:
        self._store = store
        self._options = options
        self._mutex = threading.RLock()
        self._opener: Opener | None = None
        self._subscribers = Subscribers()
        self._record_mutexes: dict[bytes, threading.Lock] = {}
        self._profiles: set[str] = {DEFAULT_PROFILE}
        self._degraded_pending: list[tuple[bytes, bytes | None, str]] = []
        self._pending_events: list[ChangeEvent] = []
        self._closed = False
        schema_bytes = store.get_bytes("schema")
        self._schema = schema_from_bytes(schema_bytes) if schema_bytes else Schema(())

    def __repr__(self) -> str:
        state = "closed" if self._closed else "locked" if self._opener is None else "unlocked"
        return f"Replica({str(self._store.path)!r}, {state})"

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | Path,
        schema: Schema,
        passphrase: str,
        *,
        options: ReplicaOptions | None = None,
        kdf: KdfParams | None = None,
    ) -> tuple[Replica, NewAccount]:
        """A new account and its first replica; show `NewAccount.recovery_key` to the user once."""
        options = options or ReplicaOptions()
        account = new_account(passphrase, options.random_bytes, kdf, schema_to_bytes(schema))
        replica = cls._new_file(Path(path), account.bundle, schema, options)
        replica._unlocked(account.keys)
        return replica, account

    @classmethod
    def join(
        cls,
        path: str | Path,
        bundle: bytes,
        *,
        schema: Schema | None = None,
        options: ReplicaOptions | None = None,
    ) -> Replica:
        """A new replica of an existing account, from its key bundle; locked until `unlock`."""
        return cls._new_file(
            Path(path), bundle_from_bytes(bundle), schema, options or ReplicaOptions()
        )

    @classmethod
    def open(cls, path: str | Path, *, options: ReplicaOptions | None = None) -> Replica:
        """An existing replica file, locked."""
        path = Path(path)
        if not path.is_file():
            raise StoreError(f"no replica at {path}", hint="create one with Replica.create or join")
        store = Store(path, synchronous=(options or ReplicaOptions()).synchronous)
        store.check_format()
        return cls(store, options or ReplicaOptions())

    @classmethod
    def _new_file(
        cls, path: Path, bundle: KeyBundle, schema: Schema | None, options: ReplicaOptions
    ) -> Replica:
        if path.exists() and path.stat().st_size > 0:
            raise StoreError(f"{path} already exists", hint="open it with Replica.open")
        store = Store(path, synchronous=options.synchronous, busy_timeout_s=options.busy_timeout_s)
        store.migrate()
        with store.transaction():
            store.set_meta("bundle", bundle_to_bytes(bundle))
            store.set_meta("node", str(_new_node(options, 0)))
            store.set_meta("clock", 0)
            if schema is not None:
                store.set_meta("schema", schema_to_bytes(schema))
        return cls(store, options)

    def unlock(self, passphrase: str) -> None:
        """Unlock with the account's passphrase (runs Argon2id)."""
        self._unlocked(unlock_with_passphrase(self._bundle(), passphrase))

    def unlock_with_recovery_key(self, recovery_key: str) -> None:
        self._unlocked(unlock_with_recovery_key(self._bundle(), recovery_key))

    def unlock_with_key(self, account_key: bytes) -> None:
        """The keyring path: the raw account key from `account_key()` of an unlocked replica."""
        self._unlocked(unlock_with_account_key(self._bundle(), account_key))

    def _unlocked(self, keys: AccountKeys) -> None:
        with self._mutex:
            self._check_open()
            self._opener = Opener(keys, self._options.cache_entries)
            if not self._schema.collections and self._store.get_bytes("schema") is None:
                info = open_info(keys.account_key, self._bundle().sealed_info)
                if info.schema:
                    self._set_schema(schema_from_bytes(info.schema))
            self._recheck_held(HELD_RECHECK_ON_UNLOCK)

    def lock(self) -> None:
        """Drop every key and decrypted record from memory; reads and writes then refuse."""
        with self._mutex:
            if self._opener is not None:
                self._opener.keys.drop()
                self._opener.forget()
                self._opener = None

    def close(self) -> None:
        with self._mutex:
            if not self._closed:
                self.lock()
                self._store.close()
                self._closed = True

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_locked(self) -> bool:
        return self._opener is None

    @property
    def node(self) -> int:
        """This device's node id (changes when the file turns out to be a copy)."""
        with self._mutex:
            return self._node()

    @property
    def schema(self) -> Schema:
        return self._schema

    def account_key(self) -> bytes:
        """The raw account key, for a keyring. Treat it as the passphrase's equal."""
        return self._keys().account_key

    def key_bundle(self) -> bytes:
        return bundle_to_bytes(self._bundle())

    def change_passphrase(self, new_passphrase: str) -> LoginKeys:
        """Re-wrap the account key under a new passphrase; no record is re-encrypted."""
        with self._mutex:
            bundle, login = change_passphrase(
                self._bundle(), self._keys(), new_passphrase, self._options.random_bytes
            )
            with self._write_transaction():
                self._store.set_meta("bundle", bundle_to_bytes(bundle))
            return login

    def declare(self, schema: Schema) -> None:
        """Replace the schema; versions held for an undeclared collection are then merged."""
        with self._mutex:
            keys = self._keys()
            bundle = self._bundle()
            info = open_info(keys.account_key, bundle.sealed_info)
            info = AccountInfo(info.account_id, info.key_epoch, schema_to_bytes(schema))
            with self._write_transaction():
                self._store.set_meta(
                    "bundle",
                    bundle_to_bytes(with_info(bundle, keys, info, self._options.random_bytes)),
                )
                self._set_schema(schema)
            self._recheck_held(("collection",))

    def _set_schema(self, schema: Schema) -> None:
        self._store.set_meta("schema", schema_to_bytes(schema))
        self._schema = schema

    # -- profiles -------------------------------------------------------------------------------

    def profiles(self) -> list[str]:
        """The account's profiles, `default` first."""
        names = [r.id for r in self.scan(PROFILES_COLLECTION) if r.id != DEFAULT_PROFILE]
        return [DEFAULT_PROFILE, *sorted(names)]

    def create_profile(self, name: str) -> None:
        check_name("profile", name)
        if name not in self._profiles and name not in self.profiles():
            self.put(PROFILES_COLLECTION, name, {})
        self._profiles.add(name)

    def _check_profile(self, profile: str) -> None:
        check_name("profile", profile)
        if profile in self._profiles:
            return
        if profile not in self.profiles():
            raise InvalidArgumentError(
                f"profile {profile!r} does not exist", hint="create it with create_profile"
            )
        self._profiles.add(profile)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE) -> Record | None:
        """The record's visible version with its causal context; None if it never existed.

        A deleted record is returned with `deleted=True` (its context resolves conflicts).
        Raises `DegradedError` when any of its versions cannot be opened.
        """
        with self._mutex:
            spec, identity = self._resolve(collection, id, profile)
            self._release_due()
            key = opaque_key(self._keys().index_key, identity)
            if spec.policy == "local":
                return self._get_local(key)
            siblings = self._open_siblings(key, self._scope(identity))
            return record_from_siblings(siblings, spec.tiebreak) if siblings else None

    def conflicts(
        self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE
    ) -> list[Version]:
        """The record's siblings other than the visible one (empty when there is no conflict)."""
        record = self.get(collection, id, profile=profile)
        return [] if record is None else list(record.conflicts)

    def scan(
        self,
        collection: str,
        *,
        profile: str = DEFAULT_PROFILE,
        include_deleted: bool = False,
        skip_degraded: bool = False,
    ) -> list[Record]:
        """Every record of a collection in key order; deleted ones only if asked.

        An unreadable record raises `DegradedError` unless `skip_degraded` is set.
        """
        with self._mutex:
            spec = self._schema.require(check_name("collection", collection))
            check_name("profile", profile)
            self._release_due()
            scope = scope_key(self._keys(), profile, collection)
            if spec.policy == "local":
                return self._scan_local(scope, include_deleted)
            records: list[Record] = []
            for key, rows in self._rows_by_key(self._store.versions_in_scope(scope)):
                try:
                    record = record_from_siblings(self._open_rows(key, rows, scope), spec.tiebreak)
                except DegradedError:
                    if skip_degraded:
                        continue
                    raise
                if include_deleted or not record.deleted:
                    records.append(record)
            return records

    def history(self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE) -> list[Version]:
        """Replaced versions kept on this device (collections declared with `history`)."""
        with self._mutex:
            _, identity = self._resolve(collection, id, profile)
            key = opaque_key(self._keys().index_key, identity)
            versions = []
            for row in self._store.history_of(key):
                opened = self._opener_or_raise().open_row(row)
                versions.append(Version(row.node, row.hlc, opened.deleted, opened.document))
            return versions

    @staticmethod
    def _rows_by_key(rows: Iterator[Row]) -> Iterator[tuple[bytes, list[Row]]]:
        current: list[Row] = []
        for row in rows:
            if current and row.key != current[0].key:
                yield current[0].key, current
                current = []
            current.append(row)
        if current:
            yield current[0].key, current

    def _open_siblings(self, key: bytes, scope: bytes) -> list[Opened]:
        return self._open_rows(key, self._store.versions_of(key), scope)

    def _open_rows(self, key: bytes, rows: list[Row], scope: bytes) -> list[Opened]:
        """Open every sibling, or latch the record degraded (persisted) and raise."""
        if self._store.is_degraded(key):
            raise DegradedError(
                "a record is degraded: one of its versions cannot be opened",
                hint="run repair to quarantine the unreadable versions",
            )
        opener = self._opener_or_raise()
        try:
            return [opener.open_row(row) for row in rows]
        except (EnvelopeError, UnknownEpochError) as exc:
            self._mark_degraded(key, scope, str(exc))
            raise DegradedError(
                f"a record cannot be opened: {exc}", hint="run repair to quarantine it"
            ) from exc

    def _mark_degraded(self, key: bytes, scope: bytes | None, reason: str) -> None:
        """Latch a record degraded; inside a transaction that is about to roll back, later."""
        if self._store.in_transaction:
            self._degraded_pending.append((key, scope, reason))
            return
        with self._store.transaction():
            self._store.mark_degraded(key, scope, reason)

    @contextmanager
    def _write_transaction(self) -> Iterator[None]:
        """A write transaction; when the outermost one ends, degraded latches found inside it
        are persisted (even on rollback) and its events published (only on commit)."""
        outermost = not self._store.in_transaction
        committed = False
        try:
            with self._store.transaction():
                yield
            committed = True
        finally:
            if outermost:
                events, self._pending_events = self._pending_events, []
                if self._degraded_pending:
                    pending, self._degraded_pending = self._degraded_pending, []
                    with self._store.transaction():
                        for key, scope, reason in pending:
                            self._store.mark_degraded(key, scope, reason)
                if committed:
                    self._subscribers.publish(events)

    def _publish(self, events: list[ChangeEvent]) -> None:
        """Tell subscribers now, or when the enclosing write transaction commits."""
        if self._store.in_transaction:
            self._pending_events.extend(events)
        else:
            self._subscribers.publish(events)

    # -- writes ---------------------------------------------------------------------------------

    def put(
        self,
        collection: str,
        id: str,
        document: Any,
        *,
        profile: str = DEFAULT_PROFILE,
        context: Context | None = None,
        if_unchanged: bool = False,
    ) -> Context:
        """Write a new version; return the record's context after the write.

        Without `context` the write replaces every current sibling (last writer wins). With
        it, exactly the siblings in `context` are replaced and any sibling merged since the
        read stays as a conflict; with `if_unchanged`, any change since the read raises
        `StaleContextError` instead.
        """
        check_document(document)
        return self._write(collection, id, profile, document, False, context, if_unchanged)

    def delete(
        self,
        collection: str,
        id: str,
        *,
        profile: str = DEFAULT_PROFILE,
        context: Context | None = None,
        if_unchanged: bool = False,
    ) -> Context:
        """Write a tombstone (a version like any other: a later edit restores the record)."""
        return self._write(collection, id, profile, None, True, context, if_unchanged)

    def update(
        self,
        collection: str,
        id: str,
        change: Callable[[Any], Any],
        *,
        profile: str = DEFAULT_PROFILE,
        attempts: int = 10,
    ) -> Context:
        """Read-modify-write one record, serialized per record; other records proceed meanwhile.

        `change` gets the visible document (None if absent or deleted) and returns the new one.
        """
        with self._record_mutex(collection, id, profile):
            for _ in range(attempts):
                record = self.get(collection, id, profile=profile)
                current = None if record is None or record.deleted else record.document
                context = frozenset() if record is None else record.context
                try:
                    return self.put(
                        collection,
                        id,
                        change(current),
                        profile=profile,
                        context=context,
                        if_unchanged=True,
                    )
                except StaleContextError:
                    continue
        raise StaleContextError(f"record kept changing during {attempts} update attempts")

    @contextmanager
    def _record_mutex(self, collection: str, id: str, profile: str) -> Iterator[None]:
        name = "\x00".join((profile, collection, id)).encode()
        with self._mutex:
            mutex = self._record_mutexes.setdefault(name, threading.Lock())
        with mutex:
            yield

    def _write(
        self,
        collection: str,
        id: str,
        profile: str,
        document: Any,
        deleted: bool,
        context: Context | None,
        if_unchanged: bool,
    ) -> Context:
        with self._mutex:
            spec, identity = self._resolve(collection, id, profile)
            if collection != PROFILES_COLLECTION:
                self._check_profile(profile)
            keys = self._keys()
            key = opaque_key(keys.index_key, identity)
            scope = self._scope(identity)
            if spec.policy == "local":
                return self._put_local(identity, key, scope, document, deleted)
            with self._write_transaction():
                now = self._options.wall_clock_ms()
                self._release_due(now)
                siblings = self._open_siblings(key, scope)
                replaced = self._replaced(siblings, context, if_unchanged)
                if spec.max_items is not None and not deleted:
                    self._check_item_limit(spec, identity, siblings, scope)
                new_context = self._seal_and_store(
                    identity, key, scope, spec, siblings, replaced, document, deleted, now
                )
        self._publish([ChangeEvent("changed", "local", profile, collection, id)])
        return new_context

    def _replaced(
        self, siblings: list[Opened], context: Context | None, if_unchanged: bool
    ) -> list[Opened]:
        current = frozenset(o.header.dot for o in siblings)
        if context is None:
            return siblings
        if if_unchanged and current != context:
            raise StaleContextError(
                f"record changed since it was read: {len(current - context)} new sibling(s)",
                hint="read it again and reapply the change",
            )
        node = self._node()
        if any(o.header.node == node and o.header.dot not in context for o in siblings):
            # A device's writes to a record must form a chain (see replica.merge).
            raise StaleContextError(
                "record was written on this device since it was read", hint="read it again"
            )
        return [o for o in siblings if o.header.dot in context]

    def _check_item_limit(
        self, spec: Collection, identity: Identity, siblings: list[Opened], scope: bytes
    ) -> None:
        if siblings and not record_from_siblings(siblings, spec.tiebreak).deleted:
            return
        live = sum(
            1
            for key, rows in self._rows_by_key(self._store.versions_in_scope(scope))
            if not record_from_siblings(self._open_rows(key, rows, scope), None).deleted
        )
        assert spec.max_items is not None
        if live >= spec.max_items:
            raise ItemLimitError(
                f"collection {spec.name!r} holds {live} items, max_items {spec.max_items}",
                hint="delete an item first",
            )

    def _seal_and_store(
        self,
        identity: Identity,
        key: bytes,
        scope: bytes,
        spec: Collection,
        siblings: list[Opened],
        replaced: list[Opened],
        document: Any,
        deleted: bool,
        now: int,
    ) -> Context:
        store = self._store
        node = self._node()
        hlc = clock.tick(store.get_int("clock"), now)
        vector = local_vector([o.header for o in replaced], node, hlc)
        envelope = seal(
            self._keys(),
            identity,
            hlc=hlc,
            node=node,
            vector=vector,
            deleted=deleted,
            document=document,
            nonce=self._options.random_bytes(12),
        )
        old_rows = [Row(key, o.header.node, o.header.hlc, b"") for o in replaced]
        if spec.history and replaced:
            store.add_history(self._rows_for(key, replaced), now, spec.history)
        store.delete_versions(old_rows)
        store.insert_versions([(Row(key, node, hlc, envelope), scope, True)])
        store.set_meta("clock", hlc)
        if self._options.freshness_window_s > 0:
            store.db.execute("DELETE FROM locks WHERE kind = 'auto' AND target = ?", (key,))
            store.add_lock(
                "auto", key, now + int(self._options.freshness_window_s * 1000), (node, hlc)
            )
        kept = {o.header.dot for o in siblings} - {o.header.dot for o in replaced}
        return frozenset(kept | {(node, hlc)})

    def _rows_for(self, key: bytes, versions: list[Opened]) -> list[Row]:
        wanted = {o.header.dot for o in versions}
        return [r for r in self._store.versions_of(key) if (r.node, r.hlc) in wanted]

    # -- device-local records (never synced) ------------------------------------------------------

    def _put_local(
        self, identity: Identity, key: bytes, scope: bytes, document: Any, deleted: bool
    ) -> Context:
        with self._write_transaction():
            now = self._options.wall_clock_ms()
            hlc = clock.tick(self._store.get_int("clock"), now)
            node = self._node()
            envelope = seal(
                self._keys(),
                identity,
                hlc=hlc,
                node=node,
                vector={node: hlc},
                deleted=deleted,
                document=document,
                nonce=self._options.random_bytes(12),
            )
            self._store.put_local(key, scope, envelope)
            self._store.set_meta("clock", hlc)
        self._publish(
            [ChangeEvent("changed", "local", identity.profile, identity.collection, identity.id)]
        )
        return frozenset({(node, hlc)})

    def _get_local(self, key: bytes) -> Record | None:
        envelope = self._store.get_local(key)
        if envelope is None:
            return None
        return record_from_siblings(
            [self._open_rows(key, [_local_row(key, envelope)], b"")[0]], None
        )

    def _scan_local(self, scope: bytes, include_deleted: bool) -> list[Record]:
        records = []
        for key, envelope in self._store.local_in_scope(scope):
            record = record_from_siblings(
                self._open_rows(key, [_local_row(key, envelope)], scope), None
            )
            if include_deleted or not record.deleted:
                records.append(record)
        return records

    # -- freshness locks and held versions ------------------------------------------------------

    def lock_scope(
        self,
        *,
        profile: str = DEFAULT_PROFILE,
        collection: str | None = None,
        id: str | None = None,
        duration_s: float | None = None,
    ) -> int:
        """Hold inbound versions of a profile, a collection in it, or one record; returns a lock id."""
        duration_s = self._options.max_lock_s if duration_s is None else duration_s
        if not 0 < duration_s <= self._options.max_lock_s:
            raise InvalidArgumentError(
                f"lock duration {duration_s} s outside (0, {self._options.max_lock_s}]"
            )
        with self._mutex:
            keys = self._keys()
            check_name("profile", profile)
            if id is not None:
                if collection is None:
                    raise InvalidArgumentError("a record lock needs its collection")
                _, identity = self._resolve(collection, id, profile)
                kind, target = "record", opaque_key(keys.index_key, identity)
            elif collection is not None:
                self._schema.require(check_name("collection", collection))
                kind, target = "collection", scope_key(keys, profile, collection)
            else:
                kind, target = "profile", profile_key(self._opener_or_raise(), profile)
            with self._write_transaction():
                expires = self._options.wall_clock_ms() + int(duration_s * 1000)
                return self._store.add_lock(kind, target, expires)

    def release_lock(self, lock_id: int) -> None:
        """End an explicit lock now; the versions it held are merged as if just arrived."""
        with self._mutex:
            with self._write_transaction():
                self._store.delete_lock(lock_id)
            self._recheck_held(("lock",))

    def accept_held(self) -> int:
        """Merge versions held for drift now (the user trusts the sender's clock)."""
        with self._mutex:
            self._keys()
            with self._write_transaction():
                rows = self._store.held_rows(("drift",))
                self._store.unhold(rows)
                state = self._store.get_int("clock")
                for row in rows:
                    state = max(state, row.hlc)
                self._store.set_meta("clock", state)
                result = self._merge(
                    [r.envelope for r in rows], now_ms=None, accept_drift=True, source="held"
                )
            self._publish(_released(result))
            return len(rows)

    def release_due(self) -> None:
        """Merge held versions whose lock ended or whose time came (every read and write does this)."""
        with self._mutex:
            self._release_due()

    def _release_due(self, now: int | None = None) -> None:
        now = self._options.wall_clock_ms() if now is None else now
        due = self._store.next_release_ms()
        if due is not None and due <= now and self._opener is not None:
            self._recheck_held(("drift", "lock"), now)

    def _recheck_held(self, reasons: tuple[str, ...], now: int | None = None) -> None:
        if self._opener is None:
            return
        with self._write_transaction():
            rows = self._store.held_rows(reasons)
            if not rows:
                return
            self._store.unhold(rows)
            result = self._merge([r.envelope for r in rows], now_ms=now, source="held")
        self._publish(_released(result))

    def _merge(
        self,
        envelopes: list[bytes],
        *,
        now_ms: int | None,
        source: str,
        accept_drift: bool = False,
    ) -> InboundResult:
        """Merge inbound envelopes inside the caller's transaction."""
        now = self._options.wall_clock_ms() if now_ms is None else now_ms
        options = self._options
        if accept_drift:
            options = replace(options, max_drift_ms=1 << 62)
        ctx = InboundContext(self._store, self._opener, self._schema, self._node(), options)
        return merge_inbound(ctx, envelopes, now, source)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one transaction: all of them land, or none (and one fsync)."""
        with self._mutex, self._write_transaction():
            yield

    def sync_session(
        self, *, max_batch_count: int = 1000, max_batch_bytes: int = 4 << 20
    ) -> SyncSession:
        """A sans-I/O sync session over this replica (see replica.sync)."""
        return SyncSession(self, max_batch_count=max_batch_count, max_batch_bytes=max_batch_bytes)

    # -- status and subscriptions ---------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback` with each ChangeEvent after its transaction commits; returns unsubscribe."""
        return self._subscribers.add(callback)

    def status(self) -> Status:
        with self._mutex:
            self._check_open()
            return read_status(self._store, locked=self._opener is None, node=self._node())

    # -- internals ------------------------------------------------------------------------------

    def _resolve(self, collection: str, id: str, profile: str) -> tuple[Collection, Identity]:
        check_name("collection", collection)
        check_name("id", id)
        check_name("profile", profile)
        spec = self._schema.require(collection)
        if spec.policy == "register" and id != REGISTER_ID:
            raise InvalidArgumentError(
                f"collection {collection!r} is a register: its only id is {REGISTER_ID!r}, got {id!r}"
            )
        return spec, Identity(profile, collection, id)

    def _scope(self, identity: Identity) -> bytes:
        return scope_key(self._keys(), identity.profile, identity.collection)

    def _node(self) -> int:
        return self._store.get_int("node")

    def _bundle(self) -> KeyBundle:
        self._check_open()
        data = self._store.get_bytes("bundle")
        if data is None:
            raise StoreError(f"{self._store.path} holds no key bundle")
        return bundle_from_bytes(data)

    def _check_open(self) -> None:
        if self._closed:
            raise ReplicaClosedError("the replica is closed")

    def _opener_or_raise(self) -> Opener:
        self._check_open()
        if self._opener is None:
            raise ReplicaLockedError("the replica is locked", hint="unlock it first")
        return self._opener

    def _keys(self) -> AccountKeys:
        return self._opener_or_raise().keys


def _local_row(key: bytes, envelope: bytes) -> Row:
    try:
        header = parse_header(envelope)
    except ProtocolError:
        return Row(key, 0, 0, envelope)
    return Row(key, header.node, header.hlc, envelope)


def _released(result: InboundResult) -> list[ChangeEvent]:
    return [
        ChangeEvent("released", e.origin, e.profile, e.collection, e.id)
        if e.kind == "changed"
        else e
        for e in result.events
    ]


def _new_node(options: ReplicaOptions, avoid: int) -> int:
    while True:
        node = int.from_bytes(options.random_bytes(8), "big")
        if node not in (0, avoid):
            return node
