"""What the device commands say of a relay that is not the one this device last saw: wiped,
restored from an older copy, or reseeded (specs/protocol.md §4.4 to §4.6)."""

from __future__ import annotations

from replica import RollbackError

ROLLBACK_HINT = (
    "the relay holds less than this device has seen (wiped, or restored from an older copy); "
    "nothing was changed here. If the relay's operator confirms, run `sealsync sync --reseed` "
    "to push everything this device holds"
)

REGAINED_MESSAGE = {
    "logged_in": "logged in to {url} again as a new device",
    "registered": "the relay had lost account {account!r}: registered it again on {url}",
}
FOLLOWED = {
    "reseed": "the account was reseeded since this device last synced: its next sync pushes "
    "everything it holds and pulls everything again",
    "adopt": "the account was reseeded since this device last synced, longer ago than the "
    "relay's tombstone horizon: its next sync pulls everything again and sets aside (see "
    "`sealsync aside`) what the relay lacks, for it may have been deleted meanwhile",
    "stop": "`sealsync sync` stops on it",
}


def rollback_hint(error: RollbackError) -> str:
    """A copy older than a collection run has a way out of its own (the error's hint);
    every other rollback, the reseed the operator confirms."""
    return error.hint if error.reason == "before_run" and error.hint else ROLLBACK_HINT
