"""`sealsync demo`: two devices of one account edit offline, sync through a relay, converge.

The relay runs on loopback in this process (the command line is the composition root: it may
import `relay`). The account is made once with Argon2id; the second device unlocks with the
raw unlock key, as a keyring would, so the demo spends its time syncing, not hashing.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import uvicorn
from rich.console import Console
from rich.table import Table

from clients.account import register_account
from clients.cli.console import fail, out, user_errors
from clients.http import RelayClient
from clients.schema import CHAT_SCHEMA
from clients.sync import SyncDriver
from relay.app import create_app
from relay.config import RelayConfig
from relay.serve import open_storage
from replica import Record, Replica, ReplicaOptions, Version
from replica.wire import LoginRequest

OPTIONS = ReplicaOptions(freshness_window_s=0)
SHOWN = ("threads", "messages", "personas", "active_persona", "drafts")


@dataclass
class Device:
    name: str
    replica: Replica
    client: RelayClient
    driver: SyncDriver = field(init=False)

    def __post_init__(self) -> None:
        self.driver = SyncDriver(self.replica, self.client)

    def close(self) -> None:
        self.replica.close()
        self.client.close()


@dataclass
class Timings:
    seconds_by_step: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds_by_step[name] = time.perf_counter() - started


def make_devices(url: str, folder: Path) -> tuple[Device, Device]:
    """An account on the relay with a phone (registers it) and a laptop (logs in)."""
    account = f"demo-{os.urandom(4).hex()}"
    passphrase = os.urandom(16).hex()
    replica, new = Replica.create(folder / "phone.db", CHAT_SCHEMA, passphrase, options=OPTIONS)
    phone = Device("phone", replica, RelayClient(url))
    register_account(phone.client, account, new, replica.key_bundle(), "phone", None)
    client = RelayClient(url)
    client.login(LoginRequest(account, new.auth_key, "laptop"))
    bundle = client.key_bundle(new.auth_key).bundle
    laptop_replica = Replica.join(folder / "laptop.db", bundle, options=OPTIONS)
    laptop_replica.unlock_with_key(replica.unlock_key())
    return phone, Device("laptop", laptop_replica, client)


def shared_start(phone: Device) -> None:
    phone.replica.put("threads", "trip", {"title": "Trip", "message_count": 1})
    phone.replica.put("messages", "m1", {"thread": "trip", "text": "Where shall we go?"})
    phone.replica.put("messages", "m2", {"thread": "trip", "text": "(typo, to delete)"})


def offline_edits(phone: Device, laptop: Device) -> None:
    """Both devices offline: new records on each, one thread edited on both, one delete."""
    p, q = phone.replica, laptop.replica
    p.put("threads", "trip", {"title": "Trip to Lisbon", "message_count": 2})
    p.put("messages", "m3", {"thread": "trip", "text": "Lisbon!"})
    p.put("personas", "guide", {"name": "Guide", "tone": "friendly"})
    p.put("active_persona", "value", {"persona": "guide"})
    p.put("drafts", "trip", {"text": "half-typed, never leaves the phone"})
    q.put("threads", "trip", {"title": "Trip to Porto", "message_count": 2})
    q.put("threads", "books", {"title": "Books", "message_count": 0})
    q.put("personas", "critic", {"name": "Critic", "tone": "dry"})
    q.delete("messages", "m2")


def run_demo(url: str, folder: Path, console: Console) -> bool:
    """Play the scenario; print state, conflicts and timings; True when both converged."""
    timings = Timings()
    with timings.step("make account and devices (one Argon2id)"):
        phone, laptop = make_devices(url, folder)
    try:
        with timings.step("first sync (shared start)"):
            shared_start(phone)
            phone.driver.sync()
            laptop.driver.sync()
        with timings.step("offline edits on both devices"):
            offline_edits(phone, laptop)
        with timings.step("sync phone, laptop, phone"):
            for device in (phone, laptop, phone):
                device.driver.sync()
        converged = contents(phone.replica) == contents(laptop.replica)
        print_state(console, phone, laptop)
        print_conflicts(console, phone.replica)
        print_timings(console, timings)
        console.print(f"converged: {'yes' if converged else 'NO'}")
        return converged
    finally:
        phone.close()
        laptop.close()


def contents(replica: Replica) -> list[tuple[str, str, Any, int]]:
    synced = [c.name for c in replica.schema.collections if c.is_synced]
    return [
        (name, r.id, r.document, len(r.conflicts)) for name in synced for r in replica.scan(name)
    ]


def print_state(console: Console, phone: Device, laptop: Device) -> None:
    for device in (phone, laptop):
        table = Table("collection", "id", "document", "conflicts", title=f"{device.name}")
        for name in SHOWN:
            for record in sorted(device.replica.scan(name), key=lambda r: r.id):
                conflicts = str(len(record.conflicts)) if record.conflicts else ""
                table.add_row(name, record.id, as_json(record.document), conflicts)
        console.print(table)


def print_conflicts(console: Console, replica: Replica) -> None:
    for collection in CHAT_SCHEMA.collections:
        if not collection.is_synced:
            continue
        for record in replica.scan(collection.name):
            if record.conflicts:
                print_conflict(console, record, collection.tiebreak)


def print_conflict(console: Console, record: Record, tiebreak: str | None) -> None:
    console.print(f"conflict {record.collection}/{record.id}:")
    console.print(f"  visible  hlc={record.hlc} node={record.node} {as_json(record.document)}")
    for sibling in record.conflicts:
        console.print(
            f"  sibling  hlc={sibling.hlc} node={sibling.node} {as_json(sibling.document)}"
        )
        console.print(f"  why: {why_visible(record, sibling, tiebreak)}")


def why_visible(record: Record, sibling: Version, tiebreak: str | None) -> str:
    """The first key of `merge.visible_key` that tells them apart: hlc, tiebreak, live, node."""
    if record.hlc != sibling.hlc:
        return "later hybrid logical clock (hlc) wins"
    if tiebreak is not None:
        mine, theirs = field_of(record.document, tiebreak), field_of(sibling.document, tiebreak)
        if mine != theirs:
            return f"equal hlc; larger {tiebreak} wins ({mine} > {theirs})"
    if record.deleted != sibling.deleted:
        return "equal hlc; a live version beats a tombstone"
    return "equal hlc and tiebreak; larger node id wins"


def as_json(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)


def field_of(document: Any, name: str) -> Any:
    return document.get(name) if isinstance(document, dict) else None


def print_timings(console: Console, timings: Timings) -> None:
    table = Table("step", "ms", title="timings")
    for name, seconds in timings.seconds_by_step.items():
        table.add_row(name, f"{seconds * 1000:.0f}")
    console.print(table)


@contextmanager
def loopback_relay(folder: Path) -> Iterator[str]:
    """A relay over a SQLite file in `folder`, served by uvicorn in a background thread on a
    free loopback port (the socket is bound first, so no other process can take the port)."""
    config = RelayConfig(open_signup=True)
    storage = open_storage(config, db=folder / "relay.db")
    app = create_app(storage, config, on_shutdown=storage.close)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                fail("the demo relay did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@click.command("demo")
def demo() -> None:
    """Two devices edit offline and converge through a relay on loopback (no setup needed)."""
    with (
        user_errors(),
        tempfile.TemporaryDirectory(prefix="sealsync-demo-") as folder,
        loopback_relay(Path(folder)) as url,
    ):
        out.print(f"relay on {url} (a temporary SQLite file)")
        converged = run_demo(url, Path(folder), out)
    if not converged:
        fail("the two devices did not converge", "please report this as a bug")
