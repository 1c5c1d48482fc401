"""Signed pushes (specs/protocol.md §4.7): a version-2 account's relay stores a push only when
the account's generation key signed it for this device, relay, account epoch and counter.

The matrix below is what a stolen access token alone (no key) can send, through the real
HTTP API over SQLite and PostgreSQL: each is refused with a 4xx and a stable code, and the
account's stored envelopes, head and byte count are the same afterwards.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from relay import tokens
from relay.errors import ConflictError, CounterStaleError, QuotaExceededError
from relay.signing import BundleKeys, Pusher, check_bundle_change
from relay.storage import Device
from replica.generations import (
    OpenedGeneration,
    rotate,
    sign_push,
)
from replica.keys import Frontier
from replica.wire import (
    MAX_HLC,
    ErrorBody,
    KeyProof,
    LoginRequest,
    Page,
    PushBatch,
    PushResult,
    PutKeyBundle,
    Receipt,
    Session,
    parse_header,
)
from tests.relay.api import KDF, MSGPACK, bearer, body, decode, new_keys, register
from tests.relay.conftest import HLC, NOW_MS, StorageFactory, account_record, envelope
from tests.relay.harness import BACKENDS, open_relays
from tests.relay.owners import (
    Owner,
    answer_code,
    record,
    register_owner,
    sealed,
    signed_account,
)


@pytest.fixture(params=BACKENDS)
def owner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Owner]:
    for relays in open_relays(tmp_path, request.param):
        owner = register_owner(relays())
        first = owner.push(owner.sign([record(b"k" * 16, 1)], counter=1))
        assert first.status_code == 200, first.content  # the real versions a forger aims at
        yield owner


# -- what a token alone can send --------------------------------------------------------------

Forgery = Callable[[Owner], PushBatch]


def unsigned_forged_vector(owner: Owner) -> PushBatch:
    """The review's forged vector: MAX_HLC for the node seen, plus a fresh dot."""
    return PushBatch([envelope(b"k" * 16, 99, HLC + 2, {7: MAX_HLC, 99: HLC + 2})])


def unsigned_future_epoch(owner: Owner) -> PushBatch:
    forged = bytearray(record(b"k" * 16, 2))
    forged[2:6] = (2**32 - 1).to_bytes(4, "big")
    return PushBatch([bytes(forged)])


def unsigned_random_bodies(owner: Owner) -> PushBatch:
    return PushBatch([record(b"k" * 16, 2), record(b"j" * 16, 3)])


def signed_by_another_key(owner: Owner) -> PushBatch:
    batch = owner.sign([record(b"k" * 16, 2)], counter=2)
    stranger = Ed25519PrivateKey.generate().sign(b"anything")
    return msgspec.structs.replace(batch, signature=stranger)


def a_generation_not_reached(owner: Owner) -> PushBatch:
    return msgspec.structs.replace(owner.sign([record(b"k" * 16, 2)], counter=2), generation=2)


def with_an_envelope_added(owner: Owner) -> PushBatch:
    batch = owner.sign([record(b"k" * 16, 2)], counter=2)
    return msgspec.structs.replace(batch, envelopes=[*batch.envelopes, record(b"j" * 16, 3)])


def with_an_envelope_removed(owner: Owner) -> PushBatch:
    batch = owner.sign([record(b"k" * 16, 2), record(b"j" * 16, 3)], counter=2)
    return msgspec.structs.replace(batch, envelopes=batch.envelopes[:1])


def with_envelopes_reordered(owner: Owner) -> PushBatch:
    batch = owner.sign([record(b"k" * 16, 2), record(b"j" * 16, 3)], counter=2)
    return msgspec.structs.replace(batch, envelopes=batch.envelopes[::-1])


def with_an_envelope_swapped(owner: Owner) -> PushBatch:
    batch = owner.sign([record(b"k" * 16, 2)], counter=2)
    return msgspec.structs.replace(
        batch, envelopes=[record(b"k" * 16, 2, {7: HLC + 2, 8: MAX_HLC})]
    )


def with_another_counter(owner: Owner) -> PushBatch:
    return msgspec.structs.replace(owner.sign([record(b"k" * 16, 2)], counter=2), counter=9)


def with_a_tombstone_declared(owner: Owner) -> PushBatch:
    """A token thief marking a live version a tombstone, for collection to drop it."""
    batch = owner.sign([record(b"k" * 16, 2)], counter=2)
    return msgspec.structs.replace(batch, tombstones=b"\x01")


