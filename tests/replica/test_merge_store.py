"""The store decides exactly as the pure merge: `apply_page` over real envelopes, in any order,
grouping or repetition, gives the same siblings and the same visible version (specs/merge.md)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from replica import Replica
from replica.merge import siblings_of
from replica.wire import Header, parse_header
from tests.conftest import FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes

OPS = st.lists(
    st.tuples(
        st.integers(0, 2),  # writer
        st.sampled_from(["put", "delete", "put_context", "exchange"]),
        st.sampled_from(["t1", "t2"]),
        st.integers(0, 2),  # value, and message_count tiebreak
        st.integers(0, 1),  # advance the shared clock or not (equal hlc on different nodes)
    ),
    min_size=1,
    max_size=12,
)


State = tuple[frozenset[tuple[int, int]], int, int, bool, object]


def state_of(replica: Replica, ids: list[str]) -> dict[str, State]:
    out: dict[str, State] = {}
    for id in ids:
        record = replica.get("threads", id)
        if record is not None:
            out[id] = (record.context, record.node, record.hlc, record.deleted, record.document)
    return out


@settings(max_examples=25)
@given(ops=OPS, seed=st.integers(0, 1000))
def test_apply_page_is_a_join_over_real_envelopes(
    make_replica: ReplicaFactory, ops: list[tuple[int, str, str, int, int]], seed: int
) -> None:
    clock = FakeClock()
    writers = [make_replica("w", wall_clock_ms=clock, freshness_window_s=0) for _ in range(3)]
    written: list[bytes] = []
    for writer, op, id, value, advance in ops:
        replica = writers[writer]
        clock.advance(advance)
        if op == "put":
            replica.put("threads", id, {"v": value, "message_count": value})
        elif op == "delete":
            replica.delete("threads", id)
        elif op == "put_context":
            record = replica.get("threads", id)
            context = frozenset() if record is None else record.context
            replica.put("threads", id, {"v": value}, context=context)
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

    ids = ["t1", "t2"]
    expected = state_of(in_order, ids)
    assert state_of(reordered, ids) == expected
    assert state_of(twice, ids) == expected
    by_key: dict[bytes, list[Header]] = {}
    for header in map(parse_header, written):
        by_key.setdefault(header.key, []).append(header)
    pure = {h.dot for group in by_key.values() for h in siblings_of(group)}
    stored = {dot for state in expected.values() for dot in state[0]}
    assert stored == pure
