"""The real relay app over a real storage (a SQLite file, or a PostgreSQL schema of the test
server), a fake clock and a raw ASGI driver, for the security and robustness suites
(authorization, limits, bad input, fuzzing)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import msgspec
from starlette.applications import Starlette
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay.app import create_app
from relay.config import RelayConfig
from relay.postgres import PostgresStorage
from relay.sqlite import SQLiteStorage
from relay.storage import Storage, VersionRules
from tests.conftest import FakeClock
from tests.relay.conftest import NOW_MS, fresh_schema, postgres_url

BACKENDS = ["sqlite", "postgres"]
"""The SQL backends a relay process can run on; suites parametrize their `relays` over them."""


@dataclass
class Relay:
    """One relay process in miniature: app, storage, configuration and clock."""

    app: Starlette
    client: TestClient
    storage: Storage
    config: RelayConfig
    clock: FakeClock


class Relays:
    """Builds relays over SQLite files in one directory, or over fresh PostgreSQL schemas;
    closes them all (and drops the schemas) at the end."""

    def __init__(
        self, directory: Path, clock: FakeClock | None = None, backend: str = "sqlite"
    ) -> None:
        self.directory = directory
        self.clock = clock or FakeClock(NOW_MS)
        self.backend = backend
        self.made: list[Relay] = []
        self.schemas = ExitStack()

    def __call__(
        self, client_address: tuple[str, int] = ("testclient", 50000), **settings: Any
    ) -> Relay:
        # The API's tests register placeholder bundles (no signing key: version 1), so their
        # pushes go unsigned; tests/relay/test_signed_push.py covers the signed default.
        config = RelayConfig(**{"open_signup": True, "accept_unsigned_pushes": True, **settings})
        storage = self.open_storage(config.version_rules(self.clock))
        app = create_app(storage, config, clock_ms=self.clock)
        relay = Relay(app, TestClient(app, client=client_address), storage, config, self.clock)
        self.made.append(relay)
        return relay

    def open_storage(self, rules: VersionRules) -> Storage:
        if self.backend == "postgres":
            schema = self.schemas.enter_context(fresh_schema())
            return PostgresStorage(postgres_url(), rules, schema=schema)
        return SQLiteStorage(self.directory / f"relay{len(self.made)}.db", rules)

    def close(self) -> None:
        with self.schemas:
            for relay in self.made:
                relay.client.close()
                relay.storage.close()


def open_relays(directory: Path, backend: str = "sqlite") -> Iterator[Relays]:
    """Relays of one test; without a PostgreSQL server its postgres runs skip (fail in CI)."""
    if backend == "postgres":
        postgres_url()
    relays = Relays(directory, backend=backend)
    try:
        yield relays
    finally:
        relays.close()


def error_body(content: bytes, content_type: str) -> dict[str, Any]:
    """An error answer as a dict, whichever of the two media types it came in."""
    if content_type.startswith("application/json"):
        value = msgspec.json.decode(content)
    else:
        value = msgspec.msgpack.decode(content)
    assert isinstance(value, dict) and set(value) == {"code", "message"}, value
    return value


def code_of(answer: httpx2.Response) -> str:
    """The `code` of an error answer."""
    return str(error_body(answer.content, answer.headers["content-type"])["code"])


# -- raw ASGI: a chunked or lying body, and what the app actually pulled ----------------------


@dataclass
class Exchange:
    """One raw ASGI request: the answer and how many body bytes the app pulled."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    pulled_bytes: int = 0

    def code(self) -> str:
        return str(error_body(self.body, self.headers.get("content-type", ""))["code"])


class CountingReceive:
    """ASGI wrapper: counts the request body bytes the wrapped app pulled through receive."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.pulled_bytes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.pulled_bytes += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


def call_asgi(
    app: ASGIApp,
    method: str,
    path: str,
    chunks: Iterable[bytes],
    headers: dict[str, str] | None = None,
    *,
    raw_headers: Sequence[tuple[bytes, bytes]] = (),
    hang_up_after_first_body: bool = False,
) -> Exchange:
    """Send a request whose body arrives as `chunks` (lazily: an endless generator is fine)
    with exactly `headers` — no Content-Length unless given, so it may lie — and
    `raw_headers` as bytes (a real server passes latin-1 bytes through). With
    `hang_up_after_first_body` the client disconnects once some of the answer arrived (for
    streams that never end)."""
    encoded = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    exchange = _call_asgi(
        app, method, path, chunks, encoded + list(raw_headers), hang_up_after_first_body
    )
    return asyncio.run(exchange)


async def _call_asgi(
    app: ASGIApp,
    method: str,
    path: str,
    chunks: Iterable[bytes],
    headers: list[tuple[bytes, bytes]],
    hang_up_after_first_body: bool,
) -> Exchange:
    counting = CountingReceive(app)
    exchange = Exchange()
    pending = iter(chunks)
    upcoming = next(pending, None)
    finished = asyncio.Event()

    async def receive() -> Message:
        nonlocal upcoming
        if upcoming is None:
            await finished.wait()
            return {"type": "http.disconnect"}
        chunk, upcoming = upcoming, next(pending, None)
        return {"type": "http.request", "body": chunk, "more_body": upcoming is not None}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            exchange.status = message["status"]
            exchange.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            exchange.body += message.get("body", b"")
            if not message.get("more_body", False) or (hang_up_after_first_body and exchange.body):
                finished.set()

    path_part, _, query = path.partition("?")
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path_part,
        "raw_path": path_part.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("testclient", 50000),
        "server": ("testserver", 80),
    }
    await counting(scope, receive, send)
    exchange.pulled_bytes = counting.pulled_bytes
    return exchange
