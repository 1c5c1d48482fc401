"""The rotation frontier (docs/key-generations.md §6): after a rotation retires a key epoch,
a version sealed under it is trusted only within the frontier the rotation recorded, and a
device's own offline writes are re-sealed under the new epoch before they are pushed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.memory import MemoryRelay
from replica import Replica
from replica.keys import LoginKeys
from replica.wire import parse_header
from tests.replica.test_sync_session import ACCOUNT, push_and_pull, sync
from tests.replica.test_upgrade import upgrade, wall_clock_ms
from tests.replica.v1 import V1Account


@pytest.fixture
def relay() -> MemoryRelay:
    return MemoryRelay(clock_ms=wall_clock_ms)


@pytest.fixture
def trio(tmp_path: Path, v1: V1Account, relay: MemoryRelay) -> Iterator[list[Replica]]:
    """Three devices of one generation-1 account, each with a record, all synced."""
    replicas = []
    for name in ("desk", "laptop", "phone"):
        replica = Replica.join(tmp_path / f"{name}.db", v1.bundle_bytes)
        replica.unlock_with_login_keys(v1.login)
        replicas.append(replica)
    upgrade(replicas[0], v1, v1.recovery_key)
    for replica in replicas[1:]:
        assert replica.adopt_bundle(replicas[0].key_bundle(), v1.login)
    for replica in replicas:
        replica.put("threads", f"from-{replica.path.stem}", {"title": replica.path.stem})
        sync(replica, relay)
    for replica in replicas:
        sync(replica, relay)
    yield replicas
    for replica in replicas:
        replica.close()


def revoke_phone(desk: Replica) -> LoginKeys:
    """Desk rotates to generation 2, revoking the phone, and unlocks with the new keys."""
    with desk.batch():
        login = desk.rotate_keys("a new passphrase, long enough", revoked_device="phone",
                                 device="desk")  # fmt: skip
    desk.unlock_with_login_keys(login)
    return login


def epochs_of(envelopes: list[bytes]) -> set[int]:
    return {parse_header(envelope).epoch for envelope in envelopes}


def pending(replica: Replica) -> list[bytes]:
    """The envelopes `replica` has yet to push, read from its file (nothing acknowledged)."""
    with sqlite3.connect(replica.path) as db:
        rows = db.execute("SELECT envelope FROM versions WHERE dirty = 1 ORDER BY id").fetchall()
    db.close()
    return [envelope for (envelope,) in rows]


def newest_epoch(replica: Replica) -> int:
    """The epoch `replica` seals its writes under now (its last write's)."""
    return parse_header(pending(replica)[-1]).epoch


def test_a_revoked_devices_new_versions_under_the_old_epoch_are_refused(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    desk, laptop, phone = trio
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    # The phone keeps generation 1: it overwrites a thread with a version that dominates
    # every write it knew of, and makes a new one.
    phone.put("threads", "from-desk", {"title": "taken over"})
    phone.put("threads", "planted", {"title": "planted"})
    desk.put("threads", "after", {"title": "after the rotation"})
    assert newest_epoch(phone) != newest_epoch(desk)
    sync(phone, relay)  # a relay that takes them: a lying one, or a folder
    for device in (desk, laptop):
        sync(device, relay)
        record = device.get("threads", "from-desk")
        assert record is not None and record.document == {"title": "desk"}
        assert device.get("threads", "planted") is None
        status = device.status()
        assert (status.quarantined, status.degraded) == (2, 0)  # refused, not damage


def test_versions_under_the_old_epoch_within_the_frontier_still_merge(
    trio: list[Replica], tmp_path: Path, v1: V1Account, relay: MemoryRelay
) -> None:
    """A device joining after the rotation reads every record written before it."""
    desk, _, _ = trio
    login = revoke_phone(desk)
    newcomer = Replica.join(tmp_path / "new.db", desk.key_bundle())
    newcomer.unlock_with_login_keys(login)
    sync(newcomer, relay)
    ids = sorted(record.id for record in newcomer.scan("threads"))
    assert ids == ["from-desk", "from-laptop", "from-phone"]
    assert newcomer.status().quarantined == 0
    newcomer.close()


def test_an_offline_write_is_resealed_under_the_new_epoch_when_the_keys_are_taken(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    desk, laptop, _ = trio
    laptop.put("threads", "offline", {"title": "written while desk rotated"})
    old_epoch = newest_epoch(laptop)
    login = revoke_phone(desk)
    desk.put("threads", "after", {"title": "after the rotation"})
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    assert newest_epoch(laptop) == newest_epoch(desk) != old_epoch  # re-sealed
    sync(laptop, relay)
    sync(desk, relay)
    record = desk.get("threads", "offline")
    assert record is not None and record.document == {"title": "written while desk rotated"}
    assert desk.status().quarantined == 0


def test_an_earlier_sealing_the_relay_holds_is_pushed_back_not_a_conflict(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """The relay stored the laptop's write but the answer was lost, and the rotation did not
    see it: the re-sealed copy meets `identity_conflict`, and the earlier bytes go again."""
    desk, laptop, _ = trio
    laptop.put("threads", "lost answer", {"title": "stored, answer lost"})
    session = laptop.sync_session()
    batch = session.next_batch()
    assert batch is not None
    relay.push(ACCOUNT, batch)  # stored; the laptop never hears of it
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    assert laptop.status().dirty == 1
    push_and_pull(laptop.sync_session(), relay)
    assert laptop.status().dirty == 0
    with sqlite3.connect(laptop.path) as db:
        assert db.execute("SELECT count(*) FROM resealed").fetchone() == (0,)
    db.close()


def test_a_version_the_rotating_device_held_is_inside_its_frontier(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """Desk held the laptop's edit behind a freshness lock while it rotated: once the lock
    ends, the edit merges there, and on a device that joins later."""
    desk, laptop, _ = trio
    lock = desk.lock_scope(collection="threads")
    laptop.put("threads", "from-laptop", {"title": "edited while desk held it"})
    sync(laptop, relay)
    sync(desk, relay)
    assert desk.status().held_for_lock == 1
    revoke_phone(desk)
    desk.release_lock(lock)
    record = desk.get("threads", "from-laptop")
    assert record is not None and record.document == {"title": "edited while desk held it"}
    assert desk.status().quarantined == 0
