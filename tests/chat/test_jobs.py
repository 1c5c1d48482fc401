"""Write-last jobs (specs/chat.md §4): nothing changes until the job's one transaction; a
job that fails or is killed leaves the chat as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from chat import ChatStore, Message, NoSuchChatError, TurnBusyError
from tests.chat.conftest import StoreFactory, a_chat, texts

CHILD = Path(__file__).with_name("chat_child.py")
ROOT = CHILD.parents[2]


def start_child(store: ChatStore, mode: str, thread: str, *args: str) -> subprocess.Popen[str]:
    """A child process on the store's replica file (tests/chat/chat_child.py), once ready."""
    child = subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            mode,
            str(store.replica.path),
            store.replica.unlock_key().hex(),
            thread,
            *args,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready", child.stderr
    return child


def test_compress_replaces_old_turns_by_one_summary(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = a_chat(store, 4)
    seen: list[str] = []

    def summarize(messages: Sequence[Message]) -> str:
        seen.extend(m.content for m in messages)
        return "summary of 3 turns"

    assert store.compress(thread, summarize, keep_last=1) == 6
    assert seen == ["q0", "a0", "q1", "a1", "q2", "a2"]
    assert texts(store, thread) == ["summary of 3 turns", "q3", "a3"]
    assert store.undo(thread) == "compress"
    assert texts(store, thread) == ["q0", "a0", "q1", "a1", "q2", "a2", "q3", "a3"]


def test_a_failing_job_changes_nothing(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = a_chat(store, 3)
    head = store.replica.feed_head()

    def fail(messages: Sequence[Message]) -> str:
        raise RuntimeError("the model is down")

    with pytest.raises(RuntimeError, match="model is down"):
        store.compress(thread, fail)
    assert store.replica.feed_head() == head
    store.append(thread, "user", "the chat is free again")


def test_a_job_killed_midway_leaves_the_chat_untouched(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = a_chat(store, 3)
    before = texts(store, thread)
    head = store.replica.feed_head()
    child = start_child(store, "compress", thread)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "summarizing", child.stderr
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert texts(store, thread) == before and store.replica.feed_head() == head
    store.append(thread, "user", "after the lease ran out")  # waits for it (1 s)
    assert texts(store, thread)[-1] == "after the lease ran out"


def test_archiving_several_chats_is_all_or_nothing(make_store: StoreFactory) -> None:
    store = make_store("r")
    chats = [store.new_chat(f"c{i}") for i in range(3)]
    store.delete(chats[2])
    with pytest.raises(NoSuchChatError, match="no chat"):
        store.archive_chats(chats)
    assert len(store.chats()) == 2
    store.archive_chats(chats[:2])
    assert store.chats() == [] and len(store.chats(archived=True)) == 2


def test_two_processes_appending_to_one_chat_lose_nothing(make_store: StoreFactory) -> None:
    store = make_store("r")
    thread = store.new_chat("busy")
    children = [start_child(store, "append", thread, "40") for _ in range(2)]
    try:
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "done", child.stderr
    finally:
        for child in children:
            child.kill()
            child.communicate()
    messages = store.messages(thread, limit=1000).messages
    assert len(messages) == 80 and len({v.message.at for v in messages}) == 80
    for child in children:  # each process's messages keep the order it wrote them in
        mine = [
            v.message.content for v in messages if v.message.content.startswith(f"{child.pid}-")
        ]
        assert mine == [f"{child.pid}-{i}" for i in range(40)]


def test_one_turn_per_chat_across_processes_and_a_killed_turn_ends(
    make_store: StoreFactory,
) -> None:
    store = make_store("r")
    thread = store.new_chat("one at a time")
    child = start_child(store, "turn", thread)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "turning", child.stderr
        with pytest.raises(TurnBusyError, match="answering already"), store.turn(thread):
            pass
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    time.sleep(1.2)  # the killed turn's lease (1 s) runs out
    with store.turn(thread) as turn:
        turn.append("user", "my turn now")
