"""`SyncDriver`: runs a replica's sans-I/O sync session over a `RelayClient`.

One round (specs/protocol.md §4): restart the pass; push every batch and acknowledge its
receipts; pull pages from the cursor and merge them until the relay has no more. Each step is
resumable: a version stops being dirty only on its receipt, and the cursor moves only with
the page it covers, so a round cut short anywhere is finished by the next one. Requests whose
outcome is unknown are sent again (`clients.retry`) — a push of the same bytes gets the same
receipts, a pull is a read. A relay found wiped or rolled back stops the round with a
`RollbackError`; an account epoch changed by another device's reseed is followed at once.
"""

from __future__ import annotations

import functools
import logging
import random as random_module
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from clients.errors import RelayClientError
from clients.http import RelayClient
from clients.live import HeadFeed
from clients.retry import Backoff, Retrier
from replica import ChangeEvent, Replica, RollbackError, SyncSession
from replica.wire import RelayLimits

log = logging.getLogger(__name__)

DEFAULT_BATCH_COUNT = 4000
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
FRAMING_BYTES = 1024
"""Room in a push body for the MessagePack map around the envelopes."""
PER_ENVELOPE_FRAMING_BYTES = 5
"""A MessagePack bin header is at most 5 bytes."""
DEFAULT_BACKOFF = Backoff()
WATCH_TICK_S = 0.1
"""How often a waiting `watch` looks at its stop event."""


@dataclass(frozen=True)
class Progress:
    """So far in this round: envelopes pushed (acknowledged) and pulled (merged or not)."""

    pushed: int
    pulled: int


@dataclass(frozen=True)
class SyncReport:
    """One `sync()`: receipts by status, pulled entries, merged versions; `rounds` is 2 when
    an epoch change made the device reseed and run again; `retries` counts resent requests."""

    pushed: int
    stored: int
    superseded: int
    refused: int
    pulled: int
    merged: int
    rounds: int
    retries: int


@dataclass
class _Tally:
    pushed: int = 0
    stored: int = 0
    superseded: int = 0
    refused: int = 0
    pulled: int = 0
    merged: int = 0
    rounds: int = 0

    def report(self, retries: int) -> SyncReport:
        return SyncReport(
            self.pushed,
            self.stored,
            self.superseded,
            self.refused,
            self.pulled,
            self.merged,
            self.rounds,
            retries,
        )


def batch_bounds(limits: RelayLimits, max_count: int, max_bytes: int) -> tuple[int, int]:
    """Batch bounds that fit the relay's push limits as well as the device's own."""
    count = max(1, min(max_count, limits.max_push_envelopes))
    room = limits.max_body_bytes - FRAMING_BYTES - PER_ENVELOPE_FRAMING_BYTES * count
    return count, max(1, min(max_bytes, room))


def is_epoch_change(error: RollbackError) -> bool:
    """True when the rollback is an account epoch other than the last seen: another device
    reseeded (or the relay was restored from before a reseed)."""
    return error.reason == "account_epoch"


