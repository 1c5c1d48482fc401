"""The store decides exactly as the pure merge: `apply_page` over real envelopes, in any order,
grouping or repetition, gives the same siblings and the same visible version (specs/merge.md)."""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Callable

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


WRITES = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete"]),
        st.none() | st.integers(0, 2),  # message_count (None: absent, counts lowest)
        st.integers(0, 1),  # advance the wall clock first (else the hlcs tie)
    ),
    min_size=2,
    max_size=4,
)


@pytest.mark.parametrize("collection", ["threads", "notes"])
@settings(max_examples=30)
@given(writes=WRITES)
def test_the_visible_sibling_is_the_greatest_by_the_spec_order(
    make_replica: ReplicaFactory, collection: str, writes: list[tuple[str, int | None, int]]
) -> None:
    """Writers that never saw each other's version write one record (mostly at one standing
    wall clock, so hlcs tie), live or deleted, with or without a tiebreak: every write stays
    a sibling, and the one shown wins over every other by (hlc, tiebreak, live, node)."""
    clock = FakeClock()
    written: list[bytes] = []
    for op, count, advance in writes:
        clock.advance(advance)
        writer = make_replica("w", wall_clock_ms=clock, freshness_window_s=0)
        if op == "delete":
            writer.delete(collection, "x")
        else:
            writer.put(collection, "x", {} if count is None else {"message_count": count})
        written.extend(dirty_envelopes(writer))
    merged = make_replica("r", wall_clock_ms=clock)
    apply(merged, written)
    record = merged.get(collection, "x")
    assert record is not None and len(record.conflicts) == len(writes) - 1
    tiebreak = "message_count" if collection == "threads" else None

    def spec_order(hlc: int, node: int, deleted: bool, document: object) -> tuple[int, ...]:
        """merge.md §6 written out here: hlc, an integer tiebreak (absent lowest), live, node."""
        count = document.get(tiebreak) if tiebreak and isinstance(document, dict) else None
        ranked = (1, count) if isinstance(count, int) else (0, 0)
        return (hlc, *ranked, 0 if deleted else 1, node)

    shown = spec_order(record.hlc, record.node, record.deleted, record.document)
    for other in record.conflicts:
        assert shown > spec_order(other.hlc, other.node, other.deleted, other.document)


def test_delete_recreate_delete_merges_alike_in_every_order(make_replica: ReplicaFactory) -> None:
    """A writes, deletes, re-creates and deletes again; B re-creates after seeing only A's
    first delete. Every order of the five envelopes, each page once or twice, ends the same:
    A's second delete and B's re-creation as concurrent siblings, the later one shown."""
    clock = FakeClock()
    a, b = (make_replica(n, wall_clock_ms=clock, freshness_window_s=0) for n in "ab")
    steps: list[bytes] = []

    def step(replica: Replica, write: Callable[[Replica], object]) -> list[bytes]:
        clock.advance(1)
        write(replica)
        envelopes = dirty_envelopes(replica)
        steps.extend(envelopes)
        return envelopes

    step(a, lambda r: r.put("notes", "n", {"v": 1}))
    first_delete = step(a, lambda r: r.delete("notes", "n"))
    apply(b, steps)
    step(a, lambda r: r.put("notes", "n", {"v": 2}))
    second_delete = step(a, lambda r: r.delete("notes", "n"))
    recreated = step(b, lambda r: r.put("notes", "n", {"v": 3}))
    assert len(steps) == 5 and first_delete and second_delete and recreated

    states = []
    for order in itertools.permutations(steps):
        replica = make_replica("r", wall_clock_ms=clock)
        for envelope in order:
            apply(replica, [envelope])
        apply(replica, list(order[:2]))  # duplicates change nothing
        record = replica.get("notes", "n")
        assert record is not None
        states.append((record.context, record.deleted, record.document, record.conflicts))
        replica.close()
    assert all(state == states[0] for state in states)
    context, deleted, document, conflicts = states[0]
    headers = {h.dot: h for h in map(parse_header, second_delete + recreated)}
    assert context == frozenset(headers)  # exactly the two concurrent versions stay
    assert (deleted, document) == (False, {"v": 3})  # B's re-creation is the later write
    assert [(c.deleted, c.document) for c in conflicts] == [(True, None)]
