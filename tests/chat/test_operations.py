"""Reshaping operations, preferences, drafts and the rules of concurrent operations of two
devices (specs/chat.md §4, §7)."""

from __future__ import annotations

import pytest

from chat.reconcile import RECOVERED_TITLE
from chat.schema import MESSAGES
from replica import InvalidArgumentError, ItemLimitError, Replica
from replica.wire import CollectedRun, Page, peek_dot
from replica.wiremarks import pack_markers
from tests.chat.conftest import StoreFactory, a_chat, sync, texts
from tests.replica.helpers import STATE, apply, dirty_envelopes


def test_fork_copies_through_a_message_and_leaves_the_source(make_store: StoreFactory) -> None:
    store = make_store("r")
    source = a_chat(store, 3)
    through = store.messages(source).messages[2]
    fork = store.fork(source, through.id)
    assert texts(store, fork) == ["q0", "a0", "q1"]
    view = store.chat(fork)
    assert view is not None and view.thread.forked_from is not None
    assert (view.thread.forked_from.thread, view.thread.forked_from.message) == (
        source,
        through.id,
    )
    assert {v.id for v in store.messages(fork).messages}.isdisjoint(
        {v.id for v in store.messages(source).messages}
    )
    store.trim(source, keep_first=0, keep_last=1)  # fork vs trim: the copy is untouched
    assert texts(store, fork) == ["q0", "a0", "q1"]
    assert texts(store, source) == ["q2", "a2"]


