"""Which stored versions are tombstones, known without opening them (specs/replica.md §2).

Every version stored from format 10 on says so in its row (`versions.tomb`), written with it
by the local write or the merge that stores it. Rows stored by an earlier format hold NULL
until an unlock opens them: `classify_unknown` runs at every unlock and does nothing once
none is left. A row that does not open stays NULL (repair quarantines it; fail closed, §7):
it is counted as `unclassified` by `status`, never guessed.

A tombstone found so was pushed, if at all, before protocol 5 let a push say so: it is
marked to be pushed once more, and the relay, which holds it already, takes the declaration
(specs/protocol.md §2, `PushBatch.tombstones`).
"""

from __future__ import annotations

from replica.envelope import open_envelope
from replica.errors import EnvelopeError, UnknownEpochError
from replica.keys import AccountKeys
from replica.store import Store

CHUNK_ROWS = 2000
"""Rows opened and written per transaction: a long first unlock keeps its progress, and
other writers of the file wait at most one chunk."""


def classify_unknown(store: Store, keys: AccountKeys) -> int:
    """Open every version whose row does not say whether it is a tombstone, and say so;
    the rows classified (those that do not open are left as they are)."""
    classified, after = 0, 0
    while True:
        with store.transaction():
            rows = store.db.execute(
                "SELECT id, envelope FROM versions WHERE tomb IS NULL AND id > ? ORDER BY id"
                " LIMIT ?",
                (after, CHUNK_ROWS),
            ).fetchall()
            if not rows:
                return classified
            found = []
            for rowid, envelope in rows:
                try:
                    found.append((int(open_envelope(keys, envelope).deleted), rowid))
                except (EnvelopeError, UnknownEpochError):
                    continue  # unreadable: repair quarantines it, nothing is guessed
            store.db.executemany(
                "UPDATE versions SET tomb = ?1, dirty = max(dirty, ?1) WHERE id = ?2", found
            )
        classified += len(found)
        after = rows[-1][0]


def tomb_counts(store: Store) -> tuple[int, int, int]:
    """(tombstones, their envelopes' bytes, versions not classified yet)."""
    row = store.db.execute(
        "SELECT count(*) FILTER (WHERE tomb = 1),"
        " coalesce(sum(length(envelope)) FILTER (WHERE tomb = 1), 0),"
        " count(*) FILTER (WHERE tomb IS NULL) FROM versions"
    ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])
