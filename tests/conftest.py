"""Shared fixtures: one account per test session (Argon2id is paid once), fake clocks."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import HealthCheck, settings

from replica import Collection, Replica, ReplicaOptions, Schema
from replica.opener import Opener
from tests.replica.v1 import V1Account, load_v1_account

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

MAX_WORKERS = 4
"""`-n auto` (pyproject's addopts) runs the suite in this many processes at most: each test
may start relays and hold PostgreSQL connections (the server allows 100), and two cores
already halve the suite's time (`-n0` runs it in one, for a debugger)."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


SCHEMA = Schema(
    (
        Collection("notes", "lww"),
        Collection("threads", "lww", tiebreak="message_count"),
        Collection("personas", "per_item", max_items=3),
        Collection("active_persona", "register"),
        Collection("drafts", "local"),
        Collection("versioned", "lww", history=3),
    )
)
PASSPHRASE = "correct horse battery staple"


def unavailable(message: str) -> NoReturn:
    """What a test cannot run without (a server, a tool) is missing: a skip on a person's
    machine, a failure in CI (never a silent pass)."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class FakeClock:
    """A wall clock that moves only when a test says so."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@dataclass(frozen=True)
class Account:
    bundle: bytes
    key: bytes
    """The unlock key a keyring would keep: generation 1's key."""
    recovery_key: str


@pytest.fixture(scope="session")
def account(tmp_path_factory: pytest.TempPathFactory) -> Account:
    path = tmp_path_factory.mktemp("account") / "first.db"
    replica, new = Replica.create(path, SCHEMA, PASSPHRASE)
    try:
        return Account(replica.key_bundle(), replica.unlock_key(), new.recovery_key)
    finally:
        replica.close()


@pytest.fixture(scope="session")
def v1() -> V1Account:
    """An account made before bundle version 2 (tests/replica/fixtures/bundle_v1.json)."""
    return load_v1_account()


ReplicaFactory = Callable[..., Replica]


@pytest.fixture
def make_replica(tmp_path: Path, account: Account) -> Iterator[ReplicaFactory]:
    """Join the session's account at a new path, unlocked with the raw key (no Argon2id)."""
    opened: list[Replica] = []

    def make(name: str = "r", **option_values: Any) -> Replica:
        options = ReplicaOptions(**option_values)
        path = tmp_path / f"{name}-{len(opened)}.db"  # unique across hypothesis examples too
        replica = Replica.join(path, account.bundle, options=options)
        replica.unlock_with_key(account.key)
        opened.append(replica)
        return replica

    yield make
    for replica in opened:
        replica.close()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every envelope a replica opens from here on (counted, never timed)."""
    seen: list[bytes] = []
    real_open = Opener.open

    def counting_open(self: Opener, envelope: bytes, header: Any = None) -> Any:
        seen.append(envelope)
        return real_open(self, envelope, header)

    monkeypatch.setattr(Opener, "open", counting_open)
    return seen


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """The child processes a test starts: killed if still running, their pipes closed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.communicate()
