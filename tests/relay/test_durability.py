"""Durability: SIGKILL a real relay (uvicorn, SQLite, synchronous=FULL) again and again while a
device pushes; the device retries every batch it got no answer for, with the same bytes. A final
pull compared with every receipt shows no acknowledged version lost (it, or a version that
dominates it, is served) and nothing duplicated."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import httpx2
import msgspec
import pytest

from replica.wire import (
    Page,
    PushBatch,
    PushResult,
    dominates,
    encode_header,
    encode_message,
    parse_header,
)
from tests.relay.api import register_over_http
from tests.relay.driver import MSGPACK
from tests.relay.server import RelayProcess

KILLS = int(os.environ.get("SEALSYNC_RELAY_KILLS", "20"))
NOW_HLC = (time.time_ns() // 1_000_000) << 16


class Writers:
    """Envelopes of 24 keys written by 3 devices: each device's versions of a key form a
    chain (each one's vector covers the one before, as a replica's do), and a device
    sometimes saw another's latest version first."""

    def __init__(self, rnd: random.Random, nodes: tuple[int, ...] = (1, 2, 3)) -> None:
        self.rnd, self.nodes = rnd, nodes
        self.hlc = NOW_HLC
        self.seen: dict[tuple[bytes, int], dict[int, int]] = {}

    def write(self, count: int) -> list[bytes]:
        rnd, out = self.rnd, []
        for _ in range(count):
            key = bytes([rnd.randrange(24)]) * 16
            node = rnd.choice(self.nodes)
            self.hlc += 1
            vector = dict(self.seen.get((key, node), {}))
            other = self.seen.get((key, rnd.choice(self.nodes)), {})
            if rnd.random() < 0.5:
                vector.update({n: max(h, vector.get(n, 0)) for n, h in other.items()})
            vector[node] = self.hlc
            self.seen[(key, node)] = vector
            body = rnd.randbytes(rnd.randrange(40, 600))
            out.append(encode_header(0, key, self.hlc, node, vector) + body)
        return out


@pytest.mark.slow
def test_no_acknowledged_version_is_lost_or_duplicated_across_sigkills(tmp_path: Path) -> None:
    rnd = random.Random(7)
    writers = Writers(rnd)
    pending = writers.write(2000)
    relay = RelayProcess(
        tmp_path / "relay.db", tmp_path / "relay.log", accept_unsigned=True
    ).start()
    token = register_over_http(relay.url, "durable")
    headers = {"authorization": f"Bearer {token}", **MSGPACK}
    acknowledged: dict[bytes, str] = {}
    in_flight = threading.Event()
    done, stop = threading.Event(), threading.Event()
    kills_in_flight = 0

    def killer() -> None:
        nonlocal kills_in_flight
        while kills_in_flight < KILLS and not stop.is_set():
            time.sleep(rnd.uniform(0.05, 0.3))
            if in_flight.is_set():
                kills_in_flight += 1
            relay.kill()
            relay.start()
        done.set()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    retries = 0
    try:
        with httpx2.Client(timeout=5) as client:
            while pending or not done.is_set():
                if not pending:
                    pending = writers.write(50)  # keep pushing until the kills are done
                batch = pending[:50]
                in_flight.set()
                try:
                    answer = client.post(
                        f"{relay.url}/v1/push",
                        content=encode_message(PushBatch(batch)),
                        headers=headers,
                    )
                except httpx2.TransportError:
                    retries += 1  # no answer: unknown, so the same bytes go again
                    time.sleep(0.02)
                    continue
                finally:
                    in_flight.clear()
                assert answer.status_code == 200, answer.content
                result = msgspec.msgpack.decode(answer.content, type=PushResult)
                for envelope, receipt in zip(batch, result.receipts, strict=True):
                    assert receipt.status != "refused", receipt
                    acknowledged[envelope] = receipt.status
                del pending[: len(batch)]
            thread.join()
            served = pull_everything(client, relay.url, headers)
    finally:
        stop.set()
        thread.join(timeout=30)  # else it may start the relay again after the kill below
        relay.kill()

    assert kills_in_flight >= KILLS and retries > 0
    seqs = [seq for seq, _ in served]
    assert len(seqs) == len(set(seqs)), "a seq was served twice"
    headers_served = [parse_header(e) for _, e in served]
    dots = [(h.key, h.dot) for h in headers_served]
    assert len(dots) == len(set(dots)), "a version was stored twice"
    by_key: dict[bytes, list[dict[int, int]]] = {}
    for h in headers_served:
        by_key.setdefault(h.key, []).append(h.vector)
    served_bytes = {e for _, e in served}
    lost = []
    for envelope in acknowledged:
        h = parse_header(envelope)
        if envelope not in served_bytes and not any(
            dominates(v, h.dot) for v in by_key.get(h.key, [])
        ):
            lost.append(h.dot)
    assert lost == [], f"{len(lost)} acknowledged versions lost"


def pull_everything(
    client: httpx2.Client, url: str, headers: dict[str, str]
) -> list[tuple[int, bytes]]:
    served, cursor = [], 0
    while True:
        answer = client.get(f"{url}/v1/pull", params={"cursor": cursor}, headers=headers)
        page = msgspec.msgpack.decode(answer.content, type=Page)
        served += [(e.seq, e.envelope) for e in page.entries]
        cursor = page.next_cursor
        if not page.has_more:
            return served
