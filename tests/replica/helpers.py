"""Small helpers shared by replica tests: pages made by hand, envelopes a replica wrote."""

from __future__ import annotations

import sqlite3

from replica import Page, PageEntry, PushResult, Receipt, RelayState, Replica
from replica.envelope import open_envelope

STATE = RelayState(storage_id="s", account_epoch="e", head=1 << 40)


def page_of(
    envelopes: list[bytes], cursor: int = 0, *, state: RelayState = STATE, last_run: int = 0
) -> Page:
    """A page with consecutive seqs after `cursor`."""
    entries = [PageEntry(cursor + i + 1, e) for i, e in enumerate(envelopes)]
    return Page(cursor, entries, cursor + len(entries), False, state, None, last_run)


def apply(replica: Replica, envelopes: list[bytes]) -> None:
    """Merge envelopes into `replica` as one page that starts at its cursor, from a relay
    whose latest collection run is the one the replica applied last, if any."""
    session = replica.sync_session()
    last_run = replica._core.store.get_int("run_passed")
    session.apply_page(page_of(envelopes, session.cursor, last_run=last_run))


def dirty_envelopes(replica: Replica) -> list[bytes]:
    """Every envelope `replica` has not pushed yet, marking them pushed."""
    session = replica.sync_session()
    out: list[bytes] = []
    while (batch := session.next_batch()) is not None:
        out.extend(batch.envelopes)
        receipts = [Receipt("stored", seq=1) for _ in batch.envelopes]
        session.acknowledge(batch, PushResult(receipts, STATE))
    return out


def undo_format_12(db: sqlite3.Connection) -> None:
    """Lay a current file out as format 11 did: no write defers a journal entry."""
    db.execute("DROP INDEX versions_awaiting")
    db.execute("ALTER TABLE versions DROP COLUMN awaits")


def undo_format_10(db: sqlite3.Connection) -> None:
    """Lay a current file out as format 9 did: its versions do not say which are
    tombstones (nor, format 12, which await a journal entry)."""
    undo_format_12(db)
    db.execute("DROP INDEX versions_unclassified")
    db.execute("ALTER TABLE versions DROP COLUMN tomb")


def undo_formats_6_to_10(db: sqlite3.Connection) -> None:
    """Lay a current file out as format 5 did, for tests of older formats' migrations: no
    blind index columns (format 6), no change feed (format 7), no leases (format 8), no
    journals (format 9), no tombstone column (format 10)."""
    undo_format_10(db)
    for statement in (
        "DROP INDEX versions_by_blind",
        "DROP INDEX versions_by_change",
        "DROP INDEX local_by_change",
        "ALTER TABLE versions DROP COLUMN blind",
        "ALTER TABLE versions DROP COLUMN created",
        "ALTER TABLE versions DROP COLUMN changed",
        "ALTER TABLE local DROP COLUMN changed",
        "DELETE FROM meta WHERE name IN ('feed_id', 'feed_seq')",
        "DROP TABLE leases",
        "DROP TABLE journal",
    ):
        db.execute(statement)


def tomb_mismatches(replica: Replica) -> list[tuple[int, int | None, bool]]:
    """(row id, `tomb` column, the envelope's `deleted`) of each version whose row says
    otherwise than its envelope (it must be opened: an unlocked replica's)."""
    core = replica._core
    keys = core.keys()
    with core.mutex:
        rows = core.store.db.execute("SELECT id, tomb, envelope FROM versions").fetchall()
    found = [(rowid, tomb, open_envelope(keys, envelope).deleted) for rowid, tomb, envelope in rows]
    return [row for row in found if row[1] != int(row[2])]
