"""Merge laws of the pure decision (specs/merge.md): siblings form a join — commutative,
associative, idempotent — over causal histories made by simulated devices, and the visible
sibling follows the total order (hlc, tiebreak, live, node)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from replica.merge import (
    is_covered,
    local_vector,
    merge_version,
    siblings_of,
    tiebreak_value,
    visible_key,
)
from replica.wire import VersionVector, dominates


@dataclass(frozen=True)
class V:
    node: int
    hlc: int
    vector: VersionVector = field(hash=False, compare=False)

    @property
    def dot(self) -> tuple[int, int]:
        return (self.node, self.hlc)


@st.composite
def histories(draw: st.DrawFn) -> list[V]:
    """Versions of one record written by up to 4 devices that each saw a random part of the
    history, and replaced a random part of what they saw (always their own latest version)."""
    nodes = draw(st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=4, unique=True))
    versions: list[V] = []
    hlc = draw(st.integers(1, 1000))
    for _ in range(draw(st.integers(1, 14))):
        node = draw(st.sampled_from(nodes))
        seen = [v for v in versions if v.node == node or draw(st.booleans())]
        current = siblings_of(seen)
        replaced = [v for v in current if v.node == node or draw(st.booleans())]
        hlc += draw(st.integers(0, 2))  # equal hlc on different nodes happens
        while any(v.dot == (node, hlc) for v in versions):
            hlc += 1
        versions.append(V(node, hlc, local_vector(replaced, node, hlc)))
    return versions


def dots(versions: list[V]) -> set[tuple[int, int]]:
    return {v.dot for v in versions}


@given(histories(), st.randoms())
def test_siblings_do_not_depend_on_order(history: list[V], rnd: random.Random) -> None:
    shuffled = list(history)
    rnd.shuffle(shuffled)
    assert dots(siblings_of(shuffled)) == dots(siblings_of(history))


@given(histories())
def test_merging_twice_changes_nothing(history: list[V]) -> None:
    once = siblings_of(history)
    assert dots(siblings_of(once + history)) == dots(once)


@given(histories(), st.data())
def test_grouping_does_not_matter(history: list[V], data: st.DataObject) -> None:
    cut_a = data.draw(st.integers(0, len(history)))
    cut_b = data.draw(st.integers(cut_a, len(history)))
    a, b, c = history[:cut_a], history[cut_a:cut_b], history[cut_b:]
    left = siblings_of(siblings_of(siblings_of(a) + b) + c)
    right = siblings_of(a + siblings_of(b + c))
    assert dots(left) == dots(right) == dots(siblings_of(history))


@given(histories())
def test_siblings_are_exactly_the_undominated_versions(history: list[V]) -> None:
    expected = {
        v.dot
        for v in history
        if not any(o.dot != v.dot and dominates(o.vector, v.dot) for o in history)
    }
    assert dots(siblings_of(history)) == expected


@given(histories())
def test_an_edit_after_a_version_always_replaces_it_whatever_the_clocks(history: list[V]) -> None:
    last = history[-1]
    siblings = siblings_of(history)
    for v in history:
        if v.dot != last.dot and dominates(last.vector, v.dot):
            assert v.dot not in dots(siblings)


def test_a_covered_inbound_version_is_dropped_and_replaces_nothing() -> None:
    old = V(1, 10, {1: 10})
    new = V(1, 20, {1: 20})
    siblings, replaced = merge_version([new], old)
    assert dots(siblings) == {new.dot} and replaced == []
    assert is_covered([new], old) and is_covered([old], old)


def test_concurrent_versions_both_stay() -> None:
    base = V(1, 10, {1: 10})
    a = V(1, 20, {1: 20})
    b = V(2, 20, {1: 10, 2: 20})  # saw base, not a
    siblings, replaced = merge_version([a], b)
    assert dots(siblings) == {a.dot, b.dot} and replaced == []
    assert dots(siblings_of([base, a, b])) == {a.dot, b.dot}


def test_visible_order_hlc_then_tiebreak_then_live_then_node() -> None:
    doc = {"message_count": 2}
    assert visible_key(2, 1, False, {}, None) > visible_key(1, 9, False, {}, None)
    assert visible_key(5, 1, False, doc, "message_count") > visible_key(
        5, 9, False, {}, "message_count"
    )
    assert visible_key(5, 1, False, {}, None) > visible_key(5, 9, True, None, None)
    assert visible_key(5, 2**64 - 1, True, None, None) > visible_key(5, 2, True, None, None)


def test_tiebreak_counts_only_integers() -> None:
    assert tiebreak_value({"n": 3}, "n") == (1, 3)
    for absent in ({}, {"n": None}, {"n": "3"}, {"n": 2.5}, {"n": True}, None, [1]):
        assert tiebreak_value(absent, "n") == (0, 0)
    assert tiebreak_value({"n": -5}, "n") > tiebreak_value({"n": None}, "n")
