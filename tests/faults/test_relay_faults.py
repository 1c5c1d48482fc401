"""A disk that fails under the relay's pushes on SQLite (issue 15, item 1): a real relay
process under strace, which fails the N-th sync or write of its log once or from then on,
while a device pushes a version a request.

Every push is answered: stored (200, with its receipt) or refused as a storage failure
(500), never a dropped connection. Afterwards the file passes `integrity_check` and holds
every version a receipt was sent for; after a one-off fault the pushes that follow are
stored again, and the relay opened its file again rather than trust the connection (its
log says so).
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

import httpx2
import pytest

from replica.wire import PushBatch
from tests.faults.test_disk_faults import strace
from tests.relay.api import MSGPACK, body, register_over_http
from tests.relay.conftest import envelope
from tests.relay.server import RelayProcess

PUSHES = 8
FAULTS = [("fsync,fdatasync", "EIO", when) for when in ("2", "4", "3+")] + [
    ("pwrite64", "ENOSPC", when) for when in ("4", "9", "6+")
]


def push(client: httpx2.Client, token: str, n: int) -> tuple[int, bytes]:
    """One version under its own key; (status, key)."""
    key = n.to_bytes(2, "big") * 8
    hlc = (time.time_ns() // 1_000_000) << 16
    batch = PushBatch([envelope(key, 1, hlc, {1: hlc})])
    headers = {"authorization": f"Bearer {token}", **MSGPACK}
    return client.post("/v1/push", content=body(batch), headers=headers).status_code, key


@pytest.mark.parametrize(("calls", "error", "when"), FAULTS)
def test_a_failing_disk_under_the_relay_loses_no_acknowledged_push(
    calls: str, error: str, when: str, tmp_path: Path
) -> None:
    db = tmp_path / "relay.db"
    inject = ("-e", f"trace={calls}", "-e", f"inject={calls}:error={error}:when={when}")
    prefix = (strace(), "-f", "-qq", "-o", str(tmp_path / "strace.log"), *inject,
              "-P", f"{db}-wal")  # fmt: skip
    with RelayProcess(db, tmp_path / "relay.log", accept_unsigned=True) as relay:
        token = register_over_http(relay.url, "ann")  # the file made before any fault
    relay = RelayProcess(db, tmp_path / "relay.log", accept_unsigned=True, prefix=prefix)
    with relay, httpx2.Client(base_url=relay.url, timeout=30) as client:
        outcomes = [push(client, token, n) for n in range(PUSHES)]
    statuses = [status for status, _ in outcomes]
    assert set(statuses) <= {200, 500}, statuses
    assert 500 in statuses, f"the fault never reached a push: {statuses}"
    if not when.endswith("+"):  # a one-off fault: the pushes after it are stored again
        assert statuses[-1] == 200, statuses
    with closing(sqlite3.connect(db)) as stored:
        assert stored.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        keys = {bytes(k) for (k,) in stored.execute("SELECT key FROM versions")}
    assert {key for status, key in outcomes if status == 200} <= keys
    assert "the database was opened again" in (tmp_path / "relay.log").read_text()
