"""A full resync (docs/tombstone-collection.md §3): what a device does when its relay ran a
tombstone collection without it (away past the horizon, or a copy of an older replica
logging in as a new device), and so will never send it the markers of that run.

The device pulls everything again from 0 and notes each version the relay still has. What
it holds that the relay does not was dropped there: dominated by a version the pull brings
(the merge drops it here too), or collected with a tombstone that covered it — this device
never merged that tombstone, so its copy would live on here, and, pushed again, bring the
record back on every device. So, at the head:

- an unseen version this device acknowledged (`dirty = 0`) is deleted: the relay had it;
- an unseen dirty version that may have been offered before is *set aside*: moved to `held`
  with reason `collected`, never merged or pushed, kept for the person to look at (its push
  may have been stored, then deleted on another device). That is one whose hlc is at or
  below meta `offered_through` (the greatest hlc a signed push included: every version
  this node wrote since has a greater hlc), one written as another
  node (a reseed marks pulled versions too; a restored or copied file's versions were
  written under its old node id, and their copies elsewhere may have pushed them since),
  and one merged from a backup (`dirty = 2`, replica/restore.py), which counts as
  acknowledged if seen;
- an unseen dirty version of this node above the mark is a new write: it is pushed;
- an unseen held version is set aside too: merged later, it could be one a collected
  tombstone replaced.

On a relay that never ran a collection (its pages' `last_run` is 0, and no run was applied
here), nothing it lacks can have been collected: every unseen version is pushed (again), and
nothing is dropped or set aside. That is the usual resync of a restored file. But a relay's
`last_run` covers only its own history: once this file forgot a relay (a reseed, an
adoption: meta `relay_changed`, kept for good), what it holds may have been collected by
another relay, or by this one before a wipe, and the one that reseeded it never knew. Then
nothing is dropped either: an unseen acknowledged version is set aside too.

The unseen set lives in a temporary table of the file's connection: a resync cut short
starts again from 0 at the next sync, as the relay still asks for one. So does one that
another process's pull overtook (its pages were not all the next ones): what that process
merged, this one never saw, and would take for gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replica.asides import HeldVersion, Row
from replica.store import Store
from replica.wire import PageEntry, node_from_i64, node_to_i64, peek_dot

SET_ASIDE = "collected"
"""The `held` reason of a version a resync set aside."""
RESYNC_LEASE = "sealsync/resync"
"""The lease held over a full resync (by the driver) and over a merge of a backup: one of
them at a time on a file, or a merge's writes would be settled by a resync that never
looked at them."""
RESYNC_LEASE_TTL_S = 60.0
"""The lease's time to live: renewed while held, it runs out this long after a crash."""


History = Literal["never_collected", "collected", "unknown"]
"""What a resync may take the relay's pages to cover: the whole history of this file, on a
relay that never ran a collection (`never_collected`) or did (`collected`); or not all of it
(`unknown`: this file forgot a relay, meta `relay_changed`, and what it holds from before
may have been collected by another relay, or by this one before a wipe)."""


@dataclass(frozen=True)
class Resynced:
    """What a full resync did to this file."""

    dropped: int
    """Versions deleted: acknowledged once, gone from the relay since."""
    set_aside: int
    """Versions moved to `held` (reason `collected`): neither merged nor pushed."""


def begin(store: Store) -> None:
    """Note every version and held version as unseen, and pull from 0 (inside the caller's
    transaction)."""
    store.db.execute("DROP TABLE IF EXISTS temp.resync_unseen")
    store.db.execute(
        "CREATE TEMP TABLE resync_unseen (key BLOB NOT NULL, node INTEGER NOT NULL,"
        " hlc INTEGER NOT NULL, PRIMARY KEY (key, node, hlc)) WITHOUT ROWID"
    )
    store.db.execute(
        "INSERT OR IGNORE INTO resync_unseen SELECT key, node, hlc FROM versions"
        " UNION SELECT key, node, hlc FROM held"
    )
    store.delete_meta("cursor")


def abandon(store: Store) -> None:
    """A resync that will not finish: its notes go (the next begins anew)."""
    store.db.execute("DROP TABLE IF EXISTS temp.resync_unseen")


def saw(store: Store, entries: list[PageEntry]) -> None:
    """The relay still has these versions."""
    dots = (peek_dot(entry.envelope) for entry in entries)
    store.db.executemany(
        "DELETE FROM resync_unseen WHERE key = ? AND node = ? AND hlc = ?",
        [(key, node_to_i64(node), hlc) for key, node, hlc in (d for d in dots if d)],
    )


def finish(store: Store, history: History) -> Resynced:
    """Settle what the relay no longer has (inside the caller's transaction)."""
    if history == "never_collected":
        return _nothing_collected(store)
    offered, own = store.get_int("offered_through"), node_to_i64(store.get_int("node"))
    rows = store.db.execute(
        "SELECT v.id, v.dirty, v.changed, v.key, v.node, v.hlc, v.envelope, v.scope"
        " FROM versions v JOIN resync_unseen u ON u.key = v.key AND u.node = v.node"
        " AND u.hlc = v.hlc"
    ).fetchall()
    gone = [r for r in rows if r[1] != 1 or r[5] <= offered or r[4] != own]
    aside = [r for r in gone if r[1] or history == "unknown"]
    store.hold(
        HeldVersion(Row(key, node_from_i64(node), hlc, envelope), SET_ASIDE, None, scope)
        for _, _, _, key, node, hlc, envelope, scope in aside
    )
    store.db.executemany("DELETE FROM versions WHERE id = ?", [(r[0],) for r in gone])
    store.db.execute("UPDATE versions SET dirty = 0 WHERE dirty = 2")  # seen: the relay has it
    held = store.db.execute(
        "UPDATE held SET reason = ?, repush = 0, release_after_ms = NULL WHERE reason <> ?"
        " AND (key, node, hlc) IN (SELECT key, node, hlc FROM resync_unseen)",
        (SET_ASIDE, SET_ASIDE),
    ).rowcount
    floor = max((r[2] or 0 for r in gone), default=0)
    if floor > store.get_int("feed_floor"):
        store.set_meta("feed_floor", floor)
    store.db.executemany(
        "DELETE FROM history WHERE key = ?1 AND NOT EXISTS (SELECT 1 FROM versions WHERE key = ?1)",
        [(key,) for key in {r[3] for r in gone}],
    )
    store.db.execute("DROP TABLE temp.resync_unseen")
    dropped = len(gone) - len(aside)
    if dropped:
        store.set_meta("resync_dropped", store.get_int("resync_dropped") + dropped)
    return Resynced(dropped, len(aside) + held)


def _nothing_collected(store: Store) -> Resynced:
    """A relay that never collected lacks a version only if it never stored it (or lost
    it): no tombstone it took away could cover one, so every unseen version is pushed
    (again), and nothing is dropped or set aside. Held versions stay held."""
    store.db.execute(
        "UPDATE versions SET dirty = 1 WHERE (key, node, hlc) IN"
        " (SELECT key, node, hlc FROM resync_unseen)"
    )
    store.db.execute("UPDATE versions SET dirty = 0 WHERE dirty = 2")  # seen: the relay has it
    store.db.execute("DROP TABLE temp.resync_unseen")
    return Resynced(0, 0)
