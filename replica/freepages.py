"""Free pages: a replica file made in SQLite's incremental auto-vacuum mode gives the pages a
collection run freed back to the disk at once (specs/replica.md §1); one made before keeps
them until `compact` (replica/compaction.py) rewrites and converts it."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

INCREMENTAL = 2
"""`PRAGMA auto_vacuum`'s value for incremental auto-vacuum."""


def is_empty_file(path: str | Path) -> bool:
    """No file yet, or one of no bytes: SQLite is about to make a new database there."""
    try:
        return os.stat(path).st_size == 0
    except FileNotFoundError:
        return True


def give_back_free_pages(db: sqlite3.Connection) -> None:
    """In a write transaction that deleted rows: a file in incremental auto-vacuum mode moves
    its free pages to its end, cut off at commit, so the disk gets the space back; a file of
    another mode keeps them for later writes, and `compact` gives them back (and converts
    it). Each step of the pragma frees one page (`execute` takes one step)."""
    (mode,) = db.execute("PRAGMA auto_vacuum").fetchone()
    if mode == INCREMENTAL:
        (free,) = db.execute("PRAGMA freelist_count").fetchone()
        for _ in range(free):
            db.execute("PRAGMA incremental_vacuum(1)")
