"""The one interface every relay storage backend implements (memory, SQLite, PostgreSQL).

Each method is one transaction. Accounts are addressed by name; every query names the
account, so one account can never reach another's rows. Versions follow `relay.versions`:
pushes of one account are serialized, sequence numbers are consecutive and become visible in
order, and a version is dropped only when a stored version of its key dominates it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from relay.signing import BundleKeys, Pusher, bundle_keys
from replica.wire import MAX_RUN_MARKERS, KdfParams, Page, PushBatch, PushResult, RelayState

TokenKind = Literal["access", "refresh", "spent"]
"""A `spent` token is a refresh token already used, kept until its grace period ends."""
RefreshStep = Literal["spend", "replay", "refuse"]
HeadListener = Callable[[str, int], None]
"""Called with (account, head) after a push that stored something has committed."""
CommitObserver = Callable[[int], None]
"""Called with the number of pushes a commit made durable."""


@dataclass(frozen=True)
class AccountRecord:
    """What the relay keeps of an account: hashes of its auth keys and its opaque bundle."""

    name: str
    auth_hash: bytes = field(repr=False)
    recovery_hash: bytes = field(repr=False)
    kdf: KdfParams
    bundle: bytes = field(repr=False)
    bundle_version: int
    created_ms: int

    @property
    def keys(self) -> BundleKeys:
        """The signing key and generation its bundle registers (none for version 1)."""
        return bundle_keys(self.bundle)


@dataclass(frozen=True)
class Device:
    id: str
    name: str
    created_ms: int


@dataclass(frozen=True)
class TokenRecord:
    """A bearer token as stored: its SHA-256, never the token itself."""

    hash: bytes = field(repr=False)
    account: str
    device_id: str
    kind: TokenKind
    expires_ms: int


@dataclass(frozen=True)
class AccountSummary:
    """One line of `sealsync relay accounts`: sizes and counts, nothing an account wrote."""

    name: str
    created_ms: int
    devices: int
    versions: int
    stored_bytes: int
    head: int
    tombstones: int
    """Versions its devices declared tombstones (their signed pushes' `tombstones`)."""
    tombstone_bytes: int
    ack_floor: int | None
    """The seq every device that counts has acknowledged pulling up to: the lowest of their
    last acks (their signed pushes' `ack`); None while one of them has not said yet, or one
    pulls everything again. Devices past the horizon asked for, and flagged ones, do not
    count (`relay.collection.split`)."""
    collected: int
    """Tombstones its collection runs deleted, to date (`Storage.collect`)."""
    collected_bytes: int
    held_back_by: str | None
    """The device collection waits for: one pulling everything again, else one that has not
    acknowledged anything yet, else the one whose last ack is the floor (a lost phone's,
    say: revoking it, or a horizon, lets runs go on)."""
    resyncing: int
    """Devices flagged to pull everything again before they push (`resync_required`)."""


@dataclass(frozen=True)
class CollectReport:
    """What one collection run did to an account (`Storage.collect`)."""

    account: str
    ack_floor: int | None
    """The lowest last ack of its devices: tombstones up to it were collectable; None while
    a device has not acknowledged anything (then nothing is collected or released)."""
    run: int | None
    """The seq the run took; None when it found nothing to collect (no seq taken)."""
    versions: int
    bytes: int
    released: int
    """Earlier runs dropped, markers and ghosts, now that every device has pulled past them."""
    flagged: int = 0
    """Devices past the horizon that this call flagged to resync: they would never see the
    markers of a run it made or released."""


@dataclass(frozen=True)
class LoginFailures:
    """Failed logins for one account name within a window: from one client address, from
    every address, and when the oldest one from that address was (its wait ends with it)."""

    from_address: int
    from_anywhere: int
    oldest_from_address_ms: int | None


class Storage(Protocol):
    """A relay's durable state. Methods are synchronous; the app calls them off its loop."""

    @property
    def storage_id(self) -> str:
        """Random id of this database: a wiped or replaced database has another one."""
        ...

    @property
    def secret(self) -> bytes:
        """A random per-database secret (deterministic fake prelogin parameters)."""
        ...

    # -- accounts ---------------------------------------------------------------------------

    def create_account(
        self,
        account: AccountRecord,
        device: Device,
        tokens: list[TokenRecord],
        invite_hash: bytes | None,
        now_ms: int,
    ) -> RelayState:
        """Create the account with its first device and tokens; consume the invite when one
        is given. Raises `ForbiddenError` for an unusable invite — checked first, so it tells
        nothing of which names exist — or `AccountExistsError` (the invite stays usable)."""
        ...

    def account(self, name: str) -> AccountRecord | None: ...

    def delete_account(self, name: str) -> bool:
        """Delete the account with its devices, tokens and versions; False if it was gone."""
        ...

    def put_key_bundle(
        self,
        name: str,
        expected_version: int,
        bundle: bytes,
        kdf: KdfParams,
        auth_hash: bytes,
        *,
        only_device: str | None = None,
        revoke_device: str | None = None,
        recovery_hash: bytes | None = None,
    ) -> int | None:
        """Replace the bundle (and the passphrase's auth hash) if its version is still
        `expected_version`; the new version, or None when another change came first. With
        `only_device`, every other device's tokens end in the same transaction (their
        devices log in again, with the new passphrase); with `revoke_device`, that device
        and its tokens go in it (`NotFoundError`, and nothing changed, if there is none):
        a rotation that revokes (docs/key-generations.md §6); with `recovery_hash`, a new
        recovery key's auth hash replaces the old one's."""
        ...

    def add_invite(self, invite_hash: bytes, expires_ms: int) -> None: ...

    def accounts(
        self, name: str | None = None, *, horizon_ms: int | None = None
    ) -> list[AccountSummary]:
        """Every account's summary by name, or only `name`'s (none if there is no such); its
        `ack_floor` and `held_back_by` as a run with `horizon_ms` sees them (`collect`)."""
        ...

    def login_failures(self, name: str, address: str, since_ms: int) -> LoginFailures:
        """The failed logins for `name` after `since_ms`, known account or not."""
        ...

    def add_login_failure(self, name: str, address: str, at_ms: int, forget_before_ms: int) -> None:
        """Count one failed login; every failure at or before `forget_before_ms` (past every
        window) is forgotten on the way."""
        ...

    def clear_login_failures(self, name: str, address: str) -> None:
        """A correct login from `address` forgives that address's failures for `name`."""
        ...

    # -- devices and tokens -----------------------------------------------------------------

    def add_device(self, name: str, device: Device, tokens: list[TokenRecord]) -> None: ...

    def renew_device(self, name: str, device_id: str, tokens: list[TokenRecord]) -> bool:
        """A device of `name` logging in again: its tokens are replaced by `tokens`, its entry
        kept. False (nothing changed) when it is not this account's device."""
        ...

    def devices(self, name: str) -> list[Device]: ...

    def rename_device(self, name: str, device_id: str, new_name: str) -> bool:
        """False if the device is not this account's (an id with NUL never is one)."""
        ...

    def revoke_device(self, name: str, device_id: str, *, own: bool = False) -> bool:
        """Delete the device and every token it holds; False if it is not this account's (an
        id with NUL never is one). Unless the device ends its `own` access, its tokens are
        remembered as revoked (`is_revoked_token`)."""
        ...

    def token(self, token_hash: bytes) -> TokenRecord | None: ...

    def is_revoked_token(self, token_hash: bytes) -> bool:
        """Whether a device held this token when it was revoked: it is told so, not only
        that its session ended (kept until the account is deleted)."""
        ...

    def replace_token(
        self, old_hash: bytes, tokens: list[TokenRecord], grace_until_ms: int
    ) -> bool:
        """Spend a refresh token and store its successors, atomically (the device's expired
        tokens go too). A spent token stays until `grace_until_ms` so that a device whose
        reply was lost can send it again: that replaces the successors it never received —
        unless they were used already (the device has a later spent token), or the grace is
        over. False when nothing was stored: the token is unknown, spent and past its grace
        or superseded, or its device is gone. A spent token refused so was used again out of
        turn — a copy of it is loose — so every token of its device goes too: the device logs
        in again, and whoever holds a copy holds nothing."""
        ...

    # -- versions ---------------------------------------------------------------------------

    def state(self, name: str) -> RelayState: ...

    def reseed(self, name: str) -> RelayState:
        """A new account epoch, data kept: every device then knows to push what it holds."""
        ...

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        """One receipt per envelope, after a durable commit. A version-2 account's push must
        be signed for `pusher` (`relay.signing.authorize_push`, checked under the account's
        lock) with a counter above the device's last, which is recorded even when the push
        is then refused. Raises `QuotaExceededError` (nothing stored) when the batch would
        grow the account past its quota (`relay.versions.is_over_quota`)."""
        ...

    def pull(
        self,
        name: str,
        cursor: int,
        limit: int | None = None,
        *,
        device_id: str | None = None,
        resync: bool = False,
    ) -> Page:
        """Versions with seq > cursor in seq order: at most min(`limit`, page size) of them
        and `max_page_bytes` of envelopes (at least one), never reading more than that. A
        device flagged to resync (`device_id`) pulls only with `resync`, and its pull from 0
        marks when its resync began; else `ResyncRequiredError`."""
        ...

    def stored_versions(self, name: str) -> int: ...

    def collect(
        self, name: str, *, limit: int = MAX_RUN_MARKERS, horizon_ms: int | None = None
    ) -> CollectReport:
        """One collection run (`relay.collection`), in one transaction under the account's
        lock, so pushes and runs take turns: at most `limit` tombstones, each its key's sole
        version, at or below every device's last ack. A run that deletes any takes the next
        seq (the head) and keeps their dots until every device has acknowledged it. With
        `horizon_ms`, a device silent for longer counts for nothing, and is flagged to
        resync once a run it did not pull past is made or released."""
        ...

    def listen(self, listener: HeadListener) -> None:
        """Call `listener` after every push that moved an account's head — also for pushes
        through other relay processes when the backend is shared (PostgreSQL)."""
        ...

    def observe_commits(self, observer: CommitObserver) -> None:
        """Call `observer` after each commit of pushes with how many it made durable: several
        when SQLite's group commit joins them, one elsewhere (the relay's metrics)."""
        ...

    def close(self) -> None: ...


DEFAULT_MAX_DRIFT_MS = 5 * 60 * 1000
DEFAULT_PAGE_SIZE = 4000
"""Envelopes per page, and (`DEFAULT_MAX_PUSH_ENVELOPES`) per push: a commit's cost grows
slower than its size (the key index is written at random places either way), so 4000 syncs
~20% faster than 1000; the byte bounds still cap what one request holds."""
DEFAULT_MAX_PUSH_ENVELOPES = DEFAULT_PAGE_SIZE
DEFAULT_MAX_ACCOUNT_BYTES = 1 << 30
DEFAULT_MAX_PAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class VersionRules:
    """The bounds a backend applies to pushes and pulls (docs/architecture.md §8.5, specs/limits.md); their
    defaults are the relay's (`RelayConfig`) and the in-memory reference's."""

    clock_ms: Callable[[], int]
    max_drift_ms: int = DEFAULT_MAX_DRIFT_MS
    page_size: int = DEFAULT_PAGE_SIZE
    max_account_bytes: int = DEFAULT_MAX_ACCOUNT_BYTES
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    """A page holds at most this many envelope bytes (but always at least one envelope)."""
    accept_unsigned_pushes: bool = False
    """Take unsigned pushes into an account without a signing key (version 1)."""


def refresh_step(
    kind: TokenKind, expires_ms: int, latest_other_spent_ms: int | None, now_ms: int
) -> RefreshStep:
    """What a refresh with this stored token does, on every backend (protocol.md §6.2):
    a live token is spent; a spent one is replayed — its unreceived successors replaced —
    while in its grace and while it is the device's latest spent token (a later one means
    the successors arrived and were used); anything else is refused."""
    if kind != "spent":
        return "spend"
    if expires_ms <= now_ms or (
        latest_other_spent_ms is not None and latest_other_spent_ms >= expires_ms
    ):
        return "refuse"
    return "replay"


def spent_until(grace_until_ms: int, latest_other_spent_ms: int | None) -> int:
    """When a token spent now stops being replayable: its grace, but always after the
    device's earlier spent tokens, so that the order of spends survives a clock stepped
    back or a shorter grace."""
    if latest_other_spent_ms is None:
        return grace_until_ms
    return max(grace_until_ms, latest_other_spent_ms + 1)


def new_random_id() -> str:
    """A storage id or account epoch: 128 random bits, hex."""
    return secrets.token_hex(16)
