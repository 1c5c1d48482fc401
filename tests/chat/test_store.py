"""The chat store's operations on one replica (specs/chat.md): each one transaction, typed
documents validated both ways, one turn per chat, a job on one chat not holding up another."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from msgspec import structs

from chat import (
    COLLECTIONS,
    ChatDataError,
    ChatStore,
    NoSuchChatError,
    TurnBusyError,
    with_chat,
)
from chat.ids import IdClock, check_id, id_time_ms, new_id
from chat.schema import MESSAGES, THREADS
from replica import (
    Collection,
    DegradedError,
    InvalidArgumentError,
    LeaseBusyError,
    Replica,
    Schema,
)
from tests.chat.conftest import StoreFactory, sync
from tests.conftest import SCHEMA, ReplicaFactory


@pytest.fixture
def store(make_replica: ReplicaFactory) -> Iterator[ChatStore]:
    replica = make_replica()
    replica.declare(with_chat(SCHEMA))
    yield ChatStore(replica, wait_s=2)


def texts(store: ChatStore, thread: str, **options: Any) -> list[str]:
    return [v.message.content for v in store.messages(thread, **options).messages]


def test_a_chat_keeps_its_messages_in_order_and_pages_back(store: ChatStore) -> None:
    thread = store.new_chat("Plans")
    for i in range(7):
        store.append(thread, "user" if i % 2 == 0 else "assistant", f"m{i}")
    assert texts(store, thread) == [f"m{i}" for i in range(7)]
    last = store.messages(thread, limit=3)
    assert [v.message.content for v in last.messages] == ["m4", "m5", "m6"]
    before = store.messages(thread, limit=3, before=last.older)
    assert [v.message.content for v in before.messages] == ["m1", "m2", "m3"]
    first = store.messages(thread, limit=3, before=before.older)
    assert [v.message.content for v in first.messages] == ["m0"] and first.older is None
    view = store.chat(thread)
    assert view is not None and view.messages == 7 and view.thread.title == "Plans"
    assert view.first_message_ms is not None and view.last_message_ms is not None
    assert view.first_message_ms <= view.last_message_ms
    assert view.bytes == 0 and store.chats(with_bytes=True)[0].bytes > 7 * 100
    record = store.replica.get(THREADS, thread)
    assert record is not None and len(record.context) == 1  # appends never wrote the chat


def test_an_edit_keeps_the_message_s_place(store: ChatStore) -> None:
    thread = store.new_chat()
    ids = [store.append(thread, "user", f"m{i}") for i in range(3)]
    store.edit(thread, ids[0], "first, edited")
    assert texts(store, thread) == ["first, edited", "m1", "m2"]
    assert store.messages(thread).messages[0].message.edited_ms is not None


def test_rename_and_archive_change_the_chat_list(store: ChatStore) -> None:
    a, b = store.new_chat("a"), store.new_chat("b")
    store.rename(a, "renamed")
    store.archive(b)
    assert [(v.id, v.thread.title) for v in store.chats()] == [(a, "renamed")]
    assert [v.id for v in store.chats(archived=True)] == [b]
    store.archive(b, archived=False)
    assert {v.id for v in store.chats()} == {a, b}


def test_a_new_chat_never_touches_another(store: ChatStore) -> None:
    first = store.new_chat("first")
    store.append(first, "user", "hello")
    for _ in range(5):
        store.new_chat()
    assert texts(store, first) == ["hello"]
    assert len(store.chats()) == 6


def test_clear_empties_a_chat_and_delete_leaves_no_orphan(store: ChatStore) -> None:
    kept, gone = store.new_chat("kept"), store.new_chat("gone")
    for i in range(4):
        store.append(kept, "user", f"k{i}")
        store.append(gone, "user", f"g{i}")
    assert store.clear(kept) == 4
    assert texts(store, kept) == [] and store.chat(kept) is not None
    chat = store.chat(kept)
    assert chat is not None and chat.thread.message_count == 0
    assert store.delete(gone) == 4
    assert store.chat(gone) is None
    live = store.replica.scan(MESSAGES, where={"thread": gone})
    assert live == []
    with pytest.raises(NoSuchChatError, match="no chat"):
        store.append(gone, "user", "into a deleted chat")


def test_documents_keep_fields_this_version_does_not_know(store: ChatStore) -> None:
    thread = store.new_chat("x")
    record = store.replica.get(THREADS, thread)
    assert record is not None
    newer = {**record.document, "pinned_by_a_newer_app": True}
    store.replica.put(THREADS, thread, newer, context=record.context)
    store.rename(thread, "renamed")
    after = store.replica.get(THREADS, thread)
    assert after is not None and after.document["pinned_by_a_newer_app"] is True
    assert after.document["title"] == "renamed"


def test_a_synced_document_of_the_wrong_shape_is_refused_by_name(store: ChatStore) -> None:
    thread = store.new_chat("x")
    store.append(thread, "user", "before: the chat's record was checked once")
    record = store.replica.get(THREADS, thread)
    assert record is not None
    store.replica.put(THREADS, thread, {**record.document, "title": 42}, context=record.context)
    with pytest.raises(ChatDataError, match=f"chat {thread}: title"):
        store.chat(thread)
    with pytest.raises(ChatDataError):
        store.append(thread, "user", "hi")


def test_an_append_sees_a_chat_deleted_elsewhere_after_it_appended(
    make_store: StoreFactory,
) -> None:
    here, there = make_store("here"), make_store("there")
    thread = here.new_chat("shared")
    here.append(thread, "user", "first")
    sync(here, there)
    there.delete(thread)
    sync(there, here)
    with pytest.raises(NoSuchChatError, match="no chat"):
        here.append(thread, "user", "into a chat deleted elsewhere")


def file_digest(replica: Replica) -> str:
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        path = Path(f"{replica.path}{suffix}")
        digest.update(path.read_bytes() if path.exists() else b"")
    return digest.hexdigest()


@pytest.mark.parametrize(
    ("operation", "error"),
    [
        (lambda s, t: s.append(t, "robot", "x"), "role"),
        (lambda s, t: s.append(t, "user", "x" * (256 * 1024 + 1)), "content"),
        (lambda s, t: s.append(t, "user", "x", thumbnails=[b"p"] * 11), "at most 10"),
        (lambda s, t: s.append(t, "user", "x", thumbnails=[b"p" * (64 * 1024 + 1)]), "65536"),
        (lambda s, t: s.append(t, "user", 7), "content"),
        (lambda s, t: s.append("not-an-id", "user", "x"), "'not-an-id'"),
        (lambda s, t: s.append(t, "user", "x", turn="bad"), "turn id"),
        (lambda s, t: s.rename(t, "t" * 201), "at most 200"),
        (lambda s, t: s.rename(t, None), "title"),
        (lambda s, t: s.edit(t, new_id(1, bytes), "x"), "no message"),
        (lambda s, t: s.new_chat("t" * 201), "at most 200"),
        (lambda s, t: s.set_setting(t, "\uf900", 1), "setting name: must be text in Unicode NFC"),
        (lambda s, t: s.set_setting(t, "a\x00b", 1), "setting name: must be text in Unicode NFC"),
        (lambda s, t: s.set_setting(t, "", 1), "name"),
        (lambda s, t: s.set_setting(t, "a/b", 1), "setting name 'a/b' holds '/'"),
    ],
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    store: ChatStore, operation: Any, error: str
) -> None:
    thread = store.new_chat("x")
    store.append(thread, "user", "hello")
    before = file_digest(store.replica)
    with pytest.raises(InvalidArgumentError, match=error):
        operation(store, thread)
    assert file_digest(store.replica) == before


def test_one_turn_per_chat_and_other_chats_go_on(store: ChatStore) -> None:
    a, b = store.new_chat("a"), store.new_chat("b")
    other = ChatStore(store.replica)
    with store.turn(a) as turn:
        turn.append("user", "question")
        with pytest.raises(TurnBusyError, match="answering already"), other.turn(a):
            pass
        with other.turn(b) as second:
            second.append("user", "another chat answers meanwhile")
        turn.append("assistant", "answer")
    with other.turn(a) as again:
        again.append("user", "the next turn")
    turns = [v.message.turn for v in store.messages(a).messages]
    assert turns[0] == turns[1] != turns[2]


def test_a_job_on_one_chat_holds_its_operations_but_not_another_s(store: ChatStore) -> None:
    """The issue's 'show it': while a slow job holds chat X, an append to chat Y commits
    at once, and one to X waits for the job's write and lands after it."""
    x, y = store.new_chat("x"), store.new_chat("y")
    done: list[str] = []
    job = store.job(x)

    def finish_job() -> None:
        time.sleep(0.5)  # the slow part, outside any transaction
        store.append(x, "assistant", "summary", lease=job)
        done.append("job")
        job.release()

    threading.Thread(target=finish_job).start()
    started = time.monotonic()
    store.append(y, "user", "not held up")
    assert time.monotonic() - started < 0.4
    store.append(x, "user", "waited for the job")
    assert time.monotonic() - started >= 0.5 and done == ["job"]
    assert texts(store, x) == ["summary", "waited for the job"]


