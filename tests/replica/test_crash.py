"""Crash atomicity: a replica file survives SIGKILL inside a write transaction or a page merge.

A child process (`replica_child.py crash`) alternates local write batches and page merges on
one replica file and prints a marker at each phase boundary. The parent SIGKILLs it a random
moment after a `txn-open` / `merge-start` marker and counts the kill as inside that phase when
the matching `committed` / `merged` marker never came. After every kill it checks the file:
`PRAGMA integrity_check` is ok; every batch whose `committed` marker was printed is present
with its exact content; no batch is partly present; every page is applied whole or not at
all, in order, and the stored cursor agrees. `SEALSYNC_CRASH_KILLS` sets how many kills must
land inside each phase (default 20).

Also here: `synchronous=FULL` really is in force on a replica's connection by default.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import statistics
import threading
import time
from collections import defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from relay.memory import MemoryRelay
from replica import Replica, ReplicaOptions
from replica.wire import parse_header, system_clock_ms
from tests.conftest import PASSPHRASE, SCHEMA, Account, ReplicaFactory
from tests.replica.replica_child import (
    LAST_BATCH_ID,
    WRITES_AFTER_MARKER,
    WRITES_BEFORE_MARKER,
    batch_document,
    batch_record_id,
    page_file,
    start_child,
)

KILLS_PER_PHASE = int(os.environ.get("SEALSYNC_CRASH_KILLS", "20"))
MAX_RUNS = 6 * KILLS_PER_PHASE + 10
PAGE_SIZE = 500
PAGES_AHEAD = 3
BATCH_SIZE = WRITES_BEFORE_MARKER + WRITES_AFTER_MARKER
CHILD_TIMEOUT_S = 30.0
RELAY_ACCOUNT = "crash"
START_MARKER = {"write": "txn-open", "merge": "merge-start"}
END_MARKER = {"write": "committed", "merge": "merged"}
PHASE_OF_START = {marker: phase for phase, marker in START_MARKER.items()}


def page_record_id(page: int, index: int) -> str:
    return f"page-{page:05}-{index:04}"


def page_document(page: int, index: int) -> dict[str, int]:
    return {"page": page, "index": index}


# -- pages from another device of the account ---------------------------------------------------


@dataclass
class PageSource:
    """Pages of another replica's envelopes, pulled from the reference relay and saved to files.

    Page i holds exactly the records `page_record_id(i, *)` at seqs (i*PAGE_SIZE, (i+1)*PAGE_SIZE].
    """

    replica: Replica
    relay: MemoryRelay
    folder: Path
    keys_by_page: list[frozenset[bytes]] = field(default_factory=list)

    def ensure(self, count: int) -> None:
        self.folder.mkdir(exist_ok=True)
        while len(self.keys_by_page) < count:
            self._make(len(self.keys_by_page))

    def _make(self, index: int) -> None:
        with self.replica.batch():
            for n in range(PAGE_SIZE):
                self.replica.put("threads", page_record_id(index, n), page_document(index, n))
        session = self.replica.sync_session()
        while (batch := session.next_batch()) is not None:
            session.acknowledge(batch, self.relay.push(RELAY_ACCOUNT, batch))
        page = self.relay.pull(RELAY_ACCOUNT, index * PAGE_SIZE, PAGE_SIZE)
        bounds = (page.cursor, len(page.entries), page.next_cursor)
        assert bounds == (index * PAGE_SIZE, PAGE_SIZE, (index + 1) * PAGE_SIZE), bounds
        target = page_file(self.folder, index)
        partial = target.with_suffix(".partial")
        partial.write_bytes(msgspec.msgpack.encode(page))
        partial.rename(target)  # the child never sees half a page file
        self.keys_by_page.append(frozenset(parse_header(e.envelope).key for e in page.entries))


# -- one child run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What a killed child printed: every marker, and those read before the kill with their time."""

    lines: list[str]
    timed: list[tuple[float, str]]

    def landed_in(self) -> tuple[str, int] | None:
        """The phase and number of the last start marker if its end marker never came."""
        last = self.lines[-1].split() if self.lines else ["nothing"]
        if last[0] in PHASE_OF_START:
            return PHASE_OF_START[last[0]], int(last[1])
        return None

    def numbers(self, marker: str) -> set[int]:
        return {int(line.split()[1]) for line in self.lines if line.split()[0] == marker}

    def durations_s(self, phase: str) -> list[float]:
        """Start-to-end marker times the parent saw (what a kill delay should span)."""
        found, started = [], None
        for at, line in self.timed:
            marker = line.split()[0]
            if marker == START_MARKER[phase]:
                started = at
            elif marker == END_MARKER[phase] and started is not None:
                found.append(at - started)
                started = None
        return found


