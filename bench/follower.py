"""Device B of `sync.e2e`, in a process of its own: it follows the relay live, as a device
in `sealsync sync --watch` does, and merges pages while device A is still pushing. Its own
process, so that its merging and A's pushing run side by side rather than taking turns on
one interpreter's lock, as two devices do.

The parent starts it with `following(...)`, which returns once B is logged in and waiting;
`Follower.start()` lets B go, and `Follower.done()` waits until B merged every record and
gives `time.perf_counter()` then: CLOCK_MONOTONIC on Linux, one clock for every process of
the machine, so the parent can compare it with its own stamps.

Run as `python bench/follower.py URL ACCOUNT AUTH_KEY_HEX FOLDER N`; FOLDER holds the
account's key bundle and raw key (`bundle`, `key`), as for scale_child.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from clients.http import RelayClient  # noqa: E402
from clients.sync import SyncDriver, SyncReport  # noqa: E402
from replica import Replica, ReplicaOptions  # noqa: E402
from replica.wire import LoginRequest  # noqa: E402

READY = "ready"


class Follower:
    """The parent's handle on B's process."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self._child = child

    def start(self) -> None:
        assert self._child.stdin is not None
        self._child.stdin.write("go\n")
        self._child.stdin.flush()

    def done(self, timeout_s: float = 600) -> float:
        """When B held every record (its perf_counter); raises with its stderr if it failed."""
        out, err = self._child.communicate(timeout=timeout_s)
        if self._child.returncode != 0:
            raise RuntimeError(f"device B failed: {err[-2000:]}")
        return float(json.loads(out.splitlines()[-1])["done"])


@contextmanager
def following(url: str, account: str, auth_key: bytes, folder: Path, n: int) -> Iterator[Follower]:
    command = [sys.executable, __file__, url, account, auth_key.hex(), str(folder), str(n)]
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_ready(child)
        yield Follower(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _wait_ready(child: subprocess.Popen[str]) -> None:
    stdout: IO[str] | None = child.stdout
    assert stdout is not None
    line = stdout.readline().strip()
    if line != READY:
        _, err = child.communicate(timeout=30)
        raise RuntimeError(f"device B did not start: {line!r} {err[-2000:]}")


def follow(url: str, account: str, auth_key: bytes, folder: Path, n: int) -> float:
    """Log in, wait for the word, then watch until `n` records merged; perf_counter then."""
    replica = Replica.join(
        folder / "follower.db",
        (folder / "bundle").read_bytes(),
        options=ReplicaOptions(freshness_window_s=0),
    )
    with replica, RelayClient(url) as client:
        replica.unlock_with_key((folder / "key").read_bytes())
        client.login(LoginRequest(account, auth_key, "b"))
        print(READY, flush=True)
        sys.stdin.readline()
        stop, merged = threading.Event(), [0]

        def on_report(report: SyncReport) -> None:
            merged[0] += report.merged
            if merged[0] >= n:
                stop.set()

        SyncDriver(replica, client).watch(stop, on_report=on_report)
        return time.perf_counter()


if __name__ == "__main__":
    url, account, key_hex, folder, n = sys.argv[1:6]
    done = follow(url, account, bytes.fromhex(key_hex), Path(folder), int(n))
    print(json.dumps({"done": done}), flush=True)
