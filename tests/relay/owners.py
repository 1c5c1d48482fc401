"""A version-2 account on a relay over HTTP, and what only its devices hold: what the tests
of signed pushes stand on (tests/relay/test_signed_push.py, test_push_declarations.py)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

import httpx2

from relay.storage import AccountSummary, Device, Storage, TokenRecord
from replica.generations import (
    OpenedGeneration,
    PushSigner,
    bundle_v2_to_bytes,
    first_generation,
    seal_generation,
    sign_push,
)
from replica.wire import (
    ErrorBody,
    Page,
    PushBatch,
    RegisterRequest,
    RelayState,
    Session,
    auth_key_hash,
    tombstone_bits,
)
from tests.relay.api import KDF, MSGPACK, Keys, bearer, body, decode, new_keys
from tests.relay.conftest import HLC, NOW_MS, account_record, envelope
from tests.relay.harness import Relay

KEK = os.urandom(32)


@dataclass
class Owner:
    """An account registered with a version-2 bundle, and what only its devices hold."""

    relay: Relay
    name: str
    keys: Keys
    generation: OpenedGeneration
    session: Session

    def signer(self) -> PushSigner:
        return PushSigner(self.name, self.session.device_id, self.state())

    def state(self) -> RelayState:
        answer = self.relay.client.get("/v1/state", headers=bearer(self.session))
        return decode(answer.content, RelayState)

    def sign(
        self,
        envelopes: list[bytes],
        counter: int,
        *,
        ack: int | None = None,
        tombs: Sequence[bool] = (),
    ) -> PushBatch:
        secrets = self.generation.secrets
        batch = PushBatch(envelopes, ack=ack, tombstones=tombstone_bits(tombs))
        return sign_push(batch, secrets.signing_key, secrets.generation, counter, self.signer())

    def push(self, batch: PushBatch) -> httpx2.Response:
        return self.relay.client.post("/v1/push", content=body(batch), headers=bearer(self.session))

    def stored(self) -> tuple[list[bytes], int, AccountSummary]:
        """Every stored envelope, the head, and the account's byte count."""
        answer = self.relay.client.get("/v1/pull?cursor=0", headers=bearer(self.session))
        page = decode(answer.content, Page)
        assert not page.has_more
        summary = self.relay.storage.accounts(self.name)[0]
        return [e.envelope for e in page.entries], page.state.head, summary


def generation_one() -> OpenedGeneration:
    return first_generation(os.urandom, os.urandom(32), None)


def sealed(opened: OpenedGeneration, chain: bytes | None = None) -> bytes:
    return bundle_v2_to_bytes(seal_generation(opened, KDF, KEK, os.urandom, chain))


def register_owner(relay: Relay, name: str = "ann") -> Owner:
    keys, opened = new_keys(), generation_one()
    request = RegisterRequest(
        name, keys.auth_key, auth_key_hash(keys.recovery_auth_key), KDF, sealed(opened), "laptop"
    )
    answer = relay.client.post("/v1/register", content=body(request), headers=MSGPACK)
    assert answer.status_code == 201, answer.content
    return Owner(relay, name, keys, opened, decode(answer.content, Session))


def record(key: bytes, tick: int, vector: dict[int, int] | None = None) -> bytes:
    return envelope(key, 7, HLC + tick, vector or {7: HLC + tick})


def answer_code(answer: httpx2.Response) -> str:
    return decode(answer.content, ErrorBody).code


def signed_account(storage: Storage) -> tuple[OpenedGeneration, PushSigner]:
    """Account "bob" of a version-2 bundle in `storage`, with device "d1"."""
    opened = generation_one()
    record_ = dataclasses.replace(account_record("bob"), bundle=sealed(opened))
    token = TokenRecord(os.urandom(32), "bob", "d1", "access", NOW_MS)
    state = storage.create_account(record_, Device("d1", "laptop", NOW_MS), [token], None, NOW_MS)
    return opened, PushSigner("bob", "d1", state)
