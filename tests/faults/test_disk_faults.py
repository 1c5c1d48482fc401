"""A disk that fails (issue 15, item 1): real faults on a real replica file, injected by
strace into a child's system calls on its write-ahead log, once at the N-th call and from
the N-th call on, for a failed fsync (EIO) and a full disk (ENOSPC on a write), over local
commits and over merging pulled pages.

Every transaction either commits (`ack`) or raises a sealsync error (`refused`): never
another kind. Afterwards the file passes `integrity_check` and every acknowledged record is
there (a refused one may be too: a failed fsync leaves the log's frames whole, and an open
may recover them), and after a one-off fault the transactions that follow commit again: the
connection was opened again rather than trusted.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from replica import Replica
from tests.conftest import Account, ReplicaFactory, unavailable
from tests.faults.fault_child import FILE_SIZE_CEILING, PAGE, WRITES
from tests.replica.helpers import dirty_envelopes

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("fault_child.py")
FAULTS = [("fsync,fdatasync", "EIO", when) for when in ("1", "2", "3", "2+")] + [
    ("pwrite64,write", "ENOSPC", when) for when in ("1", "3", "5", "2+")
]
"""(system calls, error, strace's `when`: the N-th call, or `N+` from it on)."""
PULL_FAULTS = [fault for fault in FAULTS if fault[2] in ("1", "2+")]
"""Each kind once at the first call and from the second on."""


def strace() -> str:
    """strace's path: a skip without it, a failure in CI (never a silent pass)."""
    found = shutil.which("strace")
    if found is None:
        unavailable("strace is not installed: the disk-fault tests inject faults with it")
    return found


def run_child(
    mode: str, path: Path, account: Account, arg: str, *prefix: str, **env: str
) -> list[str]:
    """The child's lines, once it ended; a traceback fails the test (an untyped error)."""
    command = [*prefix, sys.executable, str(CHILD), mode, str(path), account.bundle.hex(),
               account.key.hex(), arg]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout.splitlines()


def under_fault(
    mode: str, path: Path, account: Account, arg: str, fault: tuple[str, str, str]
) -> tuple[set[int], list[str]]:
    """Run the child with `fault` injected on the replica's log; the transactions it saw
    acknowledged, after checking every other one was refused by a sealsync error."""
    calls, error, when = fault
    inject = ["-e", f"trace={calls}", "-e", f"inject={calls}:error={error}:when={when}"]
    lines = run_child(mode, path, account, arg, strace(), "-f", "-qq", "-o", os.devnull,
                      *inject, "-P", f"{path}-wal")  # fmt: skip
    acked = {int(line.split()[1]) for line in lines if line.startswith("ack ")}
    refused = [line for line in lines if line.startswith("refused ")]
    assert refused and all(line.endswith("StoreError") for line in refused), lines
    if not when.endswith("+"):  # a one-off fault: the transactions after it commit again
        assert max(acked, default=-1) > min(int(line.split()[1]) for line in refused), lines
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return acked, lines


def notes_found(path: Path, account: Account, numbers: set[int]) -> set[int]:
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        return {n for n in numbers if replica.get("notes", f"n{n}") is not None}


@pytest.mark.parametrize(("calls", "error", "when"), FAULTS)
def test_a_failing_disk_loses_no_acknowledged_write_and_raises_only_typed_errors(
    calls: str, error: str, when: str, account: Account, tmp_path: Path
) -> None:
    path = tmp_path / "replica.db"
    run_child("put", path, account, "0")  # the file made before any fault
    acked, lines = under_fault("put", path, account, str(WRITES), (calls, error, when))
    assert notes_found(path, account, acked) == acked, lines


def pages_to_pull(make_replica: ReplicaFactory, tmp_path: Path) -> Path:
    """A file of another device's `WRITES` notes, as the `pull` mode reads them."""
    writer = make_replica("writer")
    for n in range(WRITES):
        writer.put("notes", f"n{n}", {"text": f"note {n}"})
    pulled = tmp_path / "pulled.msgpack"
    pulled.write_bytes(msgspec.msgpack.encode(dirty_envelopes(writer)))
    return pulled


@pytest.mark.parametrize(("calls", "error", "when"), PULL_FAULTS)
def test_a_failing_disk_loses_no_acknowledged_page_and_raises_only_typed_errors(
    calls: str,
    error: str,
    when: str,
    account: Account,
    make_replica: ReplicaFactory,
    tmp_path: Path,
) -> None:
    pulled = pages_to_pull(make_replica, tmp_path)
    path = tmp_path / "replica.db"
    run_child("put", path, account, "0")
    acked, lines = under_fault("pull", path, account, str(pulled), (calls, error, when))
    in_acked_pages = {n for page in acked for n in range(page * PAGE, (page + 1) * PAGE)}
    assert notes_found(path, account, in_acked_pages) == in_acked_pages, lines


def test_a_file_size_ceiling_refuses_writes_as_a_full_disk(
    account: Account, tmp_path: Path
) -> None:
    """RLIMIT_FSIZE: the log cannot grow past the ceiling, and a write past it fails with
    EFBIG. Each transaction commits or is refused, typed (once the log was copied back into
    the file and starts over, it has room again)."""
    path = tmp_path / "replica.db"
    run_child("put", path, account, "0")
    ceiling = {FILE_SIZE_CEILING: str(path.stat().st_size + 48 * 1024)}
    lines = run_child("put", path, account, "30", **ceiling)
    acked = {int(line.split()[1]) for line in lines if line.startswith("ack ")}
    refused = [line for line in lines if line.startswith("refused ")]
    assert acked and refused and all(line.endswith("StoreError") for line in refused), lines
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert notes_found(path, account, acked) == acked, lines


REPAIR_FAULTS = [("fsync,fdatasync", "EIO", when) for when in ("1", "1+")] + [
    ("pwrite64,write", "ENOSPC", when) for when in ("2", "1+")
]


@pytest.mark.parametrize(("calls", "error", "when"), REPAIR_FAULTS)
def test_a_failing_disk_under_a_repair_quarantines_all_or_nothing(
    calls: str, error: str, when: str, account: Account, tmp_path: Path
) -> None:
    """A repair refused by the disk leaves the damaged row where it was (and its record
    read-only), never half moved; the repair after it does the work whole."""
    path = tmp_path / "replica.db"
    run_child("put", path, account, str(WRITES))
    damaged = damage_newest(path)
    under_fault("repair", path, account, "2", (calls, error, when))
    assert places_of(path, damaged) == 1  # in one place: the file, or quarantine
    assert run_child("repair", path, account, "1") == ["ack 0"]
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        assert replica.status().quarantined == 1
        assert len(replica.scan("notes", skip_degraded=True)) == WRITES - 1


def damage_newest(path: Path) -> bytes:
    """Flip a bit of the newest version's tag: its damaged envelope."""
    with closing(sqlite3.connect(path)) as db, db:
        rowid, envelope = db.execute(
            "SELECT id, envelope FROM versions ORDER BY id DESC LIMIT 1"
        ).fetchone()
        damaged: bytes = envelope[:-1] + bytes([envelope[-1] ^ 1])
        db.execute("UPDATE versions SET envelope = ? WHERE id = ?", (damaged, rowid))
    return damaged


def places_of(path: Path, envelope: bytes) -> int:
    """In how many places of the file `envelope` is: its versions, and quarantine."""
    with closing(sqlite3.connect(path)) as db:
        (places,) = db.execute(
            "SELECT (SELECT count(*) FROM versions WHERE envelope = ?1)"
            " + (SELECT count(*) FROM quarantine WHERE envelope = ?1)",
            (envelope,),
        ).fetchone()
    return int(places)
