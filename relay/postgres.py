"""Relay storage in PostgreSQL, shared by any number of stateless relay processes.

The statements are `relay.sql`'s; what is PostgreSQL's own is concurrency. Pushes of one
account are serialized by a row lock on the account (`FOR NO KEY UPDATE`), so seqs are
consecutive and commit in order, while pushes to other accounts run in parallel. A pull reads
the head and the versions in one REPEATABLE READ snapshot, so it never sees a seq whose
predecessors have not committed. A push announces its new head with `pg_notify` inside its
transaction; every process LISTENs on its own connection and tells its listeners
(docs/architecture.md §8.2, specs/protocol.md §5).
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from relay import dialect
from relay.signing import Pusher
from relay.sql import SQLStorage
from relay.storage import HeadListener, VersionRules, new_random_id
from replica.errors import InvalidArgumentError
from replica.wire import PushBatch, PushResult

log = logging.getLogger(f"sealsync.{__name__}")

TYPES = dialect.Types(
    int="BIGINT", bytes="BYTEA", serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", strict=""
)
_EXTERNAL_ENVELOPES = (
    # envelopes are ciphertext: trying to compress them only costs CPU
    "ALTER TABLE versions ALTER COLUMN envelope SET STORAGE EXTERNAL"
)
_COPY_VERSIONS = f"COPY versions ({dialect.VERSION_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_VERSION_TYPES = ["int8", "int8", "bytea", "int8", "int8", "bytea", "bytea", "bytea", "int8"]
CHANNEL = "sealsync_head"
"""One NOTIFY channel per database; the payload names the schema, so schemas never mix."""
MAX_CONNECTIONS = 10
"""Per relay process; the relay calls storage from a thread pool, each call holds one."""
LISTEN_POLL_S = 0.2
"""How often the listening thread looks up from its connection to see whether to stop."""
RECONNECT_WAIT_S = 1.0
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

Connection = psycopg.Connection[TupleRow]


@functools.cache
def postgres_statement(statement: str) -> str:
    """A `relay.sql` statement for psycopg: `%s` placeholders (and no bare `%`)."""
    return statement.replace("%", "%%").replace("?", "%s")


def _conninfo(url: str, schema: str) -> str:
    """`url` with `search_path` set to `schema`, keeping any options the URL already has, and
    `synchronous_commit` on whatever the server's or the URL's default: a receipt promises
    the version survives a crash of the server."""
    options = conninfo_to_dict(url).get("options") or ""
    extra = f"-c search_path={schema} -c synchronous_commit=on"
    return make_conninfo(url, options=f"{options} {extra}".strip())


def _open_error(url: str, exc: psycopg.Error) -> InvalidArgumentError:
    """Why the storage cannot open, naming the server and database but never the password
    (a malformed URL is not quoted at all: the parser's message may hold any part of it)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return InvalidArgumentError(
            "the PostgreSQL URL is malformed", hint="postgresql://user@host:5432/database"
        )
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    reason = str(exc).strip()
    password = params.get("password")
    if password:
        reason = reason.replace(str(password), "***")
    return InvalidArgumentError(
        f"cannot open relay storage in PostgreSQL {where}/{params.get('dbname') or ''}: {reason}",
        hint="check the database URL, that the server runs, and that the user may connect",
    )


class _Notice(msgspec.Struct):
    """The NOTIFY payload of a push: which schema, which process, which account, what head."""

    schema: str
    origin: str
    account: str
    head: int


