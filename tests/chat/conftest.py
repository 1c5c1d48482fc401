"""Fixtures and helpers of the chat store's tests: stores on real replica files, and a
sync that moves every unpushed version between them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from chat import ChatStore, with_chat
from tests.conftest import SCHEMA, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes

StoreFactory = Callable[[str], ChatStore]


@pytest.fixture
def make_store(make_replica: ReplicaFactory) -> Iterator[StoreFactory]:
    def make(name: str = "r") -> ChatStore:
        replica = make_replica(name, freshness_window_s=0)
        replica.declare(with_chat(SCHEMA))
        return ChatStore(replica, wait_s=2)

    yield make


def texts(store: ChatStore, thread: str) -> list[str]:
    return [v.message.content for v in store.messages(thread, limit=1000).messages]


def sync(*stores: ChatStore) -> None:
    """Every store's unpushed versions to every other, then each reconciles."""
    outgoing = {id(s): dirty_envelopes(s.replica) for s in stores}
    for store in stores:
        for other in stores:
            if other is not store:
                apply(store.replica, outgoing[id(other)])
    for store in stores:
        store.reconcile()


def a_chat(store: ChatStore, turns: int, title: str = "a chat") -> str:
    """A new chat of `turns` turns: questions q0, q1, … each with its answer a0, a1, …"""
    thread = store.new_chat(title)
    for t in range(turns):
        with store.turn(thread) as turn:
            turn.append("user", f"q{t}")
            turn.append("assistant", f"a{t}")
    return thread
