"""What only the in-memory reference relay does: wipe, snapshot and restore in place, so replica
tests can stage a wiped or rolled-back relay (the shared behaviour is in test_storage.py)."""

from __future__ import annotations

from relay.memory import MemoryRelay
from replica import PushBatch
from tests.conftest import FakeClock
from tests.relay.conftest import HLC, NOW_MS, envelope

KEY = b"k" * 16


def test_wipe_restore_and_reseed_change_what_devices_see() -> None:
    r = MemoryRelay(clock_ms=FakeClock(NOW_MS))
    r.push("a", PushBatch([envelope(KEY, 1, HLC, {1: HLC})]))
    before = r.state("a")
    snapshot = r.snapshot()
    r.push("a", PushBatch([envelope(b"y" * 16, 1, HLC + 1, {1: HLC + 1})]))
    r.restore(snapshot)
    assert r.state("a") == before  # same storage id and epoch, head back to 1
    reseeded = r.reseed("a")
    assert reseeded.account_epoch != before.account_epoch
    r.restore(snapshot)  # a restore older than the reseed still shows another epoch
    assert r.state("a").account_epoch != reseeded.account_epoch
    r.wipe()
    assert r.state("a").storage_id != before.storage_id and r.state("a").head == 0


def test_data_operations_create_the_account_on_first_use() -> None:
    r = MemoryRelay(clock_ms=FakeClock(NOW_MS))
    assert r.pull("new", 0).entries == [] and r.state("new").head == 0
    assert r.account("new") is None  # used, but never registered
