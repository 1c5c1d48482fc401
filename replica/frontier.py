"""What a replica knows, as a rotation frontier (docs/key-generations.md §6): the union of
every version vector it holds, and the relay head it has pulled up to."""

from __future__ import annotations

from replica.generations import Frontier
from replica.store import Store
from replica.wire import decode_vector


def frontier_of(store: Store) -> Frontier:
    """Over the synced versions (history is dominated by them; held versions are not yet
    this replica's)."""
    union: dict[int, int] = {}
    for (encoded,) in store.db.execute("SELECT vector FROM versions"):
        for node, hlc in decode_vector(encoded).items():
            if hlc > union.get(node, 0):
                union[node] = hlc
    return Frontier(union, store.get_int("cursor"))
