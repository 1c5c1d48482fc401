"""A simulated device of the relay benchmarks: accounts, envelopes, push and pull requests.

Envelopes are what the relay sees of a replica's writes: a real header
(`replica.wire.encode_header`) and a random body standing for the ciphertext; the relay never
opens one, so nothing is encrypted. Every envelope a device writes carries the vector
{its node: its hlc}: a later write of the same key by the same device dominates (replaces)
the earlier one, writes of one key by two devices are concurrent (both kept).
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import time
from dataclasses import dataclass, field

import msgspec
from harness import DOCUMENT_BYTES, BenchmarkError
from load import Connection, request_bytes

from replica.generations import (
    OpenedGeneration,
    PushSigner,
    bundle_v2_to_bytes,
    first_generation,
    seal_generation,
    sign_push,
)
from replica.wire import (
    KdfParams,
    LoginRequest,
    Page,
    PushBatch,
    PushResult,
    RegisterRequest,
    Session,
    encode_header,
)

MSGPACK = "application/msgpack"
KEY_POOL = 256
"""Opaque keys per account, shared by its devices, so their writes meet on the same keys."""
DEVICE_KEY = b"\x01" * 32
"""The auth key of every benchmark account (a login needs one; its value protects nothing)."""

_page = msgspec.msgpack.Decoder(Page)
_push_result = msgspec.msgpack.Decoder(PushResult)
_session = msgspec.msgpack.Decoder(Session)


# ---- accounts -------------------------------------------------------------------------------


def post(conn: Connection, target: str, value: object, token: str | None = None) -> bytes:
    """POST a MessagePack body; the answer's body, or `BenchmarkError` unless 2xx."""
    status, body = conn.call(request_bytes("POST", target, headers(token), msgspec_body(value)))
    if not 200 <= status < 300:
        raise BenchmarkError(f"POST {target}: {status} {body[:200]!r}")
    return body


def msgspec_body(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


def headers(token: str | None) -> dict[str, str]:
    auth = {"authorization": f"Bearer {token}"} if token else {}
    return {"content-type": MSGPACK, "accept": MSGPACK, **auth}


def register(conn: Connection, account: str, bundle: bytes = b"bundle") -> Session:
    """A new account with its first device, through POST /v1/register. The default bundle
    is no version-2 one, so the account's pushes go unsigned (as a version-1 account's)."""
    request = RegisterRequest(
        account, DEVICE_KEY, os.urandom(32), KdfParams(os.urandom(16)), bundle, "device-0"
    )
    return _session.decode(post(conn, "/v1/register", request))


@dataclass(frozen=True)
class SigningAccount:
    """A version-2 account's generation, which signs its pushes (specs/protocol.md §4.7)."""

    generation: OpenedGeneration

    @classmethod
    def new(cls) -> SigningAccount:
        return cls(first_generation(os.urandom, os.urandom(32), None))

    def bundle(self) -> bytes:
        kdf, kek = KdfParams(os.urandom(16)), os.urandom(32)
        return bundle_v2_to_bytes(seal_generation(self.generation, kdf, kek, os.urandom, None))

    def sign(self, batch: PushBatch, counter: int, session: Session) -> PushBatch:
        secrets = self.generation.secrets
        signer = PushSigner(session.account, session.device_id, session.state)
        return sign_push(batch, secrets.signing_key, secrets.generation, counter, signer)


def login(conn: Connection, account: str, device_name: str) -> Session:
    """Another device of the account, through POST /v1/login."""
    return _session.decode(post(conn, "/v1/login", LoginRequest(account, DEVICE_KEY, device_name)))


def account_sessions(conn: Connection, account: str, devices: int) -> list[Session]:
    first = register(conn, account)
    return [first] + [login(conn, account, f"device-{i}") for i in range(1, devices)]


# ---- envelopes ------------------------------------------------------------------------------


def pool_key(account: str, i: int) -> bytes:
    """The i-th opaque key of an account's shared pool."""
    return hashlib.sha256(f"{account}/{i}".encode()).digest()[:16]


def make_envelope(key: bytes, node: int, hlc: int) -> bytes:
    """A DOCUMENT_BYTES envelope: a valid header, then random bytes for nonce, ciphertext, tag."""
    header = encode_header(0, key, hlc, node, {node: hlc})
    return header + os.urandom(DOCUMENT_BYTES - len(header))


@dataclass
class HlcClock:
    """A device's hybrid logical clock: wall milliseconds << 16, strictly increasing."""

    last: int = 0

    def next(self) -> int:
        self.last = max(self.last + 1, (time.time_ns() // 1_000_000) << 16)
        return self.last


def push_request(token: str, batch: PushBatch) -> bytes:
    return request_bytes("POST", "/v1/push", headers(token), msgspec_body(batch))


def pull_request(token: str, cursor: int, limit: int) -> bytes:
    return request_bytes("GET", f"/v1/pull?cursor={cursor}&limit={limit}", headers(token))


def decode_page(body: bytes) -> Page:
    return _page.decode(body)


def decode_push_result(body: bytes) -> PushResult:
    return _push_result.decode(body)


# ---- the simulated device -------------------------------------------------------------------

Dot = tuple[bytes, int, int]
"""(key, node, hlc) of one acknowledged envelope."""


@dataclass(frozen=True)
class DeviceReport:
    """What a device sends back from its generator process."""

    account: str
    pushes: int
    pulls: int
    acknowledged: list[Dot]


@dataclass
class Device:
    """One device: pushes `envelopes_per_push` writes to random keys of its account's pool
    with probability `push_share`, otherwise pulls the next page after its cursor."""

    account: str
    token: str
    seed: int
    push_share: float
    envelopes_per_push: int
    node: int = field(default_factory=lambda: secrets.randbits(63))
    cursor: int = 0
    clock: HlcClock = field(default_factory=HlcClock)
    sent: list[Dot] | None = None  # the push on the wire; None while a pull is
    pushes: int = 0
    pulls: int = 0
    acknowledged: list[Dot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def next_request(self) -> bytes:
        if self.rng.random() >= self.push_share:
            self.sent = None
            self.pulls += 1
            return pull_request(self.token, self.cursor, 1000)
        keys = [
            pool_key(self.account, self.rng.randrange(KEY_POOL))
            for _ in range(self.envelopes_per_push)
        ]
        self.sent = [(key, self.node, self.clock.next()) for key in keys]
        self.pushes += 1
        return push_request(self.token, PushBatch([make_envelope(*dot) for dot in self.sent]))

    def on_answer(self, status: int, body: bytes) -> str | None:
        if status != 200:
            return f"http_{status}"
        if self.sent is None:
            self.cursor = decode_page(body).next_cursor
            return None
        receipts = decode_push_result(body).receipts
        if len(receipts) != len(self.sent):
            return "receipt_count"
        error = None
        for dot, receipt in zip(self.sent, receipts, strict=True):
            if receipt.status == "refused":
                error = f"refused_{receipt.code}"
            else:  # stored, or superseded by a stored version that dominates it
                self.acknowledged.append(dot)
        return error

    def report(self) -> DeviceReport:
        return DeviceReport(self.account, self.pushes, self.pulls, self.acknowledged)
