"""The rotation frontier (docs/key-generations.md §6): after a rotation retires a key epoch,
a version sealed under it is trusted only within the frontier the rotation recorded, and a
device's own offline writes are re-sealed under the new epoch before they are pushed."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.memory import MemoryRelay
from replica import Replica, ReplicaLockedError, clock
from replica.envelope import Identity, seal
from replica.keys import AccountKeys, Frontier, LoginKeys
from replica.wire import PushBatch, RelayState, parse_header
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


def generation_keys_of(replica: Replica) -> AccountKeys:
    return replica._core.keys()


def newest_epoch_of(phone: Replica) -> int:
    """The epoch the phone, which kept the old keys, seals under."""
    return generation_keys_of(phone).key_epoch


def forge(
    phone: Replica, id: str, document: dict[str, str], vector: dict[int, int], hlc: int
) -> bytes:
    """A version the phone seals with the keys it kept, at a dot and vector of its choice."""
    keys = generation_keys_of(phone)
    full = {**vector, phone.node: hlc}
    return seal(keys, Identity("default", "threads", id), hlc=hlc, node=phone.node,
                vector=full, deleted=False, document=document, nonce=os.urandom(12))  # fmt: skip


def pending(replica: Replica) -> list[bytes]:
    """The envelopes `replica` has yet to push, read from its file (nothing acknowledged)."""
    with sqlite3.connect(replica.path) as db:
        rows = db.execute("SELECT envelope FROM versions WHERE dirty = 1 ORDER BY id").fetchall()
    db.close()
    return [envelope for (envelope,) in rows]


def pending_or_probe(replica: Replica) -> bytes:
    """The last envelope `replica` wrote and has not pushed (a probe write if none)."""
    if not pending(replica):
        replica.put("threads", "probe", {"title": "probe"})
    return pending(replica)[-1]


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


def test_a_revoked_device_cannot_use_the_dots_below_the_frontier_either(
    trio: list[Replica], relay: MemoryRelay, tmp_path: Path
) -> None:
    """A vector within the frontier is not enough: the phone can mint a dot below its own
    entry there that it never used, with a vector that dominates the desk's thread. Pulled
    past the head the rotation saw, on the relay it saw, it is refused all the same."""
    desk, laptop, phone = trio
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    frontier = generation_keys_of(desk).retired_epochs[newest_epoch_of(phone)]
    below = frontier.vector[phone.node] - 1  # a dot of the phone's the frontier covers
    forged = forge(phone, "from-desk", {"title": "taken over"}, frontier.vector, below)
    assert frontier.trusts(parse_header(forged).vector, None, None)  # the vector alone passes
    relay.push(ACCOUNT, PushBatch([forged]))  # a relay that takes it
    newcomer = Replica.join(tmp_path / "new.db", desk.key_bundle())
    newcomer.unlock_with_login_keys(login)
    for device in (desk, laptop, newcomer):
        sync(device, relay)
        assert device.status().quarantined == 1
    for device in (desk, laptop):
        record = device.get("threads", "from-desk")
        assert record is not None and record.document == {"title": "desk"}
    # the relay that took the forgery compacted the real version away: the newcomer has
    # neither (the lying relay's doing), and never shows the phone's
    assert newcomer.get("threads", "from-desk") is None
    newcomer.close()


def test_a_frontier_trusts_only_a_vector_within_it_and_a_seq_the_rotation_saw() -> None:
    frontier = Frontier({1: 10, 2: 20}, head=7, storage_id="s", account_epoch="e")
    relay = RelayState("s", "e", 9)
    assert frontier.trusts({1: 10, 2: 5}, 7, relay)
    assert not frontier.trusts({1: 11}, 7, relay)  # beyond the vector
    assert not frontier.trusts({3: 1}, None, None)  # a node it never saw
    assert not frontier.trusts({1: 1}, 8, relay)  # pulled past the head it saw
    for elsewhere in (RelayState("another", "e", 9), RelayState("s", "reseeded", 9)):
        assert frontier.trusts({1: 1}, 8, elsewhere)  # seqs renumbered: they mean nothing
    assert frontier.trusts({1: 1}, None, None)  # released from a hold: checked on arrival
    assert frontier.is_enforced and not Frontier({1: 10}, head=7).is_enforced


def test_a_version_the_rotating_device_held_is_inside_its_frontier(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """Desk held the laptop's edit behind a freshness lock while it rotated: once the lock
    ends, the edit merges there."""
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


def test_an_offline_write_under_a_frontier_inflated_by_the_revoked_device_arrives(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """The frontier is a per-node maximum: before its revocation the phone pushed a vector
    with an entry for the laptop a minute ahead, so the laptop's offline write has a vector
    within the frontier. It is re-sealed all the same (every pending write under a retired
    epoch is), and arrives."""
    desk, laptop, phone = trio
    ahead = clock.pack_hlc(clock.hlc_ms(parse_header(pending_or_probe(laptop)).hlc) + 60_000, 0)
    planted = forge(phone, "planted", {"title": "ahead"}, {laptop.node: ahead}, ahead)
    relay.push(ACCOUNT, PushBatch([planted]))  # the phone is not revoked yet: it may
    sync(desk, relay)
    laptop.put("threads", "offline", {"title": "written offline"})
    assert generation_keys_of(desk).key_epoch == newest_epoch(laptop)
    login = revoke_phone(desk)
    assert generation_keys_of(desk).retired_epochs[newest_epoch(laptop)].vector[laptop.node] > (
        parse_header(pending(laptop)[-1]).hlc
    )  # the write is within the frontier's vector
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    sync(laptop, relay)
    sync(desk, relay)
    record = desk.get("threads", "offline")
    assert record is not None and desk.status().quarantined == 0


def stored_epochs(relay: MemoryRelay, id_key: bytes) -> list[int]:
    """The key epochs of the relay's stored versions of one opaque key."""
    page = relay.pull(ACCOUNT, 0)
    return [
        parse_header(e.envelope).epoch
        for e in page.entries
        if parse_header(e.envelope).key == id_key
    ]


