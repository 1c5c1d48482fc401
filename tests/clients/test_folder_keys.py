"""Key changes through a shared folder (clients/folder_keys.py, specs/folder.md §4): a
rotation written as the next generation's bundle reaches the other devices, which write
nothing until they take it; what was written before it reaches a device that joins later;
nothing a revoked device writes under its old keys is read, however it is made (a dot below
the frontier, a snapshot claiming to cover others' files); a write racing the rotation
arrives sealed again; bundles that do not follow hold nobody back; two rotations at once
are named."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec
import pytest

from clients.folder import DEVICES, KEYS, FolderSync, file_name
from clients.folder_keys import check_revocable_in_folder, folder_devices, rotate_in_folder
from replica import Replica, passphrase_login_keys
from replica.bundles import parse_bundle
from replica.envelope import Identity, seal
from replica.errors import InvalidArgumentError, StoreError
from replica.folder import Kind, bundle_name
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


def revoked_after_writing(
    make_replica: ReplicaFactory, shared: Path
) -> tuple[Replica, Replica, Replica]:
    """Devices a and b, and a third that a revoked after all three wrote and synced; b has
    taken the new keys."""
    a, b, gone = make_replica("a"), make_replica("b"), make_replica("revoked")
    for n, replica in enumerate((a, b, gone)):
        replica.put("notes", f"n{n}", {"text": f"before, from {n}"})
    for replica in (a, b, gone, a, b):
        FolderSync(replica, shared).sync()
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=gone.folder_session().device)
    assert (a.key_generation, (shared / KEYS / bundle_name(2)).is_file()) == (2, True)
    b.put("notes", "n1", {"text": "after, from b"})
    paused = FolderSync(b, shared).sync()  # keys behind the folder's: nothing written
    assert paused.newer_keys is not None and paused.segments == 0
    take_newer_keys(b, shared)
    assert FolderSync(b, shared).sync().segments >= 1  # its versions, sealed again
    return a, b, gone


def plant(gone: Replica, folder: Path, kind: Kind, number: int, data: bytes) -> None:
    """A file the revoked device writes, signed with the keys it kept."""
    (folder / DEVICES / gone.folder_session().device / file_name(kind, number)).write_bytes(data)


def test_a_revoke_reaches_the_others_and_shuts_the_revoked_device_out(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    a, _, gone = revoked_after_writing(make_replica, shared)
    gone.put("notes", "n0", {"text": "minted by the revoked device"})
    mint = gone.folder_session().next_segment(99)
    assert mint is not None
    plant(gone, shared, "segment", 99, mint.data)
    read = FolderSync(a, shared).sync()
    assert read.retired == 1
    assert text(a, "n0") == {"text": "before, from 0"}  # nothing of it merged
    assert text(a, "n1") == {"text": "after, from b"}
    assert text(a, "n2") == {"text": "before, from 2"}  # written before: kept
    assert FolderSync(a, shared).sync().retired == 0  # seen once, never opened again
    shut_out = FolderSync(gone, shared).sync()
    assert shut_out.newer_keys is not None and shut_out.segments == 0
    assert (shut_out.files, shut_out.waiting, shut_out.refused) == (0, 0, [])  # reads nothing


def forgeries(gone: Replica, rotated: Replica, folder: Path, victim: Replica) -> None:
    """What a revoked device may write with the keys it kept: a version of the victim's
    note `n1` at a dot of its own below the frontier that it never used (its vector within
    the frontier), and a snapshot saying every file of the victim is merged already."""
    keys = gone._core.keys()
    frontier = rotated._core.keys().retired_epochs[keys.key_epoch]
    below = frontier.vector[gone.node] - 1
    forged = seal(keys, Identity("default", "notes", "n1"), hlc=below, node=gone.node,
                  vector={**frontier.vector, gone.node: below}, deleted=False,
                  document={"text": "taken over"}, nonce=os.urandom(12))  # fmt: skip
    session = gone.folder_session()
    plant(gone, folder, "segment", 77, session._seal("segment", 77, [forged], {}))
    covers = {victim.folder_session().device: 10**12}
    plant(gone, folder, "snapshot", 78, session._seal("snapshot", 78, [], covers))


@pytest.mark.parametrize("planted", ["after b took the keys", "before b took them"])
def test_a_dot_below_the_frontier_and_a_snapshot_covering_others_are_not_read(
    planted: str, make_replica: ReplicaFactory, shared: Path
) -> None:
    a, b, c, gone = (make_replica(name) for name in ("a", "b", "c", "revoked"))
    for n, replica in enumerate((a, b, c, gone)):
        replica.put("notes", f"n{n}", {"text": f"before, from {n}"})
    for replica in (a, b, c, gone, a, b, c):
        FolderSync(replica, shared).sync()
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=gone.folder_session().device)
    if planted == "before b took them":  # a device behind reads nothing of them
        forgeries(gone, a, shared, c)
    for replica in (b, c):
        take_newer_keys(replica, shared)
        FolderSync(replica, shared).sync()
    if planted == "after b took the keys":
        forgeries(gone, a, shared, c)
    assert FolderSync(a, shared).sync().retired == 2
    c.put("notes", "later", {"text": "c, after the forgery"})
    FolderSync(c, shared).sync()
    for replica in (b, a, b):
        FolderSync(replica, shared).sync()
    for replica in (a, b):
        assert text(replica, "n1") == {"text": "before, from 1"}
        assert text(replica, "later") == {"text": "c, after the forgery"}


def test_a_file_claiming_retired_keys_is_checked_before_it_is_set_aside(
    make_replica: ReplicaFactory, shared: Path
) -> None:
    a, b = make_replica("a"), make_replica("b")
    FolderSync(a, shared).sync()
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None)
    body = msgspec.msgpack.encode({"format": 1, "generation": 1})  # claims, signs nothing
    junk = msgspec.msgpack.encode([body, bytes(64)])
    place = shared / DEVICES / b.folder_session().device
    place.mkdir(parents=True)
    (place / file_name("segment", 50)).write_bytes(junk)
    report = FolderSync(a, shared).sync()
    assert report.retired == 0 and any("signature does not verify" in r for r in report.refused)


def test_a_device_joining_after_a_rotation_gets_what_was_written_before_it(
    make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    a, away = make_replica("a"), make_replica("away")
    away.put("notes", "old", {"text": "written under generation 1, never again"})
    FolderSync(away, shared).sync()
    FolderSync(a, shared).sync()
    rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None)
    late = Replica.join(tmp_path / "late.db", (shared / KEYS / bundle_name(2)).read_bytes())
    with late:
        late.unlock(NEW_PASSPHRASE)
        report = FolderSync(late, shared).sync()
        assert report.retired == 1 and report.merged.untrusted == 0  # away's: not read
        assert text(late, "old") == {"text": "written under generation 1, never again"}


def test_a_write_racing_the_rotation_is_not_read_then_arrives_sealed_again(
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
    assert first.retired == 1 and text(a, "racing") is None
    take_newer_keys(b, shared)
    FolderSync(b, shared).sync()
    FolderSync(a, shared).sync()
    assert text(a, "racing") == {"text": "written while the rotation was under way"}


@pytest.mark.parametrize("made_by", ["garbage", "another account", "the revoked device"])
def test_a_next_bundle_that_does_not_follow_holds_nobody_back(
    made_by: str, make_replica: ReplicaFactory, shared: Path, tmp_path: Path
) -> None:
    a, b = make_replica("a"), make_replica("b")
    FolderSync(a, shared).sync()
    if made_by == "garbage":
        data = b"not a bundle"
    else:
        other = make_replica("other") if made_by == "the revoked device" else None
        forger = other or Replica.create(tmp_path / "x.db", SCHEMA, "another account's")[0]
        with forger.batch():
            forger.rotate_keys("the forger's passphrase", revoked_device=None, device="x")
        data = forger.key_bundle()
        if made_by == "another account":
            forger.close()
    (shared / KEYS / bundle_name(2)).write_bytes(data)
    b.put("notes", "n", {"text": "b writes on"})
    report = FolderSync(b, shared).sync()
    if made_by == "the revoked device":  # chained by generation 1's key: it cannot be told
        assert report.newer_keys == data and report.segments == 0
        return
    assert report.newer_keys is None and report.segments == 1
    assert any("bundle-000002.bin" in problem for problem in report.refused)
    assert rotate_in_folder(FolderSync(a, shared), NEW_PASSPHRASE, revoked=None) is not None


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
    b.put("notes", "n", {"text": "b writes on under its own keys"})
    named = FolderSync(b, copy).sync()
    assert named.segments == 1 and any("two devices changed the keys" in r for r in named.refused)
    c = make_replica("c")
    with pytest.raises(
        StoreError, match="the folder holds key generation 2, newer than this device's 1"
    ):
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
