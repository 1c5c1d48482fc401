"""Undo per chat (specs/chat.md §8): a FIFO of 200 operations on this device, each undone
over this device's versions only, as a write that syncs."""

from __future__ import annotations

from typing import Any

import pytest

from chat import ChatStore, NothingToUndoError, with_chat
from chat.schema import MESSAGES, THREADS, UNDO
from replica import Replica
from tests.chat.conftest import StoreFactory, sync, texts
from tests.conftest import SCHEMA, Account
from tests.replica.helpers import apply, dirty_envelopes


def state(store: ChatStore, thread: str) -> Any:
    view = store.chat(thread)
    if view is None:
        return None
    messages = [(v.id, v.message.content) for v in store.messages(thread, limit=1000).messages]
    return (view.thread.title, view.thread.archived, messages, store.settings(thread))


def test_undo_200_times_goes_back_to_the_first_operation_and_no_further(
    make_store: StoreFactory,
) -> None:
    store = make_store("r")
    thread = store.new_chat("first")  # operation 1
    after_first = state(store, thread)
    for i in range(200):  # operations 2..201
        step = i % 6
        if step in (0, 3):
            store.append(thread, "user", f"m{i}")
        elif step == 1:
            store.rename(thread, f"title {i}")
        elif step == 2:
            store.edit(thread, store.messages(thread).messages[-1].id, f"edited {i}")
        elif step == 4:
            store.archive(thread, archived=i % 12 == 4)
        else:
            store.set_setting(thread, "model", f"v{i}")
    assert store.chat(thread) is not None
    names = [store.undo(thread) for _ in range(200)]
    assert names[0] == "rename" and set(names) == {
        "append",
        "rename",
        "edit",
        "archive",
        "unarchive",
        "setting",
    }
    assert state(store, thread) == after_first
    with pytest.raises(NothingToUndoError, match="nothing left to undo"):
        store.undo(thread)


def test_undo_brings_back_a_deleted_chat_and_undoes_a_trim(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("keep")
    for i in range(4):
        store.append(thread, "user", f"m{i}")
    before = state(store, thread)
    store.trim(thread, keep_first=1, keep_last=1)
    store.delete(thread)
    assert store.chat(thread) is None
    assert store.undo(thread) == "delete"
    assert store.undo(thread) == "trim"
    assert state(store, thread) == before


def test_undo_after_a_sync_keeps_what_another_device_wrote(make_store: StoreFactory) -> None:
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("shared")
    message = a.append(thread, "user", "from a")
    sync(a, b)
    b.edit(thread, message, "edited on b")  # b takes the message over
    a.rename(thread, "renamed on a")
    b.rename(thread, "renamed on b")  # concurrent with a's rename
    sync(a, b)
    assert a.undo(thread) == "rename"
    assert a.undo(thread) == "append"  # the message is b's now: it stays
    sync(a, b)
    for store in (a, b):
        assert texts(store, thread) == ["edited on b"]
        titles = {store.replica.get(THREADS, thread).document["title"]}  # type: ignore[union-attr]
        titles |= {v.document["title"] for v in store.replica.conflicts(THREADS, thread)}
        assert "renamed on b" in titles and "renamed on a" not in titles
    assert a.replica.get(MESSAGES, message) is not None


def test_appends_log_their_undo_entries_at_the_chats_next_operation_in_any_process(
    make_store: StoreFactory, account: Account
) -> None:
    """An append writes no entry (its cost stays off the hottest write); the chat's next
    other operation logs it first, here in a second process's store on the same file, so
    the log's order is the order of the operations."""
    store = make_store("r")
    thread = store.new_chat("t")
    first = store.append(thread, "user", "first")
    assert store.replica.journal_count(UNDO, thread) == 1  # the new chat's entry only
    other = Replica.open(store.replica.path)
    other.unlock_with_key(account.key)
    with other:
        other.declare(with_chat(SCHEMA))
        elsewhere = ChatStore(other)
        second = elsewhere.append(thread, "assistant", "second")
        store.rename(thread, "renamed")
        assert store.replica.journal_count(UNDO, thread) == 4
        assert [elsewhere.undo(thread) for _ in range(2)] == ["rename", "append"]
        assert [v.id for v in elsewhere.messages(thread).messages] == [first]
    store.append(thread, "user", "third")
    assert [store.undo(thread) for _ in range(3)] == ["append", "append", "new chat"]
    assert store.chat(thread) is None and store.replica.scan(MESSAGES) == []
    assert second != first
    with pytest.raises(NothingToUndoError):
        store.undo(thread)


def test_201_appends_undo_200_times_and_no_further(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("t")
    store.append(thread, "user", "the first append, op 2")
    after_first_append = texts(store, thread)
    for i in range(200):  # ops 3..202: the log keeps 200, whose entries all wait
        store.append(thread, "user", f"m{i}")
    assert [store.undo(thread) for _ in range(200)] == ["append"] * 200
    assert texts(store, thread) == after_first_append
    with pytest.raises(NothingToUndoError):
        store.undo(thread)


def test_an_append_another_device_edited_before_it_was_logged_still_counts(
    make_store: StoreFactory,
) -> None:
    """b edits a's message in the round that brought it to b, before a's next operation
    logs the append: the append still counts as one operation, undone as a no-op (b's
    edit stays), and the undo after it, not that one, takes the chat's creation back."""
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("shared")
    message = a.append(thread, "user", "from a")
    apply(b.replica, dirty_envelopes(a.replica))
    b.edit(thread, message, "edited on b")
    apply(a.replica, dirty_envelopes(b.replica))
    assert a.undo(thread) == "append"
    assert a.chat(thread) is not None and texts(a, thread) == ["edited on b"]
    assert a.undo(thread) == "new chat"
