"""Search (specs/chat.md §6): titles and bodies, at most 30 hits with the total, from a cache
the change feed keeps fresh; a warm search opens only what changed."""

from __future__ import annotations

from typing import Any

import pytest

from chat import ChatStore
from replica import InvalidArgumentError, ReplicaLockedError
from tests.chat.conftest import StoreFactory


def test_search_finds_titles_and_messages_case_insensitively(make_store: StoreFactory) -> None:
    store = make_store("r")
    trip = store.new_chat("Trip to Lisbon")
    other = store.new_chat("Groceries")
    store.append(trip, "user", "Book the hotel in lisbon")
    store.append(other, "user", "milk, eggs")
    result = store.search("LISBON")
    assert [(h.thread, h.message is None) for h in result.hits] == [(trip, True), (trip, False)]
    assert result.total == 2
    assert store.search("nothing like it").hits == []


def test_at_most_30_hits_with_the_total(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("t")
    for i in range(45):
        store.append(thread, "user", f"needle {i}")
    result = store.search("needle")
    assert len(result.hits) == 30 and result.total == 45
    assert result.hits[0].text == "needle 44"  # newest first


def test_a_warm_search_sees_changes_and_opens_only_them(
    make_store: StoreFactory, opened: list[bytes]
) -> None:
    store = make_store("r")
    thread = store.new_chat("t")
    ids = [store.append(thread, "user", f"alpha {i}") for i in range(20)]
    assert store.search("alpha").total == 20  # cold: reads everything once
    opened.clear()
    assert store.search("alpha").total == 20
    assert opened == []  # warm, nothing changed: nothing opened
    store.edit(thread, ids[0], "beta")
    opened.clear()
    assert store.search("alpha").total == 19 and store.search("beta").total == 1
    # what changed: the message (named by the feed, then read) and the undo log's two records
    assert 0 < len(opened) <= 4


def test_other_stores_writes_reach_a_cached_search(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("t")
    store.append(thread, "user", "first")
    assert store.search("second").total == 0
    other = ChatStore(store.replica)
    other.append(thread, "user", "second")
    assert store.search("second").total == 1
    other.delete(thread)
    assert store.search("first").total == 0 and store.search("t").total == 0


@pytest.mark.parametrize("query", ["", "x" * 201, 7])
def test_a_bad_query_is_refused(make_store: StoreFactory, query: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="search query"):
        make_store("r").search(query)


def test_locking_the_replica_drops_the_decrypted_cache(make_store: StoreFactory) -> None:
    store = make_store("r")
    store.append(store.new_chat("secret plans"), "user", "the secret text")
    assert store.search("secret").total == 2
    assert store._corpus is not None
    gone = ChatStore(store.replica)  # a store dropped before the lock: held weakly
    gone.search("secret")
    del gone
    key = store.replica.unlock_key()
    store.replica.lock()
    assert store._corpus is None  # nothing decrypted stays once the keys are gone
    with pytest.raises(ReplicaLockedError):
        store.search("secret")
    store.replica.unlock_with_key(key)
    assert store.search("secret").total == 2
