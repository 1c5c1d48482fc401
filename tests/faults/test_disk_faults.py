"""A disk that fails (issue 15, item 1): real faults on a real replica file, injected by
strace into a child's system calls on its write-ahead log, once at the N-th call and from
the N-th call on, for a failed fsync (EIO) and a full disk (ENOSPC on a write).

Every write either commits (`ack`) or raises a sealsync error (`refused`): never another
kind. Afterwards the file passes `integrity_check` and every acknowledged record is there
(a refused one may be too: a failed fsync leaves the log's frames whole, and an open may
recover them), and after a one-off fault the writes that follow commit again: the
connection was opened again rather than trusted.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from replica import Replica
from tests.conftest import Account

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("fault_child.py")
WRITES = 6
FAULTS = [("fsync,fdatasync", "EIO", when) for when in ("1", "2", "3", "2+")] + [
    ("pwrite64,write", "ENOSPC", when) for when in ("1", "3", "5", "2+")
]
"""(system calls, error, strace's `when`: the N-th call, or `N+` from it on)."""


def strace() -> str:
    """strace's path: a skip without it, a failure in CI (never a silent pass)."""
    found = shutil.which("strace")
    if found is None:
        message = "strace is not installed: the disk-fault tests inject faults with it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_child(path: Path, account: Account, writes: int, *prefix: str) -> list[str]:
    """The child's lines, once it ended; a traceback fails the test (an untyped error)."""
    command = [*prefix, sys.executable, str(CHILD), str(path), account.bundle.hex(),
               account.key.hex(), str(writes)]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout.splitlines()


@pytest.mark.parametrize(("calls", "error", "when"), FAULTS)
def test_a_failing_disk_loses_nothing_acknowledged_and_raises_only_typed_errors(
    calls: str, error: str, when: str, account: Account, tmp_path: Path
) -> None:
    path = tmp_path / "replica.db"
    run_child(path, account, 0)  # the file made before any fault
    inject = ["-e", f"trace={calls}", "-e", f"inject={calls}:error={error}:when={when}"]
    lines = run_child(path, account, WRITES, strace(), "-f", "-qq", "-o", os.devnull, *inject,
                      "-P", f"{path}-wal")  # fmt: skip
    acked = {int(line.split()[1]) for line in lines if line.startswith("ack ")}
    refused = {int(line.split()[1]) for line in lines if line.startswith("refused ")}
    assert len(acked) + len(refused) == WRITES and refused, lines
    assert all(line.endswith("StoreError") for line in lines if line.startswith("refused "))
    if not when.endswith("+"):  # a one-off fault: the writes after it commit again
        assert max(acked, default=-1) > min(refused), lines
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        for number in sorted(acked):
            assert replica.get("notes", f"n{number}") is not None, (number, lines)