class SyncDriver:
    """Syncs one replica through one relay client; `watch` keeps doing it live."""

    def __init__(
        self,
        replica: Replica,
        client: RelayClient,
        *,
        progress: Callable[[Progress], None] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        sleep: Callable[[float], None] = time.sleep,
        random: Callable[[], float] = random_module.random,
        clock: Callable[[], float] = time.monotonic,
        follow_reseeds: bool = True,
        max_batch_count: int = DEFAULT_BATCH_COUNT,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        """`follow_reseeds`: on an epoch change, reseed locally and sync again (protocol
        §4.5: every other device follows a reseed on its next sync)."""
        self._replica = replica
        self._client = client
        self._progress = progress
        self._retrier = Retrier(backoff, sleep=sleep, random=random, clock=clock)
        self._random = random
        self._clock = clock
        self._follow_reseeds = follow_reseeds
        self._bounds = (max_batch_count, max_batch_bytes)
        self._sync_session: SyncSession | None = None

    def sync(self) -> SyncReport:
        """One round: push everything dirty, pull everything new."""
        tally, retries = _Tally(), self._retrier.retries
        session = self._session()
        try:
            self._round(session, tally)
        except RollbackError as exc:
            if not (self._follow_reseeds and is_epoch_change(exc)):
                raise
            log.warning("%s: reseeding this device", exc)
            session.reseed()
            self._round(session, tally)
        return tally.report(self._retrier.retries - retries)

    def reseed(self, cause: RollbackError | None = None) -> SyncReport:
        """Push every version this device holds again and pull everything (protocol §4.5).

        The relay is asked for a new account epoch — so that every other device reseeds too —
        unless `cause` is an epoch change: that was another device's reseed, and asking again
        would make the devices reseed each other forever. A relay that lost the account
        answers `unauthorized`: register it again first (that needs the passphrase or the
        recovery key), then reseed.
        """
        if cause is None or not is_epoch_change(cause):
            self._retrier.call(self._client.reseed)
        self._session().reseed()
        return self.sync()

    def watch(
        self,
        stop: threading.Event,
        *,
        poll_interval_s: float = 5.0,
        idle_sync_s: float = 60.0,
        on_report: Callable[[SyncReport], None] | None = None,
    ) -> None:
        """Sync now, then on every head hint of the live feed and every local write, until
        `stop` is set. While the feed is down, sync every `poll_interval_s`; and at least
        every `idle_sync_s` anyway (writes by other processes on the same replica file are
        not heard). Unknown outcomes are logged and retried on the next wake; definitive
        refusals and rollbacks other than an epoch change end the watch with their error."""
        local = threading.Event()

        def on_change(event: ChangeEvent) -> None:
            if event.origin == "local":
                local.set()

        unsubscribe = self._replica.subscribe(on_change)
        feed = HeadFeed(self._client, backoff=self._retrier.backoff, random=self._random)
        feed.start()
        try:
            while not stop.is_set():
                local.clear()
                self._watch_round(on_report)
                self._wait_for_work(stop, feed, local, poll_interval_s, idle_sync_s)
        finally:
            feed.close()
            unsubscribe()

    # -- one round ---------------------------------------------------------------------------

    def _session(self) -> SyncSession:
        """Made on first use, with batches sized to the relay's limits (asking /v1/info
        also refuses a relay of another protocol version)."""
        if self._sync_session is None:
            limits = self._retrier.call(self._client.limits)
            count, size = batch_bounds(limits, *self._bounds)
            self._sync_session = self._replica.sync_session(
                max_batch_count=count, max_batch_bytes=size
            )
        return self._sync_session

    def _round(self, session: SyncSession, tally: _Tally) -> None:
        tally.rounds += 1
        session.restart()
        while (batch := session.next_batch()) is not None:
            result = self._retrier.call(functools.partial(self._client.push, batch))
            acknowledged = session.acknowledge(batch, result)
            tally.pushed += len(batch.envelopes)
            tally.stored += acknowledged.stored
            tally.superseded += acknowledged.superseded
            tally.refused += sum(acknowledged.refused_by_code.values())
            self._report_progress(tally)
        while True:
            page = self._retrier.call(functools.partial(self._client.pull, session.cursor))
            applied = session.apply_page(page)
            tally.pulled += len(page.entries)
            tally.merged += applied.merged
            self._report_progress(tally)
            if not page.has_more:
                return

    def _report_progress(self, tally: _Tally) -> None:
        if self._progress is not None:
            self._progress(Progress(tally.pushed, tally.pulled))

    # -- watching ----------------------------------------------------------------------------

    def _watch_round(self, on_report: Callable[[SyncReport], None] | None) -> None:
        try:
            report = self.sync()
        except RelayClientError as exc:
            if not exc.retryable:
                raise
            log.warning("sync failed, trying again on the next wake: %s", exc)
            return
        if on_report is not None:
            on_report(report)

    def _wait_for_work(
        self,
        stop: threading.Event,
        feed: HeadFeed,
        local: threading.Event,
        poll_interval_s: float,
        idle_sync_s: float,
    ) -> None:
        started = self._clock()
        while not stop.is_set():
            if feed.take_hint(WATCH_TICK_S) or local.is_set():
                return
            waited = self._clock() - started
            if waited >= idle_sync_s or (not feed.is_up and waited >= poll_interval_s):
                return