def with_another_ack(owner: Owner) -> PushBatch:
    return msgspec.structs.replace(owner.sign([record(b"k" * 16, 2)], counter=2, ack=0), ack=1)


FORGERIES: dict[str, tuple[Forgery, str]] = {
    "unsigned, forged vector": (unsigned_forged_vector, "forbidden"),
    "unsigned, key epoch 2**32-1": (unsigned_future_epoch, "forbidden"),
    "unsigned, random bodies": (unsigned_random_bodies, "forbidden"),
    "signed by another key": (signed_by_another_key, "forbidden"),
    "a generation not reached": (a_generation_not_reached, "forbidden"),
    "an envelope added": (with_an_envelope_added, "forbidden"),
    "an envelope removed": (with_an_envelope_removed, "forbidden"),
    "envelopes reordered": (with_envelopes_reordered, "forbidden"),
    "an envelope swapped": (with_an_envelope_swapped, "forbidden"),
    "another counter": (with_another_counter, "forbidden"),
    "a tombstone declared": (with_a_tombstone_declared, "forbidden"),
    "another ack": (with_another_ack, "forbidden"),
}


@pytest.mark.parametrize("forgery", FORGERIES, ids=str)
def test_a_push_the_accounts_key_did_not_sign_changes_nothing(owner: Owner, forgery: str) -> None:
    make, code = FORGERIES[forgery]
    before = owner.stored()
    answer = owner.push(make(owner))
    assert (answer.status_code, answer_code(answer)) == (403, code)
    assert owner.stored() == before
    genuine = owner.push(owner.sign([record(b"k" * 16, 5)], counter=10))
    assert genuine.status_code == 200, genuine.content  # the owner's next write is stored
    receipts = decode(genuine.content, PushResult).receipts
    assert [r.status for r in receipts] == ["stored"]


def test_a_captured_request_sent_again_is_refused_and_names_the_last_counter(
    owner: Owner,
) -> None:
    captured = owner.sign([record(b"k" * 16, 2)], counter=5)
    assert owner.push(captured).status_code == 200
    before = owner.stored()
    again = owner.push(captured)
    assert (again.status_code, answer_code(again)) == (409, "counter_stale")
    assert decode(again.content, ErrorBody).last_counter == 5
    assert owner.stored() == before
    assert owner.push(owner.sign([record(b"k" * 16, 3)], counter=6)).status_code == 200


def test_a_push_signed_for_one_device_is_refused_from_another_devices_token(
    owner: Owner,
) -> None:
    """The signed device id is the token's: a signature of the laptop's replayed by whoever
    holds the phone's token is not the phone's."""
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    answer = owner.relay.client.post("/v1/login", content=body(login), headers=MSGPACK)
    phone = decode(answer.content, Session)
    before = owner.stored()
    laptops = owner.sign([record(b"k" * 16, 2)], counter=2)
    pushed = owner.relay.client.post("/v1/push", content=body(laptops), headers=bearer(phone))
    assert (pushed.status_code, answer_code(pushed)) == (403, "forbidden")
    assert owner.stored() == before


def test_a_captured_request_sent_again_after_a_reseed_is_refused(owner: Owner) -> None:
    """The account epoch is signed: a request captured before a reseed opens nothing after
    it, even with a counter the device never reached."""
    captured = owner.sign([record(b"k" * 16, 2)], counter=50)
    proof = KeyProof(owner.keys.auth_key)
    reseeded = owner.relay.client.post(
        "/v1/reseed", content=body(proof), headers=bearer(owner.session)
    )
    assert reseeded.status_code == 200
    before = owner.stored()
    answer = owner.push(captured)
    assert (answer.status_code, answer_code(answer)) == (403, "forbidden")
    assert owner.stored() == before


def test_a_push_signed_by_a_retired_generation_is_refused_as_key_retired(owner: Owner) -> None:
    """After a rotation the old key is refused with its own code, never an unknown outcome;
    the new generation's key is taken."""
    old = owner.sign([record(b"k" * 16, 2)], counter=2)
    second = rotate(
        owner.generation.secrets,
        os.urandom,
        frontier=Frontier({7: HLC + 1}, 1),
        revoked_device=None,
        rotated_by=owner.session.device_id,
        now_ms=NOW_MS,
    )
    put_bundle(owner, sealed(second), expected_version=1)
    before = owner.stored()
    answer = owner.push(old)
    assert (answer.status_code, answer_code(answer)) == (403, "key_retired")
    assert owner.stored() == before
    owner.generation = second
    assert owner.push(owner.sign([record(b"k" * 16, 3)], counter=3)).status_code == 200


