"""Several processes on one replica file (docs/architecture.md §1): SQLite's lock serializes
them, nothing lost.

Each test starts child processes (`replica_child.py`, not threads: each has its own connection,
its own `Replica` and its own in-process locks), releases them together with `go` on stdin,
and checks the file afterwards. A child that hits SQLITE_BUSY ("database is locked") or any
other error exits non-zero with its traceback, which the test shows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest

from replica import Replica, ReplicaOptions, StoreError
from tests.conftest import Account
from tests.replica.replica_child import (
    BATCH_RECORDS,
    COUNTER_ID,
    batch_document,
    batch_record_id,
    start_child,
)

RECORDS_PER_WRITER = 400
INCREMENTS_PER_WRITER = 300
READER_BATCHES = 300
CHILD_TIMEOUT_S = 60.0


def run_together(children: list[subprocess.Popen[bytes]]) -> list[dict[str, Any]]:
    """Wait until every child is ready, start them at once, and return their result lines."""
    for child in children:
        assert child.stdout is not None
        ready = child.stdout.readline().decode().strip()
        if ready != "ready":
            _, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
            pytest.fail(f"child did not start: {ready!r}\n{stderr.decode()}")
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
    results = []
    for child in children:
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
        assert child.returncode == 0 and not stderr, (
            f"child exited with {child.returncode}:\n{stderr.decode()}"
        )
        (line,) = stdout.decode().splitlines()
        assert line.startswith("result ")
        results.append(json.loads(line.removeprefix("result ")))
    return results


def assert_overlapped(results: list[dict[str, Any]]) -> None:
    """The children really ran at the same time (else the test would prove nothing)."""
    assert max(r["started"] for r in results) < min(r["ended"] for r in results), results


def integrity_of(path: Path) -> list[tuple[str]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("PRAGMA integrity_check").fetchall()


@pytest.fixture
def replica_path(tmp_path: Path, account: Account) -> Path:
    path = tmp_path / "shared.db"
    Replica.join(path, account.bundle).close()
    return path


@pytest.mark.slow
def test_processes_writing_one_file_lose_no_record_and_no_increment(
    replica_path: Path, account: Account
) -> None:
    writers = ["alpha", "beta"]
    with ExitStack() as stack:
        children = [
            stack.enter_context(
                start_child(
                    "writer",
                    replica_path,
                    account.key,
                    who,
                    RECORDS_PER_WRITER,
                    INCREMENTS_PER_WRITER,
                )
            )
            for who in writers
        ]
        assert_overlapped(run_together(children))

    assert integrity_of(replica_path) == [("ok",)]
    with Replica.open(replica_path) as replica:
        replica.unlock_with_key(account.key)
        documents = {r.id: r.document for r in replica.scan("notes")}
        counter = replica.get("notes", COUNTER_ID)
        assert replica.status().conflicts == 0
    expected = {
        f"{who}-{n:05}": {"who": who, "n": n} for who in writers for n in range(RECORDS_PER_WRITER)
    }
    expected[COUNTER_ID] = {"n": 2 * INCREMENTS_PER_WRITER}
    assert documents == expected
    assert counter is not None and counter.conflicts == ()


@pytest.mark.slow
def test_processes_reading_while_another_writes_see_whole_batches_and_no_error(
    replica_path: Path, account: Account
) -> None:
    total = READER_BATCHES * BATCH_RECORDS
    with (
        start_child("batch-writer", replica_path, account.key, READER_BATCHES) as writer,
        start_child("reader", replica_path, account.key, total) as reader,
    ):
        written, read = run_together([writer, reader])
    assert_overlapped([written, read])
    assert read["scans"] > 10, read

    assert integrity_of(replica_path) == [("ok",)]
    with Replica.open(replica_path) as replica:
        replica.unlock_with_key(account.key)
        documents = {r.id: r.document for r in replica.scan("notes")}
    assert documents == {
        batch_record_id(batch, index): batch_document(batch, index)
        for batch in range(READER_BATCHES)
        for index in range(BATCH_RECORDS)
    }


# -- a file another connection keeps locked ------------------------------------------------------


def test_replica_open_uses_the_busy_timeout_of_its_options(
    replica_path: Path, account: Account
) -> None:
    with Replica.open(replica_path, options=ReplicaOptions(busy_timeout_s=0.25)) as replica:
        # The busy timeout is per connection, so only the replica's own connection can tell.
        assert replica._core.store.db.execute("PRAGMA busy_timeout").fetchone()[0] == 250


def test_replica_write_to_a_file_locked_past_the_busy_timeout_raises_store_error(
    tmp_path: Path, account: Account
) -> None:
    path = tmp_path / "locked.db"
    with Replica.join(path, account.bundle, options=ReplicaOptions(busy_timeout_s=0.25)) as replica:
        replica.unlock_with_key(account.key)
        with closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError, match="locked"):
                replica.put("notes", "n", {"text": "blocked"})
            other.execute("ROLLBACK")
        replica.put("notes", "n", {"text": "after"})
