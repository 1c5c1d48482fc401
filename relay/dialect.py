"""The seam between the relay's SQL, written once (`relay.sql`), and each database.

A backend gives a `Transaction`: it runs statements written in `relay.sql`'s form — `?`
placeholders, PostgreSQL's row-lock clauses, `= ANY(?)` for a list of values — rewriting them
for its database (placeholders; dropping a row lock SQLite's single writer makes needless; a
list as one array on PostgreSQL, as chunks of `IN (?, …)` on SQLite) but never restating
them, and inserts versions its fastest way. `SCHEMA` is the tables of both, with each database's
column types filled in from its `Types`.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value {bytes} NOT NULL){strict};
CREATE TABLE accounts (
    id {serial},
    name TEXT NOT NULL UNIQUE,
    auth_hash {bytes} NOT NULL,
    recovery_hash {bytes} NOT NULL,
    kdf {bytes} NOT NULL,
    bundle {bytes} NOT NULL,
    bundle_version {int} NOT NULL,
    created_ms {int} NOT NULL,
    epoch TEXT NOT NULL,
    head {int} NOT NULL DEFAULT 0,
    stored_bytes {int} NOT NULL DEFAULT 0
){strict};
CREATE TABLE devices (
    account {int} NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    id TEXT NOT NULL,
    name TEXT NOT NULL,
    created_ms {int} NOT NULL,
    PRIMARY KEY (account, id)
){strict};
-- a token belongs to a live device: revoking the device deletes it, and a refresh racing
-- the revoke cannot insert a successor for the device afterwards
CREATE TABLE tokens (
    hash {bytes} PRIMARY KEY,
    account {int} NOT NULL,
    device TEXT NOT NULL,
    kind TEXT NOT NULL,
    expires_ms {int} NOT NULL,
    FOREIGN KEY (account, device) REFERENCES devices(account, id) ON DELETE CASCADE
){strict};
CREATE INDEX tokens_by_device ON tokens (account, device);
CREATE TABLE invites (hash {bytes} PRIMARY KEY, expires_ms {int} NOT NULL){strict};
CREATE TABLE versions (
    account {int} NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    seq {int} NOT NULL,
    key {bytes} NOT NULL,
    node {int} NOT NULL,
    hlc {int} NOT NULL,
    vector {bytes} NOT NULL,
    digest {bytes} NOT NULL,
    envelope {bytes} NOT NULL,
    PRIMARY KEY (account, seq)
){strict};
CREATE INDEX versions_by_key ON versions (account, key)
"""
"""The tables of both databases as first made; a backend fills in its column types (`Types`)."""
LOGIN_FAILURES = """
-- failed logins per (account name, client address), for names that exist or not alike: in
-- the database, so that no relay process forgets them and no flood of names evicts one
CREATE TABLE login_failures (
    name TEXT NOT NULL,
    address TEXT NOT NULL,
    at_ms {int} NOT NULL
){strict};
CREATE INDEX login_failures_by_name ON login_failures (name, at_ms);
CREATE INDEX login_failures_by_time ON login_failures (at_ms)
"""
PUSH_COUNTERS = """
-- the highest signed-push counter each device used: a captured push cannot be sent again
ALTER TABLE devices ADD COLUMN push_counter {int} NOT NULL DEFAULT 0
"""
REVOKED_TOKENS = """
-- the tokens a device held when it was revoked: it is told so, not only that its session ended
CREATE TABLE revoked_tokens (
    hash {bytes} PRIMARY KEY,
    account {int} NOT NULL REFERENCES accounts(id) ON DELETE CASCADE
){strict}
"""
ACKS_AND_TOMBSTONES = """
-- the pull cursor each device last acknowledged in a signed push, and when (relay clock)
ALTER TABLE devices ADD COLUMN ack_seq {int};
ALTER TABLE devices ADD COLUMN ack_ms {int};
-- whether a version is a tombstone, as the signed push that stored or re-sent it declared
ALTER TABLE versions ADD COLUMN tomb {int} NOT NULL DEFAULT 0;
CREATE INDEX versions_tombs ON versions (account, seq) WHERE tomb = 1
"""
COLLECTION = """
-- tombstone collection runs (docs/tombstone-collection.md §2): each takes a seq of its
-- account's and keeps the dots it deleted, as markers for devices to drop the same tombstones
-- and as ghosts that refuse a re-push of what they covered, until every device pulled past it
CREATE TABLE collect_runs (
    account {int} NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    seq {int} NOT NULL,
    at_ms {int} NOT NULL,
    ack_floor {int} NOT NULL,
    versions {int} NOT NULL,
    bytes {int} NOT NULL,
    PRIMARY KEY (account, seq)
){strict};
CREATE TABLE collected (
    account {int} NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    key {bytes} NOT NULL,
    node {int} NOT NULL,
    hlc {int} NOT NULL,
    vector {bytes} NOT NULL,
    seq {int} NOT NULL,
    PRIMARY KEY (account, key, node, hlc)
){strict};
CREATE INDEX collected_by_run ON collected (account, seq);
-- what the account's runs collected to date
ALTER TABLE accounts ADD COLUMN collected_versions {int} NOT NULL DEFAULT 0;
ALTER TABLE accounts ADD COLUMN collected_bytes {int} NOT NULL DEFAULT 0
"""
RESYNC = """
-- a device that must pull everything again before it pushes or pulls as usual, and when
-- its full resync began (docs/tombstone-collection.md §3), and the account's latest run
ALTER TABLE devices ADD COLUMN resync {int} NOT NULL DEFAULT 0;
ALTER TABLE devices ADD COLUMN resync_ms {int};
ALTER TABLE accounts ADD COLUMN last_run_seq {int} NOT NULL DEFAULT 0;
UPDATE accounts SET last_run_seq = head WHERE collected_versions > 0
"""
SCHEMA_STEPS = (
    SCHEMA,
    LOGIN_FAILURES,
    PUSH_COUNTERS,
    REVOKED_TOKENS,
    ACKS_AND_TOMBSTONES,
    COLLECTION,
    RESYNC,
)
"""Step n makes a database of schema n - 1 one of schema n; a new one runs them all."""
SCHEMA_VERSION = len(SCHEMA_STEPS)

