"""The child process that test_crash and test_processes run against one replica file.

Run as `python tests/replica/replica_child.py MODE PATH KEY_HEX ...` with the project root on
PYTHONPATH. It opens an existing replica file and unlocks it with the raw account key (no
Argon2id), then, by MODE:

- `crash FIRST_BATCH PAGES_DIR PAGE_SIZE`: loops until killed. Each round writes batch k
  (FIRST_BATCH, FIRST_BATCH + 1, ...) in one `replica.batch()`, printing `txn-open k` inside the
  transaction before its last writes and `committed k` after it returns; then, if the page that
  starts at the replica's cursor is in PAGES_DIR, prints `merge-start i`, applies it and prints
  `merged i`. Every marker line is flushed at once, so the parent can SIGKILL at a known phase.
- `writer WHO COUNT INCREMENTS`: waits for `go` on stdin, then puts COUNT distinct records
  `WHO-n` and bumps the shared counter with `update` INCREMENTS times, interleaved.
- `batch-writer BATCHES`: waits for `go`, then writes BATCHES batches of BATCH_RECORDS records.
- `steady-writer SECONDS`: waits for `go`, then puts `steady-n` one per transaction, 250 a
  second, printing `committed n` as each returns.
- `reader TOTAL`: waits for `go`, then scans and reads until it sees TOTAL records, checking
  that every scan sees exactly the first b whole batches with their exact content (a
  consistent snapshot), never fewer than the previous scan, and that `get` agrees with it.

Every mode prints `ready` once the replica is open and unlocked; the modes other than `crash`
end with a JSON line (`result {...}`). Any error is a traceback on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from replica import Page, Record, Replica

WRITES_BEFORE_MARKER = 12
WRITES_AFTER_MARKER = 20
BATCH_RECORDS = 5
COUNTER_ID = "counter"
LAST_BATCH_ID = "last-batch"
MAX_ROUNDS = 10_000
STEADY_PER_S = 250
READER_TIMEOUT_S = 60.0
CHILD_SCRIPT = Path(__file__).resolve()
PROJECT_ROOT = CHILD_SCRIPT.parents[2]


def start_child(
    mode: str, path: Path, account_key: bytes, *args: object
) -> subprocess.Popen[bytes]:
    """Start this script as a child process (the parent side of the command line above)."""
    return subprocess.Popen(
        [sys.executable, str(CHILD_SCRIPT), mode, str(path), account_key.hex(), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)},
    )


def batch_record_id(batch: int, index: int) -> str:
    return f"batch-{batch:05}-{index:02}"


def batch_document(batch: int, index: int) -> dict[str, Any]:
    """The exact content of record `index` of crash batch `batch` (the parent checks it)."""
    return {"batch": batch, "index": index, "text": f"batch {batch} record {index} " + "x" * 40}


def page_file(pages_dir: Path, index: int) -> Path:
    return pages_dir / f"page-{index:05}.msgpack"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_replica(path: str, key_hex: str) -> Replica:
    replica = Replica.open(path)
    replica.unlock_with_key(bytes.fromhex(key_hex))
    return replica


def wait_for_go() -> None:
    say("ready")
    line = sys.stdin.readline().strip()
    if line != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


# -- crash --------------------------------------------------------------------------------------


def write_crash_batch(replica: Replica, batch: int) -> None:
    total = WRITES_BEFORE_MARKER + WRITES_AFTER_MARKER
    with replica.batch():
        for index in range(WRITES_BEFORE_MARKER):
            replica.put("notes", batch_record_id(batch, index), batch_document(batch, index))
        say(f"txn-open {batch}")
        for index in range(WRITES_BEFORE_MARKER, total):
            replica.put("notes", batch_record_id(batch, index), batch_document(batch, index))
        replica.put("notes", LAST_BATCH_ID, {"batch": batch})
    say(f"committed {batch}")


def merge_next_page(replica: Replica, pages_dir: Path, page_size: int) -> None:
    session = replica.sync_session()
    index = session.cursor // page_size
    path = page_file(pages_dir, index)
    if not path.exists():
        say(f"no-page {index}")
        return
    page = msgspec.msgpack.decode(path.read_bytes(), type=Page)
    say(f"merge-start {index}")
    session.apply_page(page)
    say(f"merged {index}")


def run_crash(replica: Replica, first_batch: int, pages_dir: Path, page_size: int) -> None:
    say("ready")
    for batch in range(first_batch, first_batch + MAX_ROUNDS):
        write_crash_batch(replica, batch)
        merge_next_page(replica, pages_dir, page_size)
    raise SystemExit("crash child was never killed")


# -- processes ----------------------------------------------------------------------------------


def increment(document: Any) -> dict[str, int]:
    return {"n": (document or {}).get("n", 0) + 1}


def run_writer(replica: Replica, who: str, count: int, increments: int) -> dict[str, Any]:
    wait_for_go()
    started = time.time()
    for n in range(max(count, increments)):
        if n < count:
            replica.put("notes", f"{who}-{n:05}", {"who": who, "n": n})
        if n < increments:
            replica.update("notes", COUNTER_ID, increment)
    return {"started": started, "ended": time.time()}


def run_batch_writer(replica: Replica, batches: int) -> dict[str, Any]:
    wait_for_go()
    started = time.time()
    for batch in range(batches):
        with replica.batch():
            for index in range(BATCH_RECORDS):
                replica.put("notes", batch_record_id(batch, index), batch_document(batch, index))
    return {"started": started, "ended": time.time()}


def run_steady_writer(replica: Replica, seconds: float) -> dict[str, Any]:
    """Put `steady-n` one per transaction at STEADY_PER_S for `seconds`, printing
    `committed n` (flushed) as each put returns: what the parent may count as acknowledged."""
    wait_for_go()
    started = time.monotonic()
    n = 0
    while (elapsed := time.monotonic() - started) < seconds:
        replica.put("notes", f"steady-{n}", {"n": n})
        say(f"committed {n}")
        n += 1
        time.sleep(max(0.0, n / STEADY_PER_S - elapsed - 0.0005))
    return {"commits": n, "seconds": time.monotonic() - started}


def run_reader(replica: Replica, total: int) -> dict[str, Any]:
    wait_for_go()
    started = time.time()
    scans = gets = 0
    seen = 0
    while seen < total:
        if time.time() - started > READER_TIMEOUT_S:
            raise SystemExit(f"reader saw {seen} of {total} records in {READER_TIMEOUT_S} s")
        records = replica.scan("notes")
        scans += 1
        check_whole_batches(records, seen)
        seen = len(records)
        if records:
            last = records[-1]
            got = replica.get("notes", last.id)
            gets += 1
            if got is None or got.document != last.document:
                raise SystemExit(f"get {last.id} returned {got!r} after scan saw it")
    return {"started": started, "ended": time.time(), "scans": scans, "gets": gets}


def check_whole_batches(records: list[Record], seen_before: int) -> None:
    """A scan is one snapshot: batches 0..b-1 complete with their content, nothing else."""
    batches = len(records) // BATCH_RECORDS
    expected = {
        batch_record_id(batch, index): batch_document(batch, index)
        for batch in range(batches)
        for index in range(BATCH_RECORDS)
    }
    got = {record.id: record.document for record in records}
    if len(records) < seen_before or got != expected:
        raise SystemExit(
            f"scan saw {len(records)} records after {seen_before}, "
            f"{len(set(got) - set(expected))} outside whole batches or with other content"
        )


def main(argv: list[str]) -> None:
    mode, path, key_hex, *rest = argv
    replica = open_replica(path, key_hex)
    try:
        if mode == "crash":
            run_crash(replica, int(rest[0]), Path(rest[1]), int(rest[2]))
        elif mode == "writer":
            say("result " + json.dumps(run_writer(replica, rest[0], int(rest[1]), int(rest[2]))))
        elif mode == "batch-writer":
            say("result " + json.dumps(run_batch_writer(replica, int(rest[0]))))
        elif mode == "steady-writer":
            say("result " + json.dumps(run_steady_writer(replica, float(rest[0]))))
        elif mode == "reader":
            say("result " + json.dumps(run_reader(replica, int(rest[0]))))
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        replica.close()


if __name__ == "__main__":
    main(sys.argv[1:])