class PostgresTransaction(dialect.Transaction):
    def __init__(self, db: Connection, storage: PostgresStorage) -> None:
        self._db = db
        self._storage = storage

    def one(self, statement: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self._db.execute(postgres_statement(statement), params).fetchone()

    def all(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(postgres_statement(statement), params).fetchall()

    def run(self, statement: str, params: Sequence[object] = ()) -> int:
        return self._db.execute(postgres_statement(statement), params).rowcount

    def run_many(self, statement: str, rows: Sequence[Sequence[object]]) -> None:
        if rows:
            self._db.cursor().executemany(postgres_statement(statement), rows)

    def all_in(
        self, statement: str, params: Sequence[object], values: Sequence[object]
    ) -> list[tuple[Any, ...]]:
        """One query, the values as one array: a plan prepared for `= ANY($n)` still uses the
        index, while one for a long `IN ($2, …)` scanned the account's every version."""
        if not values:
            return []
        return self._db.execute(postgres_statement(statement), (*params, list(values))).fetchall()

    def run_in(self, statement: str, params: Sequence[object], values: Sequence[object]) -> None:
        if values:
            self._db.execute(postgres_statement(statement), (*params, list(values)))

    def insert_versions(self, rows: list[dialect.VersionRow]) -> None:
        """Binary COPY: about twice as fast as executemany at 1,000 versions."""
        with self._db.cursor().copy(_COPY_VERSIONS) as copy:
            copy.set_types(_VERSION_TYPES)
            for row in rows:
                copy.write_row(row)

    def announce(self, name: str, head: int) -> None:
        self._db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self._storage.notice(name, head)))

    def give_back_free_pages(self) -> None:
        """Nothing to do: PostgreSQL reuses freed space itself (`VACUUM FULL` gives it back)."""


