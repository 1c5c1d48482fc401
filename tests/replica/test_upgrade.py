"""Moving a version-1 replica to key bundle version 2 (`Replica.upgrade_keys`), and another
device taking the newer bundle (`Replica.adopt_bundle`), from the committed v1 fixture
(docs/key-generations.md §5, §7)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from relay.memory import MemoryRelay
from replica import Replica, WrongKeyError
from replica.bundles import is_foreign, new_account, parse_bundle
from replica.errors import InvalidArgumentError, ProtocolError, ReplicaLockedError
from replica.generations import (
    KeyBundleV2,
    OpenedGeneration,
    bundle_v2_to_bytes,
    open_with_kek,
    rotate,
    seal_generation,
    sign_chain,
)
from replica.keys import Frontier, passphrase_login_keys
from replica.wire import MAX_HLC, KdfParams, parse_header
from tests.replica.test_sync_session import push_and_pull
from tests.replica.v1 import V1Account


def wall_clock_ms() -> int:
    """The replicas' own clock (the default): the relay's drift bound compares with it."""
    return time.time_ns() // 1_000_000


@pytest.fixture
def relay() -> MemoryRelay:
    return MemoryRelay(clock_ms=wall_clock_ms)


@pytest.fixture
def pair(tmp_path: Path, v1: V1Account, relay: MemoryRelay) -> Iterator[tuple[Replica, Replica]]:
    """Two devices of the version-1 account, unlocked, each with a record synced."""
    replicas = []
    for name in ("a", "b"):
        replica = Replica.join(tmp_path / f"{name}.db", v1.bundle_bytes)
        replica.unlock_with_login_keys(v1.login)
        replica.put("threads", f"from-{name}", {"title": name})
        push_and_pull(replica.sync_session(), relay)
        replicas.append(replica)
    push_and_pull(replicas[0].sync_session(), relay)
    yield replicas[0], replicas[1]
    for replica in replicas:
        replica.close()


def upgrade(replica: Replica, v1: V1Account, recovery_key: str) -> None:
    with replica.batch():
        replica.upgrade_keys(v1.login, recovery_key, device="desk")
    replica.unlock_with_login_keys(v1.login)


def stored_epochs(path: Path) -> set[int]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT envelope FROM versions").fetchall()
    db.close()
    return {parse_header(envelope).epoch for (envelope,) in rows}


def test_an_upgraded_replica_keeps_every_record_and_writes_under_a_new_epoch(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    a, _ = pair
    assert a.key_generation == 0
    upgrade(a, v1, v1.recovery_key)
    bundle = parse_bundle(a.key_bundle())
    assert isinstance(bundle, KeyBundleV2) and (bundle.generation, bundle.key_epoch) == (1, 1)
    assert a.key_generation == 1 and bundle.kdf == v1.bundle.kdf  # the passphrase stays
    for record in ("from-a", "from-b"):
        found = a.get("threads", record)
        assert found is not None and found.document == {"title": record[-1]}
    a.put("threads", "after", {"title": "new"})
    assert stored_epochs(a.path) == {0, 1}
    secrets = open_with_kek(bundle, v1.login.wrapping_key).secrets
    assert secrets.frontiers[0].vector  # what the replica knew, for slice 4's checks
    a.lock()
    a.unlock_with_recovery_key(v1.recovery_key)  # the account's recovery key opens it too
    assert a.get("threads", "after") is not None
    a.lock()
    with pytest.raises(WrongKeyError):
        a.unlock_with_key(v1.keys.unlock_key)  # the v1 account key opens nothing of it


def test_an_upgrade_takes_only_the_accounts_own_recovery_key_and_happens_once(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    a, _ = pair
    before = a.key_bundle()
    with pytest.raises(WrongKeyError):
        upgrade(a, v1, "AAAA-" * 13 + "AAAA")
    assert a.key_bundle() == before and a.key_generation == 0
    upgrade(a, v1, v1.recovery_key)
    with pytest.raises(InvalidArgumentError, match="version 2"):
        upgrade(a, v1, v1.recovery_key)


def test_the_other_device_adopts_the_newer_bundle_and_never_an_older_one(
    pair: tuple[Replica, Replica], v1: V1Account, relay: MemoryRelay
) -> None:
    a, b = pair
    upgrade(a, v1, v1.recovery_key)
    a.put("threads", "after", {"title": "under epoch 1"})
    push_and_pull(a.sync_session(), relay)
    push_and_pull(b.sync_session(), relay)
    assert b.get("threads", "after") is None  # sealed under an epoch b does not know yet
    assert b.status().held_other == {"epoch": 1}
    assert not b.adopt_bundle(v1.bundle_bytes, v1.login)  # the same version: nothing to take
    assert b.adopt_bundle(a.key_bundle(), v1.login)
    assert b.key_bundle() == a.key_bundle() and b.key_generation == 1
    found = b.get("threads", "after")  # the held version merged with the new keys
    assert found is not None and found.document == {"title": "under epoch 1"}
    assert not b.adopt_bundle(v1.bundle_bytes, v1.login)  # never back to version 1
    assert not b.adopt_bundle(a.key_bundle(), v1.login)


def test_a_newer_bundle_of_another_account_is_refused_and_changes_nothing(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    """It opens with the same passphrase (same salt and costs), but it is not this account:
    taking it would strand every record under another index key."""
    _, b = pair
    stranger = new_account(v1.passphrase, os.urandom, v1.bundle.kdf)
    before = b.key_bundle()
    with pytest.raises(ProtocolError, match="another account"):
        b.adopt_bundle(bundle_v2_to_bytes(stranger.bundle), v1.login)
    assert b.key_bundle() == before and b.key_generation == 0


def test_a_newer_bundle_that_replaces_an_epoch_key_is_refused(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    """Anyone holding the passphrase could make a generation 1 with the account's id, index
    and scope keys but another key for epoch 0: taking it would strand every record."""
    a, b = pair
    upgrade(a, v1, v1.recovery_key)
    bundle = parse_bundle(a.key_bundle())
    assert isinstance(bundle, KeyBundleV2)
    opened = open_with_kek(bundle, v1.login.wrapping_key)
    epochs = {**opened.secrets.epoch_keys, 0: os.urandom(32)}
    forged = OpenedGeneration(
        opened.key, msgspec.structs.replace(opened.secrets, epoch_keys=epochs)
    )
    sealed = seal_generation(forged, bundle.kdf, v1.login.wrapping_key, os.urandom, None)
    with pytest.raises(ProtocolError, match="epoch keys"):
        b.adopt_bundle(bundle_v2_to_bytes(sealed), v1.login)
    assert b.key_generation == 0


def both_at_generation_1(
    pair: tuple[Replica, Replica], v1: V1Account
) -> tuple[KeyBundleV2, OpenedGeneration]:
    """a upgraded, b took it: generation 1's bundle and its opened secrets."""
    a, b = pair
    upgrade(a, v1, v1.recovery_key)
    assert b.adopt_bundle(a.key_bundle(), v1.login)
    one = parse_bundle(a.key_bundle())
    assert isinstance(one, KeyBundleV2)
    return one, open_with_kek(one, v1.login.wrapping_key)


