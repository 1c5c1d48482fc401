"""Giving a replica file's free pages back to the disk (specs/replica.md §1).

Deleting keeps a file's size: SQLite keeps the pages it freed for later writes. After much
was deleted, and its tombstones collected (replica/collected.py), `compact` rewrites the
file without them (SQLite's `VACUUM`) and empties the WAL. It needs no key (pages are
copied as they are, ciphertext and all) and as much free disk as the file holds; it takes
the write lock for as long as it runs, so another process's writes wait, up to the busy
timeout, and then it is refused whole: the file is never left half-rewritten.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from replica.core import Core
from replica.errors import InvalidArgumentError, StoreError


@dataclass(frozen=True)
class Compacted:
    """The file's bytes (with its WAL) before and after."""

    before: int
    after: int


def file_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def compact(core: Core) -> Compacted:
    store = core.store
    if store.in_transaction:
        raise InvalidArgumentError("compact cannot run inside batch()")
    before = file_bytes(store.path)
    try:
        store.db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a file made before converts
        store.db.execute("VACUUM")
        store.checkpoint_truncate()
    except sqlite3.Error as exc:
        raise StoreError(
            f"could not compact {store.path}: {exc}",
            hint="stop the other processes that use the file (sync --watch), and check that "
            "the disk has as much free space as the file takes",
        ) from exc
    return Compacted(before, file_bytes(store.path))
