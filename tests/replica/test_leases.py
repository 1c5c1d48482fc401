"""Leases (replica/leases.py): one holder per name across threads and processes, renewed
while held, run out when the holder crashes, and fenced at commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from replica import (
    InvalidArgumentError,
    LeaseBusyError,
    Replica,
    ReplicaClosedError,
    ReplicaLockedError,
)
from tests.conftest import Account, FakeClock, ReplicaFactory

CHILD = Path(__file__).with_name("feed_child.py")
ROOT = CHILD.parents[2]


def test_a_lease_has_one_holder_until_it_is_given_back(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    other = Replica.open(replica.path)
    other.unlock_with_key(replica.unlock_key())
    try:
        with replica.lease("chat-1") as lease:
            with pytest.raises(LeaseBusyError, match="held by another") as busy:
                other.lease("chat-1")
            assert "chat-1" in str(busy.value)
            with other.lease("chat-2"):  # another name is another lease
                pass
            lease.check()
        with other.lease("chat-1"):
            pass
    finally:
        other.close()


def test_a_waiting_taker_gets_the_lease_when_it_is_given_back(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    first = replica.lease("chat")
    threading.Timer(0.3, first.release).start()
    started = time.monotonic()
    with replica.lease("chat", wait_s=10):
        assert 0.2 < time.monotonic() - started < 5


def test_a_held_lease_is_renewed_past_its_time_to_live(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with replica.lease("turn", ttl_s=0.3):
        time.sleep(1.0)
        with pytest.raises(LeaseBusyError):
            replica.lease("turn")


def test_a_lease_that_ran_out_and_was_taken_fails_its_check(
    make_replica: ReplicaFactory,
) -> None:
    clock = FakeClock()
    replica = make_replica(wall_clock_ms=clock)
    slow = replica.lease("chat", ttl_s=60)
    clock.advance(61_000)  # the holder stalled past its lease (its renewer never ran)
    with replica.lease("chat"), pytest.raises(LeaseBusyError, match="ran out"):
        slow.check()
    assert slow.lost
    slow.release()


def test_a_lease_of_a_closed_replica_is_lost_and_its_check_says_closed(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    lease = replica.lease("chat", ttl_s=0.3)
    replica.close()
    with pytest.raises(ReplicaClosedError):
        lease.check()
    deadline = time.monotonic() + 5
    while not lease.lost and time.monotonic() < deadline:  # its renewer gives up
        time.sleep(0.05)
    assert lease.lost
    lease.release()  # nothing left to give back: no error


def test_the_file_does_not_show_the_lease_name(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    with replica.lease("thread-id-31337"):
        data = replica.path.read_bytes() + Path(f"{replica.path}-wal").read_bytes()
        assert b"thread-id-31337" not in data


@pytest.mark.parametrize(
    ("name", "options", "error"),
    [
        ("", {}, "non-empty name"),
        ("x", {"ttl_s": 0}, "ttl_s 0 outside"),
        ("x", {"ttl_s": 7200}, "ttl_s 7200 outside"),
        ("x", {"wait_s": -1}, "wait_s -1 outside"),
    ],
)
def test_bad_leases_are_refused_clearly(
    make_replica: ReplicaFactory, name: str, options: dict[str, float], error: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=error):
        make_replica().lease(name, **options)


def test_a_lease_is_free_only_while_no_one_holds_it(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    assert replica.lease_is_free("chat")
    with replica.lease("chat"):
        assert not replica.lease_is_free("chat") and replica.lease_is_free("other")
    assert replica.lease_is_free("chat")


def test_a_locked_replica_takes_no_lease(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(ReplicaLockedError):
        replica.lease("x")


def test_a_lease_left_by_a_killed_process_runs_out(
    tmp_path: Path, account: Account, children: list[subprocess.Popen[str]]
) -> None:
    path = tmp_path / "shared.db"
    Replica.join(path, account.bundle).close()
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "lease", str(path), account.key.hex(), "turn", "1.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    children.append(child)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    assert child.stdout.readline().strip() == "taken"
    with Replica.open(path) as replica:
        replica.unlock_with_key(account.key)
        time.sleep(1.5)  # the child renews it: still busy past its time to live
        with pytest.raises(LeaseBusyError):
            replica.lease("turn")
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        started = time.monotonic()
        with replica.lease("turn", wait_s=10):
            assert time.monotonic() - started < 3


def test_a_lease_that_ran_out_is_not_renewed_and_fails_its_check(
    make_replica: ReplicaFactory,
) -> None:
    """A review found it: a stalled holder's renewal revived its expired row, hiding that
    another had worked meanwhile."""
    clock = FakeClock()
    replica = make_replica(wall_clock_ms=clock)
    job = replica.lease("chat", ttl_s=0.3)
    clock.advance(10_000)  # the holder stalled past its lease
    assert replica.lease_is_free("chat")
    time.sleep(0.5)  # its renewer runs now, late
    assert job.lost
    with pytest.raises(LeaseBusyError, match="ran out"):
        job.check()
    job.release()
