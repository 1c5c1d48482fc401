"""No skipped versions across a fleet: two relay processes (uvicorn) share one PostgreSQL
schema; many pushers write overlapping keys through both while a puller follows the account
through both. The siblings merged from everything the puller pulled equal a reference merge of
every acknowledged version — a seq committed out of order, or a page that skipped one, would
leave a version out."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import msgspec
import pytest

from replica.wire import (
    Page,
    PushBatch,
    PushResult,
    VersionVector,
    dominates,
    encode_message,
    parse_header,
)
from tests.relay.api import register_over_http
from tests.relay.conftest import fresh_schema, postgres_url
from tests.relay.driver import MSGPACK
from tests.relay.server import RelayProcess
from tests.relay.test_durability import Writers

PUSHERS = 8
BATCHES = 25


def siblings(envelopes: list[bytes]) -> set[tuple[bytes, tuple[int, int]]]:
    """The reference merge: per key, the versions no other version of that key dominates."""
    by_key: dict[bytes, list[tuple[tuple[int, int], VersionVector]]] = {}
    for envelope in envelopes:
        h = parse_header(envelope)
        by_key.setdefault(h.key, []).append((h.dot, h.vector))
    return {
        (key, dot)
        for key, versions in by_key.items()
        for dot, _ in versions
        if not any(other != dot and dominates(vector, dot) for other, vector in versions)
    }


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[list[RelayProcess]]:
    """Two relay processes sharing one fresh PostgreSQL schema."""
    url = postgres_url()
    with fresh_schema() as schema:
        options = ("--database-url", url, "--schema", schema)
        started: list[RelayProcess] = []
        try:
            for i in range(2):
                started.append(
                    RelayProcess(
                        None, tmp_path / f"relay{i}.log", *options, accept_unsigned=True
                    ).start()
                )
            yield started
        finally:
            for relay in started:
                relay.kill()


@pytest.mark.slow
def test_concurrent_pushers_through_two_relays_skip_nothing(relays: list[RelayProcess]) -> None:
    token = register_over_http(relays[0].url, "fleet")
    headers = {"authorization": f"Bearer {token}", **MSGPACK}
    acknowledged: list[bytes] = []
    pulled: list[bytes] = []
    lock = threading.Lock()
    pushing = threading.Event()
    pushing.set()

    def pusher(index: int) -> None:
        # each pusher is its own 3 devices: histories stay causal, dots never collide
        writers = Writers(random.Random(index), tuple(range(3 * index + 1, 3 * index + 4)))
        with httpx2.Client(base_url=relays[index % 2].url, timeout=30) as client:
            for _ in range(BATCHES):
                batch = writers.write(20)
                answer = client.post(
                    "/v1/push", content=encode_message(PushBatch(batch)), headers=headers
                )
                assert answer.status_code == 200, answer.content
                result = msgspec.msgpack.decode(answer.content, type=PushResult)
                with lock:
                    acknowledged.extend(
                        e
                        for e, r in zip(batch, result.receipts, strict=True)
                        if r.status != "refused"
                    )

    def puller() -> None:
        cursor, turn = 0, 0
        with httpx2.Client(timeout=30) as client:
            while True:
                still_pushing = pushing.is_set()
                relay = relays[turn % 2]
                turn += 1
                answer = client.get(
                    f"{relay.url}/v1/pull", params={"cursor": cursor}, headers=headers
                )
                page = msgspec.msgpack.decode(answer.content, type=Page)
                assert page.cursor == cursor
                pulled.extend(e.envelope for e in page.entries)
                cursor = page.next_cursor
                if not page.has_more and not still_pushing:
                    return

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(PUSHERS)]
    follower = threading.Thread(target=puller)
    follower.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pushing.clear()
    follower.join()
    assert len(acknowledged) > PUSHERS * BATCHES * 10  # most versions were stored or superseded
    assert siblings(pulled) == siblings(acknowledged)


@pytest.mark.slow
def test_the_live_feed_crosses_relay_processes(relays: list[RelayProcess]) -> None:
    """A push through one relay process wakes an event stream held by another (LISTEN/NOTIFY)."""
    token = register_over_http(relays[0].url, "live")
    headers = {"authorization": f"Bearer {token}", **MSGPACK}
    batch = Writers(random.Random(1)).write(3)
    with (
        httpx2.Client(timeout=30) as client,
        client.stream("GET", f"{relays[1].url}/v1/events", headers=headers) as events,
    ):
        lines = events.iter_lines()
        # the head when the stream opened, read before the push: the stream's headers go out
        # before it reads the head, so a push sent on the headers alone could come first
        first = {next(lines) for _ in range(4)}
        pushed = client.post(
            f"{relays[0].url}/v1/push",
            content=encode_message(PushBatch(batch)),
            headers=headers,
        )
        assert pushed.status_code == 200
        heard = {next(lines) for _ in range(3)}
    assert first == {"event: head", "id: 0", "data: 0", ""}
    assert heard == {"event: head", "id: 3", "data: 3"}
