"""Dropping what the relay collected (docs/tombstone-collection.md §4, specs/replica.md §2.3).

A replica never decides collection itself: it drops a tombstone exactly when its relay did,
by applying each run's markers as its pull passes the run (specs/protocol.md §5.1). A
marker names a dot; the version with that dot goes only if its row says it is a tombstone
(`versions.tomb = 1`, known from opening it here): a relay cannot make a device drop live
data, and a row not classified yet stays (fail closed). With the tombstone go the held
versions of its key that its vector covers, whose release would have dropped them anyway,
and, once the key has no version left, its history.

A tombstone held here when its run passes, after it was opened (behind a freshness lock, or
for drift), goes as its release and the run would have taken it: with the versions its
vector covers, the lock notwithstanding. Kept, it would merge when released and stay a
tombstone only this device holds, and the replicas would never agree again. One held
unopened (sealed while locked, an unknown epoch) is kept: nothing here can say it is a
tombstone (the safe side: nothing live comes back).

The change feed cannot show an absence: meta `feed_floor` rises to the latest change of a
dropped row, and a follower whose cursor is below it reads everything again
(`FeedResetError`, replica/feed.py).
"""

from __future__ import annotations

from replica.errors import EnvelopeError
from replica.frontier import AUTHENTICATED_HOLDS
from replica.opener import Opener
from replica.store import Store
from replica.wire import (
    CollectedRun,
    VersionVector,
    decode_vector,
    dominates,
    node_from_i64,
    node_to_i64,
)
from replica.wiremarks import unpack_markers

COUNTERS = ("collected_versions", "collected_bytes", "collect_refused")
"""Meta counters of what markers did here, to date (`status`)."""


def apply_markers(store: Store, run: CollectedRun, opener: Opener | None) -> int:
    """Drop the tombstones `run` names, inside the caller's transaction; how many. A marker
    naming a live version here is counted (`collect_refused`); one naming nothing here, or
    a version not yet known to be a tombstone, does nothing. Held tombstones are opened
    with `opener` (None: locked, they stay)."""
    dropped = size = refused = 0
    floor = store.get_int("feed_floor")
    for key, node, hlc in unpack_markers(run):
        row = store.db.execute(
            "SELECT id, tomb, vector, length(envelope), changed FROM versions"
            " WHERE key = ? AND node = ? AND hlc = ?",
            (key, node_to_i64(node), hlc),
        ).fetchone()
        if row is None:
            held = _held_tombstone(store, opener, key, node, hlc)
            if held is not None:
                vector, length = held
                floor = max(floor, _drop_versions_covered(store, key, vector))
                _drop_covered(store, key, vector)
                dropped, size = dropped + 1, size + length
            continue
        if row[1] is None:
            continue
        if row[1] == 0:
            refused += 1
            continue
        rowid, _, vector, length, changed = row
        store.db.execute("DELETE FROM versions WHERE id = ?", (rowid,))
        _drop_covered(store, key, decode_vector(vector))
        dropped, size, floor = dropped + 1, size + length, max(floor, changed or 0)
    for name, count in zip(COUNTERS, (dropped, size, refused), strict=True):
        if count:
            store.set_meta(name, store.get_int(name) + count)
    if dropped:
        store.set_meta("feed_floor", floor)
    return dropped


def _held_tombstone(
    store: Store, opener: Opener | None, key: bytes, node: int, hlc: int
) -> tuple[VersionVector, int] | None:
    """(vector, size) of the tombstone with this dot held here after it was opened; None if
    there is none (or it cannot be opened now)."""
    if opener is None:
        return None
    marks = ",".join("?" * len(AUTHENTICATED_HOLDS))
    rows = store.db.execute(
        f"SELECT envelope FROM held WHERE key = ? AND node = ? AND hlc = ? AND reason IN ({marks})",
        (key, node_to_i64(node), hlc, *AUTHENTICATED_HOLDS),
    ).fetchall()
    for (envelope,) in rows:
        try:
            opened = opener.open(envelope)
        except EnvelopeError:
            continue  # `repair` quarantines it; the marker leaves it be
        if opened.deleted:
            return opened.header.vector, len(envelope)
    return None


def _drop_versions_covered(store: Store, key: bytes, vector: VersionVector) -> int:
    """Delete the versions of `key` that `vector` covers (what merging the held tombstone
    would have replaced); the latest change among them, for the feed's floor."""
    rows = store.db.execute(
        "SELECT id, node, hlc, changed FROM versions WHERE key = ?", (key,)
    ).fetchall()
    covered = [(i, c) for i, n, h, c in rows if dominates(vector, (node_from_i64(n), h))]
    store.db.executemany("DELETE FROM versions WHERE id = ?", [(i,) for i, _ in covered])
    return max((c or 0 for _, c in covered), default=0)


def _drop_covered(store: Store, key: bytes, vector: dict[int, int]) -> None:
    """The held versions of `key` the dropped tombstone covers, and the key's history once
    no version of it is left."""
    held = store.db.execute("SELECT node, hlc FROM held WHERE key = ?", (key,)).fetchall()
    covered = [(n, h) for n, h in held if dominates(vector, (node_from_i64(n), h))]
    store.db.executemany(
        "DELETE FROM held WHERE key = ? AND node = ? AND hlc = ?",
        [(key, n, h) for n, h in covered],
    )
    if store.db.execute("SELECT 1 FROM versions WHERE key = ?", (key,)).fetchone() is None:
        store.db.execute("DELETE FROM history WHERE key = ?", (key,))


def collected_counts(store: Store) -> tuple[int, int, int]:
    """(tombstones dropped, their bytes, markers refused), to date."""
    dropped, size, refused = (store.get_int(name) for name in COUNTERS)
    return dropped, size, refused