def run_until_killed(
    path: Path,
    key: bytes,
    first_batch: int,
    pages: Path,
    marker: tuple[str, int],
    delay_s: float,
) -> Run:
    """Start a crash child; SIGKILL it `delay_s` after the n-th line with `marker` = (word, n)."""
    word, occurrence = marker
    timed: list[tuple[float, str]] = []
    killed = False
    with start_child("crash", path, key, first_batch, pages, PAGE_SIZE) as child:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        child.stdin.close()
        watchdog = threading.Timer(CHILD_TIMEOUT_S, child.kill)
        watchdog.start()
        try:
            for raw in child.stdout:
                line = raw.decode().strip()
                timed.append((time.perf_counter(), line))
                occurrence -= line.split()[0] == word
                if occurrence == 0:
                    time.sleep(delay_s)
                    os.kill(child.pid, signal.SIGKILL)
                    killed = True
                    break
            rest = child.stdout.read().decode().splitlines()
            stderr = child.stderr.read().decode()
        finally:
            watchdog.cancel()
            if not killed:
                child.kill()
    assert killed and child.returncode == -signal.SIGKILL, (
        f"child exited with {child.returncode} before {marker}; stderr:\n{stderr}"
    )
    lines = [line for _, line in timed] + [line.strip() for line in rest]
    return Run([line for line in lines if line != "ready"], timed)


# -- checks after a kill ------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    batches: set[int]
    pages: list[int]


def check_after_kill(path: Path, key: bytes, source: PageSource, committed: set[int]) -> Found:
    """Every invariant of the module docstring; returns the batches and pages the file holds."""
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored_keys = {key for (key,) in db.execute("SELECT key FROM versions")}
    replica = Replica.open(path)
    try:
        replica.unlock_with_key(key)
        batches = check_batches(replica, committed)
        pages = check_pages(replica, source, stored_keys)
        status = replica.status()
        local_records = len(batches) * BATCH_SIZE + (1 if batches else 0)
        assert status.records == len(pages) * PAGE_SIZE + local_records
        assert status.dirty == local_records
        held = status.held_for_drift + status.held_for_lock + sum(status.held_other.values())
        assert (held, status.conflicts, status.quarantined, status.degraded) == (0, 0, 0, 0)
    finally:
        replica.close()
    return Found(batches, pages)


def check_batches(replica: Replica, committed: set[int]) -> set[int]:
    """Each batch is all there with its exact content or not there; committed ones are there."""
    documents = {record.id: record.document for record in replica.scan("notes")}
    last = documents.pop(LAST_BATCH_ID, None)
    by_batch: dict[int, dict[str, Any]] = defaultdict(dict)
    for id, document in documents.items():
        by_batch[int(id.split("-")[1])][id] = document
    for batch, got in by_batch.items():
        expected = {batch_record_id(batch, i): batch_document(batch, i) for i in range(BATCH_SIZE)}
        assert got == expected, f"batch {batch}: {len(got)} of {BATCH_SIZE} records, or altered"
    lost = committed - by_batch.keys()
    assert not lost, f"batches whose commit returned are gone: {sorted(lost)}"
    assert last == ({"batch": max(by_batch)} if by_batch else None)
    return set(by_batch)


def check_pages(replica: Replica, source: PageSource, stored_keys: set[bytes]) -> list[int]:
    """Each page is applied whole or not at all, in order, and the cursor agrees."""
    applied = []
    for index, keys in enumerate(source.keys_by_page):
        present = len(keys & stored_keys)
        assert present in (0, PAGE_SIZE), f"page {index} half applied: {present} of {PAGE_SIZE}"
        if present:
            applied.append(index)
    assert applied == list(range(len(applied))), f"pages applied out of order: {applied}"
    assert replica.sync_session().cursor == len(applied) * PAGE_SIZE
    if applied:
        page = applied[-1]
        for n in (0, PAGE_SIZE - 1):
            record = replica.get("threads", page_record_id(page, n))
            assert record is not None and record.document == page_document(page, n)
    return applied