def test_an_earlier_sealing_the_relay_holds_is_replaced_and_read_everywhere(
    trio: list[Replica], relay: MemoryRelay, tmp_path: Path
) -> None:
    """The relay stored the laptop's write, the answer was lost, and the desk pulled it before
    rotating: the laptop's re-sealed copy replaces it on the relay, the desk keeps the copy it
    trusted, and a device joining after the rotation reads the new one."""
    desk, laptop, _ = trio
    laptop.put("threads", "lost answer", {"title": "stored, answer lost"})
    batch = laptop.sync_session().next_batch()
    assert batch is not None
    relay.push(ACCOUNT, batch)  # stored; the laptop never hears of it
    key = parse_header(batch.envelopes[-1]).key
    sync(desk, relay)
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    new_epoch = generation_keys_of(desk).key_epoch
    assert newest_epoch(laptop) == new_epoch  # re-sealed
    sync(laptop, relay)
    assert laptop.status().dirty == 0 and stored_epochs(relay, key) == [new_epoch]
    newcomer = Replica.join(tmp_path / "new.db", desk.key_bundle())
    newcomer.unlock_with_login_keys(login)
    sync(desk, relay)
    sync(newcomer, relay)
    for device in (desk, newcomer):
        record = device.get("threads", "lost answer")
        assert record is not None and device.status().quarantined == 0
    newcomer.close()


def test_a_write_stored_while_the_rotation_was_under_way_arrives_re_sealed(
    trio: list[Replica], relay: MemoryRelay, tmp_path: Path
) -> None:
    """The relay takes no rotation back for versions stored past the head it names (the
    device being revoked could hold it off so): the laptop pushed one then. Every device that
    took the new keys refuses that sealing; the laptop seals all its own versions again when
    it takes them, so its write arrives everywhere."""
    desk, laptop, _ = trio
    sync(desk, relay)
    laptop.put("threads", "during", {"title": "pushed while desk rotated"})
    sync(laptop, relay)  # stored past the head desk's frontier names
    login = revoke_phone(desk)
    sync(desk, relay)
    assert desk.get("threads", "during") is None  # refused: beyond the frontier
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    sync(laptop, relay)
    newcomer = Replica.join(tmp_path / "new.db", desk.key_bundle())
    newcomer.unlock_with_login_keys(login)
    for device in (desk, newcomer):
        sync(device, relay)
        record = device.get("threads", "during")
        assert record is not None and record.document == {"title": "pushed while desk rotated"}
    assert newcomer.status().quarantined == 0
    assert sorted(r.id for r in newcomer.scan("threads")) == [
        "during",
        "from-desk",
        "from-laptop",
        "from-phone",
    ]
    newcomer.close()


def pull_only(replica: Replica, relay: MemoryRelay) -> None:
    """What `sealsync upgrade` does first: a version-1 device cannot push any more."""
    session = replica.sync_session()
    while True:
        page = relay.pull(ACCOUNT, session.cursor)
        session.apply_page(page)
        if not page.has_more:
            return


def two_version_1_devices(tmp_path: Path, v1: V1Account) -> tuple[Replica, Replica]:
    devices = []
    for name in ("u", "v"):
        device = Replica.join(tmp_path / f"{name}.db", v1.bundle_bytes)
        device.unlock_with_login_keys(v1.login)
        devices.append(device)
    return devices[0], devices[1]


