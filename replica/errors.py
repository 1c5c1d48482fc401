"""The one exception tree of sealsync.

Every error names what failed, the offending value (never a secret) and the bound, and carries
an operator `hint` where the user can act; the CLI prints `error:` and `hint:` lines. `code`
names the kind of error for machines (logs, scripts). The relay's and the client's errors join
this tree too (relay.errors, clients.errors); a relay refusal's `code` is instead the one it
answers with, a `replica.wire.ErrorCode` — the wire's codes are that enum, not these strings.
No message ever holds plaintext, keys or tokens.
"""

from __future__ import annotations

import sqlite3
from typing import Literal


class SealsyncError(Exception):
    """Root of every error sealsync raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class InvalidArgumentError(SealsyncError, ValueError):
    """An argument breaks a documented bound (id length, document size, unknown collection)."""

    code = "invalid_argument"


class ProtocolError(SealsyncError):
    """Bytes from a peer or a file do not follow the wire format (a malformed header or value)."""

    code = "malformed"


class EnvelopeError(SealsyncError):
    """An envelope failed to open: tampered, truncated, relabelled, moved, or the wrong key.

    One type for every cause on purpose: a caller must not be able to tell which check failed.
    """

    code = "undecryptable"


class UnknownEpochError(SealsyncError):
    """An envelope was sealed under a key epoch this replica does not know yet: hold it."""

    code = "unknown_epoch"


class NewerKeysError(ProtocolError):
    """A folder file is signed under a key generation newer than this device's: it waits
    until the device takes the new keys."""

    code = "newer_keys"


class RetiredKeysError(ProtocolError):
    """A folder file is signed under a key generation a rotation retired: never read (a
    revoked device's, or one its device writes again under the new keys)."""

    code = "retired_keys"


class WeakPassphraseError(InvalidArgumentError):
    """A new passphrase too easy to guess to protect an account (`replica.passphrase`)."""

    code = "weak_passphrase"


class KdfParametersError(SealsyncError):
    """Argon2id parameters outside the floors and ceilings, stored or served."""

    code = "kdf_parameters"


class WrongKeyError(SealsyncError):
    """A passphrase, recovery key or raw key that does not unlock this account."""

    code = "wrong_key"


class ReplicaLockedError(SealsyncError):
    """The replica is locked: nothing sensitive can be read or written until it is unlocked."""

    code = "locked"


class ReplicaClosedError(SealsyncError):
    """The replica was closed."""

    code = "closed"


class DegradedError(SealsyncError):
    """A record could not be decrypted or parsed; its reads and overwrites are refused."""

    code = "degraded"


class StaleContextError(SealsyncError):
    """A conditional write found the record's siblings changed since its context was read."""

    code = "stale_context"


class ItemLimitError(SealsyncError):
    """A local write would take a per_item collection past its `max_items`."""

    code = "item_limit"


class RepairRefusedError(SealsyncError):
    """Repair found most rows undecryptable, which means a key mismatch, not corruption."""

    code = "repair_refused"


class FeedResetError(SealsyncError):
    """A change feed cursor this file's feed cannot continue: another file's (a restored
    backup, a copy) or behind what the feed still holds. Re-read everything, then follow
    from `Replica.feed_head()`."""

    code = "feed_reset"


class LeaseBusyError(SealsyncError):
    """Another holder has the lease (`Replica.lease`), or this holder's ran out and another
    took it; HTTP apps answer 409."""

    code = "lease_busy"


RollbackReason = Literal["storage_id", "account_epoch", "head", "before_run"]


class RollbackError(SealsyncError):
    """The relay was wiped or restored from an older copy (new storage id, epoch or low head).

    `reason` names the check that failed: a driver asks the relay for a new epoch only after
    a storage id or head rollback — an epoch change means another device already reseeded."""

    code = "relay_rollback"

    def __init__(self, message: str, *, reason: RollbackReason, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason: RollbackReason = reason


class StoreError(SealsyncError):
    """The replica file is not a sealsync replica, or is of a newer format than this code."""

    code = "store"


SQLITE_IOERR = 10
SQLITE_FULL = 13


def is_disk_error(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed to write: an I/O error or a full file (any extended code of
    either); the store then trusts its connection no more (`Store._after_failure`)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (SQLITE_IOERR, SQLITE_FULL)