def test_an_envelope_of_a_key_epoch_not_reached_is_refused_alone(owner: Owner) -> None:
    ahead = bytearray(record(b"j" * 16, 2))
    ahead[2:6] = (1).to_bytes(4, "big")
    answer = owner.push(owner.sign([bytes(ahead), record(b"i" * 16, 3)], counter=2))
    receipts = decode(answer.content, PushResult).receipts
    assert [(r.status, r.code) for r in receipts] == [("refused", "epoch_ahead"), ("stored", None)]


def head_of(owner: Owner) -> int:
    """What a device that pulled everything names as `expected_head`."""
    return owner.stored()[1]


def put_bundle(owner: Owner, bundle: bytes, expected_version: int) -> httpx2.Response:
    request = PutKeyBundle(bundle, KDF, owner.keys.auth_key, expected_version,
                           owner.keys.auth_key, expected_head=head_of(owner))  # fmt: skip
    answer = owner.relay.client.put(
        "/v1/keys", content=body(request), headers=bearer(owner.session)
    )
    return answer


def test_a_bundle_never_steps_back_a_generation_or_drops_its_signing_key(
    owner: Owner,
) -> None:
    another_key = dataclasses.replace(
        owner.generation,
        secrets=msgspec.structs.replace(owner.generation.secrets, signing_key=os.urandom(32)),
    )
    for bundle in (sealed(another_key), b"an opaque version-1 bundle"):
        answer = put_bundle(owner, bundle, expected_version=1)
        assert (answer.status_code, answer_code(answer)) == (409, "conflict")
    second = rotate(
        owner.generation.secrets,
        os.urandom,
        frontier=Frontier({}, 0),
        revoked_device=None,
        rotated_by="desk",
        now_ms=NOW_MS,
    )
    assert put_bundle(owner, sealed(second), expected_version=1).status_code == 200
    epoch_back = dataclasses.replace(
        second, secrets=msgspec.structs.replace(second.secrets, key_epoch=0)
    )
    for bundle in (sealed(owner.generation), sealed(epoch_back)):  # generation, epoch back
        answer = put_bundle(owner, bundle, expected_version=2)
        assert (answer.status_code, answer_code(answer)) == (409, "conflict")


# -- storage: counters on every backend --------------------------------------------------------


def test_a_counter_is_kept_even_when_the_push_is_refused_for_quota(
    make_storage: StorageFactory,
) -> None:
    storage = make_storage(max_account_bytes=200)
    opened, signer = signed_account(storage)
    secrets = opened.secrets

    def push(counter: int, size: int) -> PushResult:
        envelopes = [envelope(os.urandom(16), 7, HLC + counter, {7: HLC + counter}, b"x" * size)]
        batch = sign_push(PushBatch(envelopes), secrets.signing_key, 1, counter, signer)
        return storage.push("bob", batch, Pusher.of("d1", batch))

    with pytest.raises(QuotaExceededError):
        push(4, 500)
    with pytest.raises(CounterStaleError) as stale:
        push(4, 44)
    assert stale.value.last_counter == 4
    assert [r.status for r in push(5, 44).receipts] == ["stored"]


def test_a_version_1_account_still_pushes_unsigned(make_storage: StorageFactory) -> None:
    """Until it migrates (docs/key-generations.md §5): its bundle names no signing key."""
    storage = make_storage()
    storage.create_account(account_record("old"), Device("d1", "laptop", NOW_MS), [], None, NOW_MS)
    result = storage.push("old", PushBatch([record(b"k" * 16, 1)]))
    assert [r.status for r in result.receipts] == ["stored"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (BundleKeys(b"a" * 32, 2, 1), BundleKeys(b"a" * 32, 1, 1)),
        (BundleKeys(b"a" * 32, 2, 1), BundleKeys(b"b" * 32, 2, 1)),
        (BundleKeys(b"a" * 32, 2, 1), BundleKeys()),
        (BundleKeys(b"a" * 32, 2, 1), BundleKeys(b"a" * 32, 2, 0)),
    ],
    ids=["generation down", "new key, same generation", "key dropped", "key epoch down"],
)
def test_bundle_changes_that_step_back_are_refused(old: BundleKeys, new: BundleKeys) -> None:
    with pytest.raises(ConflictError):
        check_bundle_change(old, new, head_checked=True)
    later = BundleKeys(b"c" * 32, 3, 1)
    check_bundle_change(old, later, head_checked=True)
    with pytest.raises(ConflictError, match="expected_head"):  # its frontier could miss some
        check_bundle_change(old, later, head_checked=False)
    check_bundle_change(
        BundleKeys(), new, head_checked=True
    )  # a version-1 account may migrate, or stay


