"""The default relay storage: one SQLite file, WAL, `synchronous=FULL`, one relay process.

The statements are `relay.sql`'s; what is SQLite's own is concurrency. One write connection
behind a lock (SQLite has one writer, so pushes of every account are serialized and seq order
is commit order, and no row lock is needed), pushes that arrive together committed as a group
with one fsync; readers use a connection per thread and read a consistent snapshot in one
transaction.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay import dialect
from relay.errors import RelayError, StoreFailedError
from relay.signing import Pusher
from relay.sql import SQLStorage
from relay.sqlpush import PendingPush
from relay.storage import VersionRules, new_random_id
from replica.errors import InvalidArgumentError, is_disk_error
from replica.wire import PushBatch, PushResult

WAL_CHECKPOINT_PAGES = 10_000
"""Checkpoint the WAL after ~40 MB, not SQLite's ~4 MB: a push inserts into the key index at
random places, so the default checkpointed (and fsynced the file) after nearly every push.
Every commit still syncs the WAL before its receipts go out."""
WRITER_CACHE_KIB = 64 * 1024
"""The writer's page cache (SQLite's default is 2 MiB): pushes insert into the key index at
random places, and once it outgrows the cache inserts wait on reads (measured here: 200k
envelopes into one account in batches of 4000, ~12% less time per insert than with 2 MiB).
Readers keep the default: there is one per worker thread."""
FILE_MODE = 0o600
"""A new relay database, and the WAL and shared memory SQLite makes with its mode: owner only
(they hold every account's ciphertext and auth-key hashes)."""
TYPES = dialect.Types(int="INTEGER", bytes="BLOB", serial="INTEGER PRIMARY KEY", strict=" STRICT")
_ROW_LOCK = " FOR NO KEY UPDATE"
_INSERT_VERSIONS = (
    f"INSERT INTO versions ({dialect.VERSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


KEYS_PER_QUERY = 500
"""Values per `IN (?, …)`: well under SQLite's bound on parameters."""
_ANY = " = ANY(?)"


@functools.cache
def _rewrite(statement: str) -> str:
    """A `relay.sql` statement for SQLite: it has no row locks, and needs none (one writer)."""
    return statement.replace(_ROW_LOCK, "")


@functools.cache
def _expand(statement: str, count: int) -> str:
    """`= ANY(?)` as SQLite says it for `count` values: `IN (?, …)`."""
    return _rewrite(statement).replace(_ANY, f" IN ({','.join('?' * count)})")


def _chunks(values: Sequence[object]) -> list[Sequence[object]]:
    return [values[at : at + KEYS_PER_QUERY] for at in range(0, len(values), KEYS_PER_QUERY)]


INCREMENTAL = 2
"""`PRAGMA auto_vacuum`'s value for incremental auto-vacuum: a file made so gives the pages
a collection freed back to the disk at once."""


class SQLiteTransaction(dialect.Transaction):
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def one(self, statement: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        # every row read: a statement with RETURNING has then finished before COMMIT
        rows = self._db.execute(_rewrite(statement), params).fetchall()
        return rows[0] if rows else None

    def all(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(_rewrite(statement), params).fetchall()

    def run(self, statement: str, params: Sequence[object] = ()) -> int:
        return self._db.execute(_rewrite(statement), params).rowcount

    def run_many(self, statement: str, rows: Sequence[Sequence[object]]) -> None:
        self._db.executemany(_rewrite(statement), rows)

    def all_in(
        self, statement: str, params: Sequence[object], values: Sequence[object]
    ) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for chunk in _chunks(values):
            query = _expand(statement, len(chunk))
            rows += self._db.execute(query, (*params, *chunk)).fetchall()
        return rows

    def run_in(self, statement: str, params: Sequence[object], values: Sequence[object]) -> None:
        for chunk in _chunks(values):
            self._db.execute(_expand(statement, len(chunk)), (*params, *chunk))

    def insert_versions(self, rows: list[dialect.VersionRow]) -> None:
        self._db.executemany(_INSERT_VERSIONS, rows)

    def announce(self, name: str, head: int) -> None:
        """Nothing to do: one process, whose listeners hear each push after its commit."""

    def give_back_free_pages(self) -> None:
        """A file made in incremental auto-vacuum mode moves its free pages to its end, cut
        off at commit; one made before keeps them for `relay compact`. A step of the pragma
        frees one page (`execute` takes one step)."""
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL:
            for _ in range(self._db.execute("PRAGMA freelist_count").fetchone()[0]):
                self._db.execute("PRAGMA incremental_vacuum(1)")


log = logging.getLogger(f"sealsync.{__name__}")


@dataclass
class _Push:
    """One push waiting for the group commit, and what became of it."""

    pending: PendingPush
    result: PushResult | None = None
    moved: bool = False
    failure: RelayError | None = None
    """Why this push alone was refused."""
    group_failure: BaseException | None = None
    """Why the whole group's transaction failed."""
    done: bool = False


class SQLiteStorage(SQLStorage):
    """Relay storage in one SQLite file (created on first open)."""

    def __init__(
        self, path: str | Path, rules: VersionRules, *, new_id: Callable[[], str] = new_random_id
    ) -> None:
        super().__init__(rules, new_id)
        self._path = str(path)
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._queue: list[_Push] = []
        self._queue_lock = threading.Lock()
        os.close(os.open(self._path, os.O_CREAT | os.O_WRONLY, FILE_MODE))  # new: 0600
        self._writer = self._connect()
        self._writer.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        self._storage_id, self._secret = self._initialise()

    # -- connections ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        if not os.path.exists(self._path) or os.path.getsize(self._path) == 0:
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a new file's, before WAL mode
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def _after_failure(self, exc: BaseException) -> None:
        """End the writer's failed transaction (a rollback that fails too is noted on `exc`,
        never raised over it). After SQLite failed a write or a sync (IOERR, FULL), the
        writer is not trusted again: its cached pages and its view of the log may be what
        the disk never took. It is opened again, as the replica's store does."""
        try:
            if self._writer.in_transaction:
                self._writer.execute("ROLLBACK")
        except sqlite3.Error as rollback_error:
            exc.add_note(f"rollback also failed: {rollback_error}")
        if isinstance(exc, sqlite3.Error) and is_disk_error(exc):
            self._writer.close()
            self._writer = self._connect()
            self._writer.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
            log.warning("disk error: the database was opened again", extra={"error": str(exc)})

    def _reader(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._readers_lock:  # not the writer's lock: a read never waits for an fsync
                self._readers.append(db)
        return db

    @contextmanager
    def _write(self) -> Iterator[dialect.Transaction]:
        """One write transaction; `BEGIN IMMEDIATE` so it never fails half-way on a lock."""
        with self._write_lock:
            db = self._writer
            db.execute("BEGIN IMMEDIATE")
            try:
                yield SQLiteTransaction(db)
                db.execute("COMMIT")
            except BaseException as exc:
                self._after_failure(exc)
                raise

    @contextmanager
    def _read(self) -> Iterator[dialect.Transaction]:
        yield SQLiteTransaction(self._reader())

    @contextmanager
    def _snapshot(self) -> Iterator[dialect.Transaction]:
        """One read transaction: every statement inside sees the same snapshot."""
        db = self._reader()
        db.execute("BEGIN")
        try:
            yield SQLiteTransaction(db)
        finally:
            db.execute("COMMIT")

    def compact(self) -> tuple[int, int]:
        """Rewrite the file without its free pages (SQLite's VACUUM), pushes waiting
        meanwhile; its bytes, with the WAL, before and after."""
        with self._write_lock:
            before = _file_bytes(self._path)
            try:
                self._writer.execute("PRAGMA auto_vacuum=INCREMENTAL")  # converts an older file
                self._writer.execute("VACUUM")
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as exc:
                self._after_failure(exc)
                raise StoreFailedError(
                    f"could not compact the relay's file: {exc}",
                    hint="check that the disk has as much free space as the file takes",
                ) from exc
            return before, _file_bytes(self._path)

    def _is_missing_parent(self, exc: Exception) -> bool:
        return (
            isinstance(exc, sqlite3.IntegrityError)
            and exc.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
        )

    def _initialise(self) -> tuple[str, bytes]:
        with self._write() as tx:
            (version,) = self._writer.execute("PRAGMA user_version").fetchone()
            if version > dialect.SCHEMA_VERSION:
                raise InvalidArgumentError(
                    f"{self._path} is relay schema {version}; this relay reads up to "
                    f"{dialect.SCHEMA_VERSION}",
                    hint="upgrade sealsync",
                )
            if version == 0:
                dialect.create_tables(tx, TYPES, self._new_id)
            else:
                dialect.upgrade_tables(tx, TYPES, version)
            self._writer.execute(f"PRAGMA user_version={dialect.SCHEMA_VERSION}")
            return dialect.read_meta(tx)

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()
            for db in self._readers:
                db.close()

    # -- pushes -----------------------------------------------------------------------------

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        """Group commit: the push joins a queue; whoever holds the writer next applies every
        queued push (each in its own savepoint) and commits them with one fsync. Headers are
        parsed before the queue, outside the single writer."""
        job = _Push(self._check_batch(name, batch, pusher))
        with self._queue_lock:
            self._queue.append(job)
        with self._write_lock:
            if not job.done:
                self._commit_queued()
        if job.group_failure is not None:  # each waiting thread gets its own exception
            raise StoreFailedError("the commit this push joined failed") from job.group_failure
        if job.failure is not None:
            raise job.failure
        assert job.result is not None
        if job.moved:
            self._tell_listeners(name, job.result.state.head)
        return job.result

    def _commit_queued(self) -> None:
        """Apply every queued push in one transaction. A push refused on its own (quota,
        account gone) is rolled back to its savepoint and the others go on; when the
        transaction itself fails, nothing of the group is committed, so every push fails."""
        with self._queue_lock:
            jobs, self._queue = self._queue, []
        db = self._writer
        tx = SQLiteTransaction(db)
        try:
            db.execute("BEGIN IMMEDIATE")
            for job in jobs:
                db.execute("SAVEPOINT push")
                try:
                    job.result, job.moved = self._apply_push(tx, job.pending)
                    job.failure = job.pending.refusal  # over quota: its counter is kept
                except RelayError as exc:  # this push only (not authorized, account gone)
                    db.execute("ROLLBACK TO push")
                    job.failure = exc
                db.execute("RELEASE push")
            db.execute("COMMIT")
            self._committed(len(jobs))
        except BaseException as exc:
            for job in jobs:  # nothing of the group was committed: no receipt may go out
                job.result, job.group_failure = None, exc
            self._after_failure(exc)
            raise
        finally:
            for job in jobs:
                job.done = True


def _file_bytes(path: str) -> int:
    wal = Path(f"{path}-wal")
    return Path(path).stat().st_size + (wal.stat().st_size if wal.exists() else 0)
