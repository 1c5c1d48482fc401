"""Relay fixtures: every storage backend behind one factory, so one suite runs on all."""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from relay.memory import MemoryRelay
from relay.postgres import PostgresStorage
from relay.sqlite import SQLiteStorage
from relay.storage import AccountRecord, Device, Storage, TokenRecord, VersionRules
from replica.wire import KdfParams, encode_header
from tests.conftest import FakeClock, unavailable

NOW_MS = 1_800_000_000_000
HLC = NOW_MS << 16
BACKENDS = ["memory", "sqlite", "postgres"]
POSTGRES_URL = os.environ.get(
    "SEALSYNC_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)

OPEN_POSTGRES_STORAGES = 4
"""Older ones are closed early: a hypothesis test makes one per example and uses only the
last, and each holds a server connection (PostgreSQL allows 100 by default)."""

StorageFactory = Callable[..., Storage]


def envelope(
    key: bytes, node: int, hlc: int, vector: dict[int, int], body: bytes = b"", epoch: int = 0
) -> bytes:
    """A header the relay can read and an opaque body it never opens."""
    return encode_header(epoch, key, hlc, node, vector) + (body or os.urandom(44))


def account_record(name: str, created_ms: int = NOW_MS) -> AccountRecord:
    digest = hashlib.sha256(name.encode()).digest()
    return AccountRecord(name, digest, digest[::-1], KdfParams(b"s" * 16), b"bundle", 1, created_ms)


def register(storage: Storage, name: str, device_id: str = "d1") -> None:
    """An account with one device and an access token whose hash is sha256(name + device)."""
    token = TokenRecord(
        hashlib.sha256(f"{name}/{device_id}".encode()).digest(), name, device_id, "access", NOW_MS
    )
    storage.create_account(
        account_record(name), Device(device_id, "laptop", NOW_MS), [token], None, NOW_MS
    )


@functools.cache
def _postgres_error() -> str | None:
    """Why the test server cannot be reached, or None; asked once per session."""
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip()
    return None


def postgres_url() -> str:
    """The test server: a skip on a machine without one, a failure in CI (never a silent pass)."""
    error = _postgres_error()
    if error is not None:
        where = conninfo_to_dict(POSTGRES_URL)  # the message names no password
        message = (
            f"PostgreSQL {where.get('host')}:{where.get('port')}/{where.get('dbname')} is "
            f"unreachable ({error}); set SEALSYNC_TEST_POSTGRES_URL to a server tests may use"
        )
        unavailable(message)
    return POSTGRES_URL


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A schema name no other test uses; the schema (made by the storage) is dropped after."""
    name = f"test_{secrets.token_hex(8)}"
    try:
        yield name
    finally:
        with psycopg.connect(postgres_url(), autocommit=True) as db:
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(params=BACKENDS)
def make_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Build storages of the parametrized backend; each is closed after the test. With
    `reopen`, the new storage holds the data of that earlier one (its file, its schema, or a
    copy for memory) under the new bounds, as after an operator changed the configuration."""
    made: list[Storage] = []
    database_by_storage: dict[int, str] = {}
    kind = request.param
    schemas = ExitStack()
    if kind == "postgres":
        postgres_url()

    def make(
        *,
        clock: FakeClock | None = None,
        page_size: int = 3,
        max_account_bytes: int = 1 << 30,
        max_page_bytes: int = 1 << 20,
        reopen: Storage | None = None,
    ) -> Storage:
        # the storage contract is tested on version-1 accounts (`account_record`), whose
        # pushes go unsigned; signing: tests/relay/test_signed_push.py
        rules = VersionRules(
            clock or FakeClock(NOW_MS), 5 * 60_000, page_size, max_account_bytes, max_page_bytes,
            accept_unsigned_pushes=True,
        )  # fmt: skip
        storage: Storage
        database = database_by_storage[id(reopen)] if reopen else None
        if kind == "memory":
            storage = MemoryRelay(
                clock_ms=rules.clock_ms,
                page_size=page_size,
                max_account_bytes=max_account_bytes,
                max_page_bytes=max_page_bytes,
                accept_unsigned_pushes=True,
            )
            if isinstance(reopen, MemoryRelay):
                storage.restore(reopen.snapshot())
        elif kind == "sqlite":
            database = database or str(tmp_path / f"relay{len(made)}.db")
            storage = SQLiteStorage(database, rules)
        else:
            database = database or schemas.enter_context(fresh_schema())
            storage = PostgresStorage(postgres_url(), rules, schema=database)
            if len(made) >= OPEN_POSTGRES_STORAGES:
                made[-OPEN_POSTGRES_STORAGES].close()
        made.append(storage)
        database_by_storage[id(storage)] = database or ""
        return storage

    with schemas:
        yield make
        for storage in made:
            storage.close()
