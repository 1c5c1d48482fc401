"""Snapshots of a replica file: one consistent copy, as ciphertext, with no key needed.

A copy is taken through SQLite's online backup API inside one read transaction on the
source, so it is one snapshot and finishes while another process writes (stepwise, without
it, the copy restarted at every commit and never ended under a steady writer). It works on a
locked replica (the file holds only sealed envelopes and the passphrase-wrapped key bundle).
A *backup* leaves out what belongs to this device alone — records of `local` collections such
as drafts, journals, leases, and their quarantined or degraded rows — so a backup restored
elsewhere never carries one device's private state to another. Deleted rows are overwritten
(`secure_delete`), not merely unlinked. The copy is left in rollback-journal mode: one
self-contained file.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from replica.errors import StoreError
from replica.files import read_only_uri
from replica.replica import Replica
from replica.transfers import ProfileBackup

PAGES_PER_STEP = 1024
"""Pages copied between two progress reports (4 MiB at SQLite's default page size)."""
BUSY_TIMEOUT_S = 30.0

Progress = Callable[[int, int], None]
"""Called with (pages copied, pages in all) as the copy goes."""

_DROP_DEVICE_LOCAL = """
    DELETE FROM degraded WHERE key IN (SELECT key FROM local UNION ALL SELECT key FROM journal);
    DELETE FROM quarantine WHERE source IN ('local', 'journal');
    DELETE FROM local;
    DELETE FROM journal;
    UPDATE versions SET awaits = NULL WHERE awaits IS NOT NULL;
    DELETE FROM leases;
"""


def copy_replica_file(
    source: Path, target: Path, *, read_only: bool = False, progress: Progress | None = None
) -> None:
    """Copy `source` whole into the empty file `target` and fsync it."""
    uri = read_only_uri(source) if read_only else Path(source).resolve().as_uri()

    def report(_status: int, remaining: int, total: int) -> None:
        if progress is not None:
            progress(total - remaining, total)

    try:
        with (
            closing(
                sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            ) as src,
            closing(sqlite3.connect(target, isolation_level=None)) as dst,
        ):
            # One read transaction for the whole copy: every step reads the same snapshot
            # (WAL), so a writer meanwhile neither restarts the copy nor tears it.
            src.execute("BEGIN")
            src.execute("SELECT count(*) FROM sqlite_schema").fetchone()
            src.backup(dst, pages=PAGES_PER_STEP, progress=report)
            src.execute("COMMIT")
            dst.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{source} could not be copied: {exc}",
            hint="check that it is a sealsync replica or backup file",
        ) from exc
    _fsync(target)


def backup_replica_file(
    source: Path,
    target: Path,
    *,
    keep: ProfileBackup | None = None,
    progress: Progress | None = None,
) -> None:
    """Snapshot the replica at `source` into the empty file `target`, without this device's
    local records (and, given `keep`, with one profile's records only: its scopes, and its
    entry in the list of profiles); refuses a file that is not a replica before copying
    anything."""
    Replica.open(source).close()
    copy_replica_file(source, target, progress=progress)
    try:
        with closing(sqlite3.connect(target, isolation_level=None)) as copy:
            copy.execute("PRAGMA secure_delete=ON")
            copy.executescript(f"BEGIN IMMEDIATE; {_DROP_DEVICE_LOCAL} COMMIT;")
            if keep is not None:
                _keep_only(copy, keep)
    except sqlite3.Error as exc:  # the copy's disk failed or filled up: the copy is refused
        raise StoreError(f"{target} could not be written: {exc}") from exc
    _fsync(target)


def _keep_only(copy: sqlite3.Connection, keep: ProfileBackup) -> None:
    """Remove every row of other scopes (a held row whose scope is unknown among them), and
    the relay's cursor (restored in place, the replica pulls the other profiles again),
    then shrink the file: what was removed is gone from it, not left in free pages."""
    copy.execute("CREATE TEMP TABLE kept (scope BLOB PRIMARY KEY) WITHOUT ROWID")
    copy.execute("CREATE TEMP TABLE kept_keys (key BLOB PRIMARY KEY) WITHOUT ROWID")
    copy.executemany("INSERT INTO kept VALUES (?)", [(s,) for s in keep.scopes])
    copy.executemany("INSERT INTO kept_keys VALUES (?)", [(k,) for k in keep.keys])
    copy.executescript(_KEEP_ONLY_KEPT)  # one transaction
    copy.execute("VACUUM")


_KEEP_ONLY_KEPT = """
    BEGIN IMMEDIATE;
    DELETE FROM versions WHERE scope NOT IN (SELECT scope FROM kept)
        AND key NOT IN (SELECT key FROM kept_keys);
    DELETE FROM meta WHERE name IN
        ('cursor', 'max_seq_seen', 'relay_state', 'acked_cursor', 'run_passed');
    DELETE FROM held WHERE scope IS NULL OR scope NOT IN (SELECT scope FROM kept);
    DELETE FROM history WHERE key NOT IN (SELECT key FROM versions);
    DELETE FROM quarantine WHERE key IS NULL OR key NOT IN (SELECT key FROM versions);
    DELETE FROM degraded WHERE key NOT IN (SELECT key FROM versions);
    DELETE FROM locks;
    COMMIT;
"""


def _fsync(path: Path) -> None:
    with path.open("rb") as file:
        os.fsync(file.fileno())
