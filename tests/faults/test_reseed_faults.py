"""A disk that fails under a reseed (issue 15, item 1): strace fails the fsyncs or the writes
of a child's replica log, once or from then on, while it reseeds onto a new, empty relay
(as after a wipe): the reseed's own transaction and the acknowledgements of its pushes (the
relay then holds only this device's versions: their receipts moved the cursor past them,
and there is nothing to pull; test_disk_faults faults pulled pages).

Each transaction commits or is refused by a sealsync error. A reseed that was refused
marked nothing and forgot nothing (all or nothing); once one was taken, every version the
device holds is on the relay or still marked to be pushed: a refused acknowledgement never
clears a mark, so no version is left behind. Nothing the device held is lost.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from relay.memory import MemoryRelay
from replica import Replica
from tests.conftest import Account
from tests.faults.fault_child import ACCOUNT, WRITES
from tests.faults.test_disk_faults import notes_found, run_child, under_fault

TRIES = 3
RESEED_FAULTS = [("fsync,fdatasync", "EIO", when) for when in ("1", "3", "2+")] + [
    ("pwrite64,write", "ENOSPC", when) for when in ("1", "9", "2+")
]


def synced(path: Path, account: Account) -> None:
    """Every note pushed to a relay and acknowledged, and its pages pulled: nothing dirty."""
    relay = MemoryRelay(clock_ms=lambda: time.time_ns() // 1_000_000)
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        session = replica.sync_session()
        while (batch := session.next_batch()) is not None:
            session.acknowledge(batch, relay.push(ACCOUNT, batch))
        session.apply_page(relay.pull(ACCOUNT, session.cursor))
        assert session.count_dirty() == 0


def keys_and_marks(path: Path) -> tuple[set[bytes], set[bytes], object]:
    """Every version's key, those marked to be pushed, and the stored cursor."""
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT key, dirty FROM versions").fetchall()
        cursor = db.execute("SELECT value FROM meta WHERE name = 'cursor'").fetchone()
    return {bytes(k) for k, _ in rows}, {bytes(k) for k, dirty in rows if dirty}, cursor


@pytest.mark.parametrize(("calls", "error", "when"), RESEED_FAULTS)
def test_a_failing_disk_under_a_reseed_leaves_no_version_behind(
    calls: str, error: str, when: str, account: Account, tmp_path: Path
) -> None:
    path = tmp_path / "replica.db"
    before = clean_replica(path, account)
    acked, lines = under_fault("reseed", path, account, str(TRIES), (calls, error, when))
    check_reseed(path, account, before, acked, lines)


def clean_replica(path: Path, account: Account) -> tuple[set[bytes], object]:
    """`WRITES` notes, pushed and acknowledged: (their keys, the cursor)."""
    run_child("put", path, account, str(WRITES))
    synced(path, account)
    keys, marked, cursor = keys_and_marks(path)
    assert len(keys) == WRITES and not marked and cursor is not None
    return keys, cursor


def check_reseed(
    path: Path, account: Account, before: tuple[set[bytes], object], acked: set[int],
    lines: list[str],
) -> None:  # fmt: skip
    """All or nothing, and no version left behind (the module's docstring)."""
    keys, cursor = before
    assert lines[-1].startswith("relay"), lines
    on_relay = {bytes.fromhex(key) for key in lines[-1].split()[1:]}
    after, marked, cursor_after = keys_and_marks(path)
    assert after == keys
    if acked:  # the reseed was taken (the first transaction that commits is it)
        assert keys <= on_relay | marked, lines
    else:
        assert not marked and cursor_after == cursor and not on_relay, lines
    assert notes_found(path, account, set(range(WRITES))) == set(range(WRITES))
