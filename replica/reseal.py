"""Re-sealing this device's own versions after a rotation retired their key epoch
(docs/key-generations.md §6).

Every device refuses a version under a retired epoch that the rotation's frontier does not
vouch for (`Frontier.trusts`): a revoked device keeps the old keys. A version of this
device's may be such a version: made offline, before it took the new generation, or pushed
while the rotation was under way (the relay stored it past the head the rotation names, and
a device pushing then cannot tell), even with a vector the frontier covers (the frontier is a
per-node maximum, so an hlc below it proves nothing). So every version of its own under a
retired epoch is sealed again under the newest epoch, with the same dot and vector, and
pushed: the relay replaces the earlier sealing of a dot by a later one (relay/versions.py),
and a device that holds the earlier one keeps it (it took it while it trusted it). Other
devices' versions keep their bytes: they came from the relay, within the frontier, and only
their writers may seal them again.
"""

from __future__ import annotations

from replica.envelope import open_envelope, seal
from replica.errors import EnvelopeError, ProtocolError, UnknownEpochError
from replica.keys import AccountKeys, RandomBytes
from replica.store import Store
from replica.wire import NONCE_BYTES, Header, node_to_i64, parse_header


def own_under_retired(
    store: Store, keys: AccountKeys, node: int, *, pending_only: bool
) -> list[tuple[int, Header, bytes]]:
    """(row id, header, envelope) of each version of this device's (`node`) sealed under a
    retired epoch, pending or not (only pending ones with `pending_only`). A row whose header
    does not parse is left out: the push path keeps damaged rows back."""
    retired = keys.retired_epochs
    found = []
    pending = " AND dirty = 1" if pending_only else ""
    rows = store.db.execute(
        f"SELECT id, envelope FROM versions WHERE node = ?{pending}", (node_to_i64(node),)
    )
    for rowid, envelope in rows:
        try:
            header = parse_header(envelope)
        except ProtocolError:
            continue
        if header.epoch in retired:
            found.append((rowid, header, envelope))
    return found


def reseal_own(
    store: Store, keys: AccountKeys, node: int, random_bytes: RandomBytes, *, pending_only: bool
) -> int:
    """Re-seal, inside the caller's write transaction, every version `own_under_retired`
    finds, and mark it for pushing; how many. One that no longer opens is left as it is."""
    updates: list[tuple[bytes, int]] = []
    for rowid, header, envelope in own_under_retired(store, keys, node, pending_only=pending_only):
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
    store.db.executemany("UPDATE versions SET envelope = ?, dirty = 1 WHERE id = ?", updates)
    return len(updates)
