"""`FolderSync` (clients/folder.py) case by case: file names, rounds that write nothing new,
half-synced files, conflict copies, compaction and catching up from a snapshot, the state
kept beside the replica, and folders that are not what they should be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.folder import (
    DEVICES,
    FolderSync,
    file_name,
    load_state,
    make_folder,
    parse_file_name,
    read_bundle,
    state_path,
)
from replica import Replica
from replica.errors import StoreError
from tests.conftest import ReplicaFactory


@pytest.fixture
def shared(make_replica: ReplicaFactory, tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    first = make_replica("first")
    make_folder(folder, first.key_bundle(), first.key_generation)
    return folder


def own_files(replica: Replica, folder: Path) -> list[str]:
    """The names of the replica's own files, by number."""
    place = folder / DEVICES / replica.folder_session().device
    return sorted((p.name for p in place.iterdir()), key=lambda name: name.split("-")[1])


@pytest.mark.parametrize(
    ("name", "kind", "number", "copy"),
    [
        ("segment-000000000007.seg", "segment", 7, False),
        ("snapshot-000000000040.snap", "snapshot", 40, False),
        ("segment-000000000007.sync-conflict-20261202-101010-ABCDEFG.seg", "segment", 7, True),
        ("segment-000000000007 (Laptop's conflicted copy 2026-12-02).seg", "segment", 7, True),
        ("segment-000000000007 (1).seg", "segment", 7, True),
    ],
)
def test_folder_file_names_and_conflict_copies(
    name: str, kind: str, number: int, copy: bool
) -> None:
    parsed = parse_file_name(Path(name))
    assert parsed is not None and (parsed.kind, parsed.number, parsed.copy) == (kind, number, copy)
    if not copy:
        assert file_name(parsed.kind, number) == name


@pytest.mark.parametrize(
    "name",
    [
        ".segment-000000000007.seg.abc.tmp",  # ours, being written
        ".syncthing.segment-000000000007.seg.tmp",  # Syncthing's, being written
        "segment-000000000007.snap",  # the kind and the extension disagree
        "segment-7.seg",
        "notes.txt",
    ],
)
def test_other_names_are_no_folder_files(name: str) -> None:
    assert parse_file_name(Path(name)) is None


def test_a_round_with_nothing_new_writes_nothing(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    replica = make_replica()
    replica.put("notes", "n", {"text": "once"})
    first = FolderSync(replica, shared).sync()
    again = FolderSync(replica, shared).sync()
    assert (first.segments, first.pushed) == (1, 1)
    assert (again.segments, again.pushed, again.files) == (0, 0, 0)
    assert own_files(replica, shared) == [file_name("segment", 1)]


def test_a_half_synced_file_waits_and_merges_once_whole(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    writer, reader = make_replica("writer"), make_replica("reader")
    writer.put("notes", "n", {"text": "arriving"})
    FolderSync(writer, shared).sync()
    (path,) = (shared / DEVICES / writer.folder_session().device).iterdir()
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # what a file-sync tool shows mid-transfer
    waiting = FolderSync(reader, shared).sync()
    assert waiting.files == 0 and len(waiting.refused) == 1 and reader.get("notes", "n") is None
    path.write_bytes(whole)
    arrived = FolderSync(reader, shared).sync()
    assert arrived.files == 1 and not arrived.refused
    assert reader.get("notes", "n") is not None


def test_a_conflict_copy_is_merged_once(make_replica: ReplicaFactory, shared: Path) -> None:
    writer, reader = make_replica("writer"), make_replica("reader")
    writer.put("notes", "n", {"text": "kept"})
    FolderSync(writer, shared).sync()
    (path,) = (shared / DEVICES / writer.folder_session().device).iterdir()
    copy = path.with_name(f"{path.stem}.sync-conflict-20261202-101010-ABCDEFG{path.suffix}")
    copy.write_bytes(path.read_bytes())
    assert FolderSync(reader, shared).sync().files == 2
    assert FolderSync(reader, shared).sync().files == 0
    state = load_state(reader.path)
    assert state is not None and state.copies == [f"{path.parent.name}/{copy.name}"]


def test_a_device_added_late_catches_up_from_a_snapshot(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    writer = make_replica("writer")
    for n in range(10):
        writer.put("notes", f"n{n}", {"text": f"{n}"})
        FolderSync(writer, shared, snapshot_every=4).sync()
    files = own_files(writer, shared)
    assert files[0].startswith("snapshot-") and len(files) < 10  # the older files are gone
    late = make_replica("late")
    report = FolderSync(late, shared).sync()
    assert report.files == len(files) and report.merged.merged == 10
    assert all(late.get("notes", f"n{n}") is not None for n in range(10))
    state = load_state(late.path)
    assert state is not None
    assert state.done[writer.folder_session().device] == int(files[-1][-16:-4])


def test_a_reader_behind_a_compaction_takes_the_snapshot(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    writer, reader = make_replica("writer"), make_replica("reader")
    writer.put("notes", "first", {"text": "read early"})
    FolderSync(writer, shared, snapshot_every=3).sync()
    FolderSync(reader, shared).sync()
    for n in range(6):
        writer.put("notes", f"n{n}", {"text": f"{n}"})
        FolderSync(writer, shared, snapshot_every=3).sync()
    assert file_name("segment", 2) not in own_files(writer, shared)  # compacted away
    caught_up = FolderSync(reader, shared).sync()
    assert not caught_up.refused
    assert all(reader.get("notes", f"n{n}") is not None for n in range(6))


def test_folders_and_states_that_are_not_right_are_clear_errors(
    make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    replica = make_replica()
    with pytest.raises(StoreError, match="not a sealsync folder"):
        FolderSync(replica, tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sealsync-folder.json").write_text('{"sealsync_folder": 99}')
    with pytest.raises(StoreError, match="another format"):
        FolderSync(replica, tmp_path / "other")
    with pytest.raises(StoreError, match="already"):
        make_folder(shared, replica.key_bundle(), replica.key_generation)
    assert read_bundle(shared) == replica.key_bundle()
    state_path(replica.path).write_text("{not json")
    with pytest.raises(StoreError, match="folder state"):
        FolderSync(replica, shared)
    state_path(replica.path).write_text(json.dumps({"folder": str(tmp_path / "elsewhere")}))
    FolderSync(replica, shared).sync()  # a state of another folder starts anew here
    state = load_state(replica.path)
    assert state is not None and state.folder == str(shared)