def rotated_from(opened: OpenedGeneration) -> OpenedGeneration:
    return rotate(opened.secrets, os.urandom, frontier=Frontier({}, 0), revoked_device=None,
                  rotated_by="desk", now_ms=0)  # fmt: skip


def test_a_later_generation_is_taken_only_when_the_current_one_vouches_for_it(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    one, opened = both_at_generation_1(pair, v1)
    _, b = pair
    two = rotated_from(opened)
    kek, kdf = v1.login.wrapping_key, one.kdf
    unsigned = seal_generation(two, kdf, kek, os.urandom, None)
    with pytest.raises(ProtocolError, match="not vouched for"):
        b.adopt_bundle(bundle_v2_to_bytes(unsigned), v1.login)
    chain = sign_chain(two.secrets, opened.secrets.signing_key)
    assert b.adopt_bundle(
        bundle_v2_to_bytes(seal_generation(two, kdf, kek, os.urandom, chain)), v1.login
    )
    assert b.key_generation == 2


def test_a_process_whose_keys_another_process_upgraded_stops_signing_and_says_why(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    """`sync --watch` beside `sealsync upgrade` on one file: the watcher's keys are version 1,
    the file's version 2; it must not push unsigned into a refusal loop."""
    a, _ = pair
    with Replica.open(a.path) as other:
        other.unlock_with_login_keys(v1.login)
        upgrade(other, v1, v1.recovery_key)
    a.put("threads", "late", {"title": "x"})
    session = a.sync_session()
    batch = session.next_batch()
    assert batch is not None
    with pytest.raises(ReplicaLockedError, match="changed since it was unlocked"):
        session.sign(batch, "ann", "desk")
    with pytest.raises(ProtocolError, match="out of bounds"):
        session.sign_above(MAX_HLC)


def test_a_device_that_missed_two_rotations_takes_the_latest_on_the_passphrase(
    pair: tuple[Replica, Replica], v1: V1Account
) -> None:
    """The chain past its own generation is not in any bundle it can read: the passphrase,
    which every rotation changes, is what it trusts then."""
    one, first = both_at_generation_1(pair, v1)
    _, b = pair
    two = rotated_from(first)
    three = rotated_from(two)
    chain = sign_chain(three.secrets, two.secrets.signing_key)
    kek = v1.login.wrapping_key  # a revoked device's forgery: the old passphrase, its salt
    forged = seal_generation(three, one.kdf, kek, os.urandom, chain)
    with pytest.raises(ProtocolError, match="not made by a rotation"):
        b.adopt_bundle(bundle_v2_to_bytes(forged), v1.login)
    kdf = KdfParams(salt=os.urandom(16))  # every rotation draws a new salt
    login = passphrase_login_keys(v1.passphrase, kdf)
    kek = login.wrapping_key
    assert b.adopt_bundle(
        bundle_v2_to_bytes(seal_generation(three, kdf, kek, os.urandom, chain)), login
    )
    assert b.key_generation == 3


def test_a_relay_bundle_is_foreign_when_older_or_under_another_key(v1: V1Account) -> None:
    """What a device refuses after a login (clients/access.py): an account another device
    registered again after the relay lost it. A version-1 device cannot tell."""
    one = new_account(v1.passphrase, os.urandom, v1.bundle.kdf).bundle
    opened = open_with_kek(one, v1.login.wrapping_key)
    two = seal_generation(rotated_from(opened), one.kdf, v1.login.wrapping_key, os.urandom, None)
    stranger = new_account(v1.passphrase, os.urandom, v1.bundle.kdf).bundle  # generation 1 too
    assert is_foreign(one, two) and is_foreign(v1.bundle, one) and is_foreign(stranger, one)
    assert not is_foreign(one, one) and not is_foreign(two, one)
    assert not is_foreign(one, v1.bundle) and not is_foreign(v1.bundle, v1.bundle)
