"""What a sync round tells as it goes (`Progress`, one step of a batch or page) and at its end
(`SyncReport`), and how `SyncDriver` (clients/sync.py) keeps count of both."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from replica import ErrorCode, Resynced, SyncSession

Phase = Literal[
    "push_sending", "push_answered", "receipts_saved", "pull_sending", "merge_start", "merged"
]
"""The step a round has reached, in the order each batch or page goes through them; the
steps of neighbours interleave (the next batch is sent before this one's receipts are saved,
the next page is asked for before this one merges, and asked for again when a page fetched
ahead is dropped: see `SyncDriver`). A crash
between `push_answered` and `receipts_saved` leaves versions the relay has committed still
dirty: the next round pushes them again and the relay answers for them without storing them
twice. A crash between `merge_start` and `merged` leaves the page unmerged and the cursor
where it was."""


@dataclass(frozen=True)
class Progress:
    """One step of a round, reported as it happens (for a progress bar, or a log a GUI reads).

    `size`: envelopes in the batch or page the step is about (0 for `pull_sending`).
    `pushed`: envelopes acknowledged so far in this `sync()`, of `push_total` (those and the
    versions dirty when the round began; held versions a reseed marks come on top).
    `pulled`: entries pulled so far. `pull_done` of `pull_total`: sequence numbers covered
    since the round's first cursor, of those up to the relay's head (None until the first
    page): a bar in seqs, as the head also counts versions the relay has since dropped.
    """

    phase: Phase
    size: int
    pushed: int
    push_total: int
    pulled: int
    pull_done: int
    pull_total: int | None


@dataclass(frozen=True)
class SyncReport:
    """One `sync()`: receipts by status (refusals by their code), pulled entries, merged
    versions; `rounds` is 2 when an epoch change made the device reseed and run again;
    `retries` counts resent requests; `unconfirmed` counts versions the relay called
    superseded that nothing here supersedes after the pull (they stay to be pushed); `held`
    and `quarantined` count pulled versions set aside (to merge later) and those that could
    not be opened (kept verbatim in quarantine, their records degraded); `untrusted` those
    refused as a revoked device's (sealed under a retired key epoch, beyond its frontier);
    `pushing_paused` that a watch pulled only: the account's keys changed on another device,
    and this one needs the new passphrase to take them; `resynced` what a full resync did,
    when the relay asked for one (`resync_required`: it collected tombstones without this
    device), with `set_aside` versions kept here, neither merged nor pushed."""

    pushed: int
    stored: int
    superseded: int
    refused_by_code: dict[ErrorCode, int]
    pulled: int
    merged: int
    rounds: int
    retries: int
    unconfirmed: int = 0
    held: int = 0
    quarantined: int = 0
    untrusted: int = 0
    pushing_paused: bool = False
    resynced: Resynced | None = None

    @property
    def refused(self) -> int:
        return sum(self.refused_by_code.values())


@dataclass
class Tally:
    pushed: int = 0
    stored: int = 0
    superseded: int = 0
    refused_by_code: Counter[ErrorCode] = field(default_factory=Counter)
    pulled: int = 0
    merged: int = 0
    rounds: int = 0
    unconfirmed: int = 0
    held: int = 0
    quarantined: int = 0
    untrusted: int = 0
    resynced: Resynced | None = None

    def report(self, retries: int) -> SyncReport:
        return SyncReport(
            self.pushed,
            self.stored,
            self.superseded,
            dict(self.refused_by_code),
            self.pulled,
            self.merged,
            self.rounds,
            retries,
            self.unconfirmed,
            self.held,
            self.quarantined,
            self.untrusted,
            resynced=self.resynced,
        )


class Reporter:
    """Turns a round's steps into `Progress` events for the driver's callback, if it has one."""

    def __init__(
        self,
        callback: Callable[[Progress], None] | None,
        session: SyncSession,
        tally: Tally,
        cursor: int,
    ) -> None:
        """Counting the dirty versions costs a query, so only a callback pays for it."""
        self._callback = callback
        self._tally = tally
        self._push_total = tally.pushed + (session.count_dirty() if callback else 0)
        self._first_cursor = cursor
        self._pull_done = 0
        self._pull_total: int | None = None

    def saw_head(self, head: int) -> None:
        self._pull_total = max(0, head - self._first_cursor)

    def moved_to(self, cursor: int) -> None:
        self._pull_done = max(0, cursor - self._first_cursor)

    def step(self, phase: Phase, size: int) -> None:
        if self._callback is None:
            return
        t = self._tally
        push_total = max(self._push_total, t.pushed)
        self._callback(
            Progress(phase, size, t.pushed, push_total, t.pulled, self._pull_done, self._pull_total)
        )
