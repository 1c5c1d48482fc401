"""A backup merged into a live replica, as if its versions had been pulled.

Each version goes through the merge pulled pages go through (specs/merge.md §9): nothing
newer is overwritten, concurrent versions become siblings, and every rule a device applies
to what arrives from elsewhere applies here too (retired key epochs, freshness locks, drift,
holds, quarantine): a planted backup is a write path like any other. Versions the backup's
device had not pushed yet stay marked for pushing here.

The backup file is only read. Before anything is written, a sample of its envelopes must
authenticate under this account's keys: each envelope is bound to its account's id, so the
backup of another account opens none of them, and is refused. Versions merge a page per
transaction: a merge cut short merges the rest when run again, and nothing twice.

A backup may be older than a tombstone collection its relay ran since: what it holds may be
what collected tombstones replaced. So a merge makes the next sync a full resync
(`resync_needed`, replica/resync.py), and a version still to be pushed in the backup is
merged as *awaiting the resync's verdict* (`dirty = 2`): its device, or a later copy of
its file, may have pushed it since, and another device deleted it for good; it is not
pushed, and is set aside if the relay no longer has it. A replica that syncs through a
folder (no relay state) pushes them: a folder never collects.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

from replica import leases
from replica.core import Core
from replica.envelope import open_envelope
from replica.errors import EnvelopeError, ProtocolError, StoreError, UnknownEpochError
from replica.files import read_only_uri
from replica.outside import Merged, merge_outside
from replica.resync import RESYNC_LEASE, RESYNC_LEASE_TTL_S
from replica.wire import node_from_i64, parse_header

MERGE_WAIT_S = 30.0
"""How long a merge waits for a full resync of the file under way (`RESYNC_LEASE`)."""
PAGE_ROWS = 1000
"""Versions merged per transaction."""
SAMPLE_ROWS = 32
"""Envelopes opened to tell this account's backup from another's."""

Progress = Callable[[int, int], None]
"""Called with (versions read, versions in all) after each page."""
_Row = tuple[bytes, int, int, bytes, bool]
"""key, node (as stored), hlc, envelope, and whether it was still to be pushed."""
AWAITING_RESYNC = 2
"""`versions.dirty` of a version merged from a backup that may have been pushed already."""


def merge_backup(
    core: Core, backup: Path, scopes: frozenset[bytes] | None, progress: Progress | None
) -> Merged:
    """Merge the versions of `backup` (those of `scopes` only, when given) into the replica
    of `core`, which must be unlocked."""
    report = Merged()
    with (
        leases.take(core, RESYNC_LEASE, ttl_s=RESYNC_LEASE_TTL_S, wait_s=MERGE_WAIT_S),
        _checked(core, backup) as db,
    ):
        total = _count(db, scopes)
        for page in _pages(db, scopes):
            _merge_page(core, page, report)
            if progress is not None:
                progress(report.read, total)
    return report


def check_backup_account(core: Core, backup: Path) -> None:
    """`StoreError` unless `backup` is a backup of this (unlocked) replica's account, with
    rows of the right types: what a whole restore over this replica checks first."""
    with _checked(core, backup):
        pass


@contextmanager
def _checked(core: Core, backup: Path) -> Iterator[sqlite3.Connection]:
    """The backup, read-only in one read transaction (one snapshot, should anything write
    to it meanwhile), once its rows' types and its account are checked; a file SQLite
    cannot read is a `StoreError` naming it."""
    core.keys()  # ReplicaLockedError before anything is read
    try:
        with closing(sqlite3.connect(read_only_uri(backup), uri=True)) as db:
            db.execute("BEGIN")
            _check_types(backup, db)
            _check_account(core, backup, db)
            yield db
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{backup} could not be read: {exc}", hint="check it with `sealsync backup verify`"
        ) from exc


def _check_types(backup: Path, db: sqlite3.Connection) -> None:
    """Refuse, before anything is written, a backup with a row of the wrong types."""
    (damaged,) = db.execute(_WRONG_TYPES).fetchone()
    if damaged:
        raise StoreError(
            f"{backup} holds {damaged} row(s) of the wrong types: it is damaged",
            hint="nothing was merged; `sealsync backup verify` names them",
        )


_WRONG_TYPES = """
    SELECT (SELECT count(*) FROM versions WHERE typeof(key) != 'blob'
            OR typeof(envelope) != 'blob' OR typeof(node) != 'integer'
            OR typeof(hlc) != 'integer' OR typeof(dirty) != 'integer'
            OR typeof(scope) != 'blob')
         + (SELECT count(*) FROM held WHERE typeof(key) != 'blob'
            OR typeof(envelope) != 'blob' OR typeof(node) != 'integer'
            OR typeof(hlc) != 'integer' OR typeof(repush) != 'integer'
            OR typeof(scope) NOT IN ('blob', 'null'))
