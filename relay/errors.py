"""Errors the relay answers with: each a 4xx status and a stable machine-readable code.

The app turns a `RelayError` into `{"code", "message"}` with its status; anything else is a
bug. Messages name the bound that was broken, never a token, key or another account's data.
Refusals and `StoreFailedError` (storage failed: a 500) are `SealsyncError`s, so the command
line prints them as every other error: an `error:` line, and a `hint:` line where the operator
can act.
"""

from __future__ import annotations

import sqlite3

from replica.errors import SealsyncError
from replica.wire import ErrorCode


class RelayError(SealsyncError):
    """A request the relay refuses; `status` is the HTTP status, `code` the stable code.

    The `hint` stays on this side: the answer carries only code and message, and a client
    keeps its own hints by code (they speak of its commands, not of the relay's)."""

    status = 400
    code: ErrorCode = ErrorCode.BAD_REQUEST

    def __init__(
        self, message: str, *, retry_after_s: int | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.message = message
        self.retry_after_s = retry_after_s


class MalformedError(RelayError):
    """The body is not a well-formed message of the endpoint's type."""

    code = ErrorCode.MALFORMED


class InvalidError(RelayError):
    """A well-formed message breaks a documented bound (a name too long, a NUL)."""

    status = 422
    code = ErrorCode.INVALID


class UnauthorizedError(RelayError):
    """No valid token: missing, malformed, unknown, expired or revoked — one answer for all."""

    status = 401
    code = ErrorCode.UNAUTHORIZED

    def __init__(self) -> None:
        super().__init__("a valid bearer token is required")


class BadCredentialsError(RelayError):
    """Login failed; the same answer whether the account exists or not."""

    status = 401
    code = ErrorCode.BAD_CREDENTIALS

    def __init__(self) -> None:
        super().__init__("account or key not recognised")


class ForbiddenError(RelayError):
    status = 403
    code = ErrorCode.FORBIDDEN


class KeyRetiredError(RelayError):
    """A push signed by a generation the account has left: the device needs the new one."""

    status = 403
    code = ErrorCode.KEY_RETIRED


class DeviceRevokedError(RelayError):
    """A token its device held when another device revoked it: that device stops, and says
    so (docs/key-generations.md §7)."""

    status = 403
    code = ErrorCode.DEVICE_REVOKED

    def __init__(self) -> None:
        super().__init__("this device was revoked by another device of the account")


class NotFoundError(RelayError):
    status = 404
    code = ErrorCode.NOT_FOUND


class ConflictError(RelayError):
    """A compare-and-set lost, or a name is taken."""

    status = 409
    code = ErrorCode.CONFLICT


class AccountExistsError(ConflictError):
    code = ErrorCode.ACCOUNT_EXISTS


class VersionConflictError(ConflictError):
    code = ErrorCode.VERSION_CONFLICT


class CounterStaleError(ConflictError):
    """A signed push whose counter is not above the last one this device used: a replay,
    or a device restored from a backup, which signs again above `last_counter`."""

    code = ErrorCode.COUNTER_STALE

    def __init__(self, counter: int, last_counter: int) -> None:
        super().__init__(
            f"push counter {counter} is not above {last_counter}, the last one this device used"
        )
        self.last_counter = last_counter


class ResyncRequiredError(ConflictError):
    """A device a tombstone collection ran without (away past the horizon, or added after a
    run) pulls everything again, asking for it (`resync`), before it pushes or pulls as
    usual: what it holds may be what the collected tombstones replaced."""

    code = ErrorCode.RESYNC_REQUIRED

    def __init__(self) -> None:
        super().__init__(
            "this device must pull everything again first: tombstones were collected while "
            "it was away (pull from cursor 0 with resync=1, then ack the head in an empty "
            "signed push)"
        )


class TooLargeError(RelayError):
    status = 413
    code = ErrorCode.TOO_LARGE


class QuotaExceededError(RelayError):
    """The batch would take the account past its storage quota: all of it rolled back."""

    status = 413
    code = ErrorCode.QUOTA_EXCEEDED


class UnsupportedMediaError(RelayError):
    status = 415
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class RateLimitedError(RelayError):
    status = 429
    code = ErrorCode.RATE_LIMITED


STORE_FAILED_HINT = (
    "check the relay's storage: free disk space and the permissions of its SQLite file, or "
    "its PostgreSQL server; nothing of the failed commit was stored, and devices send it again"
)


class StoreFailedError(SealsyncError):
    """Storage failed under the relay (a disk error, a lost database): a 500, not a refusal.

    Not a `RelayError` on purpose: the app maps only refusals to a 4xx; this one is logged
    with its cause, counted, and answered 500 (the client's "unknown outcome", retried). A
    storage call whose database raised anything (`is_storage_error`) ends as this one."""

    code = "store_failed"

    def __init__(self, message: str, *, hint: str | None = STORE_FAILED_HINT) -> None:
        super().__init__(message, hint=hint)


def is_storage_error(exc: BaseException) -> bool:
    """A failure of the database under the relay (SQLite's or PostgreSQL's)."""
    database = type(exc).__module__.split(".")[0] == "psycopg"
    return database or isinstance(exc, (StoreFailedError, sqlite3.Error))
