"""The row digests beside a backup: `NAME.rows`, a line per row of the tables whose envelopes
are the records' data, `TABLE KEY_HEX NODE HLC SHA256`, in the order SQLite sorts them by
(key, node, hlc). Written and read as streams, so that a backup of a million records is
described and checked in bounded memory; the manifest keeps the file's SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

DIGESTED_TABLES = ("versions", "history")
"""The tables whose envelopes are the records' data; each envelope's SHA-256 is kept."""
FILE_MODE = 0o600
"""Owner-only, as the backup and its manifest."""
Position = tuple[bytes, int, int]
"""A row's place in the order: (key, node as stored, hlc)."""


ROWS_SUFFIX = ".rows"


def rows_path(backup: Path) -> Path:
    return backup.with_suffix(ROWS_SUFFIX)


def ordered_rows(db: sqlite3.Connection, table: str) -> sqlite3.Cursor:
    """(key, node, hlc, envelope) of every row of `table`, in the digests' order."""
    return db.execute(f"SELECT key, node, hlc, envelope FROM {table} ORDER BY key, node, hlc")


def write_row_digests(db: sqlite3.Connection, path: Path) -> str:
    """Write the digest of every row of `db` to the new file `path`, synced (the caller
    renames it into place); the file's SHA-256."""
    whole = hashlib.sha256()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with open(descriptor, "w", encoding="ascii") as out:
        for table in DIGESTED_TABLES:
            for key, node, hlc, envelope in ordered_rows(db, table):
                if not is_well_typed(key, node, hlc, envelope):
                    continue  # damage the copy holds verbatim: `verify` names it
                digest = hashlib.sha256(envelope).hexdigest()
                line = f"{table} {bytes(key).hex()} {node} {hlc} {digest}\n"
                out.write(line)
                whole.update(line.encode())
        out.flush()
        os.fsync(out.fileno())
    return whole.hexdigest()


def is_well_typed(key: object, node: object, hlc: object, envelope: object) -> bool:
    return (
        isinstance(key, bytes)
        and isinstance(envelope, bytes)
        and type(node) is int
        and type(hlc) is int
    )


def read_row_digests(path: Path, table: str) -> Iterator[tuple[Position, str]]:
    """The digests of `table`'s rows in order; `ValueError` at a line that does not parse."""
    with path.open(encoding="ascii") as lines:
        for line in lines:
            name, key, node, hlc, digest = line.rstrip("\n").split(" ")
            if name == table:
                yield (bytes.fromhex(key), int(node), int(hlc)), digest
