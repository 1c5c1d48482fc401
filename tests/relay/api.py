"""A tiny typed client of the relay's HTTP API for tests (MessagePack both ways)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import msgspec
from starlette.testclient import TestClient

from replica.wire import KdfParams, LoginRequest, RegisterRequest, Session, auth_key_hash

T = TypeVar("T")
MSGPACK = {"content-type": "application/msgpack"}
KDF = KdfParams(b"s" * 16)


def body(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


def decode(data: bytes, kind: type[T]) -> T:
    return msgspec.msgpack.decode(data, type=kind)


@dataclass
class Keys:
    auth_key: bytes
    recovery_auth_key: bytes


def new_keys() -> Keys:
    return Keys(os.urandom(32), os.urandom(32))


def register(
    client: TestClient, account: str, keys: Keys, invite: str | None = None, device: str = "laptop"
) -> Session:
    request = RegisterRequest(
        account,
        keys.auth_key,
        auth_key_hash(keys.recovery_auth_key),
        KDF,
        b"bundle",
        device,
        invite,
    )
    answer = client.post("/v1/register", content=body(request), headers=MSGPACK)
    assert answer.status_code == 201, answer.content
    return decode(answer.content, Session)


def login(client: TestClient, account: str, auth_key: bytes, device: str = "phone") -> Session:
    answer = client.post(
        "/v1/login", content=body(LoginRequest(account, auth_key, device)), headers=MSGPACK
    )
    assert answer.status_code == 200, answer.content
    return decode(answer.content, Session)


def bearer(session: Session) -> dict[str, str]:
    return {"authorization": f"Bearer {session.access_token}", **MSGPACK}


def error_code(answer: Any) -> str:
    return str(decode(answer.content, dict)["code"])


def register_over_http(url: str, account: str) -> str:
    """Register an account on a relay at `url`; its first device's access token."""
    keys = new_keys()
    request = RegisterRequest(
        account, keys.auth_key, auth_key_hash(keys.recovery_auth_key), KDF, b"bundle", "laptop"
    )
    answer = httpx2.post(f"{url}/v1/register", content=body(request), headers=MSGPACK)
    assert answer.status_code == 201, answer.content
    return decode(answer.content, Session).access_token
