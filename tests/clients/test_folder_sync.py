"""`FolderSync` (clients/folder.py) case by case: file names, rounds that write nothing new,
half-synced files, conflict copies, compaction and catching up from a snapshot, the state
kept beside the replica, and folders that are not what they should be."""

from __future__ import annotations

import datetime
import json
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import replica.folder
from clients.backup import backup_replica, restore_replica
from clients.folder import (
    DEVICES,
    FolderReport,
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
from replica.wire import decode_vector, encode_vector
from tests.clients.test_cli import Cli
from tests.conftest import Account, ReplicaFactory

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_driver_kept_across_rounds_writes_every_edit(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    """A watch keeps one driver: an edit of the last record written reuses its row id, and
    must still be offered in the next round."""
    writer, reader = make_replica("writer"), make_replica("reader")
    driver = FolderSync(writer, shared)
    writer.put("notes", "older", {"text": "v1"})
    writer.put("notes", "n", {"text": "v1"})
    driver.sync()
    writer.put("notes", "n", {"text": "v2"})
    assert driver.sync().segments == 1
    FolderSync(reader, shared).sync()
    assert reader.get("notes", "n").document == {"text": "v2"}  # type: ignore[union-attr]


def four_notes_past_the_bound(make_replica: ReplicaFactory, shared: Path) -> FolderReport:
    """A writer's four 600-byte notes, a round after each: the fourth asks for a snapshot;
    the last round's report."""
    writer = make_replica("writer")
    for n in range(4):
        writer.put("notes", f"n{n}", {"text": "x" * 600})
        report = FolderSync(writer, shared, snapshot_every=4).sync()
    return report


def test_a_replica_past_the_bound_is_refused_a_snapshot_before_it_is_read(
    make_replica: ReplicaFactory, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sum of its envelopes' sizes says so (a million records are never loaded to be
    refused); a smaller bound stands in for 256 MiB."""
    monkeypatch.setattr(replica.folder, "MAX_FILE_BYTES", 1_000)
    report = four_notes_past_the_bound(make_replica, shared)
    assert report.snapshot is None and "bytes of versions, above the bound" in report.refused[0]


def test_a_snapshot_no_reader_could_open_is_not_written(
    make_replica: ReplicaFactory, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound a reader takes, the segments stay (a smaller bound stands in for a
    replica of 256 MiB); a late device still gets everything from them."""
    monkeypatch.setattr(replica.folder, "MAX_FILE_BYTES", 3_000)
    report = four_notes_past_the_bound(make_replica, shared)
    assert report.snapshot is None and "above the bound" in report.refused[0]
    late = make_replica("late")
    assert not FolderSync(late, shared).sync().refused
    assert all(late.get("notes", f"n{n}") is not None for n in range(4))


def test_a_round_whose_folder_went_away_writes_nothing(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    """An unmounted disk leaves an empty mount point: the round refuses it, and the
    versions stay to be written once the folder is back."""
    writer, reader = make_replica("writer"), make_replica("reader")
    driver = FolderSync(writer, shared)
    driver.sync()
    away = shared.with_name("away")
    shared.rename(away)
    shared.mkdir()
    writer.put("notes", "n", {"text": "while the disk was away"})
    with pytest.raises(StoreError, match="not a sealsync folder"):
        driver.sync()
    assert list(shared.iterdir()) == []
    shared.rmdir()
    away.rename(shared)
    assert driver.sync().pushed == 1
    FolderSync(reader, shared).sync()
    assert reader.get("notes", "n") is not None


def test_a_huge_file_is_refused_without_being_read(
    make_replica: ReplicaFactory, shared: Path, account: Account
) -> None:
    """A 2 GiB file (sparse) dropped into the folder, read by a process allowed 1 GiB."""
    reader = make_replica("reader")
    reader.close()
    place = shared / DEVICES / "0123456789abcdef"
    place.mkdir(parents=True)
    with (place / file_name("segment", 1)).open("wb") as file:
        file.truncate(2 << 30)
    script = (
        "import sys; from pathlib import Path; from replica import Replica;"
        "from clients.folder import FolderSync;"
        "r = Replica.open(Path(sys.argv[1])); r.unlock_with_key(bytes.fromhex(sys.argv[2]));"
        "print(FolderSync(r, Path(sys.argv[3])).sync().refused)"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(reader.path), account.key.hex(), str(shared)],
        check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-500:]
    assert "2,147,483,648 bytes, above" in child.stdout


def test_a_replica_restored_in_place_reads_the_folder_anew(
    make_replica: ReplicaFactory, shared: Path, account: Account, tmp_path: Path
) -> None:
    writer, device = make_replica("writer"), make_replica("device")
    path = device.path
    FolderSync(device, shared).sync()
    device.close()
    backup = backup_replica(path, tmp_path / "backups", datetime.datetime.now(datetime.UTC))
    with Replica.open(path) as device:
        device.unlock_with_key(account.key)
        writer.put("notes", "n", {"text": "after the backup"})
        FolderSync(writer, shared).sync()
        FolderSync(device, shared).sync()  # merged here, but not in the backup
    restore_replica(backup, path, force=True)
    with Replica.open(path) as restored:
        restored.unlock_with_key(account.key)
        FolderSync(restored, shared).sync()
        assert restored.get("notes", "n") is not None


def test_a_file_system_without_hard_links_still_takes_whole_files(
    make_replica: ReplicaFactory, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAT and exFAT (a USB stick) have no hard links: the file is renamed into place."""

    def no_links(source: object, target: object) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr("os.link", no_links)
    writer, reader = make_replica("writer"), make_replica("reader")
    writer.put("notes", "n", {"text": "on a stick"})
    assert FolderSync(writer, shared).sync().segments == 1
    assert FolderSync(reader, shared).sync().files == 1


def test_a_folder_that_is_not_empty_is_not_made_a_sealsync_folder(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica, folder = make_replica(), tmp_path / "busy"
    (folder / DEVICES).mkdir(parents=True)  # a folder whose marker has not arrived yet
    with pytest.raises(StoreError, match="not empty"):
        make_folder(folder, replica.key_bundle(), replica.key_generation)
    (folder / DEVICES).rmdir()
    (folder / ".stfolder").mkdir()  # a file-sync tool's own mark is no content
    make_folder(folder, replica.key_bundle(), replica.key_generation)


def test_no_snapshot_carries_an_envelope_that_does_not_open(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    """A reader would take the snapshot for the files it covers, and never get the good
    copy: a replica holding a damaged envelope writes no snapshot (repair first)."""
    writer = make_replica("writer")
    writer.put("notes", "n", {"text": "fine"})
    FolderSync(writer, shared, snapshot_every=2).sync()
    with sqlite3.connect(writer.path) as db:
        (envelope,) = db.execute("SELECT envelope FROM versions").fetchone()
        db.execute("UPDATE versions SET envelope = ?", (envelope[:-1] + bytes([envelope[-1] ^ 1]),))
    writer.put("notes", "m", {"text": "also fine"})
    report = FolderSync(writer, shared, snapshot_every=2).sync()
    assert report.snapshot is None and "does not open" in report.refused[0]
    assert own_files(writer, shared) == [file_name("segment", 1), file_name("segment", 2)]


def test_repair_on_a_folder_device_reads_the_folder_again(
    make_replica: ReplicaFactory, shared: Path, cli: Cli
) -> None:
    """A damaged vector made a merge drop a later version as superseded; `repair`
    quarantines the row, and the folder's files are read again, as a relay's would be."""
    writer, device = make_replica("writer"), make_replica("device")
    writer.put("notes", "n", {"text": "v1"})
    FolderSync(writer, shared).sync()
    FolderSync(device, shared).sync()
    with sqlite3.connect(device.path) as db:
        (row, vector) = db.execute("SELECT id, vector FROM versions").fetchone()
        raised = {node: hlc + (1 << 40) for node, hlc in decode_vector(vector).items()}
        db.execute("UPDATE versions SET vector = ? WHERE id = ?", (encode_vector(raised), row))
    device.close()
    writer.put("notes", "n", {"text": "v2"})
    FolderSync(writer, shared).sync()
    with Replica.open(device.path) as again:
        again.unlock_with_key(writer.unlock_key())
        assert FolderSync(again, shared).sync().merged.superseded == 1  # dropped: the damage
    cli.ok(device.path, "repair", "--force")
    with Replica.open(device.path) as repaired:
        repaired.unlock_with_key(writer.unlock_key())
        FolderSync(repaired, shared).sync()
        assert repaired.get("notes", "n").document == {"text": "v2"}  # type: ignore[union-attr]


def test_an_entry_that_cannot_be_read_holds_up_no_other(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    writer, reader = make_replica("writer"), make_replica("reader")
    writer.put("notes", "n", {"text": "readable"})
    FolderSync(writer, shared).sync()
    odd = shared / DEVICES / "0000000000000001"
    (odd / file_name("segment", 1)).mkdir(parents=True)  # a folder under a file's name
    os.mkfifo(odd / file_name("segment", 2))  # a FIFO: reading it would block forever
    report = FolderSync(reader, shared).sync()
    assert sorted(r.split(": ")[1] for r in report.refused) == ["not a regular file"] * 2
    assert reader.get("notes", "n") is not None
