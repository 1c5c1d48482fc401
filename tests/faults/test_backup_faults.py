"""A disk that fails under a backup and a restore (issue 15, item 1): strace fails the N-th
write of the child's (SQLite's `pwrite64` and Python's `write`) or its N-th sync, once or
from then on, with a full disk (ENOSPC) or an I/O error (EIO), for N over the calls the
operation makes.

Each run either completes or ends with a typed sealsync error (never a traceback). A backup
that failed leaves nothing that looks like a backup (no `.db`; what a `verify` of the
folder finds is at most the damage it names, never an "ok" backup that is not whole), one
that completed verifies; the source replica is untouched either way. A restore that failed
leaves the replica it was to replace as it was, or (a sync of the folder failed after the
file took its place) the restored one whole, never a part; one that completed holds every
note.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from clients.backup import backup_replica
from clients.manifest import manifest_path
from clients.rowdigests import rows_path
from clients.verify import verify_folder
from replica import Replica
from tests.conftest import Account
from tests.faults.backup_child import NOT_GOOD, REFUSED
from tests.faults.test_disk_faults import ROOT, strace

CHILD = Path(__file__).with_name("backup_child.py")
NOTES = 12
KEPT = {"text": "the replica a restore replaces"}
KINDS = [("pwrite64,write", "ENOSPC"), ("fsync,fdatasync", "EIO")]
WHENS = (1, 3, 8, 21, 55)
"""The N-th call fails (`when=N`), and from it on (`N+`); past the calls an operation
makes, the run is clean and the sweep of that kind ends."""


def notes_of(path: Path, account: Account) -> dict[str, object]:
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        return {r.id: r.document for r in replica.scan("notes")}


@pytest.fixture
def source(account: Account, tmp_path: Path) -> Path:
    path = tmp_path / "source.db"
    replica = Replica.join(path, account.bundle)
    with replica:
        replica.unlock_with_key(account.key)
        with replica.batch():
            for n in range(NOTES):
                replica.put("notes", f"n{n}", {"text": f"note {n}" * 20})
    return path


def under_fault(mode: str, source: Path, target: Path, calls: str, error: str, when: str,
                log: Path) -> tuple[int, bool]:  # fmt: skip
    """The child's exit status under the fault, and whether the fault fired."""
    inject = ["-e", f"trace={calls}", "-e", f"inject={calls}:error={error}:when={when}"]
    command = [strace(), "-qq", "-o", str(log), *inject, sys.executable, str(CHILD), mode,
               str(source), str(target)]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120,
                          env=environment)  # fmt: skip
    assert done.returncode in (0, REFUSED), (
        f"untyped under {calls}:{error}:{when}: {done.stderr[-1500:]}"
    )
    return done.returncode, "INJECTED" in log.read_text()


def sweep(mode: str, source: Path, target: Path, folder: Path) -> Iterator[tuple[str, int]]:
    """Run the child under each fault; yields (fault, exit status) after each run, with
    `target` as the run left it (the caller checks, then it is reset)."""
    for calls, error in KINDS:
        for n in WHENS:
            for when in (str(n), f"{n}+"):
                log = folder / "strace.log"
                status, fired = under_fault(mode, source, target, calls, error, when, log)
                yield f"{calls}:{error}:{when}", status
                if not fired:
                    break
            else:
                continue
            break


def test_a_failing_disk_under_a_backup_leaves_no_backup_that_is_not_whole(
    source: Path, account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = notes_of(source, account)
    folder = tmp_path / "backups"
    outcomes = []
    for fault, status in sweep("backup", source, folder, tmp_path):
        verdicts = verify_folder(folder) if folder.exists() else []
        whole = [v for v in verdicts if v.backup.suffix == ".db" and v.state == "ok"]
        if status == 0:
            assert len(whole) == 1, (fault, verdicts)
        assert all(v.state == "ok" for v in verdicts if v.backup.suffix == ".db"), (fault, verdicts)
        outcomes.append(status)
        shutil.rmtree(folder, ignore_errors=True)
    assert notes_of(source, account) == before
    with capsys.disabled():
        print(f"\nbackup under faults: {len(outcomes)} runs, {outcomes.count(0)} done, "
              f"{outcomes.count(REFUSED)} refused (typed), 0 untyped")  # fmt: skip
    assert outcomes.count(REFUSED) > 0 and outcomes.count(0) > 0


def test_a_failing_disk_under_a_restore_keeps_the_replica_it_was_to_replace(
    source: Path, account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "backups"
    backup = backup_replica(source, folder, datetime.datetime.now(datetime.UTC))
    target, kept = tmp_path / "target.db", tmp_path / "kept.db"
    replica = Replica.join(kept, account.bundle)
    with replica:
        replica.unlock_with_key(account.key)
        replica.put("notes", "only-here", KEPT)
    shutil.copy(kept, target)
    restored = notes_of(source, account)
    outcomes = []
    for fault, status in sweep("restore", backup, target, tmp_path):
        found = notes_of(target, account)
        if status == 0:
            assert found == restored, fault
        else:  # refused before the file took its place, or after (a sync of the folder)
            assert found in ({"only-here": KEPT}, restored), fault
        with closing(sqlite3.connect(target)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",), fault
        outcomes.append(status)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        shutil.copy(kept, target)
    with capsys.disabled():
        print(f"\nrestore under faults: {len(outcomes)} runs, {outcomes.count(0)} done, "
              f"{outcomes.count(REFUSED)} refused (typed), 0 untyped")  # fmt: skip
    assert outcomes.count(REFUSED) > 0 and outcomes.count(0) > 0


def test_a_failing_read_never_lets_a_backup_pass_as_good(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EIO on the N-th read of the backup's files (strace's `-P`): `verify` says damaged or
    unreadable whenever a read failed, never "ok" on what it could not read, never a
    traceback."""
    backup = backup_replica(source, tmp_path / "backups", datetime.datetime.now(datetime.UTC))
    files = [
        arg for p in (backup, rows_path(backup), manifest_path(backup)) for arg in ("-P", str(p))
    ]
    verdicts = []
    for n in WHENS:
        for when in (str(n), f"{n}+"):
            log = tmp_path / "strace.log"
            inject = [
                "-e",
                "trace=read,pread64",
                "-e",
                f"inject=read,pread64:error=EIO:when={when}",
            ]
            command = [strace(), "-qq", "-o", str(log), *inject, *files, sys.executable,
                       str(CHILD), "verify", str(backup), "-"]  # fmt: skip
            environment = {**os.environ, "PYTHONPATH": str(ROOT)}
            done = subprocess.run(command, check=False, capture_output=True, text=True,
                                  timeout=120, env=environment)  # fmt: skip
            fired = "INJECTED" in log.read_text()
            assert done.returncode == (NOT_GOOD if fired else 0), (when, done.stderr[-1500:])
            verdicts.append(done.returncode)
    with capsys.disabled():
        print(f"\nverify under read faults: {len(verdicts)} runs, "
              f"{verdicts.count(NOT_GOOD)} not good, {verdicts.count(0)} ok (none fired)")  # fmt: skip
    assert verdicts.count(NOT_GOOD) > 0
