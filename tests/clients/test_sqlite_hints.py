"""The hint under a SQLite error the command line shows: it names what to do about a disk
that failed or filled up, a file another process holds, or a file that is not what it
should be (it once said "another process may hold the replica" for all three)."""

from __future__ import annotations

import resource
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from clients.cli.console import sqlite_hint


def raised(action: Callable[[], object]) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        action()
    return caught.value


def test_a_full_disk_a_held_file_and_a_wrong_file_each_get_their_hint(tmp_path: Path) -> None:
    path = tmp_path / "file.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("CREATE TABLE t (v BLOB)")
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size, hard))
        try:  # Python ignores SIGXFSZ: a write past the ceiling fails with EFBIG
            full = raised(lambda: db.execute("INSERT INTO t VALUES (zeroblob(100000))"))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        db.execute("BEGIN IMMEDIATE")
        with closing(sqlite3.connect(path, timeout=0)) as other:
            held = raised(lambda: other.execute("INSERT INTO t VALUES (1)"))
        db.execute("ROLLBACK")
        wrong = raised(lambda: db.execute("SELECT * FROM versions"))
    assert "disk failed or is full" in sqlite_hint(full)
    assert "another process holds the file" in sqlite_hint(held)
    assert "sealsync diagnose" in sqlite_hint(wrong)
