"""What a signed push declares besides its envelopes (protocol 5, specs/protocol.md §4.7):
which of them are tombstones, and how far its device has pulled (`ack`). Both are signed;
`relay accounts` shows them (the first step of tombstone collection,
docs/tombstone-collection.md), over the real HTTP API on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.errors import InvalidError
from relay.signing import Pusher
from relay.storage import AccountSummary, Device
from relay.versions import TOO_LARGE, with_oversized, within_bound
from replica.errors import ProtocolError
from replica.generations import sign_push
from replica.wire import (
    LoginRequest,
    PushBatch,
    PushResult,
    Receipt,
    RelayState,
    tombstone_bits,
    tombstone_flags,
)
from tests.relay.api import MSGPACK, body, decode
from tests.relay.conftest import NOW_MS, StorageFactory, account_record
from tests.relay.harness import BACKENDS, open_relays
from tests.relay.owners import Owner, answer_code, record, register_owner, signed_account


@pytest.fixture(params=BACKENDS)
def owner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Owner]:
    for relays in open_relays(tmp_path, request.param):
        yield register_owner(relays())


def summary(owner: Owner) -> AccountSummary:
    (account,) = owner.relay.storage.accounts(owner.name)
    return account


def statuses(answer_content: bytes) -> list[str]:
    return [r.status for r in decode(answer_content, PushResult).receipts]


def test_a_signed_push_declares_its_tombstones_and_the_account_counts_them(owner: Owner) -> None:
    live, tomb = record(b"a" * 16, 1), record(b"b" * 16, 2)
    answer = owner.push(owner.sign([live, tomb], counter=1, tombs=[False, True]))
    assert statuses(answer.content) == ["stored", "stored"]
    assert (summary(owner).tombstones, summary(owner).tombstone_bytes) == (1, len(tomb))
    revived = owner.push(owner.sign([record(b"b" * 16, 3)], counter=2))  # dominates the tomb
    assert statuses(revived.content) == ["stored"]
    assert (summary(owner).tombstones, summary(owner).tombstone_bytes) == (0, 0)
    head = summary(owner).head
    # a version stored before, sent again with its bit set, is declared then: how a device
    # tells a relay of tombstones it pushed before protocol 5
    again = owner.push(owner.sign([live], counter=3, tombs=[True]))
    assert statuses(again.content) == ["stored"]
    assert (summary(owner).tombstones, summary(owner).head) == (1, head)


def test_a_tombstone_bit_past_the_last_envelope_is_refused_and_stores_nothing(
    owner: Owner,
) -> None:
    before = summary(owner)
    batch = owner.sign([record(b"a" * 16, 1)], counter=1, tombs=[False, True])
    answer = owner.push(batch)
    assert (answer.status_code, answer_code(answer)) == (422, "invalid")
    assert summary(owner) == before


def test_the_ack_floor_is_the_lowest_cursor_every_device_acknowledged(owner: Owner) -> None:
    """Each device's last ack as it sent it, at most the head: a repair takes a cursor back
    to pull again, and what the device had then is no longer all there."""
    assert summary(owner).ack_floor is None  # the laptop has acknowledged nothing yet
    owner.push(owner.sign([record(b"a" * 16, 1), record(b"b" * 16, 2)], counter=1, ack=0))
    assert summary(owner).ack_floor == 0
    owner.push(owner.sign([record(b"c" * 16, 3)], counter=2, ack=99))  # past the head (2)
    assert summary(owner).ack_floor == 2
    owner.push(owner.sign([record(b"d" * 16, 4)], counter=3))  # says nothing
    assert summary(owner).ack_floor == 2
    owner.push(owner.sign([record(b"e" * 16, 5)], counter=4, ack=1))  # after a repair
    assert summary(owner).ack_floor == 1
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    answer = owner.relay.client.post("/v1/login", content=body(login), headers=MSGPACK)
    assert answer.status_code == 200
    assert summary(owner).ack_floor is None  # until the phone says how far it pulled


def test_every_storage_takes_declarations_only_from_signed_pushes(
    make_storage: StorageFactory,
) -> None:
    """The memory reference too; a version-1 account's unsigned pushes declare nothing."""
    storage = make_storage()
    opened, signer = signed_account(storage)
    tomb = record(b"b" * 16, 2)
    unsigned = PushBatch(
        [record(b"a" * 16, 1), tomb], ack=5, tombstones=tombstone_bits([False, True])
    )
    batch = sign_push(unsigned, opened.secrets.signing_key, 1, 1, signer)
    assert [r.status for r in storage.push("bob", batch, Pusher.of("d1", batch)).receipts] == [
        "stored",
        "stored",
    ]
    (bob,) = storage.accounts("bob")
    assert (bob.tombstones, bob.tombstone_bytes, bob.ack_floor) == (1, len(tomb), 0)
    padded = msgspec.structs.replace(unsigned, ack=2, tombstones=b"\x02\x00")
    refused = sign_push(padded, opened.secrets.signing_key, 1, 2, signer)
    with pytest.raises(InvalidError):  # refused before its counter or ack is recorded
        storage.push("bob", refused, Pusher.of("d1", refused))
    retried = sign_push(unsigned, opened.secrets.signing_key, 1, 2, signer)
    assert [r.status for r in storage.push("bob", retried, Pusher.of("d1", retried)).receipts] == [
        "stored",
        "stored",
    ]
    storage.create_account(account_record("old"), Device("d1", "laptop", NOW_MS), [], None, NOW_MS)
    storage.push("old", unsigned)
    (old,) = storage.accounts("old")
    assert (old.versions, old.tombstones, old.ack_floor) == (2, 0, None)


