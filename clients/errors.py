"""What talking to a relay can go wrong with, as one small tree under `SealsyncError`.

The split that matters to a caller is `retryable`: an `UnknownOutcomeError` (timeout, dropped
connection, truncated answer, 5xx) means the relay may or may not have acted, so the same
request is sent again — every sync request is idempotent. A `RelayRefusedError` is the relay's
definitive word, with its stable `code`. No message ever holds a token or a key.
"""

from __future__ import annotations

from replica.errors import SealsyncError
from replica.wire import ErrorCode


class RelayClientError(SealsyncError):
    """Root of the errors of `clients.http`; `retryable` says whether sending again may help."""

    code = "relay_client"
    retryable = False


class UnknownOutcomeError(RelayClientError):
    """No complete answer: the relay may have acted or not. Safe to retry (idempotent)."""

    code = "unknown_outcome"
    retryable = True


class RelayRefusedError(RelayClientError):
    """A definitive 4xx from the relay, with its machine-readable `code` and `status`.

    Only `rate_limited` (429) is worth sending again, after `retry_after_s`. `code` is one
    the relay can send (`ErrorCode`); a 4xx without one is a `ProtocolMismatchError`.
    """

    code: ErrorCode  # per instance: the relay's code, not the library's class code

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        *,
        retry_after_s: float | None = None,
        hint: str | None = None,
        last_counter: int | None = None,
    ) -> None:
        super().__init__(f"relay refused ({status} {code}): {message}", hint=hint)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s
        self.last_counter = last_counter
        """With `counter_stale`: the relay's last push counter of this device."""
        self.retryable = status == 429


class ProtocolMismatchError(RelayClientError):
    """The relay speaks another protocol version, or is not a sealsync relay at all: also a
    4xx whose body is not the relay's error body of this protocol (a proxy's page, or a code
    outside `ErrorCode`)."""

    code = "protocol_mismatch"


class InsecureRelayError(RelayClientError):
    """A plain-http relay URL that is not loopback: tokens and metadata would travel in clear."""

    code = "insecure_url"


class UntrustedCertificateError(RelayClientError):
    """The relay's TLS certificate did not verify: nothing was sent, and sending again will
    not help until the device trusts what signed it (`--cacert`) or the relay's is fixed."""

    code = "untrusted_certificate"


class ResyncBusyError(RelayClientError):
    """A full resync of this replica file (replica/resync.py) cannot run now: another
    process is running one (this one waited for it), or the replica is locked (its lease
    needs the keys). It is tried again later (`sync --watch` does at its next wake)."""

    code = "resync_busy"
    retryable = True


class NoSessionError(RelayClientError):
    """A call that needs a device session before one was registered, logged in or given."""

    code = "no_session"


class KeysChangedError(RelayClientError):
    """The relay's key bundle is not this device's: another device changed the account's
    keys, so this one must take them before it changes them itself."""

    code = "keys_changed"


class ForeignAccountError(RelayClientError):
    """The relay's account of this name holds older keys than this device's, or others: it was
    registered again, after the relay lost it, by another device — perhaps a revoked one.
    This device pushes nothing there and reads nothing from it."""

    code = "foreign_account"


class AccessLostError(RelayClientError):
    """The relay no longer takes this device's session, or no longer has its account; the
    message says which, the hint the way back (`login`, or `sync --reseed`)."""

    code = "access_lost"


class ResurrectionRiskError(RelayClientError):
    """A reseed refused: this device last reached its relay longer ago than the relay's
    tombstone horizon, so it may hold what a collection took while it was away, and pushing
    everything would bring that back everywhere (specs/protocol.md §5.1)."""

    code = "resurrection_risk"