class PostgresStorage(SQLStorage):
    """Relay storage in one PostgreSQL schema (tables created on first open)."""

    def __init__(
        self,
        url: str,
        rules: VersionRules,
        *,
        schema: str = "public",
        new_id: Callable[[], str] = new_random_id,
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise InvalidArgumentError(
                f"schema {schema!r} must be a lowercase identifier of at most 63 characters"
            )
        super().__init__(rules, new_id)
        self._schema = schema
        self._origin = secrets.token_hex(8)
        """Tells this object's own notifications apart: its listeners heard those already."""
        self._listen_lock = threading.Lock()
        self._listening: threading.Thread | None = None
        self._closing = threading.Event()
        self._listen_name = f"sealsync-listen-{schema}"[:63]
        """The listening connection's `application_name`, for an operator (pg_stat_activity)."""
        try:
            self._conninfo = _conninfo(url, schema)
            self._storage_id, self._secret = self._initialise()
        except psycopg.Error as exc:
            raise _open_error(url, exc) from exc
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            self._conninfo,
            kwargs={"autocommit": True},
            # a connection the server dropped (a restart) is replaced, not handed out to fail
            check=ConnectionPool.check_connection,
            min_size=1,
            max_size=MAX_CONNECTIONS,
            open=True,
            name=f"sealsync-relay-{schema}",
        )

    # -- connections ------------------------------------------------------------------------

    def _initialise(self) -> tuple[str, bytes]:
        """Create the schema and tables once, under an advisory lock, so relay processes that
        start together neither race on the DDL nor write two storage ids."""
        with psycopg.connect(self._conninfo, autocommit=True) as db, db.transaction():
            lock = f"sealsync relay schema {self._schema}"
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
            if not db.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self._schema,)
            ).fetchone():
                db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self._schema)))
            tx = PostgresTransaction(db, self)
            if db.execute("SELECT to_regclass('meta') IS NULL").fetchone() == (True,):
                dialect.create_tables(tx, TYPES, self._new_id)
                db.execute(_EXTERNAL_ENVELOPES)
                tx.run(
                    "INSERT INTO meta (name, value) VALUES ('schema_version', ?)",
                    (str(dialect.SCHEMA_VERSION).encode(),),
                )
            else:
                self._upgrade(tx)
            return dialect.read_meta(tx)

    def _upgrade(self, tx: PostgresTransaction) -> None:
        """Bring an existing schema's tables to `SCHEMA_VERSION`, one step at a time."""
        (value,) = tx.one("SELECT value FROM meta WHERE name = 'schema_version'") or (b"",)
        version = int(value) if value.isdigit() else -1
        if not 1 <= version <= dialect.SCHEMA_VERSION:
            raise InvalidArgumentError(
                f"schema {self._schema!r} is relay schema {value.decode(errors='replace')}; "
                f"this relay reads up to {dialect.SCHEMA_VERSION}",
                hint="upgrade sealsync",
            )
        dialect.upgrade_tables(tx, TYPES, version)
        tx.run(
            "UPDATE meta SET value = ? WHERE name = 'schema_version'",
            (str(dialect.SCHEMA_VERSION).encode(),),
        )

    @contextmanager
    def _write(self) -> Iterator[dialect.Transaction]:
        """One READ COMMITTED transaction: committed (durably) on exit, rolled back on error."""
        with self._pool.connection() as db, db.transaction():
            yield PostgresTransaction(db, self)

    @contextmanager
    def _read(self) -> Iterator[dialect.Transaction]:
        """One statement, no transaction around it (autocommit): one round trip."""
        with self._pool.connection() as db:
            yield PostgresTransaction(db, self)

    @contextmanager
    def _snapshot(self) -> Iterator[dialect.Transaction]:
        """One REPEATABLE READ transaction: every statement inside sees the same snapshot."""
        with self._pool.connection() as db, db.transaction():
            db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield PostgresTransaction(db, self)

    def _is_missing_parent(self, exc: Exception) -> bool:
        return isinstance(exc, psycopg.errors.ForeignKeyViolation)

    def close(self) -> None:
        self._closing.set()
        if self._listening is not None:
            self._listening.join()
        self._pool.close()

    # -- pushes -----------------------------------------------------------------------------

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        pending = self._check_batch(name, batch, pusher)
        with self._write() as tx:
            result, moved = self._apply_push(tx, pending)
        self._committed(1)
        if pending.refusal is not None:  # over quota: raised once its counter is committed
            raise pending.refusal
        if moved:
            self._tell_listeners(name, result.state.head)
        return result

    # -- listening --------------------------------------------------------------------------

    def notice(self, name: str, head: int) -> str:
        """The NOTIFY payload: ~100 bytes plus the account name, far below the 8000-byte
        limit for names of up to 256 characters (longer names would fail the push)."""
        notice = _Notice(self._schema, self._origin, name, head)
        return msgspec.json.encode(notice).decode()

    def listen(self, listener: HeadListener) -> None:
        """Pushes through this object are told at once, after their commit; pushes through
        any other process arrive by NOTIFY on a background thread, started on first use."""
        with self._listen_lock:
            super().listen(listener)
            if self._listening is None:
                db = self._connect_listener()  # here, so a bad URL raises to the caller
                self._listening = threading.Thread(
                    target=self._receive, args=(db,), name="sealsync-pg-listen", daemon=True
                )
                self._listening.start()

    def _connect_listener(self) -> Connection:
        db = psycopg.connect(self._conninfo, autocommit=True, application_name=self._listen_name)
        db.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        return db

    def _receive(self, db: Connection | None) -> None:
        """Deliver notifications until close(); a lost connection is logged and reopened
        (heads pushed meanwhile go unheard until the next push to the same account)."""
        while not self._closing.is_set():
            try:
                if db is None:
                    db = self._connect_listener()
                    log.info("LISTEN connection for schema %r restored", self._schema)
                for notify in db.notifies(timeout=LISTEN_POLL_S):
                    self._deliver(notify.payload)
            except Exception as exc:
                # this thread alone hears other processes' pushes: it must outlive any error
                if isinstance(exc, psycopg.OperationalError):
                    log.warning("LISTEN connection for schema %r lost: %s", self._schema, exc)
                else:
                    log.exception("LISTEN for schema %r failed; reconnecting", self._schema)
                if db is not None:
                    db.close()
                db = None
                self._closing.wait(RECONNECT_WAIT_S)
        if db is not None:
            db.close()

    def _deliver(self, payload: str) -> None:
        """Anyone who may connect can NOTIFY on the channel: a malformed payload is skipped."""
        try:
            notice = msgspec.json.decode(payload, type=_Notice)
        except msgspec.DecodeError:  # ValidationError too
            log.warning("skipped a malformed notification on channel %s", CHANNEL)
            return
        if notice.schema != self._schema or notice.origin == self._origin:
            return
        for listener in list(self._listeners):
            try:
                listener(notice.account, notice.head)
            except Exception:
                # this thread is the only one that can report it; it must keep listening
                log.exception("a head listener failed for a push through another process")
