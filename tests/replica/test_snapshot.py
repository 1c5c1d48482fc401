"""Backups of a replica file: whole, taken while locked, and without device-local records."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import threading
from contextlib import closing
from pathlib import Path

import pytest

from replica import Replica, StoreError, backup_replica_file, copy_replica_file
from tests.conftest import Account, ReplicaFactory
from tests.replica.replica_child import start_child


def local_envelopes(path: Path) -> list[bytes]:
    with closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT envelope FROM local")]


def test_a_backup_of_a_locked_replica_keeps_shared_records_and_drops_local_ones(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    replica = make_replica()
    for n in range(200):
        replica.put("threads", f"t{n}", {"title": f"thread {n}", "message_count": n})
    replica.put("drafts", "d1", {"text": "half-typed, this device only " * 20})
    source = replica.path
    drafts = local_envelopes(source)
    assert len(drafts) == 1
    replica.lock()

    reports: list[tuple[int, int]] = []
    target = tmp_path / "backup.db"
    target.touch()
    backup_replica_file(source, target, progress=lambda done, total: reports.append((done, total)))

    assert reports and reports[-1][0] == reports[-1][1] > 0
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    data = target.read_bytes()
    assert not any(envelope in data for envelope in drafts)  # overwritten, not just unlinked
    with closing(sqlite3.connect(target)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    with Replica.open(target) as restored:
        restored.unlock_with_key(account.key)
        assert len(restored.scan("threads")) == 200
        assert restored.get("drafts", "d1") is None
    replica.unlock_with_key(account.key)
    assert replica.get("drafts", "d1") is not None  # the source keeps its drafts


def test_a_copy_keeps_everything_and_refuses_what_is_not_sqlite(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    replica = make_replica()
    replica.put("drafts", "d1", {"text": "kept by a plain copy"})
    target = tmp_path / "copy.db"
    copy_replica_file(replica.path, target, read_only=True)
    with Replica.open(target) as copy:
        copy.unlock_with_key(account.key)
        assert copy.get("drafts", "d1") is not None

    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 500)
    with pytest.raises(StoreError, match="could not be copied"):
        copy_replica_file(junk, tmp_path / "junk-copy.db", read_only=True)
    with pytest.raises(StoreError):
        backup_replica_file(junk, tmp_path / "junk-backup.db")


LOAD_S = float(os.environ.get("SEALSYNC_BACKUP_LOAD_S", "3"))
"""How long the writer writes while backups are taken (issue 14 asks a minute: set 60)."""
SEED_RECORDS = 4000
"""About 12 MiB: a copy of many steps, so a writer has every chance to cut in."""


def committed_lines(child: subprocess.Popen[bytes], into: list[int]) -> None:
    """Collect the writer's `committed n` lines as they come (the acknowledged commits)."""
    assert child.stdout is not None
    for raw in child.stdout:
        line = raw.decode().strip()
        if line.startswith("committed "):
            into.append(int(line.split()[1]))


def backups_while(
    writer: subprocess.Popen[bytes], acknowledged: list[int], source: Path, folder: Path
) -> list[tuple[Path, int]]:
    """Back the writer's replica up again and again until it ends: (backup, commits
    acknowledged when it began) each."""
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().decode().strip() == "ready"
    reading = threading.Thread(target=committed_lines, args=(writer, acknowledged), daemon=True)
    reading.start()
    writer.stdin.write(b"go\n")
    writer.stdin.flush()
    taken: list[tuple[Path, int]] = []
    while writer.poll() is None:
        target = folder / f"backup-{len(taken)}.db"
        target.touch()
        at_start = len(acknowledged)
        backup_replica_file(source, target)
        taken.append((target, at_start))
    reading.join(timeout=10)
    return taken


@pytest.mark.slow
def test_backups_taken_while_another_process_writes_finish_whole_and_hold_a_prefix(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    """Each backup is one snapshot: it finishes while a process writes 250 records a second,
    opens, passes integrity_check, every envelope in it opens, and it holds exactly the
    writer's first k commits, k at least the commits acknowledged when the backup began."""
    replica = make_replica()
    with replica.batch():
        for n in range(SEED_RECORDS):
            replica.put("threads", f"seed-{n}", {"title": "x" * 2500, "message_count": n})
    replica.close()
    acknowledged: list[int] = []
    with start_child("steady-writer", replica.path, account.key, LOAD_S) as writer:
        taken = backups_while(writer, acknowledged, replica.path, tmp_path)
        assert writer.stderr is not None
        assert writer.wait() == 0, writer.stderr.read().decode()
    assert len(taken) >= 3 and acknowledged, (len(taken), len(acknowledged))
    for target, at_start in taken:
        with closing(sqlite3.connect(target)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        with Replica.open(target) as restored:
            restored.unlock_with_key(account.key)
            assert restored.diagnose().healthy  # every envelope opens: `verify --read-data`
            ids = {r.id for r in restored.scan("notes")}
            assert len(restored.scan("threads")) == SEED_RECORDS
        assert ids == {f"steady-{n}" for n in range(len(ids))}
        assert at_start <= len(ids) <= len(acknowledged)
