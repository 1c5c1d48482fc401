"""The schema is sealed in the replica file (specs/replica.md §4): collection names are the
app's own words, so a stolen file or backup must not show them.

Each test reads the file's raw bytes (the database, its WAL and shared memory) for a
collection name no other part of the file could hold by chance.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from replica import Collection, Replica, Schema
from replica.errors import ReplicaClosedError, ReplicaLockedError, StoreError
from replica.generations import bundle_v2_from_bytes, open_with_generation_key
from replica.keys import hkdf
from replica.schema import schema_to_bytes
from tests.conftest import PASSPHRASE, Account
from tests.replica.helpers import undo_formats_6_to_10

SECRET_NAME = "xq_private_diary"
SECRET_SCHEMA = Schema((Collection(SECRET_NAME, "lww"), Collection("notes", "lww")))


def file_bytes(path: Path) -> bytes:
    """Everything on disk for one replica: the file, its WAL and its shared memory."""
    parts = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    return b"".join(p.read_bytes() for p in parts if p.exists())


def shows_the_name(path: Path) -> bool:
    return SECRET_NAME.encode() in file_bytes(path)


def document_of(replica: Replica, id: str) -> object:
    record = replica.get(SECRET_NAME, id)
    assert record is not None
    return record.document


def test_a_created_replica_never_writes_its_schema_in_clear(tmp_path: Path) -> None:
    path = tmp_path / "created.db"
    replica, _ = Replica.create(path, SECRET_SCHEMA, PASSPHRASE)
    replica.put(SECRET_NAME, "d1", {"text": "dear diary"})
    assert not shows_the_name(path)
    replica.close()
    assert not shows_the_name(path)
    with Replica.open(path) as again:
        again.unlock(PASSPHRASE)
        assert again.schema == SECRET_SCHEMA
        assert document_of(again, "d1") == {"text": "dear diary"}


def test_the_schema_is_known_only_while_unlocked(tmp_path: Path, account: Account) -> None:
    path = tmp_path / "r.db"
    Replica.join(path, account.bundle, schema=SECRET_SCHEMA).close()
    replica = Replica.open(path)
    with pytest.raises(ReplicaLockedError):
        _ = replica.schema
    replica.unlock_with_key(account.key)
    assert replica.schema == SECRET_SCHEMA
    replica.lock()
    with pytest.raises(ReplicaLockedError):
        _ = replica.schema
    replica.close()
    with pytest.raises(ReplicaClosedError):
        _ = replica.schema


def test_a_join_seals_its_schema_at_the_first_unlock_and_scrubs_the_clear_copy(
    tmp_path: Path, account: Account
) -> None:
    """Joining is locked, so the given schema waits in clear; the first unlock seals it and
    overwrites the clear bytes in the file and in its WAL."""
    path = tmp_path / "joined.db"
    replica = Replica.join(path, account.bundle, schema=SECRET_SCHEMA)
    assert shows_the_name(path)  # the one documented window
    replica.unlock_with_key(account.key)
    assert not shows_the_name(path)
    assert replica.schema == SECRET_SCHEMA
    replica.put(SECRET_NAME, "d1", {"text": "kept"})
    replica.close()
    assert not shows_the_name(path)


def sealed_replica(path: Path, account: Account) -> Path:
    """A joined replica whose first unlock has sealed its schema, with one record."""
    with Replica.join(path, account.bundle, schema=SECRET_SCHEMA) as replica:
        replica.unlock_with_key(account.key)
        replica.put(SECRET_NAME, "d1", {"text": "from before"})
    return path


def meta_schema(path: Path) -> bytes:
    with sqlite3.connect(path) as db:
        (value,) = db.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        return bytes(value)


def set_meta_schema(path: Path, value: bytes, *, format: int | None = None) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema'", (value,))
        if format is not None:  # laid out as that format was
            undo_formats_6_to_10(db)
            db.execute(f"PRAGMA user_version = {format}")


def test_a_file_of_format_2_has_its_clear_schema_sealed_at_the_next_unlock(
    tmp_path: Path, account: Account
) -> None:
    path = sealed_replica(tmp_path / "old.db", account)
    set_meta_schema(path, schema_to_bytes(SECRET_SCHEMA), format=2)  # as format 2 kept it
    with Replica.open(path) as replica:
        replica.unlock_with_key(account.key)
        assert not shows_the_name(path)
        assert replica.schema == SECRET_SCHEMA
        assert document_of(replica, "d1") == {"text": "from before"}


def test_a_damaged_sealed_schema_refuses_the_unlock_and_changes_nothing(
    tmp_path: Path, account: Account
) -> None:
    path = sealed_replica(tmp_path / "damaged.db", account)
    sealed = meta_schema(path)
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    set_meta_schema(path, flipped)
    with Replica.open(path) as replica:
        with pytest.raises(StoreError, match="does not open with this account's key"):
            replica.unlock_with_key(account.key)
        assert replica.is_locked
    assert meta_schema(path) == flipped


def test_the_sealed_schema_opens_with_the_primitives_the_spec_names(
    tmp_path: Path, account: Account
) -> None:
    """specs/replica.md §3: AES-256-GCM under HKDF(scope key, "sealsync local schema v1"),
    nonce first, associated data "sealsync wrap v1 local schema"; no clear copy is left."""
    path = sealed_replica(tmp_path / "r.db", account)
    sealed = meta_schema(path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT 1 FROM meta WHERE name = 'clear_schema'").fetchone() is None
    bundle = bundle_v2_from_bytes(account.bundle)
    scope_key = open_with_generation_key(bundle, account.key).secrets.scope_key  # stored
    key = hkdf(scope_key, b"sealsync local schema v1")
    plain = AESGCM(key).decrypt(sealed[:12], sealed[12:], b"sealsync wrap v1 local schema")
    assert msgspec.msgpack.decode(plain) == msgspec.msgpack.decode(schema_to_bytes(SECRET_SCHEMA))
