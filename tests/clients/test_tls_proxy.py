"""The proxy drill (issue 15, item 6): a real nginx terminating TLS on loopback with a
self-signed CA, in front of a real relay that trusts it as a proxy. Devices verify the
proxy's certificate against the CA given by `--cacert` (and refuse it without), per-address
limits see the client nginx forwards, and Server-Sent Events pass through unbuffered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from clients.device import load_settings
from clients.http import RelayClient
from replica.errors import InvalidArgumentError
from replica.wire import LoginRequest, PushBatch
from tests.clients.test_cli import Cli
from tests.clients.tls_proxy import Nginx
from tests.relay.api import MSGPACK, body, register_over_http
from tests.relay.conftest import envelope
from tests.relay.server import RelayProcess


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[RelayProcess, Nginx]]:
    relay = RelayProcess(tmp_path / "relay.db", tmp_path / "relay.log", "--trusted-proxy",
                         "127.0.0.1", "--set", "heartbeat_s=0.2", accept_unsigned=True)  # fmt: skip
    with relay, Nginx(tmp_path / "nginx", relay.port) as nginx:
        yield relay, nginx


def test_devices_sync_through_the_proxy_trusting_the_ca_they_were_given(
    cli: Cli, proxy: tuple[RelayProcess, Nginx], tmp_path: Path
) -> None:
    _, nginx = proxy
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    refused = cli(first, "init", "--relay", nginx.url, "--account", "ann")
    assert refused.exit_code == 1 and "is not trusted" in refused.stderr, refused.stderr
    assert "--cacert" in refused.stderr
    assert not first.exists()
    cli.ok(first, "init", "--relay", nginx.url, "--account", "ann", "--cacert", str(nginx.ca))
    cli.ok(first, "put", "threads", "t1", '{"title": "through the proxy"}')
    assert load_settings(first).cacert == str(nginx.ca)
    cli.ok(first, "sync")  # the saved settings name the CA: no flag needed again
    cli.ok(second, "join", "--relay", nginx.url, "--account", "ann", "--cacert", str(nginx.ca))
    assert cli.json(second, "ls", "threads") == [
        {"id": "t1", "doc": {"title": "through the proxy"}}
    ]


def failed_login(client: httpx2.Client, forwarded_for: str) -> int:
    request = LoginRequest("nobody", b"w" * 32, "laptop")
    headers = {**MSGPACK, "x-forwarded-for": forwarded_for}
    return client.post("/v1/login", content=body(request), headers=headers).status_code


def test_per_address_limits_see_the_client_the_proxy_forwards(
    proxy: tuple[RelayProcess, Nginx],
) -> None:
    _, nginx = proxy
    with httpx2.Client(base_url=nginx.url, verify=nginx.trust(), timeout=10) as client:
        statuses = [failed_login(client, "198.51.100.7") for _ in range(11)]
        assert statuses == [401] * 10 + [429]  # max_login_failures: 10 per address
        assert failed_login(client, "198.51.100.8") == 401  # another client is not held


def test_events_pass_through_the_proxy_as_the_relay_writes_them(
    proxy: tuple[RelayProcess, Nginx],
) -> None:
    relay, nginx = proxy
    token = register_over_http(relay.url, "ann")
    headers = {"authorization": f"Bearer {token}"}
    with httpx2.Client(base_url=nginx.url, verify=nginx.trust(), timeout=10) as client, \
            client.stream("GET", "/v1/events", headers=headers) as events:  # fmt: skip
        lines = events.iter_lines()
        assert "data: 0" in [next(lines) for _ in range(3)]
        pushed = threading.Timer(0.5, push_one, (relay.url, headers))
        pushed.start()
        seen = [next(lines) for _ in range(40)]  # pings every 0.2 s, then the new head
        pushed.join()
    assert any(line.startswith(": ping") for line in seen)
    assert "data: 1" in seen


def push_one(url: str, headers: dict[str, str]) -> None:
    hlc = (time.time_ns() // 1_000_000) << 16  # the relay's clock is the real one
    batch = PushBatch([envelope(b"e" * 16, 1, hlc, {1: hlc})])
    answer = httpx2.post(f"{url}/v1/push", content=body(batch), headers={**headers, **MSGPACK})
    assert answer.status_code == 200


def test_a_ca_file_that_is_not_a_certificate_is_refused_by_name(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(InvalidArgumentError, match="cannot read the CA certificate") as refused:
        RelayClient("https://127.0.0.1:9", ca_file=str(garbage))
    assert str(garbage) in str(refused.value) and refused.value.hint