# -- the test -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """Kills that landed inside a phase, and how many of those found it rolled back."""

    inside: int = 0
    rolled_back: int = 0


@pytest.mark.slow
def test_replica_survives_sigkill_inside_write_batches_and_page_merges(
    tmp_path: Path, account: Account, make_replica: ReplicaFactory
) -> None:
    began = time.perf_counter()
    source = PageSource(
        make_replica("source", synchronous="normal", freshness_window_s=0),
        MemoryRelay(clock_ms=system_clock_ms, page_size=PAGE_SIZE),
        tmp_path / "pages",
    )
    path = tmp_path / "device.db"
    Replica.join(path, account.bundle).close()
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    tallies = {"write": Tally(), "merge": Tally()}
    durations: dict[str, list[float]] = {"write": [], "merge": []}
    committed: set[int] = set()
    next_batch, runs, applied = 0, 0, 0

    def run_once(marker: tuple[str, int], delay_s: float) -> None:
        nonlocal next_batch, runs, applied
        source.ensure(applied + PAGES_AHEAD)
        run = run_until_killed(path, account.key, next_batch, source.folder, marker, delay_s)
        runs += 1
        committed.update(run.numbers("committed"))
        next_batch = max(run.numbers("txn-open") | {next_batch - 1}) + 1
        for phase, seen in durations.items():
            seen.extend(run.durations_s(phase))
        found = check_after_kill(path, account.key, source, committed)
        applied = len(found.pages)
        landed = run.landed_in()
        if landed is not None:
            phase, number = landed
            tallies[phase].inside += 1
            done = number in found.batches if phase == "write" else number in found.pages
            tallies[phase].rolled_back += not done

    # One run killed right after its first merge: times both phases once, kills outside both.
    run_once(("merged", 1), 0.0)

    def needed(phase: str) -> int:
        return KILLS_PER_PHASE - tallies[phase].inside

    while needed("write") > 0 or needed("merge") > 0:
        assert runs < MAX_RUNS, f"only {tallies} kills landed inside in {runs} runs (seed {seed})"
        phase = max(("write", "merge"), key=needed)
        # Sometimes the second occurrence, so that pages and batches also commit between kills.
        marker = (START_MARKER[phase], rng.choice((1, 1, 2)))
        run_once(marker, rng.uniform(0, statistics.median(durations[phase])))

    elapsed = time.perf_counter() - began
    write_ms, merge_ms = (statistics.median(durations[p]) * 1e3 for p in ("write", "merge"))
    print(
        f"\ncrash: {runs} runs in {elapsed:.1f} s (seed {seed}); inside a write batch "
        f"{tallies['write']}, inside a page merge {tallies['merge']}; pages applied {applied}, "
        f"batches committed {len(committed)}; median write {write_ms:.1f} ms, merge {merge_ms:.1f} ms"
    )
    for phase, tally in tallies.items():
        # Many kills must find the transaction rolled back, or they did not land mid-transaction
        # (a kill during the commit's fsync finds it committed: the WAL frames were written).
        assert tally.rolled_back >= tally.inside // 4, f"{phase}: {tally} (seed {seed})"


# -- synchronous ----------------------------------------------------------------------------------


def synchronous_of(replica: Replica) -> int:
    # PRAGMA synchronous is per connection, so only the replica's own connection can tell.
    return int(replica._core.store.db.execute("PRAGMA synchronous").fetchone()[0])


@pytest.mark.parametrize(("options", "expected"), [({}, 2), ({"synchronous": "normal"}, 1)])
def test_replica_synchronous_is_full_unless_normal_is_asked(
    tmp_path: Path, account: Account, options: dict[str, Any], expected: int
) -> None:
    path = tmp_path / "r.db"
    with Replica.join(path, account.bundle, options=ReplicaOptions(**options)) as joined:
        assert synchronous_of(joined) == expected
    with Replica.open(path, options=ReplicaOptions(**options)) as reopened:
        assert synchronous_of(reopened) == expected
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_replica_create_uses_synchronous_full_by_default(tmp_path: Path) -> None:
    replica, _ = Replica.create(tmp_path / "new.db", SCHEMA, PASSPHRASE)
    with replica:
        assert synchronous_of(replica) == 2
