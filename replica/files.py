"""The replica file on disk, as made: its owner's alone; and opened read-only.

A new replica is created owner-only before SQLite opens it, so the WAL and shared-memory files
SQLite makes beside it, with the same mode, are too.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
"""A replica file, and the WAL and shared-memory files SQLite makes with its mode: owner only.
They hold only ciphertext, but also which records exist, their sizes and their history."""


def create_private_file(path: Path) -> None:
    """Make `path` an empty file only its owner can read or write (whatever the umask), or
    take an existing empty one down to that mode, before SQLite opens it."""
    descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE)
    try:
        os.fchmod(descriptor, PRIVATE_FILE_MODE)
    finally:
        os.close(descriptor)


def read_only_uri(path: Path) -> str:
    """An SQLite URI that opens `path` read-only, whatever characters its name holds (a `#`
    or `?` in a plain `file:` URI cuts the path short)."""
    return Path(path).resolve().as_uri() + "?mode=ro"
