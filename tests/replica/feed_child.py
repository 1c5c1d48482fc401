"""The child processes of test_change_feed and test_leases, on one real replica file.

Run as `python tests/replica/feed_child.py MODE PATH KEY_HEX ...` with the project root on
PYTHONPATH; each opens the replica and unlocks it with the raw account key. Modes:

- `writer FIRST COUNT`: puts records `n{FIRST}`, `n{FIRST + 1}`, … one per transaction,
  printing `committed ID` (flushed) after each commit returns; COUNT of them, slowly (2 ms
  apart), so the parent can SIGKILL it mid-run.
- `follower STATE_DB STOP_AFTER`: follows `changes()` from the cursor kept in STATE_DB (a
  SQLite file of its own), storing each page's record ids and the page's cursor in one
  transaction there — the follower the docs promise exactly once to. Waits with
  `wait_for_change`; ends after STOP_AFTER ids this run, or after 3 s without a change.
- `lease NAME TTL_S`: takes the lease NAME, prints `taken`, and holds it (renewed) until
  killed.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

from replica import Replica

IDLE_S = 3.0


def writer(replica: Replica, first: int, count: int) -> None:
    for number in range(first, first + count):
        replica.put("notes", f"n{number}", {"n": number})
        print(f"committed n{number}", flush=True)
        time.sleep(0.002)


def follower(replica: Replica, state_path: Path, stop_after: int) -> None:
    state = sqlite3.connect(state_path, isolation_level=None)
    state.execute("CREATE TABLE IF NOT EXISTS seen (n INTEGER PRIMARY KEY, id TEXT NOT NULL)")
    state.execute("CREATE TABLE IF NOT EXISTS cursor (one INTEGER PRIMARY KEY, value TEXT)")
    row = state.execute("SELECT value FROM cursor").fetchone()
    cursor = None if row is None else str(row[0])
    taken = 0
    while taken < stop_after:
        page = replica.changes(cursor, limit=7)
        state.execute("BEGIN IMMEDIATE")
        for change in page.changes:
            assert change.identity is not None
            state.execute("INSERT INTO seen (id) VALUES (?)", (change.identity.id,))
        state.execute("INSERT OR REPLACE INTO cursor VALUES (1, ?)", (page.cursor,))
        state.execute("COMMIT")
        taken += len(page.changes)
        cursor = page.cursor
        if not page.more and not replica.wait_for_change(cursor, IDLE_S):
            break
    print(f"followed {taken}", flush=True)


def main(argv: list[str]) -> None:
    mode, path, key_hex, *args = argv
    with Replica.open(path) as replica:
        replica.unlock_with_key(bytes.fromhex(key_hex))
        print("ready", flush=True)
        if mode == "writer":
            writer(replica, int(args[0]), int(args[1]))
        elif mode == "follower":
            follower(replica, Path(args[0]), int(args[1]))
        elif mode == "lease":
            with replica.lease(args[0], ttl_s=float(args[1])):
                print("taken", flush=True)
                time.sleep(3600)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
