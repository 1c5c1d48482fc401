"""The sync session, sans-I/O: what to push, what the receipts mean, how a page is merged.

A driver (clients/) moves the values; this module decides. One round:

    batch = session.next_batch()          # dirty versions, bounded by count and bytes
    session.acknowledge(batch, result)    # clears dirty only for confirmed versions
    session.apply_page(page)              # merges a page and advances the cursor atomically
    session.settle_superseded()           # what the relay called superseded, proven or not

Every relay answer carries its `RelayState`. The first one is adopted; after that a new
storage id, a new account epoch, or a head below the highest sequence number seen means the
relay was wiped or restored from an older copy: `RollbackError`, and nothing is read as a
deletion. `reseed()` then marks every version for pushing again and resets the cursor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from replica import clock, resync
from replica.asides import Row
from replica.collected import apply_markers
from replica.errors import InvalidArgumentError, ProtocolError
from replica.frontier import AUTHENTICATED_HOLDS
from replica.generations import PushSigner, sign_push
from replica.relaystate import RelayStates
from replica.wire import (
    MAX_HLC,
    CollectedRun,
    Dot,
    ErrorCode,
    Page,
    PageEntry,
    PushBatch,
    PushResult,
    RelayState,
    VersionVector,
    decode_vector,
    dominates,
    parse_header,
    tombstone_bits,
)

if TYPE_CHECKING:
    from replica.core import Core

Identity = tuple[bytes, int, int]
"""A version's (opaque key, node, hlc)."""

DEFAULT_BATCH_COUNT = 4000
COUNTER_BLOCK = 64
"""Push counters a session takes at once: a round of up to 64 batches writes the file once
for them; numbers a session leaves unused are skipped (counters only need to increase)."""
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
KEEPALIVE_MS = 24 * 3600 * 1000
"""A device that syncs acks at least this often, moved or not: a relay's collection
horizon (90 days by default) leaves out a device silent for longer."""
ACK_EVERY_S = 600.0
"""How often at most a session sends an ack with nothing to push (`ack_due`): collection
waits days for an ack, and a phone's battery should not pay for fresher ones."""