# -- the bits themselves -----------------------------------------------------------------------

ENVELOPES = st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=40)


@given(ENVELOPES)
def test_tombstone_bits_round_trip_and_are_as_short_as_the_last_set_bit(
    sent: list[tuple[int, bool]],
) -> None:
    flags = [flag for _, flag in sent]
    bits = tombstone_bits(flags)
    batch = PushBatch([bytes(size) for size, _ in sent], tombstones=bits)
    assert tombstone_flags(len(batch.envelopes), batch.tombstones) == flags
    assert bits == b"" or bits[-1] != 0
    past_the_last = tombstone_bits([*flags, True])
    with pytest.raises(ProtocolError):
        tombstone_flags(len(batch.envelopes), past_the_last)


@given(ENVELOPES, st.integers(1, 40))
def test_an_oversized_envelope_leaves_the_others_with_their_own_bits(
    sent: list[tuple[int, bool]], bound: int
) -> None:
    envelopes = [bytes([i % 256]) * size for i, (size, _) in enumerate(sent)]
    batch = PushBatch(envelopes, tombstones=tombstone_bits([flag for _, flag in sent]))
    stored = within_bound(batch, bound)
    fitting = [(e, flag) for e, (_, flag) in zip(envelopes, sent, strict=True) if len(e) <= bound]
    assert (
        list(
            zip(
                stored.envelopes,
                tombstone_flags(len(stored.envelopes), stored.tombstones),
                strict=True,
            )
        )
        == fitting
    )
    state = RelayState("s", "e", 0)
    receipts = [Receipt("stored", seq=i + 1) for i in range(len(fitting))]
    answered = with_oversized(batch, PushResult(receipts, state), bound)
    expected = iter(receipts)
    for envelope, receipt in zip(envelopes, answered.receipts, strict=True):
        assert receipt == (next(expected) if len(envelope) <= bound else TOO_LARGE)


def test_bits_past_the_last_envelope_are_the_relays_invalid() -> None:
    with pytest.raises(InvalidError):
        within_bound(PushBatch([b"x"], tombstones=b"\x02"), 10)
