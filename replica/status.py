"""A replica's health at a glance: what waits to be pushed, held, in conflict or unreadable."""

from __future__ import annotations

from dataclasses import dataclass

from replica.collected import collected_counts
from replica.store import Store
from replica.tombs import tomb_counts


@dataclass(frozen=True)
class Status:
    """Counts from the replica file (specs/replica.md §status).

    `dirty`: local versions not yet acknowledged by a relay. `awaiting_resync`: versions
    merged from a backup that wait for the next resync, which finds them on the relay or
    sets them aside (never pushes them). `held_for_drift`, `held_for_lock`, `held_other`
    (by reason: sealed, epoch, collection): versions kept aside, never dropped.
    `conflicts`: records with more than one sibling. `quarantined`: rows moved aside
    verbatim. `degraded`: records whose reads are refused until repair.
    `tombstones`, `tombstone_bytes`: versions that say their record is deleted, and their
    envelopes' bytes: what deleting keeps. `unclassified`: versions stored by an earlier
    format not yet opened to tell (until the next unlock; unreadable ones until repair).
    `collected`, `collected_bytes`: tombstones dropped as the relay collected them, and their
    bytes; `collect_refused`: markers that named a live version here (kept), to date.
    `last_sync_ms` and `skew_seen_ms` (the furthest ahead of our clock a peer's hlc was) come
    from the sync session; None until one ran.
    """

    locked: bool
    node: int
    records: int
    dirty: int
    awaiting_resync: int
    held_for_drift: int
    held_for_lock: int
    held_other: dict[str, int]
    conflicts: int
    quarantined: int
    degraded: int
    tombstones: int
    tombstone_bytes: int
    unclassified: int
    collected: int
    collected_bytes: int
    collect_refused: int
    cursor: int
    last_sync_ms: int | None
    skew_seen_ms: int | None


def read_status(store: Store, *, locked: bool, node: int) -> Status:
    db = store.db
    held = store.count_held()
    records = db.execute("SELECT count(DISTINCT key) FROM versions").fetchone()[0]
    conflicts = db.execute(
        "SELECT count(*) FROM (SELECT key FROM versions GROUP BY key HAVING count(*) > 1)"
    ).fetchone()[0]
    last_sync = store.get_meta("last_sync_ms")
    skew = store.get_meta("skew_seen_ms")
    tombstones, tombstone_bytes, unclassified = tomb_counts(store)
    collected, collected_bytes, refused = collected_counts(store)
    return Status(
        locked=locked,
        node=node,
        records=int(records),
        dirty=store.count_dirty(),
        awaiting_resync=store.count_awaiting_resync(),
        held_for_drift=held.pop("drift", 0),
        held_for_lock=held.pop("lock", 0),
        held_other=held,
        conflicts=int(conflicts),
        quarantined=store.count("quarantine"),
        degraded=store.count_degraded(),
        tombstones=tombstones,
        tombstone_bytes=tombstone_bytes,
        unclassified=unclassified,
        collected=collected,
        collected_bytes=collected_bytes,
        collect_refused=refused,
        cursor=store.get_int("cursor"),
        last_sync_ms=None if last_sync is None else int(last_sync),
        skew_seen_ms=None if skew is None else int(skew),
    )
