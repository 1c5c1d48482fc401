"""Devices of one account on a real relay (uvicorn on 127.0.0.1, SQLite) for client tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import keyring
import pytest
from click.testing import CliRunner
from keyrings.alt.file import PlaintextKeyring  # type: ignore[import-untyped]  # no py.typed

from clients.folder import make_folder
from clients.http import RelayClient
from clients.retry import Backoff
from clients.sync import SyncDriver
from replica import Replica
from replica.wire import KdfParams, LoginRequest, RegisterRequest, Session
from tests.clients.test_cli import Cli
from tests.conftest import FakeClock, ReplicaFactory
from tests.relay.server import RelayProcess

FAST_BACKOFF = Backoff(first_delay_s=0.02, max_delay_s=0.5, max_attempts=40, max_elapsed_s=60)
COLLECTIONS = ("notes", "threads")


@pytest.fixture(autouse=True)
def os_keyring(tmp_path: Path) -> Iterator[keyring.backend.KeyringBackend]:
    """The OS keyring, in a file of the test's own (keyrings.alt's plaintext backend: this
    machine runs no keyring service): the command line reads it for the passphrase, and no
    test may read or write the user's."""
    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture
def shared(make_replica: ReplicaFactory, tmp_path: Path) -> Path:
    """A sealsync folder of the session's account (clients/folder.py), as `init` makes it."""
    folder = tmp_path / "shared"
    first = make_replica("first")
    make_folder(folder, first.key_bundle(), first.key_generation)
    return folder


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """The command line in-process; no config file of the machine running the tests is read."""
    return Cli(CliRunner(), tmp_path)


@pytest.fixture
def start_relay(tmp_path: Path) -> Iterator[Callable[..., RelayProcess]]:
    """Start relays over SQLite in this test's folder (`--set name=value` options); all are
    killed after the test."""
    started: list[RelayProcess] = []

    def start(*settings: str) -> RelayProcess:
        n = len(started)
        options = [part for setting in settings for part in ("--set", setting)]
        relay = RelayProcess(tmp_path / f"relay{n}.db", tmp_path / f"relay{n}.log", *options)
        started.append(relay.start())
        return relay

    yield start
    for relay in started:
        relay.kill()


@dataclass
class Device:
    replica: Replica
    client: RelayClient
    driver: SyncDriver
    sessions: list[Session] = field(default_factory=list)


@dataclass
class Fleet:
    """Devices of one new relay account, each with its own replica, client and driver."""

    url: str
    make_replica: ReplicaFactory
    clock: FakeClock | None = None
    transport: Callable[[], httpx2.BaseTransport | None] = lambda: None
    driver_options: dict[str, Any] = field(default_factory=dict)
    account: str = field(default_factory=lambda: f"acct-{uuid.uuid4().hex[:8]}")
    auth_key: bytes = field(default_factory=lambda: os.urandom(32))
    devices: list[Device] = field(default_factory=list)

    def add(self, name: str) -> Device:
        """The first device registers the account; the others log in to it."""
        options: dict[str, Any] = {"freshness_window_s": 0}
        if self.clock is not None:
            options["wall_clock_ms"] = self.clock
        replica = self.make_replica(name, **options)
        sessions: list[Session] = []
        client = RelayClient(self.url, on_session=sessions.append, transport=self.transport())
        if self.devices:
            client.login(LoginRequest(self.account, self.auth_key, name))
        else:
            client.register(
                RegisterRequest(
                    self.account, self.auth_key, os.urandom(32), KdfParams(os.urandom(16)),
                    replica.key_bundle(), name,
                )
            )  # fmt: skip
        options = {"backoff": FAST_BACKOFF, **self.driver_options}
        device = Device(replica, client, SyncDriver(replica, client, **options), sessions)
        self.devices.append(device)
        return device

    def close(self) -> None:
        for device in self.devices:
            device.client.close()


@pytest.fixture
def fleets(make_replica: ReplicaFactory) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(url: str, **kwargs: Any) -> Fleet:
        fleet = Fleet(url, make_replica, **kwargs)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        fleet.close()


def contents(replica: Replica, *, with_nodes: bool = True) -> list[tuple[Any, ...]]:
    """Everything a reader can see: every record with tombstones, its visible version and
    its siblings; node ids left out to compare runs (they are random per replica)."""
    seen: list[tuple[Any, ...]] = []
    for collection in COLLECTIONS:
        for r in replica.scan(collection, include_deleted=True):
            siblings = [(v.hlc, v.node if with_nodes else 0, v.deleted, v.document)
                        for v in r.conflicts]  # fmt: skip
            node = r.node if with_nodes else 0
            seen.append((collection, r.id, r.document, r.deleted, r.hlc, node, siblings))
    return seen
