"""Tombstone collection runs over every account: what `sealsync relay collect` does once,
and what `relay serve` does every `collect_every_s` with the `collect` setting (off by
default: specs/protocol.md §5.1).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from relay.collection import DAY_MS
from relay.config import RelayConfig
from relay.storage import Storage

log = logging.getLogger(f"sealsync.{__name__}")


def collect_all(storage: Storage, name: str, horizon_ms: int | None) -> dict[str, object]:
    """Runs over one account until one finds nothing more; their totals."""
    runs = versions = size = released = flagged = 0
    while True:
        report = storage.collect(name, horizon_ms=horizon_ms)
        released, flagged = released + report.released, flagged + report.flagged
        if report.run is None:
            break
        runs, versions, size = runs + 1, versions + report.versions, size + report.bytes
    return {
        "account": name,
        "ack_floor": report.ack_floor,
        "runs": runs,
        "versions": versions,
        "bytes": size,
        "released": released,
        "flagged": flagged,
    }


def collect_every_account(storage: Storage, horizon_ms: int | None) -> list[dict[str, object]]:
    """`collect_all` over each account, in name order."""
    return [collect_all(storage, account.name, horizon_ms) for account in storage.accounts()]


async def collect_periodically(
    storage: Storage,
    every_s: float,
    horizon_days: int,
    call: Callable[..., Awaitable[Any]],
    stop: asyncio.Event,
) -> None:
    """Every `every_s` until `stop`, run collection over every account in a worker thread
    (`call`), and log what it freed; a failure is logged and the next round tries again."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        try:
            totals = await call(collect_every_account, storage, horizon_days * DAY_MS)
        except Exception:
            log.exception("tombstone collection failed; it runs again later")
            continue
        freed = [t for t in totals if t["runs"] or t["released"] or t["flagged"]]
        for total in freed:
            log.info("tombstones collected", extra=total)


@asynccontextmanager
async def collection_runs(
    storage: Storage, config: RelayConfig, call: Callable[..., Awaitable[Any]]
) -> AsyncIterator[None]:
    """While the relay serves: `collect_periodically` if the `collect` setting is on. At
    shutdown a run under way finishes before the storage is closed."""
    if not config.collect:
        yield
        return
    every_s, days, stop = config.collect_every_s, config.tombstone_horizon_days, asyncio.Event()
    task = asyncio.create_task(collect_periodically(storage, every_s, days, call, stop))
    try:
        yield
    finally:
        stop.set()
        await task
