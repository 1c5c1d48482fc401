"""SQLite out of memory (issue 15, item 1): a child works on a real replica file under
SQLite's hard heap limit (`PRAGMA hard_heap_limit`), set a swept headroom above what SQLite
holds once the replica is open, from none (every allocation fails: NOMEM) to plenty, over
local commits, merging pulled pages, a reseed, a repair, reads of the change feed and
batches whose failed write the app catches and goes on from.

Each transaction commits or is refused by a sealsync error (`StoreError`, or
`ReplicaClosedError` once the file could not even be opened again): never a raw
`MemoryError` or sqlite3 error. Afterwards the file passes `integrity_check` and holds every
acknowledged write, and a batch is there whole or not at all (SQLite may end the whole
transaction after a failed write inside it: the batch then refuses to go on). Each sweep
has runs refused and runs acknowledged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from replica import Replica
from tests.conftest import Account, ReplicaFactory
from tests.faults.fault_child import HEAP_LIMIT, PAGE, WRITES
from tests.faults.test_disk_faults import (
    damage_newest,
    notes_found,
    pages_to_pull,
    places_of,
    run_child,
)
from tests.faults.test_reseed_faults import TRIES, check_reseed, clean_replica

LIMITS = (0, 20_000, 40_000, 60_000, 90_000, 120_000, 150_000, 1_000_000)
"""Bytes SQLite may allocate above what it holds: none, the range where its needs lie for
these operations (SQLite 3.40 here), and plenty."""
TYPED = ("StoreError", "ReplicaClosedError")
FEED_RECORDS = 2000
Check = Callable[[Path, set[int], list[str]], None]


def under_limit(mode: str, path: Path, account: Account, arg: str, limit: int) -> list[str]:
    """The child's lines under the heap limit, once each refusal was found typed and the
    file whole."""
    lines = run_child(mode, path, account, arg, **{HEAP_LIMIT: str(limit)})
    refused = [line for line in lines if line.startswith("refused ")]
    assert all(line.split()[-1] in TYPED for line in refused), lines
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return lines


def sweep(
    mode: str, prepare: Callable[[Path], Check], account: Account, arg: str, tmp_path: Path
) -> None:
    """Each limit on a new file made by `prepare`, whose check then runs on the outcome."""
    outcomes: set[str] = set()
    for limit in LIMITS:
        path = tmp_path / f"replica-{limit}.db"
        check = prepare(path)
        lines = under_limit(mode, path, account, arg, limit)
        acked = {int(line.split()[1]) for line in lines if line.startswith("ack ")}
        check(path, acked, lines)
        outcomes |= {line.split()[0] for line in lines}
    assert {"ack", "refused"} <= outcomes, f"the sweep never crossed SQLite's needs: {outcomes}"


def test_out_of_memory_in_local_commits(account: Account, tmp_path: Path) -> None:
    def prepare(path: Path) -> Check:
        run_child("put", path, account, "0")
        return lambda path, acked, lines: check_notes(path, account, acked, lines)

    sweep("put", prepare, account, str(2 * WRITES), tmp_path)


def test_out_of_memory_in_merging_pulled_pages(
    account: Account, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    pulled = pages_to_pull(make_replica, tmp_path)

    def prepare(path: Path) -> Check:
        run_child("put", path, account, "0")

        def check(path: Path, acked: set[int], lines: list[str]) -> None:
            notes = {n for page in acked for n in range(page * PAGE, (page + 1) * PAGE)}
            check_notes(path, account, notes, lines)

        return check

    sweep("pull", prepare, account, str(pulled), tmp_path)


def test_out_of_memory_in_a_reseed(account: Account, tmp_path: Path) -> None:
    def prepare(path: Path) -> Check:
        before = clean_replica(path, account)
        return lambda path, acked, lines: check_reseed(path, account, before, acked, lines)

    sweep("reseed", prepare, account, str(TRIES), tmp_path)


def test_out_of_memory_in_a_repair(account: Account, tmp_path: Path) -> None:
    """A repair SQLite could not finish leaves the damaged row in one place."""

    def prepare(path: Path) -> Check:
        run_child("put", path, account, str(WRITES))
        damaged = damage_newest(path)
        return lambda path, acked, lines: check_one_place(path, damaged, lines)

    sweep("repair", prepare, account, "2", tmp_path)


def test_out_of_memory_in_reading_the_change_feed(account: Account, tmp_path: Path) -> None:
    def prepare(path: Path) -> Check:
        run_child("put", path, account, "0")
        replica = Replica.open(path)
        with replica:
            replica.unlock_with_key(account.key)
            with replica.batch():  # pages of the feed to read: more than a few allocations
                for number in range(FEED_RECORDS):
                    replica.put("notes", f"f{number}", {"text": f"note {number}"})
        return lambda path, acked, lines: None  # reads: typed refusals and a whole file

    sweep("changes", prepare, account, str(WRITES), tmp_path)


def test_out_of_memory_in_a_batch_keeps_it_whole_or_not_at_all(
    account: Account, tmp_path: Path
) -> None:
    def prepare(path: Path) -> Check:
        run_child("put", path, account, "0")
        return lambda path, acked, lines: check_batches(path, account, acked, lines)

    sweep("batch", prepare, account, str(WRITES), tmp_path)


def check_batches(path: Path, account: Account, acked: set[int], lines: list[str]) -> None:
    """An acknowledged batch kept its first and last write; a refused one kept neither."""
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        for number in range(WRITES):
            kept = [replica.get("notes", f"{part}{number}") is not None for part in "ac"]
            assert kept == [number in acked] * 2, (number, kept, lines)


def check_notes(path: Path, account: Account, numbers: set[int], lines: list[str]) -> None:
    assert notes_found(path, account, numbers) == numbers, lines


def check_one_place(path: Path, damaged: bytes, lines: list[str]) -> None:
    assert places_of(path, damaged) == 1, lines
