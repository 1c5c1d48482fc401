"""Rollback visible: a real relay (uvicorn, SQLite) restored from an older copy of its file, or
wiped, answers with a head below what devices saw or a new storage id; a reseed gives the
account a new epoch every device sees on its next request; a restore older than that reseed
still shows an epoch other than the latest. Devices refuse each case (RollbackError)."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from replica import Replica
from replica.errors import RollbackError
from replica.wire import KeyProof, RelayState, encode_message
from tests.conftest import ReplicaFactory
from tests.relay.driver import Device
from tests.relay.server import RelayProcess


def relay_state(device: Device) -> RelayState:
    answer = device.http.get("/v1/state", headers=device.headers)
    answer.raise_for_status()
    return msgspec.msgpack.decode(answer.content, type=RelayState)


def check(replica: Replica, state: RelayState) -> None:
    replica.sync_session().check_relay_state(state)


@pytest.mark.slow
def test_restore_wipe_and_reseed_are_visible_to_devices(
    tmp_path: Path, make_replica: ReplicaFactory
) -> None:
    db, old = tmp_path / "relay.db", tmp_path / "old-copy.db"
    relay = RelayProcess(db, tmp_path / "relay.log", accept_unsigned=True).start()
    a_replica, b_replica = make_replica("a"), make_replica("b")
    a = Device.register(a_replica, relay.url, "acct", "laptop")
    b = a.join(b_replica, "phone")
    try:
        a_replica.put("notes", "n1", {"text": "one"})
        a.sync()
        b.sync()
        relay.stop()
        shutil.copy(db, old)  # the operator's older backup
        relay.start()
        a_replica.put("notes", "n2", {"text": "two"})
        a.sync()
        b.sync()
        seen = relay_state(a)
        assert seen.head == 2

        relay.stop()  # restored from the older copy: same storage id and epoch, lower head
        shutil.copy(old, db)
        relay.start()
        restored = relay_state(a)
        assert restored.storage_id == seen.storage_id and restored.head < seen.head
        with pytest.raises(RollbackError):
            check(a_replica, restored)
        with pytest.raises(RollbackError):
            b.sync()  # the page's state is refused: nothing merged, nothing read as deleted
        assert b_replica.get("notes", "n2") is not None

        # a reseeds: a new epoch, and every version it holds pushed again
        proof = encode_message(KeyProof(a.auth_key))
        answer = a.http.post("/v1/reseed", content=proof, headers=a.headers)
        reseeded = msgspec.msgpack.decode(answer.content, type=RelayState)
        assert reseeded.account_epoch != seen.account_epoch
        a_replica.sync_session().reseed()
        a.sync()
        assert relay_state(a).head >= 2
        with pytest.raises(RollbackError):
            check(b_replica, relay_state(b))  # b sees the new epoch on its next request
        b_replica.sync_session().reseed()
        b.sync()
        assert b_replica.get("notes", "n2") is not None
        latest = relay_state(a)

        relay.stop()  # a restore older than the reseed still shows another epoch
        shutil.copy(old, db)
        relay.start()
        assert relay_state(a).account_epoch != latest.account_epoch
        with pytest.raises(RollbackError):
            check(a_replica, relay_state(a))

        relay.stop()  # wiped: a new database, a new storage id; the account is gone
        db.unlink()
        relay.start()
        assert a.http.get("/v1/state", headers=a.headers).status_code == 401
        again = Device.register(make_replica("c"), relay.url, "acct", "laptop")
        assert again.session.state.storage_id != seen.storage_id
        with pytest.raises(RollbackError):
            check(a_replica, again.session.state)
        again.close()
    finally:
        a.close()
        b.close()
        relay.kill()