VERSION_COLUMNS = "account, seq, key, node, hlc, vector, digest, envelope, tomb"


class Types(NamedTuple):
    """The column types of one database, for `SCHEMA`."""

    int: str
    bytes: str
    serial: str
    """An auto-numbered integer primary key."""
    strict: str
    """What follows a table's definition."""


VersionRow = tuple[int, int, bytes, int, int, bytes, bytes, bytes, int]
"""One row of the versions table, in `VERSION_COLUMNS` order (account, seq, key, node, hlc,
vector, digest, envelope, tomb). A plain tuple, not a NamedTuple: a push builds thousands, and
sqlite3 binds an exact tuple without going through the sequence protocol (measured here:
a 4000-envelope push took 7 to 10% longer with NamedTuple rows)."""


class Transaction(ABC):
    """One open transaction of a backend, running statements written in this module's form."""

    @abstractmethod
    def one(self, statement: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """The first row, or None."""

    @abstractmethod
    def all(self, statement: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def run(self, statement: str, params: Sequence[object] = ()) -> int:
        """Run a statement; the number of rows it changed."""

    @abstractmethod
    def run_many(self, statement: str, rows: Sequence[Sequence[object]]) -> None: ...

    @abstractmethod
    def all_in(
        self, statement: str, params: Sequence[object], values: Sequence[object]
    ) -> list[tuple[Any, ...]]:
        """The rows of a statement whose last parameter, in `= ANY(?)`, stands for `values`."""

    @abstractmethod
    def run_in(self, statement: str, params: Sequence[object], values: Sequence[object]) -> None:
        """Run a statement whose last parameter, in `= ANY(?)`, stands for `values`."""

    @abstractmethod
    def insert_versions(self, rows: list[VersionRow]) -> None:
        """Insert new versions the database's fastest way."""

    @abstractmethod
    def announce(self, name: str, head: int) -> None:
        """Tell other relay processes of a new head, as part of this transaction."""

    @abstractmethod
    def give_back_free_pages(self) -> None:
        """After rows were deleted in this transaction: the disk gets their space back, where
        the database gives it (a collection run's)."""


def upgrade_tables(tx: Transaction, types: Types, version: int) -> None:
    """Bring the tables of a database of schema `version` to `SCHEMA_VERSION`."""
    for step in SCHEMA_STEPS[version:]:
        for statement in step.format(**types._asdict()).split(";"):
            if statement.strip():
                tx.run(statement)


def create_tables(tx: Transaction, types: Types, new_id: Callable[[], str]) -> None:
    """Make the tables and the meta rows of a new database."""
    upgrade_tables(tx, types, 0)
    tx.run(
        "INSERT INTO meta (name, value) VALUES ('storage_id', ?), ('secret', ?)",
        (new_id().encode(), secrets.token_bytes(32)),
    )


def read_meta(tx: Transaction) -> tuple[str, bytes]:
    """The storage id and secret of a database."""
    meta: dict[str, bytes] = dict(tx.all("SELECT name, value FROM meta"))
    return meta["storage_id"].decode(), meta["secret"]
