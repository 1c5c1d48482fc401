"""`SyncDriver`: runs a replica's sans-I/O sync session over a `RelayClient`.

One round (specs/protocol.md §4): restart the pass; push every batch and acknowledge its
receipts; pull pages from the cursor and merge them until the relay has no more. Each request
runs on a thread of its own, one step ahead of the device's own work (the next batch is
stored by the relay while this one's receipts are saved; the next page travels while this one
merges), so the relay's time and the device's overlap. Each step is
resumable: a version stops being dirty only on its receipt, and the cursor moves only with
the page it covers (or over this device's own pushed versions, protocol §4.2 step 4), so a
round cut short anywhere is finished by the next one. Requests whose
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
from dataclasses import replace
from typing import Generic, TypeVar, cast

from clients.errors import (
    NoSessionError,
    RelayClientError,
    RelayRefusedError,
    ResyncBusyError,
    UnknownOutcomeError,
)
from clients.http import RelayClient
from clients.live import HeadFeed
from clients.resurrection import follow_reseed, refuse_a_copy_before_a_run, refuse_if_away
from clients.retry import Backoff, Retrier
from clients.syncreport import Phase as Phase  # noqa: PLC0414 (re-exported)
from clients.syncreport import Progress as Progress  # noqa: PLC0414
from clients.syncreport import Reporter, Tally
from clients.syncreport import SyncReport as SyncReport  # noqa: PLC0414
from replica import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_COUNT,
    RESYNC_LEASE,
    RESYNC_LEASE_TTL_S,
    ChangeEvent,
    ErrorCode,
    Lease,
    LeaseBusyError,
    Replica,
    RollbackError,
    SyncSession,
)
from replica.wire import Page, PushBatch, PushResult, RelayLimits

log = logging.getLogger(f"sealsync.{__name__}")
T = TypeVar("T")

FRAMING_BYTES = 1024
"""Room in a push body for the MessagePack map around the envelopes."""
PER_ENVELOPE_FRAMING_BYTES = 5
"""A MessagePack bin header is at most 5 bytes."""
DEFAULT_BACKOFF = Backoff()
RESYNC_WAIT_S = 60.0
"""How long a round waits for another process's full resync of the same file, before it
gives up for now (`ResyncBusyError`, which a watch retries at its next wake)."""
RESYNC_WAIT_SLICE_S = 1.0
"""The wait is taken in slices this long: a watch told to stop does not sit it out."""
RESYNC_ATTEMPTS = 3
"""Full resyncs a round begins before it gives up for now (each overtaken by another
process's pull, or by a collection run that refused its ending ack)."""
WATCH_TICK_S = 0.1
"""How often a waiting `watch` looks at its stop event."""


def batch_bounds(limits: RelayLimits, max_count: int, max_bytes: int) -> tuple[int, int]:
    """Batch bounds that fit the relay's push limits as well as the device's own."""
    count = max(1, min(max_count, limits.max_push_envelopes))
    room = limits.max_body_bytes - FRAMING_BYTES - PER_ENVELOPE_FRAMING_BYTES * count
    return count, max(1, min(max_bytes, room))


def is_key_retired(error: RelayClientError) -> bool:
    """A push refused because the account's keys moved past this device's (a rotation)."""
    return isinstance(error, RelayRefusedError) and error.code == ErrorCode.KEY_RETIRED


def is_resync_required(error: RelayClientError) -> bool:
    """The relay collected tombstones without this device: it must pull everything again."""
    return isinstance(error, RelayRefusedError) and error.code == ErrorCode.RESYNC_REQUIRED


def is_epoch_change(error: RollbackError) -> bool:
    """True when the rollback is an account epoch other than the last seen: another device
    reseeded (or the relay was restored from before a reseed)."""
    return error.reason == "account_epoch"


class _Request(Generic[T]):
    """One request (with its retries) running on a thread of its own while the device works.

    A daemon thread, not a pool's: when the round stops on an error or a Ctrl-C, it is left
    to finish on its own instead of holding the stop up for its retries. That is safe because
    its outcome only counts once the round reads it: an abandoned push leaves its versions
    dirty (sent again, the relay answers them without storing them twice), an abandoned pull
    moved nothing."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._call = call
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name="sealsync-request", daemon=True).start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # handed to the round's thread by `result`
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return cast(T, self._value)


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
        self._paused = False
        """A watch met newer keys on the relay: it pulls only from then on."""
        self._stopping = threading.Event()
        """A watch's stop event while it runs: a round waiting for a lease gives up on it."""

    def sync(self) -> SyncReport:
        """One round: push everything dirty, pull everything new."""
        return self._following_reseeds(self._round)

    def pull(self) -> SyncReport:
        """Pull everything new, pushing nothing: what a version-1 account's device can still
        do before its upgrade, which must first see every version the relay holds."""
        return self._following_reseeds(self._pull_round)

    def _following_reseeds(self, run: Callable[[SyncSession, Tally], None]) -> SyncReport:
        """`run`, and again after reseeding here when another device reseeded the account
        (an epoch change): every device follows a reseed on its next sync (protocol §4.5)."""
        tally, retries = Tally(), self._retrier.retries
        session = self._session()
        try:
            run(session, tally)
        except RollbackError as exc:
            if not (self._follow_reseeds and is_epoch_change(exc)):
                raise
            self._follow(session, exc)
            run(session, tally)
        return tally.report(self._retrier.retries - retries)

    def _follow(self, session: SyncSession, change: RollbackError) -> None:
        """Another device reseeded: so does this one (`follow_reseed`)."""
        horizon_ms = self._retrier.call(self._client.limits).tombstone_horizon_ms
        how = follow_reseed(self._replica, session, horizon_ms)
        log.warning("%s: this device follows (%s)", change, how)

    def _pull_round(self, session: SyncSession, tally: Tally) -> None:
        tally.rounds += 1
        if not session.knows_relay_state():
            session.check_relay_state(self._retrier.call(self._client.state))
        self._pull_all(session, tally, Reporter(self._progress, session, tally, session.cursor))

    def reseed(
        self,
        auth_key: bytes,
        cause: RollbackError | None = None,
        *,
        allow_resurrection: bool = False,
    ) -> SyncReport:
        """Push every version this device holds again and pull everything (protocol §4.5).

        The relay is asked for a new account epoch — so that every other device reseeds too —
        unless `cause` is an epoch change: that was another device's reseed, and asking again
        would make the devices reseed each other forever. Asking takes the account's current
        `auth_key`: a token alone cannot make every device reseed. A relay that lost the
        account answers `unauthorized`: `clients.access.regain_access` registers it again
        first. Unless `allow_resurrection`, a reseed that may bring back what a collection
        run deleted is refused (`ResurrectionRiskError`): from a device away past the relay's
        tombstone horizon (it may hold what a run took before the wipe), or onto a relay
        restored from a copy older than a run this device applied (the copy may hold it).
        """
        if cause is None or not is_epoch_change(cause):
            if not allow_resurrection:
                self.refuse_reseed_if_away()
                self._refuse_a_copy_before_a_run()
            self._ask_for_new_epoch(auth_key)
        self._session().reseed()
        return self.sync()

    def adopt(self, *, allow_resurrection: bool = False) -> SyncReport:
        """After a wipe another device reseeded: take the relay as it is now, pulling
        everything from it and setting aside what it lacks (a full resync), pushing only
        writes no relay ever saw. The way back for a device `reseed` refuses as away too
        long (`ResurrectionRiskError`); refused itself, unless `allow_resurrection`, for a
        relay restored from a copy older than a collection run this device applied."""
        if not allow_resurrection:
            self._refuse_a_copy_before_a_run()
        self._session().adopt_relay()
        return self.sync()

    def refuse_reseed_if_away(self) -> None:
        """`ResurrectionRiskError` when no relay took an ack of this file within the relay's
        tombstone horizon: its relay may have collected without it. `reseed` checks it; a
        caller that registers the account again first checks it before."""
        horizon_ms = self._retrier.call(self._client.limits).tombstone_horizon_ms
        refuse_if_away(self._replica, self._session(), horizon_ms)

    def _refuse_a_copy_before_a_run(self) -> None:
        """`refuse_a_copy_before_a_run`, with a page's word on the relay's latest run (even
        a flagged device's: a resync's page reads nothing else)."""
        state = self._retrier.call(self._client.state)
        page = self._retrier.call(lambda: self._client.pull(state.head, 1, resync=True))
        refuse_a_copy_before_a_run(self._session(), state, page.last_run)

    def _ask_for_new_epoch(self, auth_key: bytes) -> None:
        """POST /v1/reseed draws a new epoch each time, so it is not sent again blindly after
        an unknown outcome: each try first reads the relay's state, and stops once the epoch
        has changed (an earlier try landed, or another device reseeded meanwhile)."""
        before = self._retrier.call(self._client.state).account_epoch

        def ask() -> None:
            if self._client.state().account_epoch == before:
                self._client.reseed(auth_key)

        self._retrier.call(ask)

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
        self._stopping = stop
        try:
            while not stop.is_set():
                local.clear()
                self._watch_round(on_report)
                self._wait_for_work(stop, feed, local, poll_interval_s, idle_sync_s)
        finally:
            self._stopping = threading.Event()
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

    def _round(self, session: SyncSession, tally: Tally) -> None:
        tally.rounds += 1
        session.restart()
        if not session.knows_relay_state():  # a reseed forgot it: pushes are signed for it
            session.check_relay_state(self._retrier.call(self._client.state))
        report = Reporter(self._progress, session, tally, session.cursor)
        if session.resync_needed:  # a restored or copied file: before it pushes anything
            self._resync(session, tally, report)
        try:
            self._exchange(session, tally, report)
        except RelayRefusedError as exc:  # a copy older than the relay's view resyncs too
            if not (is_resync_required(exc) or exc.code == ErrorCode.COUNTER_STALE):
                raise
            if exc.code == ErrorCode.COUNTER_STALE:
                session.restart()  # not a flag's refusal: what this pass offered stays offered
            self._resync(session, tally, report)
            self._exchange(session, tally, report)

    def _exchange(self, session: SyncSession, tally: Tally, report: Reporter) -> None:
        """Push, pull, settle what was superseded, ack."""
        self._push_all(session, tally, report)
        self._pull_all(session, tally, report)
        tally.unconfirmed = session.settle_superseded()
        self._ack(session)

    def _resync(self, session: SyncSession, tally: Tally, report: Reporter) -> None:
        """Pull everything again, settle what the relay no longer has, and end the resync
        with the ack it waits for (replica/resync.py); then the round goes on. One process
        of the file at a time (the lease); begun again when another process's pull
        overtook it, or a collection run came meanwhile (the ack is refused)."""
        log.warning(
            "pulling everything again before pushing: tombstones were collected without "
            "this device, or this file is a restored copy"
        )
        with self._resync_lease():
            for _ in range(RESYNC_ATTEMPTS):
                if self._resync_once(session, tally, report):
                    break
            else:
                raise ResyncBusyError(
                    f"a full resync was overtaken all {RESYNC_ATTEMPTS} times it ran (by another "
                    "process's pull, or a collection run)",
                    hint="sync again",
                )
        session.restart()

    def _resync_lease(self) -> Lease:
        """The lease over a full resync, waited for `RESYNC_WAIT_S` at most, in short slices
        that look at a watch's stop event; `ResyncBusyError` (retryable) when it stays
        taken, or while the replica is locked (the lease needs its keys)."""
        if self._replica.is_locked:
            raise ResyncBusyError(
                "this replica must pull everything again, which waits until it is unlocked",
                hint="unlock it, then sync",
            )
        started = self._clock()
        while True:
            try:
                return self._replica.lease(
                    RESYNC_LEASE, ttl_s=RESYNC_LEASE_TTL_S, wait_s=RESYNC_WAIT_SLICE_S
                )
            except LeaseBusyError:
                waited = self._clock() - started
                if self._stopping.is_set() or waited >= RESYNC_WAIT_S:
                    raise ResyncBusyError(
                        "another process is pulling everything again into this replica "
                        f"(waited {waited:.0f} s of {RESYNC_WAIT_S:.0f})",
                        hint="sync again once it is done",
                    ) from None

    def _resync_once(self, session: SyncSession, tally: Tally, report: Reporter) -> bool:
        session.begin_resync()
        self._pull_all(session, tally, report, resync=True)
        tally.resynced = session.finish_resync()
        if tally.resynced is None:
            return False
        try:
            self._ack(session, after_resync=True)
        except RelayRefusedError as exc:
            if not is_resync_required(exc):
                raise
            return False
        return True

    def _ack(self, session: SyncSession, *, after_resync: bool = False) -> None:
        """Tell the relay how far this device pulled, with an empty signed push, when no
        push said so (`SyncSession.ack_due`)."""
        batch = session.ack_due()
        if batch is not None:
            push = functools.partial(self._push_signed, session, batch, after_resync=after_resync)
            result = self._retrier.call(push)
            session.verify_answer(batch, result)
            session.acknowledge(batch, result)

    def _push_all(self, session: SyncSession, tally: Tally, report: Reporter) -> None:
        """Pipelined: while the relay stores one batch, the device reads the next and saves
        the receipts of the one before. An answer is checked before the next batch goes out,
        so nothing more is sent to a relay found wiped, rolled back or misbehaving."""
        batch = session.next_batch()
        if batch is None:
            return
        in_flight = self._send(session, batch, report)
        while True:
            following = session.next_batch()
            result = in_flight.result()
            size = len(batch.envelopes)
            report.step("push_answered", size)
            session.verify_answer(batch, result)
            if following is not None:
                in_flight = self._send(session, following, report)
            acknowledged = session.acknowledge(batch, result)
            tally.pushed += size
            tally.stored += acknowledged.stored
            tally.superseded += acknowledged.superseded
            tally.refused_by_code.update(acknowledged.refused_by_code)
            report.step("receipts_saved", size)
            if following is None:
                following = session.next_batch()  # what the receipts put back to push
                if following is None:
                    return
                in_flight = self._send(session, following, report)
            batch = following

    def _send(
        self, session: SyncSession, batch: PushBatch, report: Reporter
    ) -> _Request[PushResult]:
        report.step("push_sending", len(batch.envelopes))
        push = functools.partial(self._push_signed, session, batch)
        return _Request(functools.partial(self._retrier.call, push))

    def _push_signed(
        self, session: SyncSession, batch: PushBatch, *, after_resync: bool = False
    ) -> PushResult:
        """Signed afresh for each attempt: a retry after an unknown outcome gets a new counter
        (specs/protocol.md §4.7). A `counter_stale` signs above the relay's last counter from
        then on; when the file itself was behind it (not just this session's block: another
        process took a later one), it is an older copy of itself, which may predate a
        collection run, and resyncs before it pushes (the refusal goes up to the round),
        unless it just did. A `forbidden` push was signed for a relay state that is
        gone (a reseed, a wipe) if `GET /v1/state` says so: then the `RollbackError` is what
        this device needs to hear."""
        try:
            return self._attempt(session, batch)
        except RelayRefusedError as exc:
            if exc.code == ErrorCode.FORBIDDEN:
                try:
                    session.check_relay_state(self._client.state())
                except RollbackError:
                    session.push_refused()  # signed for a state that is gone: none stored
                    raise
            if exc.code != ErrorCode.COUNTER_STALE or exc.last_counter is None:
                raise  # the mark stays: another session on the file may have offered its rows
            if session.sign_above(exc.last_counter) and not after_resync:  # an older copy
                session.push_refused()
                session.resync_before_pushing()
                raise
            return self._attempt(session, batch)

    def _attempt(self, session: SyncSession, batch: PushBatch) -> PushResult:
        """One push, signed afresh; one left unanswered may have been stored."""
        signer = self._client.session
        if signer is None:
            raise NoSessionError("pushing takes a device session", hint="log in first")
        try:
            return self._client.push(session.sign(batch, signer.account, signer.device_id))
        except UnknownOutcomeError:
            session.push_outcome_unknown()
            raise

    def _pull_all(
        self, session: SyncSession, tally: Tally, report: Reporter, *, resync: bool = False
    ) -> None:
        """Pipelined: the next page is on its way while this one merges. It is asked for
        from where this page ends; should the merge leave the cursor elsewhere (another
        process synced this file meanwhile), it is left to finish unread and the pull goes
        on from that cursor."""
        in_flight = self._fetch(session.cursor, report, resync)
        while True:
            page = in_flight.result()
            report.saw_head(page.state.head)
            if page.has_more:
                in_flight = self._fetch(page.next_cursor, report, resync)
            report.step("merge_start", len(page.entries))
            applied = session.apply_page(page)
            tally.pulled += len(page.entries)
            tally.merged += applied.merged
            tally.held += sum(applied.held.values())
            tally.quarantined += applied.quarantined
            tally.untrusted += applied.untrusted
            report.moved_to(applied.cursor)
            report.step("merged", len(page.entries))
            if not page.has_more:
                return
            if applied.cursor != page.next_cursor:
                in_flight = self._fetch(applied.cursor, report, resync)

    def _fetch(self, cursor: int, report: Reporter, resync: bool) -> _Request[Page]:
        report.step("pull_sending", 0)
        pull = functools.partial(self._client.pull, cursor, resync=resync)
        return _Request(functools.partial(self._retrier.call, pull))

    # -- watching ----------------------------------------------------------------------------

    def _watch_round(self, on_report: Callable[[SyncReport], None] | None) -> None:
        """One sync; once a push is refused `key_retired` (the keys were rotated on another
        device), pulls only: a watch cannot ask for the new passphrase, and this device's
        writes stay pending until it is given it (docs/key-generations.md §7). Versions
        under the new keys are held meanwhile."""
        try:
            report = self._pull_only() if self._paused else self.sync()
        except RelayClientError as exc:
            if is_key_retired(exc) and not self._paused:
                log.warning("the account's keys changed on another device: pulling only")
                self._paused = True
                self._watch_round(on_report)
                return
            if self._paused and is_resync_required(exc):
                log.warning(
                    "the relay asks this device to pull everything again, which ends with a "
                    "push under the account's new keys: run `sealsync sync` to give them"
                )
                return
            if not exc.retryable:
                raise
            log.warning("sync failed, trying again on the next wake: %s", exc)
            return
        if on_report is not None:
            on_report(report)

    def _pull_only(self) -> SyncReport:
        """A round of a paused watch, which ends once another process (`sealsync sync`) took
        the new keys into the file: this one still holds the old ones."""
        self._replica.check_keys_current()
        return replace(self.pull(), pushing_paused=True)

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
