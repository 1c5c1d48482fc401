"""The replica file: one SQLite database, its tables and transactions (specs/replica.md).

Only SQL lives here: no keys, no decisions. Rows hold sealed envelopes (the bytes that
travel) plus the cleartext header facts that queries need (dot, encoded vector). Writes run
in `BEGIN IMMEDIATE` transactions, so several processes sharing one file serialize on SQLite's
lock (with a busy timeout) instead of failing; nested `transaction()` calls become savepoints
that never hide the original error. Node ids are unsigned 64-bit; SQLite integers are signed,
hence `node_to_i64`. The merge's statements pass BLOB values through `_blob` (see there).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import msgspec

from replica import freepages
from replica.asides import AsideTables, Row, sha256
from replica.blindtables import BlindTables
from replica.errors import ReplicaClosedError, StoreError, is_disk_error
from replica.migrations import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from replica.wire import node_from_i64, node_to_i64

Synchronous = Literal["full", "normal"]
WAL_CHECKPOINT_PAGES = 10_000
"""Checkpoint the WAL after ~40 MB, not SQLite's ~4 MB: a merged page dirties hundreds of
random pages, so the default checkpointed (and fsynced the file) every other page, and
copied pages that the next pages rewrote anyway. With synchronous=full (the default) every
commit still syncs the WAL."""
CACHE_KIB = 16 * 1024
"""Page cache per connection (SQLite's default is 2 MiB). Merged records go into two indexes
at random places; once those outgrow the cache (~50k records), each insert read its index
pages back from the file: a quarter of the time of merging new records."""


_blob = bytearray
"""A BLOB parameter as the stdlib sqlite3 module binds it fastest. It looks for an adapter,
through two failing attribute lookups, for every `bytes` value, but binds a bytearray at once
(same BLOB stored, and read back as bytes): a merge binds several per version."""


class NewVersion(msgspec.Struct, frozen=True, gc=False):
    """A version to store, with the cleartext header facts that queries need (Row and
    NewVersion are msgspec Structs: a merge builds one per version it writes)."""

    key: bytes
    node: int
    hlc: int
    scope: bytes
    vector: bytes
    envelope: bytes
    dirty: bool
    tomb: bool
    """Whether the version is a tombstone (its `deleted` flag, column `tomb`)."""
    blind: bytes | None = None
    """The version's blind index entry (replica/blind.py), with its creation order."""
    created: int | None = None
    changed: int = 0
    """The sequence number of its record's change that stored it (replica/feed.py)."""
    awaits: bytes | None = None
    """The journal whose entry for this write is deferred (replica/journal.py)."""


class Store(AsideTables, BlindTables):
    """A connection to one replica file; not thread-safe on its own (the Replica locks)."""

    def __init__(
        self, path: Path, *, synchronous: Synchronous = "full", busy_timeout_s: float = 30.0
    ):
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.closed = False
        self._depth = 0
        self._ended_by_sqlite: BaseException | None = None
        """The failure after which SQLite rolled back the open transaction itself."""
        self.transactions = 0
        """Counts write transactions begun, and rollbacks of any part of one, on this
        connection: what was done "once in this transaction" is undone when it changes."""
        self._meta: dict[str, bytes | int | str | None] = {}
        """Meta values read or written in the open write transaction (no other connection
        writes meanwhile); emptied when it ends and when a savepoint rolls back."""
        self._next_lock_sweep_ms = 0
        self._synchronous = synchronous
        try:
            self.db = self._connect()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a SQLite database: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self.busy_timeout_s
        )
        if freepages.is_empty_file(self.path):  # before WAL mode writes its header (a pragma on a
            # file in use would touch it at every open): a new file gives the pages it frees
            # back (`give_back_free_pages`); an older one keeps them until `compact` converts it
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        db.execute("PRAGMA foreign_keys=ON")
        db.create_function("sha256", 1, sha256, deterministic=True)
        return db

    def close(self) -> None:
        self.db.close()
        self.closed = True

    # -- format and migrations ----------------------------------------------------------------

    def migrate(self) -> None:
        """Bring the file to SCHEMA_VERSION, one recorded step at a time."""
        with self.transaction():
            app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if app_id not in (0, APPLICATION_ID) or (app_id == 0 and not self._is_new()):
                raise StoreError(f"{self.path} is not a sealsync replica")
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has format {version}, newer than this sealsync ({SCHEMA_VERSION})",
                    hint="upgrade sealsync",
                )
            for step in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[step].split(";"):
                    if statement.strip():
                        self.db.execute(statement)
            self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _is_new(self) -> bool:
        return int(self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]) == 0

    def check_format(self) -> None:
        """Refuse a file that is not a replica; migrate (taking the write lock) only if old."""
        app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise StoreError(f"{self.path} is not a sealsync replica", hint="check the path")
        if self.db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            self.migrate()
        self._check_layout()

    def _check_layout(self) -> None:
        """Format 1 is still pre-release: refuse a file an earlier build laid out differently
        instead of failing on its first write."""
        for table, column in (("versions", "vector"), ("held", "digest"), ("quarantine", "hlc")):
            columns = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                raise StoreError(
                    f"{self.path} was made by a pre-release build of sealsync "
                    f"({table} has no {column} column)",
                    hint="create the replica again and sync it from the relay",
                )

    # -- transactions ------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE at the outermost level, savepoints inside; rollback on any error."""
        if self.closed:
            raise ReplicaClosedError(f"the replica at {self.path} is closed")
        commit, rollback = self._begin() if self._depth == 0 else self._savepoint()
        self._depth += 1
        try:
            yield
            if self._depth == 1:
                self._check_not_ended()
        except BaseException as exc:
            self._depth -= 1
            self._meta.clear()
            self.transactions += 1
            self._roll_back(rollback, commit, exc)
            if self._depth > 0 and not self.db.in_transaction and not self._ended_by_sqlite:
                self._ended_by_sqlite = exc  # SQLite undid the whole transaction, not a part
            self._after_failure(exc)
            raise
        self._depth -= 1
        if self._depth == 0:
            self._meta.clear()
        try:
            self._execute_or_busy(commit)
        except BaseException as exc:
            if self._depth == 0:  # a failed COMMIT may leave the transaction open: end it
                self._roll_back(rollback, commit, exc)
            self._after_failure(exc)
            raise

    def _begin(self) -> tuple[str, str]:
        """BEGIN IMMEDIATE; the statements that end the transaction."""
        self._execute_or_busy("BEGIN IMMEDIATE")
        self.transactions += 1
        self._ended_by_sqlite = None
        return "COMMIT", "ROLLBACK"

    def _savepoint(self) -> tuple[str, str]:
        """A savepoint inside the open transaction; the statements that end it."""
        self._check_not_ended()
        name = f"sp{self._depth}"
        try:
            self.db.execute(f"SAVEPOINT {name}")
        except BaseException as exc:
            if not self.db.in_transaction:  # SQLite ended the transaction as it failed
                self._ended_by_sqlite = exc
            raise
        return f"RELEASE {name}", f"ROLLBACK TO {name}"

    def _check_not_ended(self) -> None:
        """Refuse to go on with a transaction SQLite itself rolled back: after an error
        inside a savepoint (out of memory, a disk error) it may end the whole transaction,
        and a savepoint opened then would start a new one, committed alone."""
        if self._ended_by_sqlite is not None:
            raise StoreError(
                f"{self.path}: SQLite rolled this transaction back after a write inside it "
                f"failed ({self._ended_by_sqlite!r}): nothing of it was kept",
                hint="retry the whole transaction",
            ) from self._ended_by_sqlite

    def _after_failure(self, exc: BaseException) -> None:
        """After SQLite failed a write or an fsync (its IOERR or FULL), or could not end a
        failed transaction (out of memory), the connection is not trusted again (its cached
        pages and its view of the log may be what the disk never took): the outermost
        transaction opens the file again and raises `StoreError` naming the failure; deeper,
        the error goes on up to it. Whether a transaction whose fsync failed is kept is
        unknown: the log's frames are whole in the file, and a later open may recover them.
        It was not acknowledged; what was, stays."""
        if self._depth > 0:
            return
        disk_error = isinstance(exc, sqlite3.Error) and is_disk_error(exc)
        if not disk_error and not self.db.in_transaction:
            return
        self.db.close()  # an open transaction ends with the connection, undone
        try:
            self.db = self._connect()
        except (sqlite3.Error, MemoryError) as reopen_error:
            self.closed = True  # every later call: ReplicaClosedError
            exc.add_note(f"opening the file again failed too: {reopen_error!r}")
        if not disk_error:
            raise StoreError(
                f"{self.path}: a failed transaction could not be rolled back ({exc!r}); "
                "the file was opened again, which undid it"
            ) from exc
        name = getattr(exc, "sqlite_errorname", "disk error")
        raise StoreError(
            f"{self.path}: SQLite could not write ({name}: {exc}); whether this transaction "
            "was kept is unknown, and the file was opened again",
            hint="check the disk and its free space, then retry",
        ) from exc

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads that see one state of the file, without taking the write lock (a deferred
        BEGIN); inside a transaction, that transaction's state."""
        if self.closed:
            raise ReplicaClosedError(f"the replica at {self.path} is closed")
        if self._depth > 0:
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            if self.db.in_transaction:  # SQLite ends it itself after some errors (NOMEM)
                self.db.execute("COMMIT")

    def _roll_back(self, rollback: str, release: str, original: BaseException) -> None:
        self.rollbacks += 1
        try:
            self.db.execute(rollback)
            if self._depth > 0:
                self.db.execute(release)
        except (sqlite3.Error, MemoryError) as rollback_error:  # keep the original error
            original.add_note(f"rollback also failed: {rollback_error!r}")

    def _execute_or_busy(self, statement: str) -> None:
        try:
            self.db.execute(statement)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreError(
                    f"{self.path} stayed locked by another connection past the busy timeout "
                    f"({self.busy_timeout_s} s): {exc}",
                    hint="another process holds a long write transaction; retry, or raise "
                    "busy_timeout_s",
                ) from exc
            raise

    @property
    def in_transaction(self) -> bool:
        return self._depth > 0

    # -- meta ----------------------------------------------------------------------------------

    def get_meta(self, name: str) -> bytes | int | str | None:
        if name in self._meta:
            return self._meta[name]
        row = self.db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        value = None if row is None else row[0]
        if self._depth > 0:
            self._meta[name] = value
        return value

    def get_int(self, name: str, default: int = 0) -> int:
        value = self.get_meta(name)
        return default if value is None else int(value)

    def get_bytes(self, name: str) -> bytes | None:
        value = self.get_meta(name)
        if value is not None and not isinstance(value, bytes):
            raise StoreError(f"meta {name!r} is not bytes")
        return value

    def set_meta(self, name: str, value: bytes | int | str) -> None:
        self.db.execute(
            "INSERT INTO meta (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, value),
        )
        if self._depth > 0:
            self._meta[name] = value

    def delete_meta(self, name: str) -> None:
        self.db.execute("DELETE FROM meta WHERE name = ?", (name,))
        self._meta.pop(name, None)

    def scrub_meta(self, name: str) -> None:
        """Delete a meta row, overwriting its bytes in the file (`secure_delete`); after the
        commit, `checkpoint_truncate` clears the copies the WAL still holds."""
        self.db.execute("PRAGMA secure_delete = ON")
        self.delete_meta(name)
        self.db.execute("PRAGMA secure_delete = OFF")

    def set_node(self, node: int, feed_id: str) -> None:
        """Write as `node` from now on, and start another change feed (`feed_id`): a copied
        file's history is not the original's, so its followers must read it again. Its next
        sync pulls everything again (`resync_needed`, replica/resync.py): a copy may be
        older than a tombstone collection, and push what it collected back."""
        self.set_meta("node", str(node))
        self.set_meta("feed_id", feed_id)
        self.set_meta("resync_needed", 1)

    def checkpoint_truncate(self) -> None:
        """Copy the WAL into the file and empty it (a no-op while a reader holds it open)."""
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def give_back_free_pages(self) -> None:
        """In the write transaction that deleted rows (replica/freepages.py)."""
        freepages.give_back_free_pages(self.db)

    # -- versions (siblings) ------------------------------------------------------------------

    def version_ids(self, key: bytes) -> tuple[tuple[tuple[int, int, bytes], ...], bool]:
        """(node, hlc, AEAD tag) of each version of `key`, in order (the tag tells apart two
        sealings of one dot: a rolled-back write's, and the one that took its place), and
        whether the record is latched degraded: one statement, and one more only for a key
        with no version left."""
        rows = self.db.execute(
            "SELECT node, hlc, substr(envelope, -16), "
            "EXISTS (SELECT 1 FROM degraded WHERE key = ?1) "
            "FROM versions WHERE key = ?1 ORDER BY node, hlc",
            (key,),
        ).fetchall()
        degraded = any(d for *_, d in rows) if rows else self.is_degraded(key)  # none: latched?
        return tuple((node_from_i64(n), h, t) for n, h, t, _ in rows), degraded

    def versions_of(self, key: bytes) -> list[Row]:
        rows = self.db.execute(
            "SELECT key, node, hlc, envelope FROM versions WHERE key = ?", (key,)
        ).fetchall()
        return [Row(k, node_from_i64(n), h, e) for k, n, h, e in rows]

    def versions_in_scope(self, scope: bytes) -> Iterator[Row]:
        cursor = self.db.execute(
            "SELECT key, node, hlc, envelope FROM versions WHERE scope = ? ORDER BY key", (scope,)
        )
        for k, n, h, e in cursor:
            yield Row(k, node_from_i64(n), h, e)

    def insert_versions(self, rows: Iterable[NewVersion]) -> None:
        """Insert versions; callers insert only identities the record does not hold (merging
        drops covered versions, and a local write's dot is new)."""
        self.db.executemany(
            "INSERT INTO versions"
            " (key, node, hlc, scope, vector, envelope, dirty, tomb, blind, created, changed,"
            " awaits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    _blob(v.key),
                    node_to_i64(v.node),
                    v.hlc,
                    _blob(v.scope),
                    _blob(v.vector),
                    _blob(v.envelope),
                    int(v.dirty),
                    int(v.tomb),
                    v.blind,
                    v.created,
                    v.changed,
                    v.awaits,
                )
                for v in rows
            ],
        )

    def sibling_rows(
        self, keys: Sequence[bytes]
    ) -> Iterator[tuple[int, bytes, int, int, bytes, bytes | None, int | None]]:
        """(row id, key, node, hlc, encoded vector, blind, created) of many records' siblings:
        what merging needs, without reading a single envelope. Rows are yielded as SQLite steps to them,
        so none outlives its use (a page loads a thousand: fewer objects for the GC)."""
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):
            chunk = [_blob(key) for key in unique[start : start + 500]]
            marks = ",".join("?" * len(chunk))
            cursor = self.db.execute(
                f"SELECT id, key, node, hlc, vector, blind, created FROM versions"
                f" WHERE key IN ({marks})",
                chunk,
            )
            for rowid, key, node, hlc, vector, blind, created in cursor:
                yield rowid, key, node_from_i64(node), hlc, vector, blind, created

    def scope_of(self, key: bytes) -> bytes | None:
        row = self.db.execute("SELECT scope FROM versions WHERE key = ? LIMIT 1", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def replace_versions(self, pairs: Iterable[tuple[int, NewVersion]], *, index: bool) -> None:
        """Replace the version in row `id` by another of the same record, in place: the
        cheapest write SQLite can do here, the common merge. With `index` its blind index
        entry is written too; without, the row keeps the one it has (setting an indexed
        column costs an index update even when its value stays: +50 % measured)."""
        entry = ", blind = ?, created = ?" if index else ""
        self.db.executemany(
            "UPDATE versions SET node = ?, hlc = ?, vector = ?, envelope = ?, dirty = ?,"
            f" tomb = ?, changed = ?{entry} WHERE id = ?",
            [
                (
                    node_to_i64(new.node),
                    new.hlc,
                    _blob(new.vector),
                    _blob(new.envelope),
                    int(new.dirty),
                    int(new.tomb),
                    new.changed,
                    *((new.blind, new.created) if index else ()),
                    rowid,
                )
                for rowid, new in pairs
            ],
        )

    def set_changed(self, changes: Iterable[tuple[int, bytes]]) -> None:
        """Give every row of each record (key) its latest change's sequence number."""
        self.db.executemany("UPDATE versions SET changed = ? WHERE key = ?", changes)

    def take_seqs(self, count: int) -> int:
        """The first of `count` new change sequence numbers (replica/feed.py), taken inside
        the caller's write transaction: numbers only grow, and none is given twice."""
        first = self.get_int("feed_seq") + 1
        if count:
            self.set_meta("feed_seq", first + count - 1)
        return first

    def changes_after(self, seq: int, limit: int) -> list[tuple[int, bytes, str]]:
        """(seq, key, table) of the records whose latest change came after `seq`, oldest
        first; a record with several siblings has one row each, all with one seq."""
        rows = self.db.execute(
            "SELECT changed, key, 'versions' FROM versions WHERE changed > ?1"
            " UNION ALL SELECT changed, key, 'local' FROM local WHERE changed > ?1"
            " ORDER BY 1 LIMIT ?2",
            (seq, limit),
        ).fetchall()
        return [(changed, bytes(key), table) for changed, key, table in rows]

    def delete_versions(self, rows: Iterable[Row]) -> None:
        self.db.executemany(
            "DELETE FROM versions WHERE key = ? AND node = ? AND hlc = ?",
            [(r.key, node_to_i64(r.node), r.hlc) for r in rows],
        )

    def rows_to_push(self, table: str, limit: int, after: int) -> list[tuple[int, Row, bool]]:
        """(row id, version, tombstone) of dirty versions (`versions`) or of held versions
        marked by a reseed (`held`: never declared tombstones, the row does not say), in row
        order after row `after` (keyset pagination, so a refused version is not offered
        twice). Row order, not identity order: `versions_dirty` yields it without a sort, and
        a batch's rows sit together in the file, so acknowledging it rewrites few pages."""
        # Held copies nobody could authenticate yet (sealed, epoch) are never pushed: a forged
        # copy must not reach a reseeded relay before the genuine one. They are pushed once
        # they open (the mark survives re-examination).
        marked = {
            "versions": "dirty = 1",
            "held": "repush = 1 AND reason NOT IN ('sealed', 'epoch')",
        }
        tomb = "tomb = 1" if table == "versions" else "0"
        rows = self.db.execute(
            f"SELECT rowid, key, node, hlc, envelope, {tomb} FROM {table} WHERE {marked[table]}"
            " AND rowid > ? ORDER BY rowid LIMIT ?",
            (after, limit),
        ).fetchall()
        return [(i, Row(k, node_from_i64(n), h, e), bool(t)) for i, k, n, h, e, t in rows]

    def all_version_envelopes(self) -> list[bytes]:
        """The envelope of every current version, and of every held one (a folder
        snapshot's content: a reader that skips the files it covers must miss nothing)."""
        query = "SELECT envelope FROM versions UNION ALL SELECT envelope FROM held"
        return [bytes(e) for (e,) in self.db.execute(query)]

    def clear_dirty(self, identities: Iterable[tuple[bytes, int, int]]) -> None:
        """Clear the push marks of acknowledged versions, in `versions` and in `held` (where
        marks exist only after a reseed: the usual batch skips that table's statements)."""
        args = [(_blob(k), node_to_i64(n), h) for k, n, h in identities]
        self.db.executemany(
            "UPDATE versions SET dirty = 0 WHERE key = ? AND node = ? AND hlc = ?", args
        )
        if self.db.execute("SELECT 1 FROM held WHERE repush = 1 LIMIT 1").fetchone():
            self.db.executemany(
                "UPDATE held SET repush = 0 WHERE key = ? AND node = ? AND hlc = ?", args
            )

    def still_marked(self, identities: Iterable[tuple[bytes, int, int]]) -> int:
        """How many of `identities` still carry a push mark (dirty, or held for a repush)."""
        args = [(_blob(k), node_to_i64(n), h) for k, n, h in identities]
        return sum(
            self.db.execute(
                "SELECT (SELECT count(*) FROM versions WHERE key = ?1 AND node = ?2 AND hlc = ?3"
                " AND dirty = 1) + (SELECT count(*) FROM held WHERE key = ?1 AND node = ?2"
                " AND hlc = ?3 AND repush = 1)",
                arg,
            ).fetchone()[0]
            > 0
            for arg in args
        )

    def count_dirty(self) -> int:
        """Versions not yet acknowledged by a relay (the partial index counts them, in time
        proportional to their number, not to the file's)."""
        return int(self.db.execute("SELECT count(*) FROM versions WHERE dirty = 1").fetchone()[0])

    def count_awaiting_resync(self) -> int:
        """Versions merged from a backup that wait for a resync's verdict (`dirty = 2`): rare,
        so no index; a scan of the file, as `status` makes anyway."""
        return int(self.db.execute("SELECT count(*) FROM versions WHERE dirty = 2").fetchone()[0])

    def mark_all_for_push(self) -> None:
        self.db.execute("UPDATE versions SET dirty = 1 WHERE dirty <> 2")  # 2 waits for a resync
        # what a resync set aside is never pushed: the relay may have collected it
        self.db.execute("UPDATE held SET repush = 1 WHERE reason <> 'collected'")

    def has_identity(self, key: bytes, node: int, hlc: int) -> bool:
        args = (key, node_to_i64(node), hlc)
        for table in ("versions", "held", "history", "quarantine"):
            found = self.db.execute(
                f"SELECT 1 FROM {table} WHERE key = ? AND node = ? AND hlc = ?", args
            ).fetchone()
            if found:
                return True
        return False

    def add_history(self, rows: Iterable[Row], at_ms: int, keep: int) -> None:
        """Keep replaced versions, first in first out: the `keep` most recently replaced."""
        rows = list(rows)
        self.db.executemany(
            "INSERT OR IGNORE INTO history (key, node, hlc, envelope, replaced_at_ms) VALUES (?, ?, ?, ?, ?)",
            [(r.key, node_to_i64(r.node), r.hlc, r.envelope, at_ms) for r in rows],
        )
        for key in {r.key for r in rows}:
            self.db.execute(
                "DELETE FROM history WHERE key = ? AND (node, hlc) NOT IN "
                "(SELECT node, hlc FROM history WHERE key = ? "
                "ORDER BY replaced_at_ms DESC, hlc DESC LIMIT ?)",
                (key, key, keep),
            )

    def history_of(self, key: bytes) -> list[Row]:
        rows = self.db.execute(
            "SELECT key, node, hlc, envelope FROM history WHERE key = ? "
            "ORDER BY replaced_at_ms DESC, hlc DESC",
            (key,),
        ).fetchall()
        return [Row(k, node_from_i64(n), h, e) for k, n, h, e in rows]

    def count(self, table: str) -> int:
        return int(self.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
