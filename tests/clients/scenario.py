"""One seeded script of offline edits and syncs by three devices, replayable on any relay and
transport so runs can be compared: same seed, same writes, same sync calls, same clock."""

from __future__ import annotations

import random

from tests.clients.conftest import Device, Fleet, contents
from tests.conftest import FakeClock

IDS = [f"n{i}" for i in range(8)]


def play(fleet: Fleet, clock: FakeClock, seed: int, steps: int = 60) -> list[Device]:
    """Three devices edit offline (puts, deletes, one concurrent edit of a record) and sync in
    random order, then sync until every replica reads the same."""
    rng = random.Random(seed)
    devices = [fleet.add(name) for name in ("a", "b", "c")]
    for step in range(steps):
        clock.advance(7)
        device = rng.choice(devices)
        record = rng.choice(IDS)
        if rng.random() < 0.2:
            device.replica.delete("notes", record)
        else:
            device.replica.put(
                "notes", record, {"text": f"step {step}", "by": devices.index(device)}
            )
        if rng.random() < 0.3:
            rng.choice(devices).driver.sync()
        if step == steps // 2:  # everyone in step, then one record edited on two devices offline
            for d in devices:
                d.driver.sync()
            for d in devices[:2]:
                clock.advance(3)
                d.replica.put("threads", "shared", {"title": f"from {devices.index(d)}"})
    converge(devices, rng)
    return devices


def converge(devices: list[Device], rng: random.Random) -> None:
    for _ in range(4):
        for device in rng.sample(devices, len(devices)):
            device.driver.sync()
        if all(contents(d.replica) == contents(devices[0].replica) for d in devices):
            return
    raise AssertionError("replicas did not converge in four rounds of syncs")
