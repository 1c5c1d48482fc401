"""Tombstone collection on the relay (docs/tombstone-collection.md §2), the parts every
storage backend shares, as `relay.versions` is for pushes.

A run deletes the stored tombstones that every device of the account has acknowledged
pulling (the lowest of their last acks, the *floor*), each only while it is its key's sole
version: a tombstone beside a concurrent edit stays until a write resolves them. The run
takes a seq of the account's, so devices meet it in order, once, and keeps the dots it
deleted: as markers, sent on the page that ends at the run, and as ghosts, which refuse a
re-push of anything they covered. Both go once every device has pulled past the run.

With a *horizon*, a device that has not acknowledged anything for that long (a lost phone)
holds nothing back: it is left out of the floor, and once a run collects or releases what
it has not pulled past, it is flagged to *resync* (pull everything again before it may
push: `resync_required`), since it will never see those markers. No run starts while a
flagged device is pulling everything (within `RESYNC_GRACE_MS` of its start): it could
pass a version before its tombstone is collected and miss the run's markers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from replica.errors import InvalidArgumentError
from replica.wire import MAX_RUN_MARKERS, PageEntry, VersionVector, dominates

DAY_MS = 24 * 3600 * 1000
RESYNC_GRACE_MS = DAY_MS
"""How long a device's full resync holds runs back, from its first pull; past it, a resync
still going is taken to have stopped (the device starts again at its next sync)."""


MAX_HORIZON_MS = 10 * 365 * DAY_MS


def check_run_bounds(limit: int, horizon_ms: int | None) -> None:
    """A run's size and horizon, within their bounds (`Storage.collect`)."""
    if not 1 <= limit <= MAX_RUN_MARKERS:
        raise InvalidArgumentError(f"a run collects 1..{MAX_RUN_MARKERS}, not {limit}")
    check_horizon(horizon_ms)


def check_horizon(horizon_ms: int | None) -> None:
    """A horizon within its bounds (`Storage.collect`, `Storage.accounts`)."""
    if horizon_ms is not None and not 1 <= horizon_ms <= MAX_HORIZON_MS:
        raise InvalidArgumentError(
            f"a horizon is 1 ms..{MAX_HORIZON_MS} ms (10 years), not {horizon_ms}"
        )


class Standing(NamedTuple):
    """What collection knows of one device."""

    id: str
    ack: int | None
    ack_ms: int | None
    created_ms: int
    resync: bool
    resync_ms: int | None
    """When its current full resync began (its first pull asking for one); None before."""


class Split(NamedTuple):
    """An account's devices as a run sees them."""

    floor: int | None
    """The lowest last ack of the active devices: None while one has not acked yet (or
    none is active), and while a resync under way holds runs back."""
    stale: list[Standing]
    """Devices past the horizon and not flagged yet."""


def resync_under_way(device: Standing, now_ms: int) -> bool:
    """Whether a flagged device's full resync began within `RESYNC_GRACE_MS`: runs wait."""
    return device.resync_ms is not None and device.resync_ms > now_ms - RESYNC_GRACE_MS


def split(devices: Iterable[Standing], now_ms: int, horizon_ms: int | None) -> Split:
    """The floor over the devices that count, and those the horizon leaves out."""
    active: list[int | None] = []
    stale: list[Standing] = []
    resyncing = False
    for device in devices:
        if device.resync:
            resyncing = resyncing or resync_under_way(device, now_ms)
            continue
        seen = device.ack_ms if device.ack_ms is not None else device.created_ms
        if horizon_ms is not None and seen < now_ms - horizon_ms:
            stale.append(device)
        else:
            active.append(device.ack)
    return Split(None if resyncing else ack_floor(active), stale)


def waited_for(
    devices: Sequence[Standing], now_ms: int, horizon_ms: int | None
) -> tuple[int | None, str | None]:
    """`AccountSummary.ack_floor` and `held_back_by`, as a run with this horizon sees them:
    the floor, and the device runs wait for: one pulling everything again, else one that
    counts and has not acknowledged anything, else the one whose last ack is the floor
    (ties: the first by id). Left-out and flagged devices hold nothing back."""
    floor, stale = split(devices, now_ms, horizon_ms)
    left_out = {device.id for device in stale}

    def waiting(device: Standing) -> tuple[bool, bool, int, str]:
        return (not device.resync, device.ack is not None, device.ack or 0, device.id)

    counted = [
        device
        for device in devices
        if device.id not in left_out and (not device.resync or resync_under_way(device, now_ms))
    ]
    held = min(counted, key=waiting, default=None)
    return floor, None if held is None else held.id


def to_flag(stale: Iterable[Standing], top: int | None) -> list[str]:
    """The stale devices that have not pulled past `top`, the latest run this call made or
    released: they would never see its markers."""
    if top is None:
        return []
    return [d.id for d in stale if d.ack is None or d.ack < top]


class Candidate(NamedTuple):
    """A stored tombstone a run may delete."""

    seq: int
    key: bytes
    node: int
    hlc: int
    vector: bytes
    size: int


def ack_floor(acks: Iterable[int | None]) -> int | None:
    """The seq every device has pulled up to: None while one of them has not acknowledged
    anything (a device that never said how far it pulled holds every tombstone back)."""
    values = list(acks)
    if not values or None in values:
        return None
    return min(value for value in values if value is not None)


def haunted(ghosts: Sequence[VersionVector], node: int, hlc: int) -> bool:
    """Whether a pushed version is one a run deleted, or one that such a tombstone covered:
    either way every device has moved past it, and storing it again would bring it back."""
    return any(dominates(vector, (node, hlc)) for vector in ghosts)


def page_end(
    entries: Sequence[PageEntry], has_more: bool, run: int | None, head: int, cursor: int
) -> tuple[int, bool]:
    """A page's next cursor and whether more follows it. The page stops at its last entry
    while versions before the next run (or the head) remain; it ends at the run and carries
    its markers once it reaches it; without a run, it ends at the head."""
    if has_more:
        return entries[-1].seq, True
    if run is not None:
        return run, run < head
    return max(head, cursor), False
