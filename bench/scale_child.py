"""A device of the scale tests and benchmarks, in a process of its own so its peak memory is
its own: `push` makes an account of N records on a relay and pushes them; `join` joins it
and pulls everything. Prints one JSON line: what it did and its peak RSS.

Run as `python bench/scale_child.py MODE URL ACCOUNT FOLDER [N]`. FOLDER holds the account's
key bundle and raw key (`bundle`, `key`).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from clients.backup import backup_replica  # noqa: E402
from clients.http import RelayClient  # noqa: E402
from clients.sync import SyncDriver  # noqa: E402
from clients.verify import verify_backup  # noqa: E402
from replica import Replica  # noqa: E402
from replica.wire import KdfParams, LoginRequest, RegisterRequest  # noqa: E402

AUTH_KEY = b"\x02" * 32
BATCH = 1000


def peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, whose count starts at exec (`ru_maxrss` keeps the
    parent's peak across fork and exec on Linux, which is the parent's size, not ours)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status: peak RSS is measured on Linux only")


def document(i: int) -> dict[str, object]:
    """About the size of a chat message (~500 bytes of MessagePack)."""
    return {"thread": f"thread-{i % 97:04d}", "text": "x" * 400, "n": i}


def push(url: str, account: str, folder: Path, n: int) -> dict[str, object]:
    replica = _device(folder, "pusher")
    with replica, RelayClient(url) as client:
        bundle, kdf = replica.key_bundle(), KdfParams(os.urandom(16))
        client.register(RegisterRequest(account, AUTH_KEY, os.urandom(32), kdf, bundle, "pusher"))
        for start in range(0, n, BATCH):
            with replica.batch():
                for i in range(start, min(start + BATCH, n)):
                    replica.put("notes", f"n{i:08d}", document(i))
        started = time.perf_counter()
        report = SyncDriver(replica, client).sync()
        return {"pushed": report.pushed, "seconds": time.perf_counter() - started}


def join(url: str, account: str, folder: Path) -> dict[str, object]:
    replica = _device(folder, "joiner")
    with replica, RelayClient(url) as client:
        client.login(LoginRequest(account, AUTH_KEY, "joiner"))
        started = time.perf_counter()
        report = SyncDriver(replica, client).sync()
        seconds = time.perf_counter() - started
        joined = peak_rss_mib()
        return {"pulled": report.pulled, "seconds": seconds, "join_peak_rss_mib": joined,
                **upkeep(replica, folder)}  # fmt: skip


def upkeep(replica: Replica, folder: Path) -> dict[str, object]:
    """What a person runs on a big replica now and then: `status`, a backup and its check,
    `repair`; each must stay within a device's memory too."""
    records = replica.status().records
    now = datetime.datetime.now(datetime.UTC)
    backup = backup_replica(replica.path, folder / "backups", now)
    verdict = verify_backup(backup)
    repaired = replica.repair()
    return {"records": records, "backup": verdict.state, "repaired": repaired.quarantined}


def _device(folder: Path, name: str) -> Replica:
    """A new replica of the account whose key bundle and raw key are in `folder` (no
    Argon2id: its 64 MiB would be most of a device's peak)."""
    replica = Replica.join(folder / f"{name}.db", (folder / "bundle").read_bytes())
    replica.unlock_with_key((folder / "key").read_bytes())
    return replica


if __name__ == "__main__":
    mode, url, account, folder = sys.argv[1:5]
    done = (
        push(url, account, Path(folder), int(sys.argv[5]))
        if mode == "push"
        else join(url, account, Path(folder))
    )
    print(json.dumps({"mode": mode, **done, "peak_rss_mib": round(peak_rss_mib(), 1)}))
