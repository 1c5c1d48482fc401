"""The store decides exactly as the pure merge: `apply_page` over real envelopes, in any order,
grouping or repetition, gives the same siblings and the same visible version (specs/merge.md)."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica import Context, ItemLimitError, Replica
from replica.merge import siblings_of
from replica.wire import Header, parse_header
from tests.conftest import FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes

OPS = st.lists(
    st.tuples(
        st.integers(0, 2),  # writer
        st.sampled_from(["put", "delete", "put_context", "exchange"]),
        st.integers(0, 1),  # which record
        st.integers(0, 2),  # value, and message_count tiebreak
        st.integers(0, 1),  # advance the shared clock or not (equal hlc on different nodes)
    ),
    min_size=1,
    max_size=12,
)


def put_or_refuse(
    replica: Replica, collection: str, id: str, document: dict[str, int], context: Context | None
) -> None:
    with contextlib.suppress(ItemLimitError):  # per_item: the bound refuses local additions
        replica.put(collection, id, document, context=context)


State = tuple[frozenset[tuple[int, int]], int, int, bool, object]


def state_of(replica: Replica, collection: str, ids: list[str]) -> dict[str, State]:
    out: dict[str, State] = {}
    for id in ids:
        record = replica.get(collection, id)
        if record is not None:
            out[id] = (record.context, record.node, record.hlc, record.deleted, record.document)
    return out


IDS_BY_COLLECTION = {
    "threads": ["t1", "t2"],  # lww with a tiebreak
    "notes": ["n1", "n2"],  # lww
    "personas": ["p1", "p2"],  # per_item (max_items only bounds local additions)
    "active_persona": ["value"],  # register
}


@pytest.mark.parametrize("collection", sorted(IDS_BY_COLLECTION))
@settings(max_examples=15)
@given(ops=OPS, seed=st.integers(0, 1000))
def test_apply_page_is_a_join_over_real_envelopes(
    make_replica: ReplicaFactory,
    collection: str,
    ops: list[tuple[int, str, int, int, int]],
    seed: int,
) -> None:
    ids = IDS_BY_COLLECTION[collection]
    clock = FakeClock()
    writers = [make_replica("w", wall_clock_ms=clock, freshness_window_s=0) for _ in range(3)]
    written: list[bytes] = []
    for writer, op, which, value, advance in ops:
        replica, id = writers[writer], ids[which % len(ids)]
        clock.advance(advance)
        if op == "put":
            put_or_refuse(replica, collection, id, {"v": value, "message_count": value}, None)
        elif op == "delete":
            replica.delete(collection, id)
        elif op == "put_context":
            record = replica.get(collection, id)
            context = frozenset() if record is None else record.context
            put_or_refuse(replica, collection, id, {"v": value}, context)
        else:
            other = writers[(writer + 1) % 3]
            apply(other, [e for e in written if random.Random(value).random() < 0.7])
        written.extend(dirty_envelopes(replica))

    rnd = random.Random(seed)
    shuffled = list(written)
    rnd.shuffle(shuffled)
    in_order, reordered, twice = (make_replica("r", wall_clock_ms=clock) for _ in range(3))
    apply(in_order, written)
    cut = rnd.randrange(len(shuffled) + 1)
    apply(reordered, shuffled[:cut])
    apply(reordered, shuffled[cut:])
    apply(twice, shuffled)
    apply(twice, written)

    expected = state_of(in_order, collection, ids)
    assert state_of(reordered, collection, ids) == expected
    assert state_of(twice, collection, ids) == expected
    by_key: dict[bytes, list[Header]] = {}
    for header in map(parse_header, written):
        by_key.setdefault(header.key, []).append(header)
    pure = {h.dot for group in by_key.values() for h in siblings_of(group)}
    stored = {dot for state in expected.values() for dot in state[0]}
    assert stored == pure
