"""The replica's mutex, which also names what SQLite could not do (specs/replica.md, "A
failing disk").

Every call into a replica holds `Core.mutex`. When SQLite fails under it because the disk
failed or filled up (IOERR, FULL) or its memory ran out (NOMEM: `PRAGMA hard_heap_limit`, or
the machine's), the caller gets a `StoreError` that says so, not a raw `sqlite3` error or a
`MemoryError`: an app (and the CLI's `error:` line) handles one kind of error. Inside a
write transaction the error goes on up unchanged: the transaction rolls back where it
began, and after a disk error opens the file again (`Store._after_failure`), which needs
to see SQLite's own error.
"""

from __future__ import annotations

import sqlite3
import threading
from types import TracebackType

from replica.errors import StoreError, is_disk_error
from replica.store import Store


class StoreMutex:
    """A re-entrant lock (`with mutex:`) over one store."""

    def __init__(self, store: Store) -> None:
        self._lock = threading.RLock()
        self._store = store

    def __enter__(self) -> StoreMutex:
        self._lock.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not self._store.in_transaction:
                _raise_named(self._store, exc)
        finally:
            self._lock.release()


def _raise_named(store: Store, exc: BaseException) -> None:
    """Raise `StoreError` for SQLite's out-of-memory and disk errors; else nothing."""
    if isinstance(exc, MemoryError):
        raise StoreError(
            f"{store.path}: out of memory (SQLite's heap limit or the machine's)",
            hint="a write it stopped was rolled back: free memory or raise the limit, then retry",
        ) from exc
    if isinstance(exc, sqlite3.Error) and is_disk_error(exc):
        name = getattr(exc, "sqlite_errorname", "disk error")
        raise StoreError(
            f"{store.path}: SQLite could not read or write the file ({name}: {exc})",
            hint="check the disk and its free space, then retry",
        ) from exc
