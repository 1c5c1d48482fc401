"""The replica: an app's encrypted, offline-first copy of its account's data (docs/architecture.md §6).

Synchronous and thread-safe: one connection per `Replica`, guarded by a re-entrant mutex;
several processes may open one file, serialized by SQLite's write lock. Reads decrypt through a
bounded cache and fail closed: a record whose envelope does not open is degraded, and its reads
and overwrites raise until repair. Writes live in `replica.write`, held versions and explicit
locks in `replica.held`, the shared internals in `replica.core`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from replica import indexed, journal, repair, write
from replica.bundles import (
    AnyBundle,
    NewAccount,
    bundle_bytes,
    check_successor,
    is_newer,
    new_account,
    parse_bundle,
    unlock_by_key,
    unlock_by_login,
    unlock_by_recovery_key,
    with_schema,
)
from replica.coordination import Coordination
from replica.core import Core, rows_by_key
from replica.envelope import Identity
from replica.errors import InvalidArgumentError, StaleContextError, StoreError
from replica.files import create_private_file
from replica.generations import KeyBundleV2
from replica.indexed import IndexStats, ScanPage
from replica.keyops import KeyOperations
from replica.keys import AccountKeys, LoginKeys, passphrase_login_keys
from replica.limits import check_document, check_name
from replica.options import ReplicaOptions
from replica.outside import Merged
from replica.record import Context, Record, Version, record_from_siblings
from replica.restore import merge_backup
from replica.schema import (
    DEFAULT_PROFILE,
    PROFILES_COLLECTION,
    Collection,
    Schema,
    schema_to_bytes,
)
from replica.store import Store
from replica.transfers import Transfers
from replica.upkeep import Upkeep
from replica.wire import KdfParams

HELD_RECHECK_ON_UNLOCK = ("sealed", "epoch", "collection")
"""Unlocking gives keys, and reloads the schema another process may have declared."""


class Replica(KeyOperations, Coordination, Transfers, Upkeep):
    """One device's replica file. Make one with `create`, `join` or `open`; then `unlock`."""

    def __init__(self, store: Store, options: ReplicaOptions) -> None:
        self._core = Core(store, options)
        self._record_mutexes: dict[tuple[str, str, str], threading.Lock] = {}
        self._batching = threading.local()

    def __repr__(self) -> str:
        core = self._core
        state = "closed" if core.closed else "locked" if core.opener is None else "unlocked"
        return f"Replica({str(core.store.path)!r}, {state})"

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
        replica = cls._new_file(Path(path), account.bundle, None, options)  # the bundle's
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
        parsed = parse_bundle(bundle)
        return cls._new_file(Path(path), parsed, schema, options or ReplicaOptions())

    @classmethod
    def open(cls, path: str | Path, *, options: ReplicaOptions | None = None) -> Replica:
        """An existing replica file, locked."""
        path = Path(path)
        options = options or ReplicaOptions()
        if not path.is_file():
            raise StoreError(f"no replica at {path}", hint="create one with Replica.create or join")
        store = Store(path, synchronous=options.synchronous, busy_timeout_s=options.busy_timeout_s)
        try:
            store.check_format()
        except sqlite3.Error as exc:  # the disk failed or filled up as the file was opened
            store.close()
            raise StoreError(f"{path} could not be opened: {exc}") from exc
        return cls(store, options)

    @classmethod
    def _new_file(
        cls, path: Path, bundle: AnyBundle, schema: Schema | None, options: ReplicaOptions
    ) -> Replica:
        if path.exists() and path.stat().st_size > 0:
            raise StoreError(f"{path} already exists", hint="open it with Replica.open")
        create_private_file(path)
        store = Store(path, synchronous=options.synchronous, busy_timeout_s=options.busy_timeout_s)
        with store.transaction():  # one transaction: a crash leaves no half-made replica
            store.migrate()
            store.set_meta("bundle", bundle_bytes(bundle))
            store.set_meta("node", str(options.new_node_id()))
            store.set_meta("clock", 0)
            if schema is not None:  # locked: sealed by the first unlock
                store.set_meta("clear_schema", schema_to_bytes(schema))
        return cls(store, options)

    def unlock(self, passphrase: str) -> None:
        """Unlock with the account's passphrase (runs Argon2id)."""
        bundle = self._core.bundle()
        self._unlocked(unlock_by_login(bundle, passphrase_login_keys(passphrase, bundle.kdf)))

    def unlock_with_login_keys(self, login: LoginKeys) -> None:
        """Unlock with `passphrase_login_keys(passphrase, self.kdf_params())`: a caller that
        also logs in to the relay with that passphrase runs Argon2id once, not twice."""
        self._unlocked(unlock_by_login(self._core.bundle(), login))

    def unlock_with_recovery_key(self, recovery_key: str) -> None:
        self._unlocked(unlock_by_recovery_key(self._core.bundle(), recovery_key))

    def unlock_with_key(self, unlock_key: bytes) -> None:
        """The keyring path: the raw key from `unlock_key()` of an unlocked replica."""
        self._unlocked(unlock_by_key(self._core.bundle(), unlock_key))

    def _unlocked(self, keys: AccountKeys) -> None:
        core = self._core
        with core.mutex:
            core.check_open()
            core.forget_keys()
            core.unlock(keys)
            core.recheck_held(HELD_RECHECK_ON_UNLOCK)

    def lock(self) -> None:
        """Drop every key and decrypted record from memory; reads and writes then refuse."""
        with self._core.mutex:
            self._core.forget_keys()

    def close(self) -> None:
        core = self._core
        with core.mutex:
            if not core.closed:
                core.forget_keys()
                core.store.close()
                core.closed = True

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_locked(self) -> bool:
        return self._core.opener is None

    @property
    def node(self) -> int:
        """This device's node id (changes when the file turns out to be a copy)."""
        with self._core.mutex:
            self._core.check_open()
            return self._core.node()

    @property
    def schema(self) -> Schema:
        """The declared collections; the file keeps them sealed, so only while unlocked."""
        with self._core.mutex:
            return self._core.schema

    @property
    def path(self) -> Path:
        return self._core.store.path

    def take_new_node_id(self) -> int:
        """Write as a new node from now on (works while locked), for a file copied from
        another device's, such as a restored backup: two files writing as one node would
        give different versions the same identity. Its change feed starts anew too
        (`FeedResetError` for earlier cursors). Returns the new id."""
        core = self._core
        with core.mutex, core.write_transaction():
            node = core.options.new_node_id(avoid=core.node())
            core.store.set_node(node, core.options.random_bytes(16).hex())
            return node

    def adopt_bundle(self, data: bytes, login: LoginKeys) -> bool:
        """Take the relay's key bundle when it is newer than this file's (another device
        upgraded or rotated the account's keys) and the passphrase's keys open it; False
        when it is not newer, for a device never goes back. `WrongKeyError` when the
        passphrase does not open it, `ProtocolError` when it is another account's."""
        candidate = parse_bundle(data)
        core = self._core
        with core.mutex:
            with core.write_transaction():
                if not is_newer(candidate, core.bundle()):
                    return False
                assert isinstance(candidate, KeyBundleV2), "only version 2 is newer"
                keys = unlock_by_login(candidate, login)
                check_successor(candidate, keys, core.bundle(), core.keys())
                core.store.set_meta("bundle", bundle_bytes(candidate))
            self._unlocked(keys)
        return True

    def declare(self, schema: Schema) -> None:
        """Replace the schema; versions held for an undeclared collection are then merged,
        and the blind index of each collection whose index changed is rebuilt."""
        core = self._core
        with core.mutex:
            with core.write_transaction():  # read and replace the bundle under one lock
                keys, random_bytes = core.keys(), core.options.random_bytes
                reindexed = indexed.changed_indexes(core.schema, schema)
                sealed = with_schema(core.bundle(), keys, schema_to_bytes(schema), random_bytes)
                core.store.set_meta("bundle", bundle_bytes(sealed))
                core.store_schema(schema, keys)
                if reindexed:  # every profile's, known or not yet: rows say their scope only
                    indexed.rebuild(core, None)
            core.recheck_held(("collection",))

    # -- profiles -------------------------------------------------------------------------------

    def profiles(self) -> list[str]:
        """The account's profiles, `default` first."""
        names = [r.id for r in self.scan(PROFILES_COLLECTION) if r.id != DEFAULT_PROFILE]
        return [DEFAULT_PROFILE, *sorted(names)]

    def create_profile(self, name: str) -> None:
        """Make a profile (a namespace for records); it syncs to the account's other devices."""
        check_name("profile", name)
        if name not in self.profiles():
            self.put(PROFILES_COLLECTION, name, {})

    # -- reads ----------------------------------------------------------------------------------

    def get(self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE) -> Record | None:
        """The record's visible version with its causal context; None if it never existed.

        A deleted record is returned with `deleted=True` (its context resolves conflicts).
        Raises `DegradedError` when any of its versions cannot be opened.
        """
        core = self._core
        with core.mutex:
            spec, identity = core.resolve(collection, id, profile)
            core.release_due()
            key = core.record_key(identity)
            scope = core.scope(profile, collection)
            if spec.policy == "local":
                return write.get_local(core, key, scope)
            siblings = core.open_siblings(key, scope)
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
        where: Mapping[str, str | int] | None = None,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[Record]:
        """Every record of a collection in key order; deleted ones only if asked. With `where`
        on the collection's indexed field, only the records under that value, in creation
        order (`newest_first` reverses it), at most `limit`: see `scan_page`.

        An unreadable record raises `DegradedError` unless `skip_degraded` is set.
        """
        if where is not None:
            return self.scan_page(
                collection,
                where=where,
                profile=profile,
                newest_first=newest_first,
                limit=limit,
                include_deleted=include_deleted,
                skip_degraded=skip_degraded,
            ).records
        if newest_first or limit is not None:
            raise InvalidArgumentError("newest_first and limit order indexed reads: pass where=")
        return self._scan_all(collection, profile, include_deleted, skip_degraded)

    def _scan_all(
        self, collection: str, profile: str, include_deleted: bool, skip_degraded: bool
    ) -> list[Record]:
        core = self._core
        with core.mutex:
            spec = core.schema.require(check_name("collection", collection))
            check_name("profile", profile)
            core.release_due()
            scope = core.scope(profile, collection)
            if spec.policy == "local":
                return write.scan_local(core, scope, include_deleted)
            rows = rows_by_key(core.store.versions_in_scope(scope))
            return indexed.open_records(
                core,
                spec,
                scope,
                rows,
                include_deleted=include_deleted,
                skip_degraded=skip_degraded,
            )

    def scan_page(
        self,
        collection: str,
        *,
        where: Mapping[str, str | int],
        profile: str = DEFAULT_PROFILE,
        newest_first: bool = False,
        limit: int | None = None,
        after: bytes | None = None,
        include_deleted: bool = False,
        skip_degraded: bool = False,
    ) -> ScanPage:
        """The records whose indexed field (`Collection.index`) holds the value `where` names,
        in creation order (`Collection.created_field`, else hlc; then key), from the resume
        point `after` a previous page returned; at most `limit` records. Only those records
        are opened (a blind index on this device: specs/replica.md §2)."""
        core = self._core
        with core.mutex:
            spec, scope, blind = self._indexed_read(collection, profile, where)
            core.release_due()
            keys, resume = indexed.ordered_keys(
                core, blind, newest_first=newest_first, limit=limit, after=after
            )
            rows = ((key, core.store.versions_of(key)) for key in keys)
            records = indexed.open_records(
                core,
                spec,
                scope,
                rows,
                include_deleted=include_deleted,
                skip_degraded=skip_degraded,
            )
            return ScanPage(records, resume)

    def last_created(
        self, collection: str, *, where: Mapping[str, str | int], profile: str = DEFAULT_PROFILE
    ) -> int | None:
        """The greatest creation order under `where` (None: no record), at the cost of one
        index lookup: where a new record goes after the last (`index_stats` counts too)."""
        with self._core.mutex:
            return self._core.store.blind_last(self._where_key(collection, profile, where))

    def index_degraded(
        self, collection: str, *, where: Mapping[str, str | int], profile: str = DEFAULT_PROFILE
    ) -> int:
        """How many records under `where` are degraded (a read of them raises until repair):
        an app can treat what they belong to as read-only (specs/replica.md §2.1)."""
        with self._core.mutex:
            return self._core.store.blind_degraded(self._where_key(collection, profile, where))

    def index_stats(
        self,
        collection: str,
        *,
        where: Mapping[str, str | int],
        profile: str = DEFAULT_PROFILE,
        with_bytes: bool = False,
    ) -> IndexStats:
        """How many records an indexed read of `where` would list, and their first and last
        creation order, from the blind index without opening a record (with `with_bytes`,
        the size of their stored versions too, which reads their rows)."""
        with self._core.mutex:
            blind = self._where_key(collection, profile, where)
            return IndexStats(*self._core.store.blind_stats(blind, with_bytes))

    def _where_key(self, collection: str, profile: str, where: Mapping[str, str | int]) -> bytes:
        return self._indexed_read(collection, profile, where)[2]

    def _indexed_read(
        self, collection: str, profile: str, where: Mapping[str, str | int]
    ) -> tuple[Collection, bytes, bytes]:
        """The collection, the scope and the blind key an indexed read of `where` uses."""
        core = self._core
        spec = core.schema.require(check_name("collection", collection))
        check_name("profile", profile)
        scope = core.scope(profile, collection)
        return spec, scope, indexed.where_key(core, spec, scope, where)

    def history(self, collection: str, id: str, *, profile: str = DEFAULT_PROFILE) -> list[Version]:
        """Replaced versions kept on this device (collections declared with `history`)."""
        core = self._core
        with core.mutex:
            _, identity = core.resolve(collection, id, profile)
            key = core.record_key(identity)
            rows = core.store.history_of(key)
            opened = core.open_rows(key, rows, core.scope(profile, collection))
            return [Version(o.header.node, o.header.hlc, o.deleted, o.document) for o in opened]

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
        deferred_entry: tuple[str, str] | None = None,
    ) -> Context:
        """Write a new version; return the record's context after the write.

        Without `context` the write replaces every current sibling (last writer wins). With
        it, exactly the siblings in `context` are replaced and any sibling merged since the
        read stays as a conflict; with `if_unchanged`, any change since the read raises
        `StaleContextError` instead. With `deferred_entry`, the (collection, name) of a
        journal, the write's entry there is left to the caller's next `journal_deferred`,
        at no cost now (the chat store's appends).
        """
        check_document(document)
        with self._core.mutex:
            identity = Identity(profile, collection, id)
            awaits = None if deferred_entry is None else self._deferred_log(profile, deferred_entry)
            return write.write_record(
                self._core,
                identity,
                document,
                deleted=False,
                context=context,
                if_unchanged=if_unchanged,
                awaits=awaits,
            )

    def _deferred_log(self, profile: str, journal_name: tuple[str, str]) -> bytes:
        if not (isinstance(journal_name, tuple) and len(journal_name) == 2):
            raise InvalidArgumentError(
                f"deferred_entry is a journal's (collection, name), got {journal_name!r:.60}"
            )
        return journal.deferred_log(self._core, profile, *journal_name)

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
        with self._core.mutex:
            identity = Identity(profile, collection, id)
            return write.write_record(
                self._core,
                identity,
                None,
                deleted=True,
                context=context,
                if_unchanged=if_unchanged,
            )

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

        `change` gets the visible document (None if absent or deleted) and returns the new one;
        it runs without the replica's mutex held. If another process changed the record
        in between, the read and `change` are repeated (up to `attempts` times).
        """
        with self._record_mutex(profile, collection, id):
            for _ in range(attempts):
                record = self.get(collection, id, profile=profile)
                current = None if record is None or record.deleted else record.document
                context: Context = frozenset() if record is None else record.context
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
    def _record_mutex(self, profile: str, collection: str, id: str) -> Iterator[None]:
        if getattr(self._batching, "depth", 0):
            # Inside batch() this thread holds the replica's mutex, which serializes it
            # already; waiting for a record lock here could deadlock with another update().
            yield
            return
        with self._core.mutex:
            mutex = self._record_mutexes.setdefault((profile, collection, id), threading.Lock())
        with mutex:
            yield

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one transaction: all of them land, or none (and one fsync)."""
        with self._core.mutex, self._core.write_transaction():
            self._batching.depth = getattr(self._batching, "depth", 0) + 1
            try:
                yield
            finally:
                self._batching.depth -= 1

    def merge_backup(
        self,
        backup: str | Path,
        *,
        profile: str | None = None,
        collection: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Merged:
        """Merge the versions of a backup file as if pulled: nothing here is overwritten by
        anything older, concurrent versions become siblings (replica/restore.py). Only one
        profile's, or one declared collection's (in every profile, or in `profile`), when
        given. Refuses (`StoreError`) the backup of another account, before writing."""
        core = self._core
        with core.mutex:
            core.check_open()
            scopes = None
            if profile is not None or collection is not None:
                names = [collection] if collection else [c.name for c in core.schema.collections]
                if collection is not None and core.schema.get(collection) is None:
                    raise InvalidArgumentError(f"collection {collection!r} is not declared")
                profiles = [profile] if profile is not None else self.profiles()
                scopes = frozenset(core.scope(p, n) for p in profiles for n in names)
        return merge_backup(core, Path(backup), scopes, progress)

    # -- fail closed: clear ----------------------------------------------------------------------

    def clear(self, collection: str, *, profile: str = DEFAULT_PROFILE, force: bool = False) -> int:
        """Empty a collection even while it is degraded: unreadable rows go to quarantine,
        every readable record gets a tombstone. Returns the number of records deleted."""
        core = self._core
        with core.mutex, core.write_transaction():
            core.schema.require(check_name("collection", collection))
            check_name("profile", profile)
            repair.repair(core, force=force, scope=core.scope(profile, collection))
            records = self.scan(collection, profile=profile)
            for record in records:
                self.delete(collection, record.id, profile=profile, context=record.context)
            return len(records)
