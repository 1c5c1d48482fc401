"""The relay's metrics (issue 15, item 6): off unless asked, scraped in Prometheus' text
format, counting requests by route and status, latency, envelopes and bytes moved, pushes
per commit, open event streams and storage errors; naming no account and no token."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from itertools import islice
from pathlib import Path

import httpx2
import psycopg
import pytest
from starlette.testclient import TestClient

from replica.wire import PushBatch
from tests.relay.api import bearer, body, new_keys, register, register_over_http
from tests.relay.conftest import HLC, envelope, postgres_url
from tests.relay.harness import BACKENDS, Relay, Relays, open_relays
from tests.relay.server import RelayProcess

SAMPLE = re.compile(r"^(?P<series>[a-z_]+(?:\{[^}]*\})?) (?P<value>\S+)$")


def samples(text: str) -> dict[str, float]:
    """Each sample line's series (name and labels) and value; comments must be HELP/TYPE."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split()[1] in ("HELP", "TYPE"), line
            continue
        match = SAMPLE.match(line)
        assert match is not None, f"not a sample: {line!r}"
        found[match["series"]] = float(match["value"])
    return found


def scrape(client: TestClient | httpx2.Client) -> dict[str, float]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(answer.text)


@pytest.fixture(params=BACKENDS)
def relays(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path, request.param)


def test_metrics_count_what_the_relay_did_and_name_no_account(relays: Relays) -> None:
    relay = relays(metrics=True)
    client = relay.client
    session = register(client, "alice-private-name", new_keys())
    pushed = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(3)]
    answer = client.post("/v1/push", content=body(PushBatch(pushed)), headers=bearer(session))
    assert answer.status_code == 200
    assert client.get("/v1/pull?cursor=0", headers=bearer(session)).status_code == 200
    assert client.get("/v1/pull?cursor=0").status_code == 401
    assert client.get("/v1/no-such-route").status_code == 404
    for invented in ("BREW", "WHEN"):  # no series per method a client makes up
        assert client.request(invented, "/v1/pull").status_code == 405
    text = client.get("/metrics").text
    assert "alice" not in text and session.access_token not in text
    found = scrape(client)
    requests = 'sealsync_relay_requests_total{route="%s",method="%s",status="%s"}'
    assert found[requests % ("/v1/push", "POST", 200)] == 1
    assert found[requests % ("/v1/pull", "GET", 200)] == 1
    assert found[requests % ("/v1/pull", "GET", 401)] == 1
    assert found[requests % ("unmatched", "GET", 404)] == 1
    assert found[requests % ("/v1/pull", "other", 405)] == 2
    assert found['sealsync_relay_request_seconds_count{route="/v1/pull"}'] == 4
    assert found['sealsync_relay_request_seconds_bucket{route="/v1/pull",le="+Inf"}'] == 4
    assert found["sealsync_relay_push_envelopes_total"] == 3
    assert found["sealsync_relay_push_bytes_total"] == sum(map(len, pushed))
    assert found["sealsync_relay_pull_envelopes_total"] == 3
    assert found["sealsync_relay_pull_bytes_total"] == sum(map(len, pushed))
    assert found["sealsync_relay_pushes_per_commit_count"] == 1
    assert found['sealsync_relay_pushes_per_commit_bucket{le="1"}'] == 1
    assert found["sealsync_relay_event_streams"] == 0
    assert found["sealsync_relay_storage_errors_total"] == 0


def test_metrics_are_not_served_unless_asked(relays: Relays) -> None:
    assert relays().client.get("/metrics").status_code == 404


def test_a_storage_failure_is_counted(relays: Relays) -> None:
    relay = relays(metrics=True)
    session = register(relay.client, "alice", new_keys())
    drop_versions_table(relays, relay)  # the database fails under the relay
    client = TestClient(relay.app, raise_server_exceptions=False)
    assert client.get("/v1/pull?cursor=0", headers=bearer(session)).status_code == 500
    found = scrape(client)
    assert found["sealsync_relay_storage_errors_total"] == 1
    series = 'sealsync_relay_requests_total{route="/v1/pull",method="GET",status="500"}'
    assert found[series] == 1


def drop_versions_table(relays: Relays, relay: Relay) -> None:
    if relays.backend == "postgres":
        schema = relay.storage._schema  # type: ignore[attr-defined]
        with psycopg.connect(postgres_url(), autocommit=True) as db:
            db.execute(f'DROP TABLE "{schema}".versions CASCADE')
        return
    with closing(sqlite3.connect(relays.directory / "relay0.db")) as db:
        db.execute("DROP TABLE versions")
        db.commit()


def test_a_real_relay_counts_its_open_event_streams(tmp_path: Path) -> None:
    """Over uvicorn: a device listening is one stream, and none once it hung up."""
    process = RelayProcess(tmp_path / "relay.db", tmp_path / "relay.log", "--metrics",
                           "--set", "heartbeat_s=0.2")  # fmt: skip
    with process as relay, httpx2.Client(base_url=relay.url, timeout=10) as client:
        token = register_over_http(relay.url, "alice")
        headers = {"authorization": f"Bearer {token}"}
        with client.stream("GET", "/v1/events", headers=headers) as events:
            lines = events.iter_lines()  # held: a dropped iterator closes the stream
            assert "event: head" in list(islice(lines, 3))
            assert scrape(client)["sealsync_relay_event_streams"] == 1
        deadline = time.monotonic() + 10
        while scrape(client)["sealsync_relay_event_streams"] != 0:
            assert time.monotonic() < deadline, "the stream was never counted as closed"
            time.sleep(0.1)
