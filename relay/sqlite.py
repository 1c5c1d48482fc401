"""The default relay storage: one SQLite file, WAL, `synchronous=FULL`, one relay process.

One write connection behind a lock (SQLite has one writer, so pushes of every account are
serialized and seq order is commit order); readers use a connection per thread and read a
consistent snapshot in one transaction. Versions follow `relay.versions`, shared with the
other backends.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from relay.errors import (
    AccountExistsError,
    ForbiddenError,
    NotFoundError,
    QuotaExceededError,
    RelayError,
    StoreFailedError,
)
from relay.storage import (
    AccountRecord,
    AccountSummary,
    Device,
    HeadListener,
    TokenRecord,
    VersionRules,
    new_random_id,
    node_from_i64,
    node_to_i64,
    refresh_step,
    spent_until,
)
from relay.versions import (
    PushPlan,
    StoredVersion,
    check_envelope,
    cut_page,
    is_over_quota,
    page_bounds,
)
from replica.errors import InvalidArgumentError
from replica.wire import (
    Header,
    KdfParams,
    Page,
    PageEntry,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
    decode_message,
    decode_vector,
    encode_message,
)

_LATEST_OTHER_SPENT = (
    "SELECT max(expires_ms) FROM tokens WHERE account = ? AND device = ? AND kind = 'spent'"
    " AND hash != ?"
)
SCHEMA_VERSION = 1
WAL_CHECKPOINT_PAGES = 10_000
"""Checkpoint the WAL after ~40 MB, not SQLite's ~4 MB: a push inserts into the key index at
random places, so the default checkpointed (and fsynced the file) after nearly every push.
Every commit still syncs the WAL before its receipts go out."""
KEYS_PER_QUERY = 500
"""Keys per sibling query: well under SQLite's bound on parameters."""
WRITER_CACHE_KIB = 64 * 1024
"""The writer's page cache (SQLite's default is 2 MiB): pushes insert into the key index at
random places, and once it outgrows the cache inserts wait on reads (measured here: 200k
envelopes into one account in batches of 4000, ~12% less time per insert than with 2 MiB).
Readers keep the default: there is one per worker thread."""
_SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) STRICT;
CREATE TABLE accounts (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    auth_hash BLOB NOT NULL,
    recovery_hash BLOB NOT NULL,
    kdf BLOB NOT NULL,
    bundle BLOB NOT NULL,
    bundle_version INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    epoch TEXT NOT NULL,
    head INTEGER NOT NULL DEFAULT 0,
    stored_bytes INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE TABLE devices (
    account INTEGER NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (account, id)
) STRICT;
-- a token belongs to a live device: revoking the device deletes it, and a refresh racing
-- the revoke cannot insert a successor for the device afterwards
CREATE TABLE tokens (
    hash BLOB PRIMARY KEY,
    account INTEGER NOT NULL,
    device TEXT NOT NULL,
    kind TEXT NOT NULL,
    expires_ms INTEGER NOT NULL,
    FOREIGN KEY (account, device) REFERENCES devices(account, id) ON DELETE CASCADE
) STRICT;
CREATE INDEX tokens_by_device ON tokens (account, device);
CREATE TABLE invites (hash BLOB PRIMARY KEY, expires_ms INTEGER NOT NULL) STRICT;
CREATE TABLE versions (
    account INTEGER NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    key BLOB NOT NULL,
    node INTEGER NOT NULL,
    hlc INTEGER NOT NULL,
    vector BLOB NOT NULL,
    digest BLOB NOT NULL,
    envelope BLOB NOT NULL,
    PRIMARY KEY (account, seq)
) STRICT;
CREATE INDEX versions_by_key ON versions (account, key);
"""


def _is_foreign_key_failure(exc: sqlite3.IntegrityError) -> bool:
    """A token for a device that is not (or no longer) there."""
    return exc.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY


def _stored_versions(
    db: sqlite3.Connection, account_id: int, keys: list[bytes]
) -> dict[bytes, list[StoredVersion]]:
    """The stored versions of each of `keys` (keys with none are absent), without envelopes."""
    found: dict[bytes, list[StoredVersion]] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), KEYS_PER_QUERY):
        chunk = unique[start : start + KEYS_PER_QUERY]
        rows = db.execute(
            "SELECT key, seq, node, hlc, vector, digest, length(envelope) FROM versions"
            f" WHERE account = ? AND key IN ({','.join('?' * len(chunk))})",
            (account_id, *chunk),
        )
        for key, seq, node, hlc, vector, digest, size in rows:
            version = StoredVersion(
                seq, node_from_i64(node), hlc, decode_vector(vector), digest, size
            )
            found.setdefault(key, []).append(version)
    return found


@dataclass
class _Push:
    """One push waiting for the group commit, and what became of it."""

    name: str
    envelopes: list[bytes]
    checked: list[Header | Receipt]
    result: PushResult | None = None
    moved: bool = False
    failure: RelayError | None = None
    """Why this push alone was refused."""
    group_failure: BaseException | None = None
    """Why the whole group's transaction failed."""
    done: bool = False


class SQLiteStorage:
    """Relay storage in one SQLite file (created on first open)."""

    def __init__(
        self, path: str | Path, rules: VersionRules, *, new_id: Callable[[], str] = new_random_id
    ) -> None:
        self._path = str(path)
        self._rules = rules
        self._new_id = new_id
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._listeners: list[HeadListener] = []
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._queue: list[_Push] = []
        self._queue_lock = threading.Lock()
        self._writer = self._connect()
        self._writer.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
        self._storage_id, self._secret = self._initialise()

    # -- connections ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def _reader(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._readers_lock:  # not the writer's lock: a read never waits for an fsync
                self._readers.append(db)
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; `BEGIN IMMEDIATE` so it never fails half-way on a lock."""
        with self._write_lock:
            db = self._writer
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every statement inside sees the same snapshot."""
        db = self._reader()
        db.execute("BEGIN")
        try:
            yield db
        finally:
            db.execute("COMMIT")

    def _initialise(self) -> tuple[str, bytes]:
        with self._write() as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(
                    "INSERT INTO meta VALUES ('storage_id', ?), ('secret', ?)",
                    (self._new_id().encode(), secrets.token_bytes(32)),
                )
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise InvalidArgumentError(
                    f"{self._path} is relay schema {version}; this relay reads {SCHEMA_VERSION}"
                )
            meta = dict(db.execute("SELECT name, value FROM meta"))
        return bytes(meta["storage_id"]).decode(), bytes(meta["secret"])

    @property
    def storage_id(self) -> str:
        return self._storage_id

    @property
    def secret(self) -> bytes:
        return self._secret

    def close(self) -> None:
        with self._write_lock:
            self._writer.close()
            for db in self._readers:
                db.close()

    # -- accounts ---------------------------------------------------------------------------

    def create_account(
        self,
        account: AccountRecord,
        device: Device,
        tokens: list[TokenRecord],
        invite_hash: bytes | None,
        now_ms: int,
    ) -> RelayState:
        with self._write() as db:
            # the invite first (an existing name rolls its use back): without a usable invite,
            # a taken name and a free one look alike
            if invite_hash is not None:
                used = db.execute(
                    "DELETE FROM invites WHERE hash = ? AND expires_ms >= ?", (invite_hash, now_ms)
                ).rowcount
                if not used:
                    raise ForbiddenError("the invite is unknown, used or expired")
            if db.execute("SELECT 1 FROM accounts WHERE name = ?", (account.name,)).fetchone():
                raise AccountExistsError(f"account {account.name!r} already exists")
            epoch = self._new_id()
            account_id = db.execute(
                "INSERT INTO accounts (name, auth_hash, recovery_hash, kdf, bundle,"
                " bundle_version, created_ms, epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    account.name,
                    account.auth_hash,
                    account.recovery_hash,
                    encode_message(account.kdf),
                    account.bundle,
                    account.bundle_version,
                    account.created_ms,
                    epoch,
                ),
            ).lastrowid
            assert account_id is not None
            self._insert_device(db, account_id, device, tokens)
        return RelayState(self._storage_id, epoch, 0)

    @staticmethod
    def _insert_device(
        db: sqlite3.Connection, account_id: int, device: Device, tokens: list[TokenRecord]
    ) -> None:
        db.execute(
            "INSERT INTO devices VALUES (?, ?, ?, ?)",
            (account_id, device.id, device.name, device.created_ms),
        )
        db.executemany(
            "INSERT INTO tokens VALUES (?, ?, ?, ?, ?)",
            [(t.hash, account_id, t.device_id, t.kind, t.expires_ms) for t in tokens],
        )

    def _account_id(self, db: sqlite3.Connection, name: str) -> int:
        row = db.execute("SELECT id FROM accounts WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFoundError("no such account")
        return int(row[0])

    def account(self, name: str) -> AccountRecord | None:
        with self._read() as db:
            row = db.execute(
                "SELECT name, auth_hash, recovery_hash, kdf, bundle, bundle_version, created_ms"
                " FROM accounts WHERE name = ?",
                (name,),
            ).fetchone()
        if row is None:
            return None
        kdf = decode_message(row[3], KdfParams)
        return AccountRecord(row[0], row[1], row[2], kdf, row[4], row[5], row[6])

    def delete_account(self, name: str) -> bool:
        with self._write() as db:
            return db.execute("DELETE FROM accounts WHERE name = ?", (name,)).rowcount > 0

    def put_key_bundle(
        self, name: str, expected_version: int, bundle: bytes, kdf: KdfParams, auth_hash: bytes
    ) -> int | None:
        with self._write() as db:
            changed = db.execute(
                "UPDATE accounts SET bundle = ?, kdf = ?, auth_hash = ?,"
                " bundle_version = bundle_version + 1 WHERE name = ? AND bundle_version = ?",
                (bundle, encode_message(kdf), auth_hash, name, expected_version),
            ).rowcount
        return expected_version + 1 if changed else None

    def add_invite(self, invite_hash: bytes, expires_ms: int) -> None:
        with self._write() as db:
            db.execute("DELETE FROM invites WHERE expires_ms < ?", (self._rules.clock_ms(),))
            db.execute("INSERT INTO invites VALUES (?, ?)", (invite_hash, expires_ms))

    def accounts(self) -> list[AccountSummary]:
        with self._read() as db:
            rows = db.execute(
                "SELECT a.name, a.created_ms,"
                " (SELECT count(*) FROM devices d WHERE d.account = a.id),"
                " (SELECT count(*) FROM versions v WHERE v.account = a.id),"
                " a.stored_bytes, a.head FROM accounts a ORDER BY a.name"
            ).fetchall()
        return [AccountSummary(*row) for row in rows]

    # -- devices and tokens -----------------------------------------------------------------

    def add_device(self, name: str, device: Device, tokens: list[TokenRecord]) -> None:
        try:
            with self._write() as db:
                self._insert_device(db, self._account_id(db, name), device, tokens)
        except sqlite3.IntegrityError as exc:
            if not _is_foreign_key_failure(exc):
                raise
            raise NotFoundError("no such device") from exc

    def devices(self, name: str) -> list[Device]:
        with self._read() as db:
            rows = db.execute(
                "SELECT d.id, d.name, d.created_ms FROM devices d JOIN accounts a"
                " ON d.account = a.id WHERE a.name = ? ORDER BY d.id",
                (name,),
            ).fetchall()
        return [Device(*row) for row in rows]

    def rename_device(self, name: str, device_id: str, new_name: str) -> bool:
        if "\0" in device_id:  # no device has one: PostgreSQL TEXT cannot even hold it
            return False
        with self._write() as db:
            return (
                db.execute(
                    "UPDATE devices SET name = ? WHERE id = ?"
                    " AND account = (SELECT id FROM accounts WHERE name = ?)",
                    (new_name, device_id, name),
                ).rowcount
                > 0
            )

    def revoke_device(self, name: str, device_id: str) -> bool:
        """The device's tokens go with it (foreign key, ON DELETE CASCADE)."""
        if "\0" in device_id:  # no device has one: PostgreSQL TEXT cannot even hold it
            return False
        with self._write() as db:
            return (
                db.execute(
                    "DELETE FROM devices WHERE id = ?"
                    " AND account = (SELECT id FROM accounts WHERE name = ?)",
                    (device_id, name),
                ).rowcount
                > 0
            )

    def token(self, token_hash: bytes) -> TokenRecord | None:
        with self._read() as db:
            row = db.execute(
                "SELECT t.hash, a.name, t.device, t.kind, t.expires_ms FROM tokens t"
                " JOIN devices d ON d.account = t.account AND d.id = t.device"
                " JOIN accounts a ON t.account = a.id WHERE t.hash = ?",
                (token_hash,),
            ).fetchone()
        return TokenRecord(*row) if row else None

    def replace_token(
        self, old_hash: bytes, tokens: list[TokenRecord], grace_until_ms: int
    ) -> bool:
        now = self._rules.clock_ms()
        try:
            with self._write() as db:  # the one writer: refreshes and revokes take turns
                row = db.execute(
                    "SELECT account, device, kind, expires_ms FROM tokens WHERE hash = ?",
                    (old_hash,),
                ).fetchone()
                if row is None:
                    return False
                account, device, kind, expires_ms = row
                (latest,) = db.execute(_LATEST_OTHER_SPENT, (account, device, old_hash)).fetchone()
                step = refresh_step(kind, expires_ms, latest, now)
                if step == "refuse":
                    return False
                if step == "spend":
                    db.execute(
                        "UPDATE tokens SET kind = 'spent', expires_ms = ? WHERE hash = ?",
                        (spent_until(grace_until_ms, latest), old_hash),
                    )
                else:  # the reply was lost: the successors it carried were never received
                    db.execute(
                        "DELETE FROM tokens WHERE account = ? AND device = ? AND kind != 'spent'",
                        (account, device),
                    )
                db.executemany(
                    "INSERT INTO tokens VALUES (?, ?, ?, ?, ?)",
                    [(t.hash, account, t.device_id, t.kind, t.expires_ms) for t in tokens],
                )
                db.execute(  # the device's expired tokens go with each refresh
                    "DELETE FROM tokens WHERE account = ? AND device = ? AND expires_ms <= ?",
                    (account, device, now),
                )
                return True
        except sqlite3.IntegrityError as exc:
            if not _is_foreign_key_failure(exc):
                raise
            return False  # a successor for a device that is gone: nothing changed

    # -- versions ---------------------------------------------------------------------------

    def _state(self, db: sqlite3.Connection, name: str) -> tuple[int, RelayState]:
        row = db.execute("SELECT id, epoch, head FROM accounts WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFoundError("no such account")
        return int(row[0]), RelayState(self._storage_id, row[1], row[2])

    def state(self, name: str) -> RelayState:
        with self._read() as db:
            return self._state(db, name)[1]

    def reseed(self, name: str) -> RelayState:
        with self._write() as db:
            db.execute("UPDATE accounts SET epoch = ? WHERE name = ?", (self._new_id(), name))
            return self._state(db, name)[1]

    def stored_versions(self, name: str) -> int:
        with self._read() as db:
            account_id = self._account_id(db, name)
            (count,) = db.execute(
                "SELECT count(*) FROM versions WHERE account = ?", (account_id,)
            ).fetchone()
        return int(count)

    def listen(self, listener: HeadListener) -> None:
        self._listeners.append(listener)

    def push(self, name: str, batch: PushBatch) -> PushResult:
        """Group commit: the push joins a queue; whoever holds the writer next applies every
        queued push (each in its own savepoint) and commits them with one fsync. Headers are
        parsed before the queue, outside the single writer."""
        now_ms = self._rules.clock_ms()
        drift = self._rules.max_drift_ms
        job = _Push(
            name, batch.envelopes, [check_envelope(e, now_ms, drift) for e in batch.envelopes]
        )
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
            for listener in self._listeners:
                listener(name, job.result.state.head)
        return job.result

    def _commit_queued(self) -> None:
        """Apply every queued push in one transaction. A push refused on its own (quota,
        account gone) is rolled back to its savepoint and the others go on; when the
        transaction itself fails, nothing of the group is committed, so every push fails."""
        with self._queue_lock:
            jobs, self._queue = self._queue, []
        db = self._writer
        try:
            db.execute("BEGIN IMMEDIATE")
            for job in jobs:
                db.execute("SAVEPOINT push")
                try:
                    job.result, job.moved = self._apply(db, job)
                except RelayError as exc:  # this push only (over quota, account gone)
                    db.execute("ROLLBACK TO push")
                    job.failure = exc
                db.execute("RELEASE push")
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            for job in jobs:  # nothing of the group was committed: no receipt may go out
                job.result, job.group_failure = None, exc
            raise
        finally:
            for job in jobs:
                job.done = True

    def _apply(self, db: sqlite3.Connection, job: _Push) -> tuple[PushResult, bool]:
        """One push inside the group's transaction: receipts, and whether the head moved.

        The stored versions of every key in the batch are read in one query, the batch is
        decided in memory (`PushPlan`), and what stays is written with one statement per
        table."""
        row = db.execute(
            "SELECT id, epoch, head, stored_bytes FROM accounts WHERE name = ?", (job.name,)
        ).fetchone()
        if row is None:
            raise NotFoundError("no such account")
        account_id, epoch, before, stored_bytes = row
        keys = [header.key for header in job.checked if isinstance(header, Header)]
        plan = PushPlan(before, stored_bytes, _stored_versions(db, account_id, keys))
        receipts = [
            h if isinstance(h, Receipt) else plan.add(h, e)
            for h, e in zip(job.checked, job.envelopes, strict=True)
        ]
        if is_over_quota(plan.stored_bytes, stored_bytes, self._rules.max_account_bytes):
            raise QuotaExceededError(
                f"the batch would take the account past its quota of "
                f"{self._rules.max_account_bytes} bytes"
            )
        db.executemany(
            "DELETE FROM versions WHERE account = ? AND seq = ?",
            [(account_id, seq) for seq in plan.deleted],
        )
        db.executemany(
            "INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (account_id, seq, h.key, node_to_i64(h.node), h.hlc, h.vector_bytes, digest, e)
                for seq, (h, e, digest) in plan.inserted.items()
            ],
        )
        db.execute(
            "UPDATE accounts SET head = ?, stored_bytes = ? WHERE id = ?",
            (plan.head, plan.stored_bytes, account_id),
        )
        state = RelayState(self._storage_id, epoch, plan.head)
        return PushResult(receipts, state), plan.head != before

    def pull(self, name: str, cursor: int, limit: int | None = None) -> Page:
        count = page_bounds(cursor, limit, self._rules.page_size)
        with self._read() as db:
            account_id, state = self._state(db, name)
            sizes = db.execute(
                "SELECT seq, length(envelope) FROM versions WHERE account = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (account_id, cursor, count + 1),
            ).fetchall()
            kept, has_more = cut_page(sizes, count, self._rules.max_page_bytes)
            rows = db.execute(
                "SELECT seq, envelope FROM versions WHERE account = ? AND seq > ? AND seq <= ?"
                " ORDER BY seq",
                (account_id, cursor, sizes[kept - 1][0] if kept else cursor),
            ).fetchall()
        entries = [PageEntry(seq, envelope) for seq, envelope in rows]
        next_cursor = entries[-1].seq if has_more else max(state.head, cursor)
        return Page(cursor, entries, next_cursor, has_more, state)
