"""The long soak (issue 15, item 7; not in CI): many devices, threads of one process, write
and sync for minutes against one relay process (SQLite) through a network that loses and
cuts replies, while the relay is killed and started again now and then. At the end every
device syncs on a clean network until nothing moves, and the soak checks:

- 0 lost: every device holds the last write of every record (each record is written by one
  device only, so its last write is known), deletions included;
- 0 duplicated: no record has a second version (a retried push stored twice would be one),
  on any device or on the relay (one row per key);
- convergence: every device holds the same records.

    python bench/soak.py [--devices 200] [--minutes 5] [--fault-rate 0.05]
                         [--restart-every 60] [--dir DIR]

It prints one JSON line of figures; CONTRIBUTING.md keeps the last ones.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from clients.errors import RelayClientError  # noqa: E402
from clients.http import RelayClient  # noqa: E402
from clients.retry import Backoff  # noqa: E402
from clients.sync import SyncDriver  # noqa: E402
from replica import Replica, SealsyncError  # noqa: E402
from replica.wire import KdfParams, LoginRequest, RegisterRequest  # noqa: E402
from tests.clients.chaos import ChaosTransport  # noqa: E402
from tests.conftest import PASSPHRASE, SCHEMA  # noqa: E402
from tests.relay.server import RelayProcess  # noqa: E402

AUTH_KEY = b"\x03" * 32
BACKOFF = Backoff(first_delay_s=0.05, max_delay_s=1.0, max_attempts=30, max_elapsed_s=60)
SETTLE_ROUNDS = 3


@dataclass
class Device:
    """One device: its replica, its clients (through the faulty network, then a clean one),
    and the last write of each record it owns (None: deleted)."""

    number: int
    replica: Replica
    chaos: ChaosTransport
    owned: dict[str, Any] = field(default_factory=dict)
    writes: int = 0
    syncs: int = 0
    failed_syncs: int = 0

    def write(self, rng: random.Random) -> None:
        roll = rng.random()
        if self.owned and roll < 0.2:
            record = rng.choice(sorted(self.owned))
            if roll < 0.05:
                self.replica.delete("notes", record)
                self.owned[record] = None
                self.writes += 1
                return
        else:
            record = f"d{self.number:03d}-{self.writes:06d}"
        document = {"by": self.number, "write": self.writes, "text": "x" * rng.randrange(400)}
        self.replica.put("notes", record, document)
        self.owned[record] = document
        self.writes += 1


def make_devices(url: str, folder: Path, count: int, fault_rate: float) -> list[Device]:
    first, _ = Replica.create(folder / "account.db", SCHEMA, PASSPHRASE)
    bundle, key = first.key_bundle(), first.unlock_key()
    first.close()
    devices = []
    for number in range(count):
        replica = Replica.join(folder / f"device{number:03d}.db", bundle)
        replica.unlock_with_key(key)
        rate = fault_rate / 2
        devices.append(Device(number, replica, ChaosTransport(seed=number, timeout_rate=rate,
                                                              truncate_rate=rate)))  # fmt: skip
    with RelayClient(url) as client:
        kdf = KdfParams(os.urandom(16))
        client.register(RegisterRequest("soak", AUTH_KEY, os.urandom(32), kdf, bundle, "first"))
    return devices


def driver(device: Device, url: str, transport: Any) -> SyncDriver:
    """A driver over `transport` (None: a clean network), logged in on a clean one."""
    with RelayClient(url) as clean:
        session = clean.login(LoginRequest("soak", AUTH_KEY, f"d{device.number}"))
    client = RelayClient(url, session=session, transport=transport)
    return SyncDriver(device.replica, client, backoff=BACKOFF)


def run_device(device: Device, url: str, stop: threading.Event) -> None:
    rng = random.Random(device.number)
    sync = driver(device, url, device.chaos)
    while not stop.is_set():
        for _ in range(rng.randrange(1, 4)):
            device.write(rng)
        try:
            sync.sync()
            device.syncs += 1
        except (RelayClientError, SealsyncError):
            device.failed_syncs += 1  # a relay down for longer than the backoff: next round
        stop.wait(rng.uniform(0.2, 2.0))


def settle(devices: list[Device], url: str) -> float:
    """Sync every device on a clean network until a whole round moved nothing; seconds."""
    started = time.perf_counter()
    drivers = [driver(d, url, None) for d in devices]
    for _ in range(SETTLE_ROUNDS):
        for sync in drivers:
            sync.sync()
    return time.perf_counter() - started


def check(devices: list[Device], relay_db: Path) -> dict[str, int]:
    expected = {record: doc for d in devices for record, doc in d.owned.items()}
    states = []
    lost = duplicated = 0
    for device in devices:
        held = {}
        for record in device.replica.scan("notes", include_deleted=True):
            held[record.id] = None if record.deleted else record.document
            duplicated += bool(device.replica.conflicts("notes", record.id))
        lost += sum(held.get(r, "absent") != doc for r, doc in expected.items())
        states.append(held)
    with closing(sqlite3.connect(relay_db)) as db:
        (twice,) = db.execute(
            "SELECT count(*) FROM (SELECT key FROM versions GROUP BY key HAVING count(*) > 1)"
        ).fetchone()
    diverged = sum(state != states[0] for state in states)
    return {"lost": lost, "duplicated": duplicated, "relay_keys_twice": twice, "diverged": diverged}


def soak(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    relay = RelayProcess(folder / "relay.db", folder / "relay.log")
    with relay:
        devices = make_devices(relay.url, folder, args.devices, args.fault_rate)
        stop = threading.Event()
        threads = [threading.Thread(target=run_device, args=(d, relay.url, stop)) for d in devices]
        for thread in threads:
            thread.start()
        restarts, deadline = 0, time.monotonic() + args.minutes * 60
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, args.restart_every))
            if time.monotonic() < deadline:
                relay.kill()
                relay.start()
                restarts += 1
        stop.set()
        for thread in threads:
            thread.join()
        settle_s = settle(devices, relay.url)
        faults: Counter[str] = sum((d.chaos.faults for d in devices), Counter())
        figures = {
            "devices": args.devices, "minutes": args.minutes, "fault_rate": args.fault_rate,
            "writes": sum(d.writes for d in devices), "syncs": sum(d.syncs for d in devices),
            "failed_syncs": sum(d.failed_syncs for d in devices), "restarts": restarts,
            "faults": sum(faults.values()), "settle_s": round(settle_s, 1),
        }  # fmt: skip
        figures |= check(devices, folder / "relay.db")
        for device in devices:
            device.replica.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--fault-rate", type=float, default=0.05)
    parser.add_argument("--restart-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--dir", type=Path, help="scratch folder parent (default: system temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sealsync-soak-", dir=args.dir) as folder:
        figures = soak(args, Path(folder))
    print(json.dumps(figures))
    bad = (
        figures["lost"] + figures["duplicated"] + figures["relay_keys_twice"] + figures["diverged"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