def test_an_operation_gives_up_on_a_chat_a_job_keeps_too_long(store: ChatStore) -> None:
    thread = store.new_chat()
    with store.job(thread), pytest.raises(LeaseBusyError, match="busy with a job"):
        ChatStore(store.replica, wait_s=0.2).append(thread, "user", "x")


def test_the_store_needs_its_collections_declared(make_replica: ReplicaFactory) -> None:
    with pytest.raises(InvalidArgumentError, match=r"chat\.threads"):
        ChatStore(make_replica())
    declared = with_chat(SCHEMA)
    assert with_chat(declared) == declared
    assert {c.name for c in COLLECTIONS} <= {c.name for c in declared.collections}


def test_a_replica_declared_by_the_first_chat_store_works_and_is_brought_up_to_date(
    make_replica: ReplicaFactory,
) -> None:
    """The first release declared threads and messages without `unique_ids`."""
    first = tuple(structs.replace(c, unique_ids=False) for c in COLLECTIONS)
    replica = make_replica()
    replica.declare(Schema((*SCHEMA.collections, *first)))
    store = ChatStore(replica)
    thread = store.new_chat("declared before unique_ids")
    store.append(thread, "user", "still works")
    replica.declare(with_chat(replica.schema))
    assert all(replica.schema.get(c.name) == c for c in COLLECTIONS)
    assert [v.message.content for v in store.messages(thread).messages] == ["still works"]
    other = Collection("chat.messages", "lww", index="thread")
    with pytest.raises(InvalidArgumentError, match="declared otherwise"):
        with_chat(Schema((*SCHEMA.collections, other)))


