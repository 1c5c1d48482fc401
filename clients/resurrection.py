"""When a way back to a relay could bring back what a tombstone collection deleted
(docs/tombstone-collection.md §3 (b)): from a device away longer than the relay's horizon,
which a run may have passed by, or onto a relay restored from a copy older than a run this
device applied, which may still hold what the run deleted."""

from __future__ import annotations

from typing import Literal

from clients.errors import ResurrectionRiskError
from replica import Replica, SyncSession
from replica.relaystate import BEFORE_RUN_HINT
from replica.wire import RelayState

DAY_MS = 24 * 3600 * 1000


def away_past_horizon(replica: Replica, session: SyncSession, horizon_ms: int) -> bool:
    """Whether no relay took an ack of this file within `horizon_ms`, so a collection may
    have passed it by (`SyncSession.away_ms`; a version-1 account's devices never ack, and
    no run passes one by)."""
    return _away_past(replica, session, horizon_ms) is not None


def _away_past(replica: Replica, session: SyncSession, horizon_ms: int) -> int | None:
    """How long this file has been away from any relay, when past `horizon_ms`; else None."""
    away = session.away_ms()
    past = bool(replica.key_generation) and away is not None and away > horizon_ms
    return away if past else None


def follow_reseed(
    replica: Replica, session: SyncSession, horizon_ms: int
) -> Literal["reseed", "adopt"]:
    """Another device reseeded the account: this one reseeds too, pushing everything it
    holds — unless it was away past the relay's tombstone horizon (`horizon_ms`): then it
    adopts the relay (a full resync that sets aside what the relay lacks), for what it holds
    may have been collected meanwhile, and a relay restored from an older copy may lack the
    flag that would make it resync."""
    if away_past_horizon(replica, session, horizon_ms):
        session.adopt_relay()
        return "adopt"
    session.reseed()
    return "reseed"


def refuse_if_away(replica: Replica, session: SyncSession, horizon_ms: int) -> None:
    """`ResurrectionRiskError` when no relay took an ack of this file within `horizon_ms`."""
    away = _away_past(replica, session, horizon_ms)
    if away is None:
        return
    away_days, days = away // DAY_MS, horizon_ms // DAY_MS
    raise ResurrectionRiskError(
        f"this device last reached its relay {away_days} days ago, beyond the relay's "
        f"tombstone horizon of {days} days: it may hold what was deleted and collected "
        "meanwhile, and a reseed from it would bring that back",
        hint="reseed from a device that synced within the horizon, then `sealsync sync "
        "--adopt` here; with no such device, `sync --reseed --allow-resurrection`",
    )


def refuse_a_copy_before_a_run(session: SyncSession, state: RelayState, last_run: int) -> None:
    """`ResurrectionRiskError` for a relay, answering `state` and `last_run`, restored from
    a copy older than a collection run this device applied (`run_missing_from`)."""
    run = session.run_missing_from(state, last_run)
    if run:
        raise ResurrectionRiskError(
            f"the relay was restored from a copy older than collection run {run}: the copy "
            "may still hold what that run deleted, and reseeding onto it or adopting it "
            "would bring that back everywhere",
            hint=BEFORE_RUN_HINT,
        )
