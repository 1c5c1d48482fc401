"""Relay fixtures: every storage backend behind one factory, so one suite runs on all."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay.memory import MemoryRelay
from relay.sqlite import SQLiteStorage
from relay.storage import AccountRecord, Device, Storage, TokenRecord, VersionRules
from replica.wire import KdfParams, encode_header
from tests.conftest import FakeClock

NOW_MS = 1_800_000_000_000
HLC = NOW_MS << 16
BACKENDS = ["memory", "sqlite"]

StorageFactory = Callable[..., Storage]


def envelope(key: bytes, node: int, hlc: int, vector: dict[int, int], body: bytes = b"") -> bytes:
    """A header the relay can read and an opaque body it never opens."""
    return encode_header(0, key, hlc, node, vector) + (body or os.urandom(44))


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


@pytest.fixture(params=BACKENDS)
def make_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Build storages of the parametrized backend; each is closed after the test."""
    made: list[Storage] = []
    kind = request.param

    def make(
        *, clock: FakeClock | None = None, page_size: int = 3, max_account_bytes: int = 1 << 30
    ) -> Storage:
        rules = VersionRules(clock or FakeClock(NOW_MS), 5 * 60_000, page_size, max_account_bytes)
        storage: Storage
        if kind == "memory":
            storage = MemoryRelay(
                clock_ms=rules.clock_ms,
                page_size=page_size,
                max_account_bytes=max_account_bytes,
            )
        else:
            storage = SQLiteStorage(tmp_path / f"relay{len(made)}.db", rules)
        made.append(storage)
        return storage

    yield make
    for storage in made:
        storage.close()
