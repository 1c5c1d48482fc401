"""Key changes through a shared folder (clients/folder_keys.py, specs/folder.md §4): a
rotation written as the next generation's bundle reaches the other devices, which write
nothing until they take it; files of earlier generations stay readable through the chain of
bundles; a revoked device's later writes are refused by every reader; a write racing the
rotation arrives sealed again; and two rotations at once are named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clients.folder import DEVICES, KEYS, FolderSync, bundle_name, file_name
from clients.folder_keys import check_revocable_in_folder, folder_devices, rotate_in_folder
from replica import Replica, passphrase_login_keys
from replica.bundles import parse_bundle
from replica.errors import InvalidArgumentError, ProtocolError, StoreError
from tests.conftest import SCHEMA, ReplicaFactory

NEW_PASSPHRASE = "the folder's new and longer passphrase"


def text(replica: Replica, note: str) -> object:
    """The note's document, or None when the replica has none."""
    record = replica.get("notes", note)
    return None if record is None else record.document


def take_newer_keys(replica: Replica, folder: Path) -> None:
    """What `sealsync sync` does when a round finds newer keys: take them, with the new
    passphrase."""
    report = FolderSync(replica, folder).sync()
    assert report.newer_keys is not None
    login = passphrase_login_keys(NEW_PASSPHRASE, parse_bundle(report.newer_keys).kdf)
    assert replica.adopt_bundle(report.newer_keys, login)


def test_a_revoke_reaches_the_others_and_shuts_the_revoked_device_out(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    a, b, gone = make_replica("a"), make_replica("b"), make_replica("revoked")
    for n, replica in enumerate((a, b, gone)):
        replica.put("notes", f"n{n}", {"text": f"before, from {n}"})
    for replica in (a, b, gone, a, b):
        FolderSync(replica, shared).sync()
    revoked = gone.folder_session().device
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=revoked)
    assert (a.key_generation, (shared / KEYS / bundle_name(2)).is_file()) == (2, True)

    b.put("notes", "n1", {"text": "after, from b"})
    paused = FolderSync(b, shared).sync()  # keys behind the folder's: nothing written
    assert paused.newer_keys is not None and paused.segments == 0
    take_newer_keys(b, shared)
    assert FolderSync(b, shared).sync().segments >= 1  # its versions, sealed again

    gone.put("notes", "n0", {"text": "minted by the revoked device"})
    mint = gone.folder_session().next_segment(99)  # what a revoked device may still write
    assert mint is not None
    (shared / DEVICES / revoked / file_name("segment", 99)).write_bytes(mint.data)
    read = FolderSync(a, shared).sync()
    assert read.merged.untrusted == 1
    assert text(a, "n0") == {"text": "before, from 0"}  # nothing of it merged
    assert text(a, "n1") == {"text": "after, from b"}
    assert text(a, "n2") == {"text": "before, from 2"}  # written before: kept
    shut_out = FolderSync(gone, shared).sync()
    assert shut_out.newer_keys is not None and shut_out.segments == 0
    assert shut_out.waiting >= 2 and not shut_out.refused  # a's and b's, once it has the keys


def test_a_device_joining_after_a_rotation_reads_the_files_from_before_it(
    make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    a, away = make_replica("a"), make_replica("away")
    away.put("notes", "old", {"text": "written under generation 1, never again"})
    FolderSync(away, shared).sync()
    FolderSync(a, shared).sync()
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None)
    late = Replica.join(tmp_path / "late.db", (shared / KEYS / bundle_name(2)).read_bytes())
    late.unlock(NEW_PASSPHRASE)
    report = FolderSync(late, shared).sync()
    assert not report.refused and report.merged.untrusted == 0
    assert text(late, "old") == {"text": "written under generation 1, never again"}

    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    (shared / KEYS / bundle_name(1)).write_bytes(other.key_bundle())  # the chain broken
    later = Replica.join(tmp_path / "later.db", (shared / KEYS / bundle_name(2)).read_bytes())
    later.unlock(NEW_PASSPHRASE)
    refused = FolderSync(later, shared).sync()
    assert text(later, "old") is None
    assert any("which no bundle in the folder's keys/ vouches for" in r for r in refused.refused)
    for replica in (late, later, other):
        replica.close()


def test_a_write_racing_the_rotation_is_refused_once_then_arrives_sealed_again(
    make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    a, b = make_replica("a"), make_replica("b")
    for replica in (a, b, a):
        FolderSync(replica, shared).sync()
    behind = tmp_path / "behind"  # b's copy of the folder, before the rotation reaches it
    shutil.copytree(shared, behind)
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None)
    b.put("notes", "racing", {"text": "written while the rotation was under way"})
    FolderSync(b, behind).sync()
    for written in (behind / DEVICES / b.folder_session().device).iterdir():
        shutil.copy2(written, shared / DEVICES / b.folder_session().device / written.name)
    first = FolderSync(a, shared).sync()
    assert first.merged.untrusted == 1 and text(a, "racing") is None
    take_newer_keys(b, shared)
    FolderSync(b, shared).sync()
    FolderSync(a, shared).sync()
    assert text(a, "racing") == {"text": "written while the rotation was under way"}


def test_two_rotations_at_once_are_named_and_a_later_one_waits(
    make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    a, b = make_replica("a"), make_replica("b")
    for replica in (a, b):
        FolderSync(replica, shared).sync()
    copy = tmp_path / "b's copy"
    shutil.copytree(shared, copy)
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None)
    rotate_in_folder(FolderSync(b, copy), "b's own new passphrase, at once", revoked=None)
    shutil.copy2(shared / KEYS / bundle_name(2), copy / KEYS / bundle_name(2))  # the tool's pick
    with pytest.raises(ProtocolError, match="two devices changed the account's keys at once"):
        FolderSync(b, copy).sync()
    c = make_replica("c")
    with pytest.raises(StoreError, match="the folder holds newer keys"):
        rotate_in_folder(FolderSync(c, shared), "a third passphrase", revoked=None)
    assert c.key_generation == 1 and not (shared / KEYS / bundle_name(3)).exists()


def test_only_another_device_with_a_place_in_the_folder_can_be_revoked(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    a, b = make_replica("a"), make_replica("b")
    for replica in (a, b):
        replica.put("notes", "n", {"text": "x"})
        FolderSync(replica, shared).sync()
    here, there = a.folder_session().device, b.folder_session().device
    listed = folder_devices(shared, here)
    assert sorted((d.id, d.current, d.files) for d in listed) == sorted(
        [(here, True, 1), (there, False, 1)]
    )
    check_revocable_in_folder(shared, here, there)
    for wrong in (here, "0123456789abcdef"):
        with pytest.raises(InvalidArgumentError):
            check_revocable_in_folder(shared, here, wrong)
