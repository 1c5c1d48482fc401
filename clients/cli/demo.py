"""`sealsync demo`: two devices of one account chat offline, sync through a relay, converge.

The scenario runs on the chat store (specs/chat.md): both devices append to one chat
offline (both messages stay), rename it (the later rename shows, the other stays a sibling),
the laptop forks it and deletes a chat the phone kept writing to (the chat comes back with
the new message), and each device searches.

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

from chat import ChatStore
from chat.schema import THREADS
from clients.account import register_account
from clients.cli.console import fail, out, user_errors, when
from clients.cli.records import written_at
from clients.http import RelayClient
from clients.schema import CHAT_SCHEMA
from clients.sync import SyncDriver
from relay.app import create_app
from relay.config import RelayConfig
from relay.serve import open_storage
from replica import Record, Replica, ReplicaOptions, Version
from replica.wire import LoginRequest

OPTIONS = ReplicaOptions(freshness_window_s=0)


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


@dataclass
class Chats:
    """The two devices' chat stores, and the ids of the chats the scenario uses."""

    phone: ChatStore
    laptop: ChatStore
    trip: str = ""
    groceries: str = ""


def shared_start(chats: Chats) -> None:
    chats.trip = chats.phone.new_chat("Trip")
    chats.phone.append(chats.trip, "user", "Where shall we go?")
    chats.groceries = chats.phone.new_chat("Groceries")
    chats.phone.append(chats.groceries, "user", "milk")


def offline_edits(chats: Chats) -> None:
    """Both devices offline: appends to one chat on both, two renames, a fork, a delete of a
    chat the other device writes to, a draft."""
    phone, laptop = chats.phone, chats.laptop
    phone.append(chats.trip, "assistant", "Lisbon has sun and trams.")
    phone.rename(chats.trip, "Trip to Lisbon")
    phone.append(chats.groceries, "user", "and bread")
    phone.save_draft(chats.trip, "half-typed, never leaves the phone", phone.draft_stamp())
    laptop.append(chats.trip, "user", "What about Porto?")
    laptop.rename(chats.trip, "Trip to Porto")
    first = laptop.messages(chats.trip).messages[0].id
    laptop.fork(chats.trip, first)
    laptop.delete(chats.groceries)


def sync_all(phone: Device, laptop: Device, chats: Chats) -> None:
    for device in (phone, laptop, phone):
        device.driver.sync()
    for store in (chats.phone, chats.laptop):
        store.reconcile()  # the groceries chat comes back: the phone wrote to it meanwhile
    for device in (phone, laptop):
        device.driver.sync()


def run_demo(url: str, folder: Path, console: Console) -> bool:
    """Play the scenario; print chats, a conflict, searches and timings; True when both
    devices show the same chats."""
    timings = Timings()
    with timings.step("make account and devices (one Argon2id)"):
        phone, laptop = make_devices(url, folder)
    chats = Chats(ChatStore(phone.replica), ChatStore(laptop.replica))
    try:
        with timings.step("first sync (shared start)"):
            shared_start(chats)
            phone.driver.sync()
            laptop.driver.sync()
        with timings.step("offline edits on both devices"):
            offline_edits(chats)
        with timings.step("sync, reconcile, sync"):
            sync_all(phone, laptop, chats)
        converged = contents(chats.phone) == contents(chats.laptop)
        print_state(console, chats)
        print_conflicts(console, phone.replica)
        print_timings(console, timings)
        console.print(f"converged: {'yes' if converged else 'NO'}")
        return converged
    finally:
        phone.close()
        laptop.close()


def contents(store: ChatStore) -> list[tuple[str, str, list[str]]]:
    return [
        (v.id, v.thread.title, [m.message.content for m in store.messages(v.id).messages])
        for v in store.chats()
    ]


def print_state(console: Console, chats: Chats) -> None:
    for name, store in (("phone", chats.phone), ("laptop", chats.laptop)):
        table = Table("chat", "messages", "last message", title=name)
        for view in store.chats():
            texts = [m.message.content for m in store.messages(view.id).messages]
            table.add_row(view.thread.title, " | ".join(texts), when(view.last_message_ms))
        console.print(table)
        hits = store.search("lisbon")
        console.print(f"{name} searches 'lisbon': {hits.total} hit(s)")
        console.print(f"{name}'s draft: {store.draft(chats.trip)!r}")


def print_conflicts(console: Console, replica: Replica) -> None:
    for record in replica.scan(THREADS):
        if record.conflicts:
            print_conflict(console, record, "message_count")


def print_conflict(console: Console, record: Record, tiebreak: str | None) -> None:
    console.print(f"conflict on a chat's title ({record.id}):")
    title = field_of(record.document, "title")
    console.print(f"  shown    {title!r}, written {written_at(record.hlc)}")
    for sibling in record.conflicts:
        other = field_of(sibling.document, "title")
        console.print(f"  sibling  {other!r}, written {written_at(sibling.hlc)}")
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
    """Two devices chat offline and converge through a relay on loopback (no setup needed)."""
    with (
        user_errors(),
        tempfile.TemporaryDirectory(prefix="sealsync-demo-") as folder,
        loopback_relay(Path(folder)) as url,
    ):
        out.print(f"relay on {url} (a temporary SQLite file)")
        converged = run_demo(url, Path(folder), out)
    if not converged:
        fail("the two devices did not converge", "please report this as a bug")