def test_trim_keeps_the_first_and_last_turns_whole(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = a_chat(store, 5)
    assert store.trim(thread, keep_first=1, keep_last=2) == 4
    assert texts(store, thread) == ["q0", "a0", "q3", "a3", "q4", "a4"]
    assert store.trim(thread, keep_first=2, keep_last=5) == 0
    with pytest.raises(InvalidArgumentError, match="at least one turn"):
        store.trim(thread, keep_first=0, keep_last=0)


def test_edit_and_retry_replaces_the_last_question_and_drops_its_answers(
    make_store: StoreFactory,
) -> None:
    store = make_store("r")
    thread = a_chat(store, 2)
    message = store.edit_and_retry(thread, "q1, better")
    assert texts(store, thread) == ["q0", "a0", "q1, better"]
    assert store.messages(thread).messages[-1].id == message


def test_settings_changed_on_two_devices_offline_both_survive(make_store: StoreFactory) -> None:
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat()
    sync(a, b)
    a.set_setting(thread, "model", "large")
    b.set_setting(thread, "temperature", 0.2)
    sync(a, b)
    assert a.settings(thread) == b.settings(thread) == {"model": "large", "temperature": 0.2}
    a.set_setting(thread, "model", None)
    assert a.settings(thread) == {"temperature": 0.2}


def test_personas_are_bounded_and_a_gone_one_falls_back_to_the_default(
    make_store: StoreFactory,
) -> None:
    store = make_store("r")
    writer = store.create_persona("Writer", "You write.")
    thread = store.new_chat(persona=writer)
    store.set_active_persona(writer)
    assert store.active_persona()[1].name == "Writer"
    store.delete_persona(writer)
    assert store.active_persona()[0] == "default"
    chat = store.chat(thread)
    assert chat is not None and store.persona(chat.thread.persona)[0] == "default"
    critic = store.create_persona("Critic")
    store.set_persona(thread, critic)
    chat = store.chat(thread)
    assert chat is not None and store.persona(chat.thread.persona)[1].name == "Critic"
    with pytest.raises(InvalidArgumentError, match="persona id"):
        store.set_persona(thread, "not an id")
    with pytest.raises(InvalidArgumentError, match="built in"):
        store.delete_persona("default")
    for i in range(49):
        store.create_persona(f"p{i}")
    with pytest.raises(ItemLimitError, match="max_items 50"):
        store.create_persona("one too many")
    assert len(store.personas()) == 51  # 49 more custom, the critic, and the default


def test_a_late_draft_save_never_brings_back_a_cleared_draft(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat()
    typed = store.draft_stamp()
    cleared = store.draft_stamp()
    assert store.save_draft(thread, "", cleared)
    assert not store.save_draft(thread, "half a sentence", typed)  # the debounced save, late
    assert store.draft(thread) == ""
    assert store.save_draft(thread, "new text", store.draft_stamp())
    assert store.draft(thread) == "new text"
    assert all(b"new text" not in e for e in dirty_envelopes(store.replica))  # never synced


def test_delete_takes_the_settings_and_the_draft_too(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat()
    store.set_setting(thread, "model", "x")
    store.save_draft(thread, "unsent", store.draft_stamp())
    store.delete(thread)
    assert store.replica.scan("chat.settings", where={"thread": thread}) == []
    assert store.draft(thread) == ""


def test_an_append_concurrent_with_a_delete_brings_the_chat_back(
    make_store: StoreFactory,
) -> None:
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("Trip")
    a.append(thread, "user", "known to both")
    sync(a, b)
    a.delete(thread)  # offline, meanwhile:
    b.append(thread, "user", "written while a deleted")
    sync(a, b)
    for store in (a, b):
        view = store.chat(thread)
        assert view is not None and view.thread.title == "Trip"
        assert texts(store, thread) == ["written while a deleted"]
        orphans = [
            r for r in store.replica.scan(MESSAGES) if store.chat(r.document["thread"]) is None
        ]
        assert orphans == []


def test_a_delete_that_saw_every_message_stays_a_delete(make_store: StoreFactory) -> None:
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("Gone")
    a.append(thread, "user", "m")
    sync(a, b)
    b.delete(thread)
    sync(a, b)
    assert a.chat(thread) is None and b.chat(thread) is None
    assert a.reconcile() == 0


def test_rename_against_rename_converges_and_keeps_the_other_as_a_sibling(
    make_store: StoreFactory,
) -> None:
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("old")
    sync(a, b)
    a.rename(thread, "from a")
    b.rename(thread, "from b")
    sync(a, b)
    titles = {s.chat(thread).thread.title for s in (a, b)}  # type: ignore[union-attr]
    assert len(titles) == 1 and titles <= {"from a", "from b"}
    replica: Replica = a.replica
    assert len(replica.conflicts("chat.threads", thread)) == 1


def test_a_held_tombstone_does_not_make_a_seen_message_revive_its_chat(
    make_store: StoreFactory,
) -> None:
    """A review found it: b holds the message's tombstone (an explicit lock while its user
    edits) when the chat's tombstone merges; the delete saw the message, so it stays."""
    a, b = make_store("a"), make_store("b")
    thread = a.new_chat("Gone")
    message = a.append(thread, "user", "seen by the delete")
    sync(a, b)
    lock = b.replica.lock_scope(collection=MESSAGES, id=message, duration_s=60)
    a.delete(thread)
    sync(a, b)
    assert b.reconcile() == 0 and b.chat(thread) is None  # waits while something is held
    b.replica.release_lock(lock)
    assert b.reconcile() == 0
    sync(a, b)
    assert a.chat(thread) is None and b.chat(thread) is None


def test_reconcile_with_nothing_new_writes_nothing(make_store: StoreFactory) -> None:
    store = make_store("r")
    store.append(store.new_chat(), "user", "x")
    store.reconcile()
    head = store.replica.feed_head()
    store.reconcile()
    store.reconcile()
    assert store.replica.feed_head() == head


def test_a_message_that_outlived_its_chats_collected_delete_brings_the_chat_back(
    make_store: StoreFactory,
) -> None:
    """A deleted a chat; b, offline, appended to it. c merged the delete, and the relay then
    collected its tombstones (every device acknowledged them before b's message arrived):
    c dropped them, and b's message arrives under a chat c no longer has at all. It comes
    back as "Recovered chat" (its history went with the tombstones), no message orphaned."""
    a, b, c = make_store("a"), make_store("b"), make_store("c")
    thread = a.new_chat("Trip")
    a.append(thread, "user", "known to all")
    sync(a, b, c)
    a.delete(thread)
    tombs = dirty_envelopes(a.replica)
    apply(c.replica, tombs)
    assert c.reconcile() == 0 and c.chat(thread) is None
    session = c.replica.sync_session()
    at = session.cursor
    marked = [dot for dot in map(peek_dot, tombs) if dot is not None]
    run = CollectedRun(at + 1, pack_markers(marked))
    assert session.apply_page(Page(at, [], at + 1, False, STATE, run)).collected == len(tombs)
    b.append(thread, "user", "written while a deleted")
    apply(c.replica, dirty_envelopes(b.replica))
    assert c.reconcile() == 1
    view = c.chat(thread)
    assert view is not None and view.thread.title == RECOVERED_TITLE
    assert texts(c, thread) == ["written while a deleted"]