# -- rotation: revoking a device installs the next generation -----------------------------------


def rotate_request(
    owner: Owner, generation: OpenedGeneration, version: int, expected_head: int | None = None
) -> bytes:
    request = PutKeyBundle(
        sealed(generation),
        KDF,
        owner.keys.auth_key,
        version,
        owner.keys.auth_key,
        expected_head=head_of(owner) if expected_head is None else expected_head,
    )
    return body(request)


def next_generation(owner: Owner) -> OpenedGeneration:
    return rotate(
        owner.generation.secrets,
        os.urandom,
        frontier=Frontier({}, 0),
        revoked_device="phone",
        rotated_by=owner.session.device_id,
        now_ms=NOW_MS,
    )


def test_a_rotation_revokes_the_device_and_installs_the_next_generation_at_once(
    owner: Owner,
) -> None:
    client = owner.relay.client
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    phone = decode(client.post("/v1/login", content=body(login), headers=MSGPACK).content, Session)
    path = f"/v1/devices/{phone.device_id}/rotate"
    keys_before = owner.relay.storage.account(owner.name)
    unknown = f"/v1/devices/{tokens.new_device_id()}/rotate"  # well formed: storage rolls back
    refusals = [
        (f"/v1/devices/{owner.session.device_id}/rotate", next_generation(owner), 422),  # itself
        (unknown, next_generation(owner), 404),
        (path, owner.generation, 409),  # not the next generation
    ]
    for target, generation, status in refusals:
        answer = client.post(
            target, content=rotate_request(owner, generation, 1), headers=bearer(owner.session)
        )
        assert answer.status_code == status, answer.content
    stolen = PutKeyBundle(
        sealed(next_generation(owner)), KDF, os.urandom(32), 1, os.urandom(32)
    )  # a token, and keys made up
    answer = client.post(path, content=body(stolen), headers=bearer(owner.session))
    assert (answer.status_code, answer_code(answer)) == (403, "forbidden")
    assert owner.relay.storage.account(owner.name) == keys_before  # nothing changed
    assert len(owner.relay.storage.devices(owner.name)) == 2
    second = next_generation(owner)
    answer = client.post(
        path, content=rotate_request(owner, second, 1), headers=bearer(owner.session)
    )
    assert answer.status_code == 200, answer.content
    told = client.get("/v1/state", headers=bearer(phone))
    assert (told.status_code, answer_code(told)) == (403, "device_revoked")
    retired = owner.push(owner.sign([record(b"k" * 16, 2)], counter=2))
    assert (retired.status_code, answer_code(retired)) == (403, "key_retired")
    owner.generation = second
    assert owner.push(owner.sign([record(b"k" * 16, 3)], counter=3)).status_code == 200


def test_the_device_being_revoked_cannot_hold_its_revocation_off_by_pushing(
    owner: Owner,
) -> None:
    """It still holds a token and the signing key until the rotation commits: each push it
    makes moves the head past the one the rotation names. The rotation passes all the same;
    the devices refuse what it stored past that head (docs/key-generations.md §6)."""
    client = owner.relay.client
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    phone = decode(client.post("/v1/login", content=body(login), headers=MSGPACK).content, Session)
    expected = head_of(owner)
    thief = Owner(owner.relay, owner.name, owner.keys, owner.generation, phone)
    assert thief.push(thief.sign([record(b"t" * 16, 2)], counter=1)).status_code == 200
    assert head_of(owner) > expected
    rotation = rotate_request(owner, next_generation(owner), 1, expected_head=expected)
    answer = client.post(
        f"/v1/devices/{phone.device_id}/rotate", content=rotation, headers=bearer(owner.session)
    )
    assert answer.status_code == 200, answer.content
    assert len(owner.relay.storage.devices(owner.name)) == 1  # the phone is revoked