@dataclass(frozen=True)
class Acknowledged:
    """What a push's receipts did: confirmed versions are no longer dirty; refused stay dirty."""

    stored: int
    superseded: int
    refused_by_code: dict[ErrorCode, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Applied:
    """What merging a page did; `cursor_advanced` is False for a page that was not next."""

    merged: int
    superseded: int
    held: dict[str, int]
    quarantined: int
    cursor: int
    cursor_advanced: bool
    untrusted: int = 0
    """Versions a revoked device's old keys could have made: refused (specs/replica.md §7.1)."""
    collected: int = 0
    """Tombstones dropped as the relay collected them (the page's run, replica/collected.py)."""


def _check_batch_bounds(max_batch_count: object, max_batch_bytes: object) -> None:
    if not (isinstance(max_batch_count, int) and isinstance(max_batch_bytes, int)) or (
        max_batch_count < 1 or max_batch_bytes < 1
    ):
        raise InvalidArgumentError(
            f"batch bounds must be ≥ 1, got {max_batch_count} envelopes / {max_batch_bytes} bytes"
        )


class SyncSession(RelayStates):
    """Pushes and pulls for one replica; create it with `Replica.sync_session()`."""

    def __init__(
        self,
        core: Core,
        *,
        max_batch_count: int = DEFAULT_BATCH_COUNT,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        _check_batch_bounds(max_batch_count, max_batch_bytes)
        self._core = core
        self._store = core.store
        self._max_count = max_batch_count
        self._max_bytes = max_batch_bytes
        self._after = {"versions": 0, "held": 0}
        """Per table, the row id of the last version offered in this pass."""
        self._superseded: set[Identity] = set()
        """Versions the relay called superseded in this pass, not yet proven so here."""
        self._counters: list[int] | None = None
        """[next, last] push counter of the block this session took (`_next_counter`)."""
        self._acked = 0
        self._acked_at: float | None = None
        """The last ack this session signed, and when (`time.monotonic`)."""
        self._resyncing = False
        """Between `begin_resync` and `finish_resync`: pages note what the relay still has."""
        self._resync_at = -1
        """Where the resync's pages reached, each starting where the one before ended; -1
        once one did not (another process's pull moved the cursor past what this one saw)."""
        self._resync_run = 0
        """The relay's latest collection run, as the resync's last page said (0: none)."""
        self._offering = self._offering_before = 0
        """The greatest hlc of the versions this pass offered so far (`next_batch`), and before
        its latest batch (what stands if the relay refuses that one: `push_refused`)."""
        self._offered: tuple[int, int] | None = None
        """Meta `offered_through` before this pass raised it, and what it raised it to (None:
        it did not)."""
        self._outcome_unknown = False
        """A push of this pass got no answer: it may have been stored, so no refusal puts the
        mark back until the next pass (`push_refused`)."""

    # -- push -----------------------------------------------------------------------------------

    def next_batch(self) -> PushBatch | None:
        """The next dirty versions to push (each once per pass), or None when the pass is done.

        A stored envelope whose header no longer names its own row is damaged: it is latched
        degraded and kept back, so local damage never spreads to the other devices.
        """
        with self._core.mutex:
            self._core.check_open()
            if self._after == {"versions": 0, "held": 0}:  # a new pass
                self._core.reseal_pending()
            node = self._core.node()
            for table in ("versions", "held"):
                while rows := self._store.rows_to_push(table, self._max_count, self._after[table]):
                    chosen = _fit(rows, self._max_bytes)
                    self._after[table] = chosen[-1][0]
                    # this node's rows only (held ones too): a resync sets another node's
                    # aside anyway, and one held for drift may be far ahead of this clock
                    self._offering_before = self._offering
                    own = [r.hlc for _, r, _ in chosen if r.node == node]
                    self._offering = max(self._offering, *own, 0)
                    sound = [(row.envelope, tomb) for _, row, tomb in chosen if self._is_sound(row)]
                    if sound:
                        bits = tombstone_bits([tomb for _, tomb in sound])
                        return PushBatch([envelope for envelope, _ in sound], tombstones=bits)
            return None

    def _is_sound(self, row: Row) -> bool:
        try:
            header = parse_header(row.envelope)
        except ProtocolError:
            header = None
        if header is not None and (header.key, header.node, header.hlc) == (
            row.key,
            row.node,
            row.hlc,
        ):
            return True
        reason = "a stored envelope to push is damaged"
        self._core.mark_degraded(row.key, self._store.scope_of(row.key), reason)
        return False

    def count_dirty(self) -> int:
        """`Status.dirty` alone: what a progress bar needs at the start of a round, without
        the two scans of every version that the rest of `Replica.status()` costs."""
        with self._core.mutex:
            self._core.check_open()
            return self._store.count_dirty()

    def restart(self) -> None:
        """Start a new pass over the dirty versions (after a failed or refused push)."""
        self._after = {"versions": 0, "held": 0}
        self._superseded = set()
        self._offering = self._offering_before = 0
        self._offered = None
        self._outcome_unknown = False

    def push_outcome_unknown(self) -> None:
        """A push got no answer (a timeout, a dropped connection): it may have been stored."""
        with self._core.mutex:
            self._outcome_unknown = True

    def push_refused(self) -> None:
        """The relay refused the latest batch outright, storing none of it (it was signed for
        a relay state that is gone): the mark of what was offered goes back to what the
        pass's earlier batches offered, unless another session raised it since, or an
        attempt of this pass went unanswered (it may have stored the batch)."""
        with self._core.mutex, self._store.transaction():
            if self._offered is None or self._outcome_unknown:
                return
            before, raised = self._offered
            standing = max(before, self._offering_before)
            if self._store.get_int("offered_through") == raised and standing < raised:
                self._store.set_meta("offered_through", standing)
                self._offered = (before, standing)
            self._offering = self._offering_before

    def acknowledge(self, batch: PushBatch, result: PushResult) -> Acknowledged:
        """Clear dirty for versions the relay stored; refused stay dirty, and so do those it
        called superseded until this device holds what supersedes them (`settle_superseded`):
        a relay's word alone must never make a write vanish."""
        _check_receipt_count(batch, result)
        seqs = [r.seq for r in result.receipts if r.seq is not None]
        with self._core.mutex, self._store.transaction():
            self._check_state(result.state, max(seqs, default=0))
            stored: list[Identity] = []
            superseded: list[Identity] = []
            refused: dict[ErrorCode, int] = {}
            for envelope, receipt in zip(batch.envelopes, result.receipts, strict=True):
                header = parse_header(envelope)
                identity = (header.key, header.node, header.hlc)
                if receipt.code is not None:  # refused: only a refused receipt has a code
                    refused[receipt.code] = refused.get(receipt.code, 0) + 1
                    continue
                (stored if receipt.status == "stored" else superseded).append(identity)
            proven = self._dominated_here(superseded)
            self._superseded.update(set(superseded) - set(proven))
            self._store.clear_dirty(stored + proven)
            self._pass_own_versions(seqs)
            if self._acked_at is not None:
                # the cursor this session signed last, in this batch or in one still in flight
                # (should that one fail, the relay holds less: collection only waits longer)
                self._store.set_meta("acked_cursor", self._acked)
                self._store.set_meta("acked_ms", self._core.options.wall_clock_ms())
        return Acknowledged(
            stored=sum(r.status == "stored" for r in result.receipts),
            superseded=sum(r.status == "superseded" for r in result.receipts),
            refused_by_code=refused,
        )

    def acknowledge_written(self, batch: PushBatch) -> None:
        """A transport with no relay (a folder) holds `batch` durably: its versions stop
        being dirty. There are no receipts: whatever a reader refuses is its to report."""
        identities = []
        for envelope in batch.envelopes:
            header = parse_header(envelope)
            identities.append((header.key, header.node, header.hlc))
        with self._core.mutex, self._store.transaction():
            self._store.clear_dirty(identities)

    def settle_superseded(self) -> int:
        """After a pass's pull: a version the relay called superseded stops being pushed once
        this device holds, authenticated and merged, a version that dominates it (the pull
        normally brings it); the others stay marked, to be pushed again next pass. Returns
        how many stay: a relay that keeps saying superseded and never sends what supersedes
        them is dropping writes, and the user should hear of it."""
        if not self._superseded:  # the usual pass: no write lock taken
            return 0
        with self._core.mutex, self._store.transaction():
            proven = self._dominated_here(self._superseded)
            self._store.clear_dirty(proven)
            self._superseded.difference_update(proven)
            return self._store.still_marked(self._superseded)

    def _dominated_here(self, identities: Iterable[Identity]) -> list[Identity]:
        """Those of `identities` that an authenticated sibling of their record dominates:
        merged, or held after it was opened (behind a lock or for drift: its release will
        drop them here; pushed again meanwhile, they could outlive a collected tombstone's
        ghost on the relay and bring the record back). Unverified held ones prove nothing."""
        wanted = list(identities)
        keys = [k for k, _, _ in wanted]
        vectors: dict[bytes, list[tuple[Dot, VersionVector]]] = {}
        for _, key, node, hlc, vector, _, _ in self._store.sibling_rows(keys):
            vectors.setdefault(key, []).append(((node, hlc), decode_vector(vector)))
        for key, envelope in self._store.held_of(keys, AUTHENTICATED_HOLDS):
            header = parse_header(envelope)
            vectors.setdefault(key, []).append((header.dot, header.vector))
        return [
            (key, node, hlc)
            for key, node, hlc in wanted
            if any(
                dot != (node, hlc) and dominates(vector, (node, hlc))
                for dot, vector in vectors.get(key, [])
            )
        ]

    def _pass_own_versions(self, seqs: list[int]) -> None:
        """Move the cursor over this push's own versions when their seqs directly follow it.

        Every seq from the cursor + 1 to the highest is then one of this batch's receipts
        (seqs are unique per account), so those entries are versions this replica holds:
        pulling them back would merge nothing, and a device would otherwise download all it
        uploaded. Any gap (another device's version) leaves the cursor where it is."""
        if not seqs:
            return
        low, high = min(seqs), max(seqs)
        if low == self._store.get_int("cursor") + 1 and high - low + 1 == len(set(seqs)):
            self._store.set_meta("cursor", high)

    # -- pull -----------------------------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """Pull from here: every version with a higher seq is yet to be merged."""
        with self._core.mutex:
            self._core.check_open()
            return self._store.get_int("cursor")

    def apply_page(self, page: Page) -> Applied:
        """Merge a page atomically; advance the cursor only if the page starts where it stands.

        A duplicated, reordered or stale page still merges (merging is idempotent and
        order-free) but never moves the cursor past versions it has not seen.
        """
        core = self._core
        top_seq = max((e.seq for e in page.entries), default=0)
        with core.mutex, core.write_transaction():
            cursor = self._store.get_int("cursor")
            fresh = page.cursor == cursor  # served for where this file stands: after its runs
            self._check_state(page.state, top_seq, page.last_run if fresh else None)
            now = core.options.wall_clock_ms()
            advanced = fresh and page.next_cursor >= cursor
            entries = page.entries if advanced else self._after_runs(page.entries)
            envelopes, seqs = [e.envelope for e in entries], [e.seq for e in entries]
            result = core.merge(envelopes, now_ms=now, source="pull", seqs=seqs, relay=page.state)
            collected = 0
            if self._resyncing:
                self._note_resync_page(page)
            if advanced:
                cursor = page.next_cursor
                self._store.set_meta("cursor", cursor)
                if page.collected is not None:  # once: only the page that was next
                    collected = self._apply_run(page.collected)
            self._note_sync(result.max_hlc, now)
            core.publish(result.events)
        return Applied(
            merged=result.merged,
            superseded=result.superseded,
            held=dict(result.held),
            quarantined=result.quarantined,
            cursor=cursor,
            cursor_advanced=advanced,
            untrusted=result.untrusted,
            collected=collected,
        )

    def _note_resync_page(self, page: Page) -> None:
        """What a resync's page says the relay still has, and how far its pages reached."""
        resync.saw(self._store, page.entries)
        self._resync_at = page.next_cursor if page.cursor == self._resync_at else -1
        self._resync_run = page.last_run

    def _apply_run(self, run: CollectedRun) -> int:
        """A collection run's markers, in the page's transaction: the tombstones go, and the
        pages they took leave the file (`give_back_free_pages`)."""
        collected = apply_markers(self._store, run, self._core.opener)
        self._store.set_meta("run_passed", run.seq)
        self._store.give_back_free_pages()
        return collected

    # -- full resync ----------------------------------------------------------------------------

    @property
    def resync_needed(self) -> bool:
        """This file took a new node id (a restored backup, a copy): it may be older than a
        tombstone collection its relay ran, and resyncs before it pushes (`begin_resync`)."""
        with self._core.mutex:
            return self._store.get_int("resync_needed") > 0

    def begin_resync(self) -> None:
        """Pull everything again from 0, noting what the relay still has (replica/resync.py):
        what a relay that ran a collection without this device asks (`resync_required`).
        The relay refuses every push of a flagged device, so what this pass offered was not
        stored: its rows count as never offered again (a row stored before the flag cannot
        have been deleted and collected since). One process of a file at a time: the
        driver holds the lease `RESYNC_LEASE` meanwhile."""
        with self._core.mutex, self._store.transaction():
            resync.begin(self._store)
            self._unoffer()
            self._resyncing, self._resync_at, self._resync_run = True, 0, 0
        self.restart()

    def _unoffer(self) -> None:
        """Put `offered_through` back, unless another session raised it since."""
        if self._offered is None:
            return
        before, raised = self._offered
        self._offered = None
        if self._store.get_int("offered_through") != raised:
            return
        if before == 0:
            self._store.delete_meta("offered_through")
        else:
            self._store.set_meta("offered_through", before)

    def finish_resync(self) -> resync.Resynced | None:
        """At the head after `begin_resync`: settle what the relay no longer has. An ack is
        then due, whatever was acked before: the empty push that ends the resync there.
        None, changing nothing, when a page of it was not the next one (another process
        pulled meanwhile, so this one did not see everything): begin again."""
        if not self._resyncing:
            raise InvalidArgumentError("no resync was begun in this session")
        self._resyncing = False
        with self._core.mutex, self._store.transaction():
            if self._resync_at != self._store.get_int("cursor"):
                resync.abandon(self._store)
                return None
            done = resync.finish(self._store, self._history())
            for name in ("acked_cursor", "resync_needed"):
                self._store.delete_meta(name)
        self._acked, self._acked_at = 0, None
        return done

    def _history(self) -> resync.History:
        """What the resync may take the relay's pages to cover (replica/resync.py)."""
        if self._store.get_int("relay_changed"):
            return "unknown"
        ran = self._resync_run > 0 or self._store.get_int("run_passed") > 0
        return "collected" if ran else "never_collected"

    def _after_runs(self, entries: list[PageEntry]) -> list[PageEntry]:
        """The entries of a page that was not next that no collection run applied here can
        have outdated: one from before the run may be a version whose tombstone is gone
        now, and would come back. Those dropped are here already, or come again in order
        (the cursor is past them, or not yet at them)."""
        passed = self._store.get_int("run_passed")
        return [e for e in entries if e.seq > passed] if passed else entries

    def _note_sync(self, max_hlc: int, now: int) -> None:
        self._store.set_meta("last_sync_ms", now)
        if max_hlc:
            skew = clock.hlc_ms(max_hlc) - now
            if skew > self._store.get_int("skew_seen_ms", -(1 << 62)):
                self._store.set_meta("skew_seen_ms", skew)

    # -- signing ------------------------------------------------------------------------------

    def sign(self, batch: PushBatch, account: str, device_id: str) -> PushBatch:
        """`batch` signed for this device and the relay last seen, under a counter above every
        one this file used, committed before the batch is sent: a crash skips numbers, never
        reuses one. Counters are taken `COUNTER_BLOCK` at a time, in one transaction, so a
        push costs one transaction per batch (its acknowledgement), not two. A version-1
        account signs nothing (specs/protocol.md §4.7)."""
        with self._core.mutex:
            keys = self._core.keys()
            self._core.refuse_stale_keys()
            signing_key = keys.signing_key
            if signing_key is None:
                return batch
            stored = self._store.get_bytes("relay_state")
            counter = self._next_counter(offered=self._offering)
            cursor = self._store.get_int("cursor")  # the ack: every version up to it is here
            self._acked, self._acked_at = cursor, time.monotonic()
        if stored is None:
            raise ProtocolError(
                "no relay state is known to sign a push for", hint="pull before pushing"
            )
        state = msgspec.msgpack.decode(stored, type=RelayState)
        signer = PushSigner(account, device_id, state)
        acked = msgspec.structs.replace(batch, ack=cursor)
        return sign_push(acked, signing_key, keys.generation, counter, signer)

    def ack_due(self) -> PushBatch | None:
        """An empty batch to push (signed, it acks the cursor) when the cursor passed both
        the last one this session signed and the last one the relay took from this file
        (meta `acked_cursor`, any session's), or the relay took none from this file for
        `KEEPALIVE_MS` (meta `acked_ms`), and this session acked nothing for `ACK_EVERY_S`;
        None otherwise, and for a version-1 account, whose unsigned pushes ack nothing. A
        device that only reads, or whose own pushes moved its cursor, so tells the relay how
        far it is: collection waits for every device active within its horizon
        (docs/tombstone-collection.md §1)."""
        if self._acked_at is not None and time.monotonic() - self._acked_at < ACK_EVERY_S:
            return None
        with self._core.mutex:
            opener = self._core.opener
            if opener is None or opener.keys.signing_key is None:
                return None
            last = max(self._acked, self._store.get_int("acked_cursor"))
            acked_ms = self._store.get_int("acked_ms")  # 0: never (the cursor says when)
            silent = acked_ms and self._core.options.wall_clock_ms() - acked_ms >= KEEPALIVE_MS
            if self._store.get_int("cursor") <= last and not silent:
                return None
        return PushBatch([])

    def _next_counter(self, *, offered: int = 0) -> int:
        """The next counter of the block this session took, or of a new block: the file
        keeps the block's last number, so another session (any process) takes the next. A
        batch with a version above meta `offered_through` (an hlc) raises it to the greatest
        hlc this pass offered (in the same transaction) before it is sent: a version of this
        node up to it may have reached the relay; one written since, even while the batch
        was signed, has a greater hlc and was not offered (replica/resync.py)."""
        spent = self._counters is None or self._counters[0] > self._counters[1]
        if spent or (offered and offered > self._store.get_int("offered_through")):
            with self._store.transaction():
                marked = self._store.get_int("offered_through")
                if offered > marked:
                    before = marked if self._offered is None else self._offered[0]
                    self._offered = (before, offered)
                    self._store.set_meta("offered_through", offered)
                if spent:
                    first = self._store.get_int("push_counter") + 1
                    self._store.set_meta("push_counter", first + COUNTER_BLOCK - 1)
                    self._counters = [first, first + COUNTER_BLOCK - 1]
        assert self._counters is not None, "taken above"
        counter = self._counters[0]
        self._counters[0] += 1
        return counter

    def sign_above(self, last_counter: int) -> bool:
        """Sign from above `last_counter` on: the relay's last counter of this device. True
        when this file is an older copy of itself: the relay saw a counter of this session's
        own block (no other session of the file could take one), or one above every block
        the file gave out. False when another session of the file took a later block and
        pushed with it (two processes on one file)."""
        if not 0 <= last_counter < MAX_HLC:
            raise ProtocolError(
                f"the relay names push counter {last_counter}, out of bounds 0..{MAX_HLC - 1}"
            )
        with self._core.mutex, self._store.transaction():
            given = self._store.get_int("push_counter")
            block_end = self._counters[1] if self._counters is not None else 0
            older_copy = last_counter <= block_end or given < last_counter
            if given < last_counter:
                self._store.set_meta("push_counter", last_counter)
            self._counters = None  # the block may lie below it: take a new one
        return older_copy

    def resync_before_pushing(self) -> None:
        """The relay saw a higher push counter from this device than this file used: the
        file is an older copy of itself (a file restored from a backup of the disk), which
        may predate a collection run and hold what it collected. Its next round resyncs
        before it pushes (replica/resync.py)."""
        with self._core.mutex, self._store.transaction():
            self._store.set_meta("resync_needed", 1)

    # -- relay state: wipe and rollback ---------------------------------------------------------

    def verify_answer(self, batch: PushBatch, result: PushResult) -> None:
        """Raise as `acknowledge` would (`ProtocolError`, `RollbackError`), writing nothing: a
        driver that sends the next batch before it saves this one's receipts checks the answer
        first, so nothing more goes to a relay found wiped, rolled back or misbehaving."""
        _check_receipt_count(batch, result)
        with self._core.mutex, self._store.snapshot():
            self._verify_state(result.state)

    def reseed(self) -> None:
        """Mark every version (held ones too) for pushing, reset the cursor, forget the relay."""
        with self._core.mutex, self._store.transaction():
            self._store.mark_all_for_push()
            self._forget_relay()
        self.restart()

    def adopt_relay(self) -> None:
        """Forget the relay as `reseed` does, but push nothing again: the next sync pulls
        everything from the relay another device reseeded and sets aside what it lacks, as
        if it had collected it (a full resync). For a device away longer than the relay's
        tombstone horizon, whose reseed could bring back what a run took before the wipe."""
        with self._core.mutex, self._store.transaction():
            self._forget_relay()
            self._store.set_meta("resync_needed", 1)
        self.restart()


def _check_receipt_count(batch: PushBatch, result: PushResult) -> None:
    if len(result.receipts) != len(batch.envelopes):
        raise ProtocolError(f"{len(result.receipts)} receipts for {len(batch.envelopes)} envelopes")


def _fit(rows: list[tuple[int, Row, bool]], max_bytes: int) -> list[tuple[int, Row, bool]]:
    """The longest prefix of `rows` within `max_bytes` (at least one row, however large)."""
    size = 0
    for index, (_, row, _) in enumerate(rows):
        size += len(row.envelope)
        if index and size > max_bytes:
            return rows[:index]
    return rows
