"""The test harness's relay process: it must start even when its port was taken meanwhile
(`free_port` cannot reserve one; a busy machine took one once and failed a CI run)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx2

from tests.relay.server import RelayProcess


def test_a_relay_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        relay = RelayProcess(tmp_path / "relay.db", tmp_path / "relay.log")
        relay.port, relay.url = port, f"http://127.0.0.1:{port}"
        with relay:
            assert relay.port != port
            assert httpx2.get(f"{relay.url}/v1/health", timeout=5).status_code == 200
        assert "address already in use" in (tmp_path / "relay.log").read_text()
