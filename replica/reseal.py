"""Re-sealing this device's pending writes after a rotation retired their key epoch
(docs/key-generations.md §6).

Every device refuses a version under a retired epoch that the rotation's frontier does not
vouch for (`Frontier.trusts`): a revoked device keeps the old keys. A write this device has
not pushed yet may be such a version: made offline, before it took the new generation, even
with a vector the frontier covers (the frontier is a per-node maximum, so an hlc below it
proves nothing). So every pending write of its own under a retired epoch is sealed again
under the newest epoch, with the same dot and vector, before it is pushed. Other devices'
versions a reseed marked for pushing keep their bytes: they came from the relay, within the
frontier, and two devices sealing one dot differently would conflict forever.

The earlier sealing is kept in `resealed` (until the next re-seal, which drops those of
acknowledged writes; a push that uses one drops it): if the relay holds
it already (the answer to an earlier push was lost), the relay answers `identity_conflict`,
and the earlier bytes are pushed again, which it acknowledges as stored. That copy was
stored before the rotation, which pulled it (the relay checked its head): within the
frontier, at a seq it saw, so the other devices trust it.
"""

from __future__ import annotations

from replica.envelope import open_envelope, seal
from replica.errors import EnvelopeError, ProtocolError, UnknownEpochError
from replica.keys import AccountKeys, RandomBytes
from replica.store import Store
from replica.wire import NONCE_BYTES, Header, node_to_i64, parse_header

Identity = tuple[bytes, int, int]


def pending_under_retired(
    store: Store, keys: AccountKeys, node: int
) -> list[tuple[int, Header, bytes]]:
    """(row id, header, envelope) of each dirty version of this device's (`node`) sealed under
    a retired epoch. A row whose header does not parse is left out: the push path keeps
    damaged rows back."""
    retired = keys.retired_epochs
    found = []
    rows = store.db.execute(
        "SELECT id, envelope FROM versions WHERE dirty = 1 AND node = ?", (node_to_i64(node),)
    )
    for rowid, envelope in rows:
        try:
            header = parse_header(envelope)
        except ProtocolError:
            continue
        if header.epoch in retired:
            found.append((rowid, header, envelope))
    return found


def reseal_pending(store: Store, keys: AccountKeys, node: int, random_bytes: RandomBytes) -> int:
    """Re-seal, inside the caller's write transaction, every version `pending_under_retired`
    finds, keeping its earlier sealing; how many. One that no longer opens is left as it is."""
    updates: list[tuple[bytes, int]] = []
    earlier: list[tuple[bytes, int, int, bytes]] = []
    for rowid, header, envelope in pending_under_retired(store, keys, node):
        try:
            opened = open_envelope(keys, envelope, header)
        except (EnvelopeError, UnknownEpochError):
            continue
        fresh = seal(
            keys,
            opened.identity,
            hlc=header.hlc,
            node=header.node,
            vector=header.vector,
            deleted=opened.deleted,
            document=opened.document,
            nonce=random_bytes(NONCE_BYTES),
        )
        updates.append((fresh, rowid))
        earlier.append((header.key, node_to_i64(header.node), header.hlc, envelope))
    store.db.executemany("INSERT OR IGNORE INTO resealed VALUES (?, ?, ?, ?)", earlier)
    store.db.executemany("UPDATE versions SET envelope = ? WHERE id = ?", updates)
    return len(updates)


def forget_acknowledged(store: Store) -> None:
    """Drop the earlier sealings of writes no longer pending (acknowledged, or replaced)."""
    store.db.execute(
        "DELETE FROM resealed WHERE NOT EXISTS (SELECT 1 FROM versions v WHERE v.dirty = 1"
        " AND v.key = resealed.key AND v.node = resealed.node AND v.hlc = resealed.hlc)"
    )


def restore_earlier_sealings(store: Store, conflicts: list[Identity]) -> tuple[int, int]:
    """Put back, still dirty, the earlier sealing of re-sealed versions the relay refused with
    `identity_conflict`: it holds that sealing, so pushing it again is acknowledged as stored.
    Returns how many were put back and the lowest row id among them (for the push pass to
    offer them again)."""
    rowids: list[int] = []
    for key, node, hlc in conflicts:
        args = (key, node_to_i64(node), hlc)
        row = store.db.execute(
            "DELETE FROM resealed WHERE key = ? AND node = ? AND hlc = ? RETURNING envelope", args
        ).fetchone()
        if row is None:
            continue
        found = store.db.execute(
            "UPDATE versions SET envelope = ? WHERE key = ? AND node = ? AND hlc = ? AND dirty = 1"
            " RETURNING id",
            (row[0], *args),
        ).fetchone()
        if found is not None:
            rowids.append(found[0])
    return len(rowids), min(rowids, default=0)
