"""Convergence of the chat store: three replicas mix every chat operation with syncs in
random orders, with duplicated and reordered envelopes and restarts (specs/chat.md §7).

After every step: each replica's blind index equals a rebuild and its change feed has one
number per record, and no live message sits under a chat its replica shows deleted. At the
end, once everything is synced: all replicas show the same chats and messages, and every
message survives that no replica deleted while it held it (concurrent appends both stay).

Examples: 300 under CI; set SEALSYNC_CHAT_CONVERGENCE_EXAMPLES for more.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from chat import ChatStore, NoSuchChatError, with_chat
from chat.schema import MESSAGES, THREADS
from replica import Replica, ReplicaOptions, Schema
from replica.indexed import rebuild
from tests.replica.helpers import apply, dirty_envelopes
from tests.replica.test_convergence import one_sequence_number_per_record

REPLICAS = 3
EXAMPLES = int(
    os.environ.get("SEALSYNC_CHAT_CONVERGENCE_EXAMPLES", "300" if os.environ.get("CI") else "100")
)
OPTIONS = ReplicaOptions(freshness_window_s=0, synchronous="normal")
_ACCOUNT: dict[str, bytes] = {}


def shared_account() -> tuple[bytes, bytes]:
    """One account for every example (Argon2id once per process)."""
    if not _ACCOUNT:
        folder = Path(tempfile.mkdtemp(prefix="sealsync-chat-account-"))
        replica, _ = Replica.create(folder / "a.db", with_chat(Schema(())), "chat convergence 12")
        _ACCOUNT.update(bundle=replica.key_bundle(), key=replica.unlock_key())
        replica.close()
        shutil.rmtree(folder)
    return _ACCOUNT["bundle"], _ACCOUNT["key"]


class Device:
    def __init__(self, path: Path) -> None:
        self.path = path
        bundle, self.key = shared_account()
        replica = Replica.join(path, bundle, options=OPTIONS)
        replica.unlock_with_key(self.key)
        self.store = ChatStore(replica, wait_s=5)
        self.pulled = 0

    def reopen(self) -> None:
        self.store.replica.close()
        replica = Replica.open(self.path, options=OPTIONS)
        replica.unlock_with_key(self.key)
        self.store = ChatStore(replica, wait_s=5)


class ChatMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="sealsync-chat-conv-"))
        self.log: list[bytes] = []
        self.devices: list[Device] = []
        self.rng = random.Random(0)
        self.chats: list[str] = []
        self.created: set[str] = set()
        self.deleted_knowingly: set[str] = set()
        self.edited: set[str] = set()

    @initialize()
    def make_devices(self) -> None:
        self.devices = [Device(self.folder / f"d{i}.db") for i in range(REPLICAS)]

    def teardown(self) -> None:
        for device in self.devices:
            device.store.replica.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- operations ----------------------------------------------------------------------------

    def _visible(self, store: ChatStore) -> set[str]:
        return {r.id for r in store.replica.scan(MESSAGES)}

    def _act(self, device: int, action: Any) -> None:
        """Run one chat operation; what it deleted is noted as deleted knowingly."""
        store = self.devices[device].store
        before = self._visible(store)
        try:
            action(store)
        except NoSuchChatError:
            return  # not here yet, or deleted here: a person would see no such chat
        after = self._visible(store)
        self.deleted_knowingly |= before - after
        self.created |= after - before

    @rule(device=st.integers(0, REPLICAS - 1), title=st.sampled_from(["a", "b"]))
    def new_chat(self, device: int, title: str) -> None:
        self.chats.append(self.devices[device].store.new_chat(title))

    @rule(
        device=st.integers(0, REPLICAS - 1),
        pick=st.integers(0, 9),
        kind=st.sampled_from(
            [
                "append",
                "append",
                "rename",
                "archive",
                "delete",
                "clear",
                "trim",
                "retry",
                "fork",
                "edit",
            ]
        ),
    )
    def operate(self, device: int, pick: int, kind: str) -> None:
        """One operation on a chat a device shows (the first device from `device` on that
        shows any)."""
        for index in [*range(device, REPLICAS), *range(device)]:
            store = self.devices[index].store
            shown = sorted(v.id for a in (False, True) for v in store.chats(archived=a))
            if shown:
                self._operate(index, shown[pick % len(shown)], pick, kind)
                return

    @rule(device=st.integers(0, REPLICAS - 1), pick=st.integers(0, 9))
    def append(self, device: int, pick: int) -> None:
        self.operate(device, pick, "append")

    def _operate(self, device: int, thread: str, pick: int, kind: str) -> None:
        def run(store: ChatStore) -> None:
            if kind == "append":
                store.append(thread, "user", f"m{len(self.created)}")
            elif kind == "rename":
                store.rename(thread, f"t{device}")
            elif kind == "archive":
                store.archive(thread, archived=bool(pick % 2))
            elif kind == "delete":
                store.delete(thread)
            elif kind == "clear":
                store.clear(thread)
            elif kind == "trim":
                store.trim(thread, keep_first=0, keep_last=1)
            elif kind == "retry":
                self.edited |= self._visible(store)
                store.edit_and_retry(thread, "retried")
            elif kind == "fork":
                messages = store.messages(thread).messages
                if messages:
                    self.chats.append(store.fork(thread, messages[0].id))
            else:
                messages = store.messages(thread).messages
                if messages:
                    self.edited.add(messages[-1].id)
                    store.edit(thread, messages[-1].id, "edited")

        self._act(device, run)

    @rule(device=st.integers(0, REPLICAS - 1), pick=st.integers(0, 9), delete=st.booleans())
    def persona(self, device: int, pick: int, delete: bool) -> None:
        """Persona delete vs use: make one, or delete one, or give a chat one."""
        store = self.devices[device].store
        custom = sorted(set(store.personas()) - {"default"})
        if delete and custom:
            store.delete_persona(custom[pick % len(custom)])
        elif not custom or pick % 3 == 0:
            store.create_persona(f"p{pick}")
        else:
            shown = sorted(v.id for a in (False, True) for v in store.chats(archived=a))
            if shown:
                self._act(
                    device,
                    lambda s: s.set_persona(shown[pick % len(shown)], custom[pick % len(custom)]),
                )

    @rule(device=st.integers(0, REPLICAS - 1))
    def push(self, device: int) -> None:
        self.log.extend(dirty_envelopes(self.devices[device].store.replica))

    @rule(device=st.integers(0, REPLICAS - 1), mode=st.sampled_from(["all", "shuffled", "dup"]))
    def pull(self, device: int, mode: str) -> None:
        target = self.devices[device]
        fresh = self.log[target.pulled :]
        if mode == "shuffled":
            self.rng.shuffle(fresh)
        elif mode == "dup":
            fresh = fresh + self.log[: target.pulled][-5:]  # duplicates of what it has
        if fresh:
            apply(target.store.replica, fresh)
        target.pulled = len(self.log)
        target.store.reconcile()

    @rule(device=st.integers(0, REPLICAS - 1))
    def restart(self, device: int) -> None:
        self.devices[device].reopen()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def indexes_and_feeds_are_exact(self) -> None:
        for device in self.devices:
            replica = device.store.replica
            core = replica._core
            with core.mutex, pytest.raises(_RolledBack), core.store.transaction():
                assert rebuild(core) == 0, device.path
                raise _RolledBack
            assert one_sequence_number_per_record(replica), device.path

    @invariant()
    def no_message_sits_under_a_deleted_chat(self) -> None:
        for device in self.devices:
            replica = device.store.replica
            for record in replica.scan(MESSAGES):
                chat = replica.get(THREADS, record.document["thread"])
                assert chat is None or not chat.deleted, (device.path, record.id)

    def teardown_check(self) -> None:
        for _ in range(2):
            for index in range(REPLICAS):
                self.push(index)
            for index in range(REPLICAS):
                self.pull(index, "all")
        states = [self._state(d.store) for d in self.devices]
        assert states[0] == states[1] == states[2]
        personas = [self._personas(d.store) for d in self.devices]
        assert personas[0] == personas[1] == personas[2]
        survivors = {m for chat in states[0].values() for m in chat[2]}
        expected = self.created - self.deleted_knowingly - self.edited
        assert expected <= survivors, expected - survivors

    @staticmethod
    def _personas(store: ChatStore) -> dict[str, str]:
        """The persona each chat shows: a deleted one shows as the default, everywhere."""
        shown = {}
        for archived in (False, True):
            for view in store.chats(archived=archived):
                persona, _ = store.persona(view.thread.persona)
                assert persona == "default" or persona in store.personas()
                shown[view.id] = persona
        return shown

    def _state(self, store: ChatStore) -> dict[str, tuple[str, bool, tuple[str, ...]]]:
        return {
            view.id: (
                view.thread.title,
                view.thread.archived,
                tuple(v.id for v in store.messages(view.id, limit=1000).messages),
            )
            for archived in (False, True)
            for view in store.chats(archived=archived)
        }


class _RolledBack(Exception):
    pass


class CheckedChatMachine(ChatMachine):
    def teardown(self) -> None:
        try:
            self.teardown_check()
        finally:
            super().teardown()


TestChatConvergence = pytest.mark.slow(CheckedChatMachine.TestCase)
TestChatConvergence.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None
)
