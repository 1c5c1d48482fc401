"""Baselines: what plain sqlite3 and AES-GCM do with no engine around them."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from harness import (
    DOCUMENT_BYTES,
    Bench,
    Line,
    benchmark,
    best_seconds,
    check_equal,
    no_check,
)

# ---- plain sqlite3 and AES-GCM: the baselines -----------------------------------------------


def connect_wal(path: Path) -> sqlite3.Connection:
    """A connection set up as the replica's: WAL, synchronous=FULL, explicit transactions."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db


def random_rows(n: int, value_bytes: int) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(16), os.urandom(value_bytes)) for _ in range(n)]


KV_TABLE = "CREATE TABLE kv (key BLOB PRIMARY KEY, value BLOB NOT NULL)"


def sqlite_upsert_line(bench: Bench, name: str, create_table: str) -> Line:
    """Rows/s of one executemany upsert of N random-keyed rows into an empty table."""
    n = bench.sizes.sqlite_rows
    rows = random_rows(n, DOCUMENT_BYTES)

    def prepare() -> sqlite3.Connection:
        db = connect_wal(bench.path("sqlite-upsert"))
        db.execute(create_table)
        return db

    def run(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO kv (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            rows,
        )
        db.execute("COMMIT")

    def verify(db: sqlite3.Connection) -> None:
        check_equal(f"{name} rows", db.execute("SELECT count(*) FROM kv").fetchone()[0], n)
        db.close()

    seconds = best_seconds(bench, bench.sizes.repeats, prepare, run, verify)
    return Line(name, n / seconds, "rows/s", extra={"n": n})


@benchmark("raw.sqlite_upsert")
def bench_sqlite_upsert(bench: Bench) -> list[Line]:
    """What SQLite alone does: one executemany upsert of N ~500-byte rows, ordinary table."""
    return [sqlite_upsert_line(bench, "raw.sqlite_upsert", KV_TABLE)]


@benchmark("raw.sqlite_upsert_without_rowid", needs=("raw.sqlite_upsert",))
def bench_sqlite_upsert_without_rowid(bench: Bench) -> list[Line]:
    """The same into a WITHOUT ROWID table, as the replica's `versions` table is declared.

    SQLite advises WITHOUT ROWID only for rows under ~1/20 of a page; envelopes are larger,
    and random keys then split wide leaf pages. This line shows what that costs.
    """
    line = sqlite_upsert_line(bench, "raw.sqlite_upsert_without_rowid", KV_TABLE + " WITHOUT ROWID")
    return [replace(line, baseline="raw.sqlite_upsert")]


def seal_many(aead: AESGCM, plaintexts: Sequence[bytes], ad: bytes) -> list[bytes]:
    """nonce ‖ ciphertext ‖ tag for each plaintext, as an envelope carries them."""
    out = []
    for plaintext in plaintexts:
        nonce = os.urandom(12)
        out.append(nonce + aead.encrypt(nonce, plaintext, ad))
    return out


def open_all(aead: AESGCM, sealed: Sequence[bytes], ad: bytes) -> None:
    for data in sealed:
        aead.decrypt(data[:12], data[12:], ad)


@benchmark("raw.aesgcm_open")
def bench_aesgcm_open(bench: Bench) -> list[Line]:
    """What AES-256-GCM alone costs per ~500-byte ciphertext, Python call overhead included."""
    n = bench.sizes.aead_ops
    aead = AESGCM(AESGCM.generate_key(256))
    ad = os.urandom(72)  # an envelope header with one vector entry, plus the account id
    sealed = seal_many(aead, [os.urandom(DOCUMENT_BYTES - 28) for _ in range(n)], ad)
    seconds = best_seconds(
        bench, bench.sizes.repeats, lambda: None, lambda _: open_all(aead, sealed, ad), no_check
    )
    return [Line("raw.aesgcm_open", n / seconds, "ops/s", extra={"n": n, "bytes": len(sealed[0])})]


@dataclass(frozen=True)
class UpsertData:
    """Inbound envelopes and the older or newer versions already stored for their keys."""

    aead: AESGCM
    keys: list[bytes]
    inbound: list[bytes]
    stored_hlc: list[int]


INBOUND_HLC = 2000


def make_upsert_data(n: int) -> UpsertData:
    """Even keys hold an older version (1000), odd ones a newer one (3000): half win."""
    aead = AESGCM(AESGCM.generate_key(256))
    keys = [os.urandom(16) for _ in range(n)]
    inbound = [
        seal_many(aead, [os.urandom(DOCUMENT_BYTES - 28)], key + INBOUND_HLC.to_bytes(8, "big"))[0]
        for key in keys
    ]
    stored = [1000 if i % 2 == 0 else 3000 for i in range(n)]
    return UpsertData(aead, keys, inbound, stored)


def prepare_upsert_table(bench: Bench, data: UpsertData) -> sqlite3.Connection:
    db = connect_wal(bench.path("upsert-aead"))
    db.execute(
        "CREATE TABLE versions (key BLOB PRIMARY KEY, hlc INTEGER NOT NULL, envelope BLOB NOT NULL)"
    )
    db.execute("BEGIN IMMEDIATE")
    db.executemany(
        "INSERT INTO versions (key, hlc, envelope) VALUES (?, ?, ?)",
        [(k, h, e) for k, h, e in zip(data.keys, data.stored_hlc, data.inbound, strict=True)],
    )
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def open_and_upsert(db: sqlite3.Connection, data: UpsertData) -> None:
    """Authenticate every envelope, then one upsert that keeps the newer version of each key."""
    rows = []
    decrypt = data.aead.decrypt
    for key, envelope in zip(data.keys, data.inbound, strict=True):
        decrypt(envelope[:12], envelope[12:], key + INBOUND_HLC.to_bytes(8, "big"))
        rows.append((key, INBOUND_HLC, envelope))
    db.execute("BEGIN IMMEDIATE")
    db.executemany(
        "INSERT INTO versions (key, hlc, envelope) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET hlc = excluded.hlc, envelope = excluded.envelope "
        "WHERE excluded.hlc > hlc",
        rows,
    )
    db.execute("COMMIT")


@benchmark("raw.upsert_aead")
def bench_upsert_aead(bench: Bench) -> list[Line]:
    """The floor of a merge: open N sealed envelopes, upsert them where newer (half are)."""
    n = bench.sizes.merge_rows
    data = make_upsert_data(n)

    def verify(db: sqlite3.Connection) -> None:
        won = db.execute("SELECT count(*) FROM versions WHERE hlc = ?", (INBOUND_HLC,)).fetchone()
        check_equal("raw.upsert_aead newer versions stored", won[0], (n + 1) // 2)
        check_equal(
            "raw.upsert_aead rows", db.execute("SELECT count(*) FROM versions").fetchone()[0], n
        )
        db.close()

    seconds = best_seconds(
        bench,
        bench.sizes.merge_repeats,  # as many tries as replica.merge gets: a fair best-of
        lambda: prepare_upsert_table(bench, data),
        lambda db: open_and_upsert(db, data),
        verify,
    )
    extra = {"n": n, "newer": (n + 1) // 2, "envelope_bytes": len(data.inbound[0])}
    return [Line("raw.upsert_aead", n / seconds, "rows/s", extra=extra)]
