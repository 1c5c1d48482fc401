"""What a replica knows, as a rotation frontier (docs/key-generations.md §6): the union of
every version vector it holds, and the relay head it has pulled up to."""

from __future__ import annotations

from replica.generations import Frontier
from replica.store import Store
from replica.wire import decode_vector, merge_vectors


def frontier_of(store: Store) -> Frontier:
    """Over the synced versions (history is dominated by them; held versions are not yet
    this replica's)."""
    rows = store.db.execute("SELECT vector FROM versions")
    union = merge_vectors(decode_vector(encoded) for (encoded,) in rows)
    return Frontier(union, store.get_int("cursor"))
