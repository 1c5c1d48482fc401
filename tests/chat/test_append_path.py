"""An append right after this store's own append to the chat reads nothing of the chat again
while the file's change mark stays the same (chat/base.py, `Replica.change_mark`). Whatever
changed the file in between is seen: another connection's commit, another store's write on
this connection, a held version falling due."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator

import pytest

from chat import ChatStore, NoSuchChatError, with_chat
from chat.schema import THREADS
from replica import DEFAULT_PROFILE, DegradedError, LeaseBusyError, Replica, ReplicaOptions
from replica.envelope import Identity
from tests.chat.conftest import StoreFactory, sync
from tests.conftest import SCHEMA, Account, FakeClock, ReplicaFactory
from tests.replica.helpers import apply, dirty_envelopes


def test_a_chat_damaged_by_another_connection_after_an_append_is_seen(
    make_store: StoreFactory,
) -> None:
    store = make_store("here")
    thread = store.new_chat("soon damaged")
    store.append(thread, "user", "first")
    key = store.replica._core.record_key(Identity(DEFAULT_PROFILE, THREADS, thread))
    with sqlite3.connect(store.replica.path) as db:  # flip a bit of the AEAD tag
        ((rowid, envelope),) = db.execute(
            "SELECT id, envelope FROM versions WHERE key = ?", (key,)
        ).fetchall()
        damaged = envelope[:-1] + bytes([envelope[-1] ^ 1])
        db.execute("UPDATE versions SET envelope = ? WHERE id = ?", (damaged, rowid))
    with pytest.raises(DegradedError):
        store.append(thread, "user", "into a damaged chat")


def test_a_job_another_store_took_on_this_replica_is_waited_for(
    make_store: StoreFactory,
) -> None:
    store = make_store("here")
    here = ChatStore(store.replica, wait_s=0.2)
    thread = here.new_chat("busy soon")
    here.append(thread, "user", "first")
    with store.job(thread), pytest.raises(LeaseBusyError, match="busy with a job"):
        here.append(thread, "user", "while a job holds the chat")
    here.append(thread, "user", "after the job")
    assert [v.message.content for v in here.messages(thread).messages] == [
        "first",
        "after the job",
    ]


def test_an_append_after_a_job_s_own_append_still_waits_for_the_job(
    make_store: StoreFactory,
) -> None:
    """The job's append checked its lease, not that the chat is free: nothing may skip that."""
    store = make_store("here")
    here = ChatStore(store.replica, wait_s=0.2)
    thread = here.new_chat("a job's")
    with here.job(thread) as job:
        here.append(thread, "assistant", "from the job", lease=job)
        with pytest.raises(LeaseBusyError, match="busy with a job"):
            here.append(thread, "user", "while the job holds the chat")


def test_an_append_whose_batch_rolled_back_leaves_nothing_to_trust(
    make_store: StoreFactory,
) -> None:
    """A review found it: the chat made and appended to in the app's batch is gone once the
    batch rolls back, though no other connection committed and no row count went down."""
    store = make_store("here")
    with pytest.raises(RuntimeError), store.replica.batch():
        thread = store.new_chat("rolled back")
        store.append(thread, "user", "first")
        raise RuntimeError("the app's batch fails")
    with pytest.raises(NoSuchChatError, match="no chat"):
        store.append(thread, "user", "into a chat that never was")


def test_a_held_delete_that_falls_due_stops_the_next_append(
    make_replica: ReplicaFactory, make_store: StoreFactory
) -> None:
    clock = FakeClock(time.time_ns() // 1_000_000)  # the other device's clock is the real one
    replica = make_replica("here", freshness_window_s=0, wall_clock_ms=clock)
    replica.declare(with_chat(SCHEMA))
    here, there = ChatStore(replica, wait_s=2), make_store("there")
    thread = here.new_chat("deleted elsewhere")
    sync(here, there)
    there.delete(thread)
    replica.lock_scope(collection=THREADS, duration_s=60)
    apply(replica, dirty_envelopes(there.replica))  # the delete is held by the lock
    here.append(thread, "user", "before the lock ends")
    clock.advance(61_000)  # nothing is written: the held delete merges when next read
    with pytest.raises(NoSuchChatError, match="no chat"):
        here.append(thread, "user", "after the delete merged")


@pytest.fixture
def two_connections(make_replica: ReplicaFactory, account: Account) -> Iterator[list[ChatStore]]:
    """Two stores on one replica file through two connections (as two processes would)."""
    first = make_replica("shared")
    first.declare(with_chat(SCHEMA))
    second = Replica.open(first.path, options=ReplicaOptions())
    second.unlock_with_key(account.key)
    yield [ChatStore(r, wait_s=2, now_ms=lambda: 1_800_000_000_000) for r in (first, second)]
    second.close()


def test_appends_through_two_connections_keep_their_order(
    two_connections: list[ChatStore],
) -> None:
    """One millisecond for all: a place is the last one plus one, so an append that
    trusted what it placed before the other connection appended would take its place."""
    here, there = two_connections
    thread = here.new_chat("shared")
    for store, text in [(here, "h1"), (here, "h2"), (there, "t1"), (here, "h3"), (there, "t2")]:
        store.append(thread, "user", text)
    for store in (here, there):
        page = store.messages(thread).messages
        assert [v.message.content for v in page] == ["h1", "h2", "t1", "h3", "t2"]
        places = [v.message.at for v in page]
        assert places == sorted(set(places))
