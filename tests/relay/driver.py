"""A minimal device-side HTTP sync loop for relay tests (the real driver is clients/, later):
a replica's sans-I/O session moved over httpx2 with MessagePack bodies."""

from __future__ import annotations

import os

import httpx2
import msgspec

from replica import Replica
from replica.wire import (
    KdfParams,
    LoginRequest,
    Page,
    PushResult,
    RegisterRequest,
    Session,
    encode_message,
)

MSGPACK = {"content-type": "application/msgpack"}


class Device:
    """One replica and its relay session."""

    def __init__(self, replica: Replica, url: str, session: Session, auth_key: bytes) -> None:
        self.replica, self.url, self.session, self.auth_key = replica, url, session, auth_key
        self.http = httpx2.Client(base_url=url, timeout=10)

    @classmethod
    def register(cls, replica: Replica, url: str, account: str, device_name: str) -> Device:
        request = RegisterRequest(
            account, os.urandom(32), os.urandom(32), KdfParams(os.urandom(16)), b"b", device_name
        )
        answer = httpx2.post(f"{url}/v1/register", content=encode_message(request), headers=MSGPACK)
        answer.raise_for_status()
        session = msgspec.msgpack.decode(answer.content, type=Session)
        return cls(replica, url, session, request.auth_key)

    def join(self, replica: Replica, device_name: str) -> Device:
        """Another device of this account, logged in with the same auth key."""
        request = LoginRequest(self.session.account, self.auth_key, device_name)
        answer = httpx2.post(
            f"{self.url}/v1/login", content=encode_message(request), headers=MSGPACK
        )
        answer.raise_for_status()
        session = msgspec.msgpack.decode(answer.content, type=Session)
        return Device(replica, self.url, session, self.auth_key)

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.session.access_token}", **MSGPACK}

    def sync(self) -> None:
        """Push every dirty version, then pull every page."""
        session = self.replica.sync_session()
        session.restart()
        while (batch := session.next_batch()) is not None:
            answer = self.http.post("/v1/push", content=encode_message(batch), headers=self.headers)
            answer.raise_for_status()
            session.acknowledge(batch, msgspec.msgpack.decode(answer.content, type=PushResult))
        while True:
            answer = self.http.get(
                "/v1/pull", params={"cursor": session.cursor}, headers=self.headers
            )
            answer.raise_for_status()
            page = msgspec.msgpack.decode(answer.content, type=Page)
            session.apply_page(page)
            if not page.has_more:
                return

    def close(self) -> None:
        self.http.close()
