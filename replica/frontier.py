"""What a replica knows, as a rotation frontier (docs/key-generations.md §6): the union of
every version vector it holds, and the relay storage and head it has pulled up to."""

from __future__ import annotations

import msgspec

from replica.keys import Frontier
from replica.store import Store
from replica.wire import RelayState, decode_vector, merge_vectors, parse_header

AUTHENTICATED_HOLDS = ("drift", "lock", "collection")
"""Held versions that were opened before being held (the others are not yet this replica's)."""


FOLDER_STORAGE = "folder"
"""The storage a frontier recorded through a shared folder names: files carry no seqs, so
only the vector rule applies to it (never a relay's storage id, so never its seq rule)."""


def frontier_of(store: Store, *, through_folder: bool = False) -> Frontier:
    """Over the versions (history is dominated by them) and the authenticated held ones: a
    version this device pulled but holds must stay within the frontier, or every device would
    refuse it once its epoch is retired. Its own pending writes count too: one the relay
    stored although the answer was lost is trusted by the others from that copy, and its
    vector may hold the only entry left of a version it replaced. Without a relay state
    (never synced since a reseed) the frontier is not enforced, unless it was recorded
    `through_folder` after a round (which read what the folder holds)."""
    rows = store.db.execute("SELECT vector FROM versions")
    merged = (decode_vector(encoded) for (encoded,) in rows)
    held = (parse_header(row.envelope).vector for row in store.held_rows(AUTHENTICATED_HOLDS))
    vector, cursor = merge_vectors((*merged, *held)), store.get_int("cursor")
    stored = store.get_bytes("relay_state")
    if stored is None:
        return Frontier(vector, cursor, FOLDER_STORAGE if through_folder else "")
    relay = msgspec.msgpack.decode(stored, type=RelayState)
    return Frontier(vector, cursor, relay.storage_id, relay.account_epoch)