def test_ids_sort_by_time_and_never_repeat_within_a_millisecond() -> None:
    clock = IdClock()
    ids = [new_id(1_700_000_000_000, bytes, clock) for _ in range(100)]
    assert ids == sorted(ids) and len(set(ids)) == 100
    assert all(check_id("x", i) == i for i in ids)
    assert id_time_ms(new_id(1_800_000_000_123, lambda n: b"\xff" * n, clock)) == 1_800_000_000_123
    assert id_time_ms(new_id(1_700_000_000_000, bytes, clock)) >= 1_800_000_000_123  # not back
    for bad in ("", "0" * 25, "8" + "0" * 25, "I" * 26, 5):
        with pytest.raises(InvalidArgumentError):
            check_id("chat", bad)


def damage_last_message(store: ChatStore) -> None:
    """Flip the last byte of the message written last (the newest indexed row)."""
    with sqlite3.connect(store.replica.path) as db:
        rowid, envelope = db.execute(
            "SELECT id, envelope FROM versions WHERE blind IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        db.execute(
            "UPDATE versions SET envelope = ? WHERE id = ?",
            (envelope[:-1] + bytes([envelope[-1] ^ 1]), rowid),
        )


def test_a_chat_with_an_unreadable_message_is_read_only_until_cleared(
    store: ChatStore,
) -> None:
    other = store.new_chat("other")
    store.append(other, "user", "fine")
    thread = store.new_chat("damaged")
    for i in range(3):
        store.append(thread, "user", f"m{i}")
    damage_last_message(store)
    with pytest.raises(DegradedError):  # the first read that meets it latches it
        store.replica.scan(MESSAGES, where={"thread": thread})
    page = store.messages(thread)
    assert [v.message.content for v in page.messages] == ["m0", "m1"] and page.damaged == 1
    for write in (
        lambda: store.append(thread, "user", "more"),
        lambda: store.rename(thread, "x"),
        lambda: store.undo(thread),
    ):
        with pytest.raises(DegradedError, match="read-only"):
            write()
    store.append(other, "user", "other chats go on")
    assert store.clear(thread) == 2  # lifts it: the unreadable row goes to quarantine
    store.append(thread, "user", "writable again")
    assert texts(store, thread) == ["writable again"]
    assert store.replica.status().quarantined == 1


def test_a_job_s_lease_writes_only_to_its_own_chat(store: ChatStore) -> None:
    """A review found it: any lease let its holder write into a chat another job held."""
    held, mine = store.new_chat("held"), store.new_chat("mine")
    with store.job(held), store.job(mine) as job:
        with pytest.raises(InvalidArgumentError, match="is not chat"):
            store.append(held, "user", "into another job's chat", lease=job)
        store.append(mine, "user", "into its own", lease=job)
