"""A sync session's view of its relay (specs/protocol.md §4.4 to §4.6): the relay state it last
saw, which every answer is checked against (a wiped, reseeded or rolled-back relay is a
`RollbackError`), what a reseed or an adoption forgets of it, and how long ago a relay last
heard from this file. Mixed into `SyncSession` (replica/sync.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from replica.errors import RollbackError
from replica.wire import RelayState

if TYPE_CHECKING:
    from replica.core import Core
    from replica.store import Store


BEFORE_RUN_HINT = (
    "have the relay's operator delete the account (`sealsync relay accounts --delete NAME`), "
    "then `sealsync sync --reseed` from a device that synced recently, and `sealsync sync "
    "--adopt --trust-account` on every device that synced with the restored copy; "
    "`--allow-resurrection` takes this copy as it is"
)


class RelayStates:
    """The relay-state half of `SyncSession`."""

    _core: Core
    _store: Store

    def knows_relay_state(self) -> bool:
        """Whether a relay state was seen since the last reseed (pushes are signed for it)."""
        with self._core.mutex:
            self._core.check_open()
            return self._store.get_bytes("relay_state") is not None

    def last_relay_state(self) -> RelayState | None:
        """The relay state seen last since the last reseed (None: none yet)."""
        with self._core.mutex:
            self._core.check_open()
            return self._known_state()

    def _known_state(self) -> RelayState | None:
        stored = self._store.get_bytes("relay_state")
        return None if stored is None else msgspec.msgpack.decode(stored, type=RelayState)

    def check_relay_state(self, state: RelayState) -> None:
        """Raise `RollbackError` if `state` shows a wiped or rolled-back relay; adopt it first time."""
        with self._core.mutex, self._store.transaction():
            self._check_state(state, 0)

    def _check_state(self, state: RelayState, seen_seq: int, last_run: int | None = None) -> None:
        high = self._verify_state(state, last_run)
        self._store.set_meta("relay_state", msgspec.msgpack.encode(state))
        self._store.set_meta("max_seq_seen", max(high, seen_seq, 0))

    def _verify_state(self, state: RelayState, last_run: int | None = None) -> int:
        """Raise `RollbackError` if `state` is not the relay last seen (with a page's
        `last_run`: nor a relay whose latest run is older than one applied here); the
        highest seq seen."""
        known = self._known_state()
        high = max(self._store.get_int("max_seq_seen"), self._store.get_int("cursor"))
        if known is not None:
            if known.storage_id != state.storage_id:
                raise RollbackError(
                    f"relay storage changed from {known.storage_id} to {state.storage_id}: "
                    "it was wiped or replaced",
                    reason="storage_id",
                    hint="run a reseed to push everything this device holds",
                )
            if known.account_epoch != state.account_epoch:
                raise RollbackError(
                    f"account epoch changed from {known.account_epoch} to {state.account_epoch}",
                    reason="account_epoch",
                    hint="another device reseeded or the relay was restored: reseed",
                )
            self._check_head(known, state, high, last_run)
        return high

    def _check_head(
        self, known: RelayState, state: RelayState, high: int, last_run: int | None
    ) -> None:
        """A head below what this file saw: the relay was restored from an older copy. One
        older than a collection run this file applied (`before_run`) is found by its head or,
        once new pushes lifted its head past the run's seq, by a page's `last_run`."""
        missing = self._run_missing(known, state, last_run)
        if missing:
            raise RollbackError(
                f"the relay lacks collection run {missing}, which this device applied (its "
                f"head is {state.head}): it was restored from a copy older than that run, "
                "and the copy may still hold what the run deleted",
                reason="before_run",
                hint=BEFORE_RUN_HINT,
            )
        if state.head < high:
            raise RollbackError(
                f"relay head {state.head} is below sequence {high} seen before: "
                "it was restored from an older copy",
                reason="head",
                hint="run a reseed to push everything this device holds",
            )

    def run_missing_from(self, state: RelayState, last_run: int | None = None) -> int:
        """The collection run this file applied that the relay, answering `state` (and a
        page's `last_run`), lacks (0: none): in the same storage and account epoch, its head
        or its latest run is below the run's seq, so it was restored from a copy older than
        the run, which may still hold versions the run's tombstones were the last to cover
        (docs/tombstone-collection.md §3 (b))."""
        with self._core.mutex:
            self._core.check_open()
            known = self._known_state()
            return 0 if known is None else self._run_missing(known, state, last_run)

    def _run_missing(self, known: RelayState, state: RelayState, last_run: int | None) -> int:
        passed = self._store.get_int("run_passed")
        same = (known.storage_id, known.account_epoch) == (state.storage_id, state.account_epoch)
        below = state.head < passed or (last_run is not None and last_run < passed)
        return passed if same and below else 0

    def _forget_relay(self) -> None:
        """A reseed or an adoption: the relay is forgotten, and for good, this file's history
        is no longer one relay's (meta `relay_changed`): another relay's collection runs, or
        this one's before a wipe, are not in any page's `last_run` (replica/resync.py)."""
        for name in ("cursor", "max_seq_seen", "relay_state", "acked_cursor", "run_passed"):
            self._store.delete_meta(name)
        self._store.set_meta("relay_changed", 1)

    def away_ms(self) -> int | None:
        """How long ago, by this device's clock, a relay last took an ack of this file — or,
        before its first, this file last pulled (a device that just joined); None when it
        never did either: nothing it holds came from a relay. Collection leaves out a device
        silent past its horizon: one away longer may hold what a run took (specs/protocol.md
        §5.1)."""
        with self._core.mutex:
            seen = self._store.get_int("acked_ms") or self._store.get_int("last_sync_ms")
            return None if not seen else self._core.options.wall_clock_ms() - seen
