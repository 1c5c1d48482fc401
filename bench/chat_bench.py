"""The chat store's benchmarks (issue 13), each against the engine's line it builds on."""

from __future__ import annotations

from pathlib import Path

import engine  # noqa: F401  (registers replica.put_single, the baseline named here)
from harness import SCHEMA, Bench, Line, benchmark, best_seconds, check_equal

from chat import ChatStore, with_chat
from replica import Replica


def chat_store(bench: Bench) -> tuple[ChatStore, str, Path]:
    replica, path = bench.replica("chat-append")
    replica.declare(with_chat(SCHEMA))
    store = ChatStore(replica)
    return store, store.new_chat("bench"), path


def append_each(store: ChatStore, thread: str, n: int) -> None:
    for i in range(n):
        store.append(thread, "user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 300)


def verify(store: ChatStore, thread: str, n: int) -> None:
    chat = store.chat(thread)
    check_equal("chat.append messages", chat.messages if chat else -1, n)
    check_equal("chat.append last page", len(store.messages(thread, limit=n).messages), n)
    replica: Replica = store.replica
    replica.close()


@benchmark("chat.append", needs=("replica.put_single",))
def bench_chat_append(bench: Bench) -> list[Line]:
    """ChatStore.append, one transaction (and one fsync) each, as replica.put_single is: it
    also reads the chat and its last place from the blind index (issue 13 asks ≥ 0.8)."""
    n = bench.sizes.single_puts
    seconds = best_seconds(
        bench,
        bench.sizes.repeats,
        lambda: chat_store(bench),
        lambda state: append_each(state[0], state[1], n),
        lambda state: verify(state[0], state[1], n),
    )
    return [Line("chat.append", n / seconds, "ops/s", "replica.put_single", {"n": n})]
