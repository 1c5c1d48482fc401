"""The signed files of folder sync (replica/folder.py): what one device seals another of
the account opens and merges; anything cut short, changed, moved, or signed by another
account is refused before one envelope is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import ProtocolError, Replica
from replica.errors import InvalidArgumentError
from tests.conftest import SCHEMA, ReplicaFactory
from tests.replica.v1 import V1Account


@pytest.fixture
def sealed(make_replica: ReplicaFactory) -> tuple[Replica, bytes]:
    """A replica with three notes, and its first segment."""
    writer = make_replica("writer")
    for n in range(3):
        writer.put("notes", f"n{n}", {"text": f"note {n}"})
    segment = writer.folder_session().next_segment(1)
    assert segment is not None
    return writer, segment.data


def test_a_segment_merges_on_another_device_and_is_written_once(
    make_replica: ReplicaFactory, sealed: tuple[Replica, bytes]
) -> None:
    writer, data = sealed
    session = writer.folder_session()
    first = session.next_segment(1)
    assert first is not None and first.data == data  # nothing written yet: the same batch
    session.written(first)
    assert writer.status().dirty == 0 and writer.folder_session().next_segment(2) is None
    reader = make_replica("reader")
    body = reader.folder_session().open(data, session.device, 1, "segment")
    merged = reader.folder_session().merge(body)
    assert (merged.read, merged.merged) == (3, 3)
    assert reader.get("notes", "n2").document == {"text": "note 2"}  # type: ignore[union-attr]
    assert reader.status().dirty == 0  # another device's versions: that device writes them


def test_a_snapshot_holds_every_version_and_what_it_covers(
    make_replica: ReplicaFactory, sealed: tuple[Replica, bytes]
) -> None:
    writer, _ = sealed
    session = writer.folder_session()
    data = session.snapshot(4, {session.device: 3, "00000000000000aa": 7})
    body = make_replica("reader").folder_session().open(data, session.device, 4, "snapshot")
    assert len(body.envelopes) == 3 and body.covers == {session.device: 3, "00000000000000aa": 7}


@given(position=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_any_flipped_bit_is_refused(
    make_replica: ReplicaFactory, sealed: tuple[Replica, bytes], position: int, bit: int
) -> None:
    writer, data = sealed
    changed = bytearray(data)
    changed[position % len(data)] ^= 1 << bit
    with pytest.raises(ProtocolError):
        writer.folder_session().open(bytes(changed), writer.folder_session().device, 1, "segment")


@given(length=st.integers(0, 10_000))
def test_a_file_cut_short_is_refused(sealed: tuple[Replica, bytes], length: int) -> None:
    writer, data = sealed
    with pytest.raises(ProtocolError, match=r"cut short|signature"):
        writer.folder_session().open(
            data[: length % len(data)], writer.folder_session().device, 1, "segment"
        )


def test_a_moved_file_and_another_accounts_file_are_refused(
    sealed: tuple[Replica, bytes], tmp_path: Path
) -> None:
    writer, data = sealed
    session = writer.folder_session()
    for device, number, kind in (
        (session.device, 2, "segment"),
        ("00000000000000aa", 1, "segment"),
        (session.device, 1, "snapshot"),
    ):
        with pytest.raises(ProtocolError, match="moved from its place"):
            session.open(data, device, number, kind)  # type: ignore[arg-type]
    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    with other:
        other.put("notes", "n0", {"text": "forged"})
        forged = other.folder_session().next_segment(1)
        assert forged is not None
        with pytest.raises(ProtocolError, match="signature does not verify"):
            session.open(forged.data, other.folder_session().device, 1, "segment")


def test_a_version_1_account_cannot_sign_folder_files(tmp_path: Path, v1: V1Account) -> None:
    with Replica.join(tmp_path / "old.db", v1.bundle_bytes) as replica:
        replica.unlock_with_login_keys(v1.login)
        replica.put("threads", "t", {"title": "old"})
        with pytest.raises(InvalidArgumentError, match="signs nothing"):
            replica.folder_session().next_segment(1)