"""


def _check_account(core: Core, backup: Path, db: sqlite3.Connection) -> None:
    """Refuse a backup none of whose sampled envelopes (merged or held there) opens with
    this account's keys."""
    sample = [bytes(row[0]) for row in db.execute(_SAMPLE, (SAMPLE_ROWS, SAMPLE_ROWS))]
    keys = core.keys()
    unknown = 0
    for envelope in sample:
        try:
            open_envelope(keys, envelope, parse_header(envelope))
            return
        except UnknownEpochError:
            unknown += 1
        except (EnvelopeError, ProtocolError):
            pass
    if sample and unknown == len(sample):
        raise StoreError(
            f"{backup} is sealed under keys this replica does not have yet",
            hint="sync first: another device changed the account's keys after this backup",
        )
    if sample:
        raise StoreError(
            f"{backup} is another account's backup: none of {len(sample)} envelopes tried "
            "opens with this account's keys",
            hint="nothing was merged; `sealsync backup verify --read-data` checks it with a "
            "passphrase",
        )


_SAMPLE = """
    SELECT envelope FROM versions
        WHERE rowid IN (SELECT rowid FROM versions ORDER BY random() LIMIT ?)
    UNION ALL SELECT envelope FROM held
        WHERE rowid IN (SELECT rowid FROM held ORDER BY random() LIMIT ?)
"""
"""Row ids drawn first: ordering the envelopes themselves at random would read them all."""


def _count(db: sqlite3.Connection, scopes: frozenset[bytes] | None) -> int:
    if scopes is None:
        query = "SELECT (SELECT count(*) FROM versions) + (SELECT count(*) FROM held)"
        return int(db.execute(query).fetchone()[0])
    query = f"SELECT count(*) FROM versions WHERE scope IN ({','.join('?' * len(scopes))})"
    return int(db.execute(query, tuple(scopes)).fetchone()[0])


def _pages(db: sqlite3.Connection, scopes: frozenset[bytes] | None) -> Iterator[list[_Row]]:
    """The backup's versions and held versions, a page at a time; only the versions of
    `scopes` when given (a held version of an unverified scope is not among them)."""
    columns = "key, node, hlc, envelope"
    queries: list[tuple[str, tuple[bytes, ...]]]
    if scopes is None:
        queries = [
            (f"SELECT {columns}, dirty FROM versions ORDER BY id", ()),
            (f"SELECT {columns}, repush FROM held", ()),
        ]
    else:
        marks = ",".join("?" * len(scopes))
        where = f"WHERE scope IN ({marks}) ORDER BY id"
        queries = [(f"SELECT {columns}, dirty FROM versions {where}", tuple(scopes))]
    for query, args in queries:
        cursor = db.execute(query, args)
        while rows := cursor.fetchmany(PAGE_ROWS):
            yield [(bytes(k), node, hlc, bytes(e), bool(mark)) for k, node, hlc, e, mark in rows]


def _merge_page(core: Core, page: Sequence[_Row], report: Merged) -> None:
    """One page in one transaction, with the verdicts it leaves to the next resync."""
    with core.mutex, core.write_transaction():
        # a folder keeps no acks and never collects: there, nothing waits for a verdict
        pending = [(key, node, hlc) for key, node, hlc, _, dirty in page if dirty]
        push_now = core.store.get_bytes("relay_state") is None
        to_push = frozenset(
            (key, node_from_i64(node), hlc) for key, node, hlc in (pending if push_now else [])
        )
        awaiting = [] if push_now else pending
        report.add(merge_outside(core, [row[3] for row in page], "backup", to_push))
        core.store.db.executemany(
            "UPDATE versions SET dirty = ? WHERE key = ? AND node = ? AND hlc = ? AND dirty = 0",
            [(AWAITING_RESYNC, *dot) for dot in awaiting],
        )
        core.store.set_meta("resync_needed", 1)