def test_an_upgrade_whose_last_push_lost_its_answer_loses_nothing(
    tmp_path: Path, v1: V1Account, relay: MemoryRelay
) -> None:
    u, v = two_version_1_devices(tmp_path, v1)
    u.put("threads", "b", {"title": "stored, answer lost"})
    batch = u.sync_session().next_batch()
    assert batch is not None
    relay.push(ACCOUNT, batch)
    pull_only(u, relay)
    upgrade(u, v1, v1.recovery_key)
    assert v.adopt_bundle(u.key_bundle(), v1.login)
    sync(v, relay)
    sync(u, relay)
    record = v.get("threads", "b")
    assert record is not None and v.status().quarantined == 0
    assert u.status().dirty == 0


def test_an_upgrade_keeps_in_its_frontier_what_an_offline_overwrite_replaced(
    tmp_path: Path, v1: V1Account, relay: MemoryRelay
) -> None:
    """The upgrading device overwrote v's record offline: the version it replaced is only in
    the pending write's vector now, and a device joining before that write is pushed still
    trusts v's copy on the relay."""
    u, v = two_version_1_devices(tmp_path, v1)
    v.put("threads", "x", {"title": "by v"})
    sync(v, relay)
    sync(u, relay)
    u.put("threads", "x", {"title": "u, offline"})
    pull_only(u, relay)
    upgrade(u, v1, v1.recovery_key)
    w = Replica.join(tmp_path / "w.db", u.key_bundle())
    w.unlock_with_login_keys(v1.login)
    sync(w, relay)
    record = w.get("threads", "x")
    assert record is not None and record.document == {"title": "by v"}
    assert w.status().quarantined == 0
    for device in (u, v, w):
        device.close()


def test_after_a_wipe_the_reseeds_push_the_bytes_everyone_holds(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """A reseed marks every version for pushing again: those acknowledged before keep their
    bytes, and the relay keeps the later of two sealings of one dot whichever comes first
    (the laptop holds the desk's versions as sealed before the desk re-sealed them)."""
    desk, laptop, _ = trio
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    relay.wipe()
    for device in (desk, laptop):
        session = device.sync_session()
        session.reseed()
        device.lock()
        device.unlock_with_login_keys(login)  # an unlock after the reseed re-seals nothing
        push_and_pull(device.sync_session(), relay)
    for device in (desk, laptop):
        sync(device, relay)
        assert device.status().dirty == 0 and device.status().quarantined == 0


def test_repair_takes_nothing_back_from_quarantine_under_a_retired_epoch(
    trio: list[Replica], relay: MemoryRelay
) -> None:
    """Where a quarantined version came from, and so whether the frontier vouches for it, is
    no longer known: one under a retired epoch stays, even though it opens."""
    desk, _, phone = trio
    forged = forge(phone, "planted", {"title": "by the phone"}, {}, clock.pack_hlc(1, 0))
    revoke_phone(desk)
    with desk._core.write_transaction():
        desk._core.store.quarantine("pull", parse_header(forged).key, forged, "untrusted", 1)
    assert desk._core.opener_or_raise().open(forged) is not None  # it opens: the keys are kept
    assert desk.repair().readmitted == 0 and desk.status().quarantined == 1
    assert desk.get("threads", "planted") is None


@pytest.mark.parametrize("relock", [False, True], ids=["same handle", "unlocked again"])
def test_a_write_made_with_keys_another_handle_retired_is_re_sealed_before_it_is_pushed(
    trio: list[Replica], relay: MemoryRelay, v1: V1Account, relock: bool
) -> None:
    """An app kept the laptop's file open with the old keys while `sealsync sync` took the
    new ones: its write is sealed under the retired epoch after the re-sealing pass. It is
    sealed again before it is pushed (at each push pass, and at each unlock), so it arrives
    instead of being refused everywhere."""
    desk, laptop, _ = trio
    app = Replica.open(laptop.path)
    app.unlock_with_login_keys(v1.login)
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    app.put("threads", "late", {"title": "written with the old keys"})
    app.close()
    if relock:
        laptop.lock()
        laptop.unlock_with_login_keys(login)
    sync(laptop, relay)  # unlocked before the write, or after: re-sealed before pushing
    sync(desk, relay)
    record = desk.get("threads", "late")
    assert record is not None and desk.status().quarantined == 0


def test_a_handle_whose_keys_another_took_over_repairs_nothing(
    trio: list[Replica], v1: V1Account
) -> None:
    """What its old keys cannot open was re-sealed, not damaged: a repair there would set
    this device's own versions aside."""
    desk, laptop, _ = trio
    app = Replica.open(laptop.path)
    app.unlock_with_login_keys(v1.login)
    login = revoke_phone(desk)
    assert laptop.adopt_bundle(desk.key_bundle(), login)
    for check in (app.diagnose, app.repair):
        with pytest.raises(ReplicaLockedError, match="changed since it was unlocked"):
            check()
    app.close()
    assert laptop.status().quarantined == 0 and laptop.get("threads", "from-laptop") is not None
