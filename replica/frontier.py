"""What a replica knows, as a rotation frontier (docs/key-generations.md §6): the union of
every version vector it holds, and the relay head it has pulled up to."""

from __future__ import annotations

from replica.generations import Frontier
from replica.store import Store
from replica.wire import decode_vector, merge_vectors, parse_header

AUTHENTICATED_HOLDS = ("drift", "lock", "collection")
"""Held versions that were opened before being held (the others are not yet this replica's)."""


def frontier_of(store: Store) -> Frontier:
    """Over the synced versions (history is dominated by them) and the authenticated held
    ones: a version this device pulled but holds must stay within the frontier, or every
    device would refuse it once its epoch is retired."""
    rows = store.db.execute("SELECT vector FROM versions")
    merged = (decode_vector(encoded) for (encoded,) in rows)
    held = (parse_header(row.envelope).vector for row in store.held_rows(AUTHENTICATED_HOLDS))
    return Frontier(merge_vectors((*merged, *held)), store.get_int("cursor"))