def test_a_later_sealing_signed_by_the_accounts_key_replaces_the_earlier_one(
    owner: Owner,
) -> None:
    """After a rotation each device seals its own versions again under the new epoch
    (replica/reseal.py): same dot and vector, other bytes. The relay keeps the later sealing,
    and answers the earlier one pushed again (a reseed) with it. Another vector, or one
    epoch sealed twice, is still a conflict: a device may not rewrite another's version."""
    client = owner.relay.client
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    phone = decode(client.post("/v1/login", content=body(login), headers=MSGPACK).content, Session)
    (earlier,), _, _ = owner.stored()
    second = next_generation(owner)
    path = f"/v1/devices/{phone.device_id}/rotate"
    rotated = client.post(
        path, content=rotate_request(owner, second, 1), headers=bearer(owner.session)
    )
    assert rotated.status_code == 200, rotated.content
    owner.generation = second
    epoch = second.secrets.key_epoch
    later = envelope(b"k" * 16, 7, HLC + 1, {7: HLC + 1}, epoch=epoch)

    def push(envelope_: bytes, counter: int) -> Receipt:
        answer = owner.push(owner.sign([envelope_], counter=counter))
        assert answer.status_code == 200, answer.content
        (receipt,) = decode(answer.content, PushResult).receipts
        return receipt

    assert push(later, 2) == Receipt("stored", seq=2)
    assert owner.stored()[:2] == ([later], 2)
    assert push(earlier, 3) == Receipt("stored", seq=2)  # kept in the later sealing
    twice = envelope(b"k" * 16, 7, HLC + 1, {7: HLC + 1}, epoch=epoch)
    assert push(twice, 4).code == "identity_conflict"
    old_epoch = parse_header(earlier).epoch
    stale = envelope(b"j" * 16, 7, HLC + 5, {7: HLC + 5}, epoch=old_epoch)
    assert push(stale, 5) == Receipt("stored", seq=3)
    widened = envelope(b"j" * 16, 7, HLC + 5, {6: HLC, 7: HLC + 5}, epoch=epoch)
    assert push(widened, 6).code == "identity_conflict"  # would delete concurrent siblings
    assert owner.stored()[:2] == ([later, stale], 3)


def test_a_version_2_account_revokes_another_device_only_by_rotating(owner: Owner) -> None:
    """A plain revoke would leave the device every key of what is written next; a device
    may still end its own access."""
    client = owner.relay.client
    login = LoginRequest(owner.name, owner.keys.auth_key, "phone")
    phone = decode(client.post("/v1/login", content=body(login), headers=MSGPACK).content, Session)
    path, proof = f"/v1/devices/{phone.device_id}", body(KeyProof(owner.keys.auth_key))
    answer = client.request("DELETE", path, content=proof, headers=bearer(owner.session))
    assert (answer.status_code, answer_code(answer)) == (409, "conflict")
    assert b"/rotate" in answer.content
    assert len(owner.relay.storage.devices(owner.name)) == 2
    answer = client.request("DELETE", path, content=proof, headers=bearer(phone))  # itself
    assert answer.status_code == 204, answer.content
    assert len(owner.relay.storage.devices(owner.name)) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_version_1_account_gets_no_push_accepted_unless_the_relay_is_set_to(
    backend: str, tmp_path: Path
) -> None:
    """No signing key, no push: a stolen token could forge it (item 2). An operator may
    take them for a transition (`accept_unsigned_pushes`)."""
    for relays in open_relays(tmp_path, backend):
        for accept in (False, True):
            relay = relays(accept_unsigned_pushes=accept)
            session = register(relay.client, "old", new_keys())  # a bundle with no signing key
            push = body(PushBatch([record(b"k" * 16, 1)]))
            answer = relay.client.post("/v1/push", content=push, headers=bearer(session))
            pulled = relay.client.get("/v1/pull?cursor=0", headers=bearer(session))
            entries = decode(pulled.content, Page).entries
            if accept:
                assert answer.status_code == 200 and len(entries) == 1, answer.content
            else:
                assert (answer.status_code, answer_code(answer)) == (403, "forbidden")
                assert b"sealsync upgrade" in answer.content and entries == []


def test_a_new_generation_by_put_names_the_head_its_frontier_covers(owner: Owner) -> None:
    """An upgrade retires epochs like a rotation does: only a client that records a
    frontier may make one, and it says which head it covers."""
    later = sealed(next_generation(owner))
    for head, status in ((None, 409), (0, 200)):
        request = PutKeyBundle(later, KDF, owner.keys.auth_key, 1, owner.keys.auth_key,
                               expected_head=head)  # fmt: skip
        answer = owner.relay.client.put(
            "/v1/keys", content=body(request), headers=bearer(owner.session)
        )
        assert answer.status_code == status, (head, answer.content)
