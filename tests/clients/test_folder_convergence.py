"""Convergence through a shared folder (clients/folder.py): three devices, each with its own
copy of the folder, kept in step by a test file-sync tool that copies files late, out of
order, twice, half-way (a half-synced file under its final name), and as conflict copies
named as Syncthing and Dropbox name them, and removes what a device's compaction removed
only later; devices restart and compact. In the end every device holds what the reference
model (tests/replica/model.py) says, so nothing written was lost. After every step, each
device's own files in its own copy open: nothing a device writes is ever misread.

Examples: 200 under CI (40 steps each); SEALSYNC_FOLDER_EXAMPLES sets more.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from clients.folder import DEVICES, FolderSync, make_folder, parse_file_name
from replica import Replica, ReplicaOptions
from tests.conftest import FakeClock
from tests.replica.model import Model
from tests.replica.test_convergence import shared_account

DEVICE_COUNT = 3
IDS = ["a", "b", "c"]
COLLECTIONS = ["notes", "threads"]
EXAMPLES = int(os.environ.get("SEALSYNC_FOLDER_EXAMPLES", "200" if os.environ.get("CI") else "25"))
CONFLICT_NAMES = (
    "{stem}.sync-conflict-20261202-101010-ABCDEFG{suffix}",  # Syncthing
    "{stem} (Laptop's conflicted copy 2026-12-02){suffix}",  # Dropbox
)
Copy = Path


class Device:
    def __init__(self, folder: Path, name: str, clock: FakeClock, shared: Path) -> None:
        self.path = folder / f"{name}.db"
        self.copy: Copy = folder / f"{name}-folder"
        shutil.copytree(shared, self.copy)
        bundle, self.key = shared_account()
        self.options = ReplicaOptions(synchronous="normal", wall_clock_ms=clock)
        self.replica = Replica.join(self.path, bundle, options=self.options)
        self.replica.unlock_with_key(self.key)
        self.name = self.replica.folder_session().device

    def reopen(self) -> None:
        self.replica.close()
        self.replica = Replica.open(self.path, options=self.options)
        self.replica.unlock_with_key(self.key)

    def sync(self) -> None:
        FolderSync(self.replica, self.copy, snapshot_every=3, max_batch_bytes=1).sync()


def files_of(copy: Copy) -> list[Path]:
    return sorted(p for p in (copy / DEVICES).rglob("*") if p.is_file())


class FolderConvergence(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="sealsync-folder-conv-"))
        self.clock = FakeClock()
        self.model = Model({"threads": "message_count"})
        self.devices: list[Device] = []

    @initialize()
    def make_devices(self) -> None:
        shared = self.folder / "original"
        bundle, _ = shared_account()
        make_folder(shared, bundle, 1)
        self.devices = [
            Device(self.folder, f"d{i}", self.clock, shared) for i in range(DEVICE_COUNT)
        ]

    def teardown(self) -> None:
        for device in self.devices:
            device.replica.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- writes ---------------------------------------------------------------------------------

    def _write(self, device: Device, collection: str, id: str, document: Any) -> None:
        replica = device.replica
        before = replica.get(collection, id)
        current = set() if before is None else set(before.context)
        deleted = document is None
        after = replica.delete(collection, id) if deleted else replica.put(collection, id, document)
        (new_dot,) = [d for d in after if d not in current]
        record = ("default", collection, id)
        self.model.write(record, *new_dot, sorted(current), deleted, document)

    @rule(
        device=st.integers(0, DEVICE_COUNT - 1),
        collection=st.sampled_from(COLLECTIONS),
        id=st.sampled_from(IDS),
        value=st.integers(0, 3),
    )
    def put(self, device: int, collection: str, id: str, value: int) -> None:
        self._write(self.devices[device], collection, id, {"v": value, "message_count": value})

    @rule(
        device=st.integers(0, DEVICE_COUNT - 1),
        collection=st.sampled_from(COLLECTIONS),
        id=st.sampled_from(IDS),
    )
    def delete(self, device: int, collection: str, id: str) -> None:
        self._write(self.devices[device], collection, id, None)

    @rule(device=st.integers(0, DEVICE_COUNT - 1))
    def sync(self, device: int) -> None:
        self.devices[device].sync()

    @rule(device=st.integers(0, DEVICE_COUNT - 1))
    def reopen(self, device: int) -> None:
        self.devices[device].reopen()

    @rule(ms=st.sampled_from([1, 11_000]))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    # -- the file-sync tool ---------------------------------------------------------------------

    def _owner(self, path: Path, copy: Copy) -> Device:
        (owner,) = [d for d in self.devices if d.name == path.relative_to(copy / DEVICES).parts[0]]
        return owner

    @rule(
        source=st.integers(0, DEVICE_COUNT - 1),
        into=st.integers(0, DEVICE_COUNT - 1),
        pick=st.integers(0, 1000),
        how=st.sampled_from(["whole", "whole", "half", "conflict copy", "again"]),
    )
    def transfer(self, source: int, into: int, pick: int, how: str) -> None:
        """Bring one file of `source`'s copy to `into`'s: never into a device's own place
        in its own copy (a tool keeps the writer's file: it is the newest)."""
        src, dst = self.devices[source], self.devices[into]
        candidates = [p for p in files_of(src.copy) if self._owner(p, src.copy) is not dst]
        if src is dst or not candidates:
            return
        path = candidates[pick % len(candidates)]
        goal = dst.copy / path.relative_to(src.copy)
        data = path.read_bytes()
        goal.parent.mkdir(parents=True, exist_ok=True)
        if how == "half":
            goal.write_bytes(data[: len(data) // 2])
        elif how == "conflict copy":
            name = CONFLICT_NAMES[pick % 2].format(stem=path.stem, suffix=path.suffix)
            goal.with_name(name).write_bytes(data)
        elif how == "again" and goal.exists():
            goal.write_bytes(goal.read_bytes())
        else:
            goal.write_bytes(data)

    @rule(device=st.integers(0, DEVICE_COUNT - 1), pick=st.integers(0, 1000))
    def remove_what_an_owner_removed(self, device: int, pick: int) -> None:
        dst = self.devices[device]
        gone = [
            p
            for p in files_of(dst.copy)
            if (owner := self._owner(p, dst.copy)) is not dst
            and not (owner.copy / p.relative_to(dst.copy)).exists()
            and (parsed := parse_file_name(p)) is not None
            and not parsed.copy
        ]
        if gone:
            gone[pick % len(gone)].unlink()

    # -- what holds throughout, and in the end ----------------------------------------------------

    @invariant()
    def own_files_always_open(self) -> None:
        for device in self.devices:
            session = device.replica.folder_session()
            own = device.copy / DEVICES / device.name
            for path in own.iterdir() if own.exists() else []:
                parsed = parse_file_name(path)
                assert parsed is not None and not parsed.copy, path
                session.open(path.read_bytes(), device.name, parsed.number, parsed.kind)

    def quiesce_and_compare(self) -> None:
        self.clock.advance(24 * 3600 * 1000)  # every freshness lock has ended
        for _ in range(3):
            for device in self.devices:
                device.replica.release_due()
                device.sync()
            self._bring_every_file_everywhere()
        for device in self.devices:
            device.sync()
            status = device.replica.status()
            assert status.dirty == 0 and status.held_for_lock == 0, status
            assert status.quarantined == 0 and status.degraded == 0, status
        for record in sorted(self.model.records()):
            visible = self.model.visible(record)
            dots = frozenset(v.dot for v in self.model.siblings(record))
            for device in self.devices:
                got = device.replica.get(record[1], record[2])
                assert got is not None, (record, device.name)
                assert got.context == dots, (record, device.name)
                shown = (got.node, got.hlc, got.deleted, got.document)
                assert shown == (visible.node, visible.hlc, visible.deleted, visible.document)

    def _bring_every_file_everywhere(self) -> None:
        """What the tool does once every device is online: each owner's files, whole,
        everywhere, and the files it removed removed."""
        for owner in self.devices:
            own = owner.copy / DEVICES / owner.name
            for other in self.devices:
                if other is owner or not own.exists():
                    continue
                place = other.copy / DEVICES / owner.name
                place.mkdir(parents=True, exist_ok=True)
                for path in place.iterdir():
                    parsed = parse_file_name(path)
                    if parsed is not None and not parsed.copy and not (own / path.name).exists():
                        path.unlink()
                for path in own.iterdir():
                    shutil.copyfile(path, place / path.name)


class FolderConvergenceTest(FolderConvergence):
    def teardown(self) -> None:
        try:
            if self.devices:
                self.quiesce_and_compare()
        finally:
            super().teardown()


FolderConvergenceTest.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None
)
test_folder_convergence = pytest.mark.slow(FolderConvergenceTest.TestCase)
