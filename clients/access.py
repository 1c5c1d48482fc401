"""A device getting back onto its relay: what `login` and `sync --reseed` do when the relay no
longer takes the device's session (specs/protocol.md §4.6).

A session ends when its device is revoked, its tokens expire or are lost — also with a relay
restored from a copy older than them — and the account is then still on the relay: logging in
again, as a new device, is all it takes. When the relay was wiped, or restored from a copy
older than the account, the account itself is gone, and only registering it again, with the
key bundle and the auth keys the device holds, brings it back. Prelogin tells the two apart
without trying a secret: the relay hands out the account's own KDF salt, and a fake one for an
account it does not have, so a salt other than this replica's means the relay does not have
the account as this device knows it (lost — or its passphrase was changed on another device,
and registering again then finds the name taken). No step here changes the replica except
`follow_relay`, which only marks it for a reseed (or a full resync): nothing can be lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import msgspec

from clients.account import Secret, log_in
from clients.device import RelaySettings, load_settings, sidecar_path
from clients.errors import (
    AccessLostError,
    ForeignAccountError,
    NoSessionError,
    RelayClientError,
    RelayRefusedError,
)
from clients.http import RelayClient, check_relay_url
from clients.resurrection import follow_reseed
from clients.sync import SyncDriver
from replica import LoginKeys, Replica, RollbackError, recovery_login_keys
from replica.bundles import is_foreign, parse_bundle
from replica.errors import InvalidArgumentError, ProtocolError
from replica.wire import ErrorCode, RegisterRequest, Session, auth_key_hash

Regained = Literal["logged_in", "registered"]
RESEED_HINT = (
    "if the relay lost the account (wiped, or restored from an older copy), "
    "`sealsync sync --reseed` registers it again and pushes everything this device holds "
    "(with --invite if the relay takes new accounts by invite only); if the passphrase was "
    "changed on another device, `sealsync login --recovery-key` logs this device in again"
)
HINT_BY_REGISTER_REFUSAL: dict[ErrorCode, str] = {
    ErrorCode.ACCOUNT_EXISTS: "the relay has the account, with another passphrase: it was "
    "changed on another device. Nothing was changed here; `sealsync login --recovery-key` "
    "logs this device in again",
    ErrorCode.FORBIDDEN: "the relay takes new accounts by invite only: give --invite (or "
    "SEALSYNC_INVITE); its operator makes one with `sealsync relay invite`",
}
LOGIN_HINT = (
    "`sealsync login` logs this device in again (as a new device); its next sync checks the "
    "relay and follows any reseed"
)


def is_session_refused(exc: RelayClientError) -> bool:
    """The relay does not take this device's tokens (or it has none): unknown, expired,
    revoked or lost with the relay's data — the relay gives one answer for all of them."""
    if isinstance(exc, NoSessionError):
        return True
    return isinstance(exc, RelayRefusedError) and exc.code == ErrorCode.UNAUTHORIZED


def has_account(client: RelayClient, replica: Replica, account: str) -> bool:
    """True when the relay has `account` with this replica's KDF salt (see the module doc)."""
    return client.prelogin(account).kdf == replica.kdf_params()


def access_lost_error(client: RelayClient, replica: Replica, account: str) -> AccessLostError:
    """What a refused session means here, and the way back."""
    if has_account(client, replica, account):
        return AccessLostError(
            f"the relay does not take this device's session for account {account!r} "
            "(unauthorized: revoked, expired, or lost with the relay's data); nothing was "
            "changed here",
            hint=LOGIN_HINT,
        )
    return AccessLostError(
        f"the relay does not have account {account!r} as this device knows it: it was wiped or "
        "restored from a copy older than the account, or the passphrase was changed on another "
        "device (as a revoke that rotates the keys does: this device may be the revoked one); "
        "nothing was changed here",
        hint=RESEED_HINT,
    )


@contextmanager
def explained_refusals(client: RelayClient, replica: Replica, account: str) -> Iterator[None]:
    """A refused session becomes an `AccessLostError` saying whether the account is still
    there: the generic "unauthorized" cannot tell `login` from `sync --reseed`."""
    try:
        yield
    except RelayClientError as exc:
        if not is_session_refused(exc):
            raise
        raise access_lost_error(client, replica, account) from exc


@dataclass(frozen=True)
class Reentry:
    """What a device brings to get back onto its account on a relay: the account's name, the
    passphrase's login keys (derived once: the replica was unlocked with them), the name it
    registers under, how to ask for the recovery key (asked only to register an account
    whose bundle does not carry the recovery auth key: made before it was kept), and an
    invite for a relay that takes new accounts by invite only."""

    account: str
    login: LoginKeys
    device_name: str
    recovery_key: Callable[[], str] = field(repr=False)
    invite: str | None = field(default=None, repr=False)
    trust_account: bool = False
    """Log in to an account another device registered again after a wipe (the person
    knows that device: see `refuse_reregistered`)."""


def regain_access(client: RelayClient, replica: Replica, reentry: Reentry) -> Regained | None:
    """Before a reseed: make sure the device has a working session. Log in again if the relay
    still has the account, register the account again if not; None if the session works.
    The client adopts (and its `on_session` saves) the new session."""
    try:
        state = client.state()
    except RelayClientError as exc:
        if not is_session_refused(exc):
            raise
    else:  # a session saved by a login whose end below did not reach the relay, say
        if client.session is not None:
            session = msgspec.structs.replace(client.session, state=state)
            trust = reentry.trust_account
            refuse_reregistered(
                client, replica, reentry.account, reentry.login, session, trust=trust
            )
        return None
    if has_account(client, replica, reentry.account):  # the replica's KDF is the relay's
        was = client.session.device_id if client.session else None
        session = log_in(client, reentry.account, reentry.login, reentry.device_name, device_id=was)
        trust = reentry.trust_account
        refuse_reregistered(client, replica, reentry.account, reentry.login, session, trust=trust)
        return "logged_in"
    register_again(client, replica, reentry)
    return "registered"


def check_way_back(
    client: RelayClient, replica: Replica, account: str, *, adopt: bool, check_reseed: bool
) -> None:
    """Before a way back logs in or registers anything: an adoption needs the account on the
    relay (another device reseeded it: adopting an empty relay would set aside everything
    here); a reseed, unless told otherwise, a device not away past the tombstone horizon."""
    if adopt and not has_account(client, replica, account):
        raise AccessLostError(
            f"the relay does not have account {account!r}: no device reseeded it since it lost "
            "it, so there is nothing to adopt; nothing was changed here",
            hint="reseed from a device that synced within the relay's tombstone horizon "
            "(`sealsync sync --reseed`), then `sealsync sync --adopt` here",
        )
    if not adopt and check_reseed:
        SyncDriver(replica, client).refuse_reseed_if_away()


def register_again(client: RelayClient, replica: Replica, reentry: Reentry) -> Session:
    """Register the account the relay lost, with this device's key bundle, the passphrase's
    auth key and the recovery key's auth key hash (sealed in the bundle), as at `init`; the
    client adopts the new session.

    A lost answer is safe to retry: the account then exists with this salt, and the next
    attempt logs in instead.
    """
    recovery_auth_hash = replica.recovery_auth_hash()
    if recovery_auth_hash is None:
        key = reentry.recovery_key()
        replica.unlock_with_recovery_key(key)  # a key of another account stops here
        recovery_auth_hash = auth_key_hash(recovery_login_keys(key).auth_key)
    kdf = replica.kdf_params()
    request = RegisterRequest(
        account=reentry.account,
        auth_key=reentry.login.auth_key,
        recovery_auth_hash=recovery_auth_hash,
        kdf=kdf,
        bundle=replica.key_bundle(),
        device_name=reentry.device_name,
        invite=reentry.invite,
    )
    try:
        return client.register(request)
    except RelayRefusedError as exc:
        hint = HINT_BY_REGISTER_REFUSAL.get(exc.code)
        if hint is None:
            raise
        raise AccessLostError(str(exc), hint=hint) from exc


def login_again(
    client: RelayClient,
    replica: Replica,
    account: str,
    secret: Secret,
    device_name: str,
    *,
    device_id: str | None = None,
    trust_account: bool = False,
) -> Session:
    """`login`: unlock the replica with `secret` first — a secret of another account stops
    there, before anything is sent — then log in: as the device `device_id` it was, if the
    relay still lists it, else as a new one. Refused although the secret opens this replica:
    the relay does not have the account as this device knows it. The replica's KDF
    parameters serve for both: a relay with others has not this account. An account another
    device registered again after a wipe is refused unless `trust_account`."""
    keys = secret.login_keys(replica.kdf_params())
    secret.unlock(replica, keys)
    try:
        session = log_in(client, account, keys, device_name, device_id=device_id)
    except RelayRefusedError as exc:
        if exc.code != ErrorCode.BAD_CREDENTIALS:
            raise
        raise AccessLostError(
            f"the relay does not take this device's secret for account {account!r}: it lost "
            "the account (wiped, or restored from a copy older than it), or the passphrase "
            "was changed on another device; nothing was changed here",
            hint=RESEED_HINT,
        ) from exc
    refuse_foreign_account(client, replica, account, keys, session)
    refuse_reregistered(client, replica, account, keys, session, trust=trust_account)
    return session


def refuse_reregistered(
    client: RelayClient,
    replica: Replica,
    account: str,
    keys: LoginKeys,
    session: Session,
    *,
    trust: bool,
) -> None:
    """After a login: a relay wiped since this device last saw it (another storage id) has
    the account only because a device registered it again. Another one, holding the same
    keys as this one, may be trusted or may be a revoked one that kept them: they look alike
    from here (docs/key-generations.md §9), so this device pushes nothing there until the
    person, told which device it was, says they trust it (`--trust-account`); its session
    there, `session`, is ended meanwhile. Nothing is checked when the person said `trust`."""
    known = replica.sync_session().last_relay_state()
    if trust or known is None or known.storage_id == session.state.storage_id:
        return
    first = min(client.devices().devices, key=lambda d: d.created_ms, default=None)
    if first is None or first.id == session.device_id:
        return  # this device registered it again itself
    who = f"device {first.name!r}"
    client.revoke_device(session.device_id, keys.auth_key)
    raise ForeignAccountError(
        f"the relay was wiped since this device last synced, and {who} registered account "
        f"{account!r} again: if that is a device you revoked, it kept the keys this one "
        "holds, so this device pushes nothing there (its session there was ended)",
        hint=f"if you trust {who}, run this again with --trust-account; if not, ask the "
        f"relay's operator to delete the account (`sealsync relay accounts --delete "
        f"{account}`), then `sealsync sync --reseed` here registers yours",
    )


def refuse_foreign_account(
    client: RelayClient, replica: Replica, account: str, keys: LoginKeys, session: Session
) -> None:
    """After a login: an account whose keys are older than this device's, or others, is not
    this device's (docs/key-generations.md §7): the session just made is revoked at once, so
    no later sync pushes there or reads from there, and the way out is said."""
    relay_bundle = client.key_bundle(keys.auth_key).bundle
    try:
        foreign = is_foreign(parse_bundle(relay_bundle), parse_bundle(replica.key_bundle()))
    except ProtocolError:
        foreign = True
    if not foreign:
        return
    client.revoke_device(session.device_id, keys.auth_key)
    raise ForeignAccountError(
        f"the relay's account {account!r} holds older keys than this device's, or others: "
        "another device registered it again after the relay lost it (perhaps the revoked "
        "one); this device pushes nothing there, and its session there was ended",
        hint=f"ask the relay's operator to delete it (`sealsync relay accounts --delete "
        f"{account}`), then `sealsync sync --reseed` here registers yours again",
    )


@dataclass(frozen=True)
class RelayFinding:
    """What `follow_relay` found, and what this device does about it (`then`)."""

    rollback: RollbackError
    then: Literal["reseed", "adopt", "stop"]


def follow_relay(replica: Replica, session: Session, horizon_ms: int) -> RelayFinding | None:
    """After a login: the relay state the new session carries, checked against the last this
    device saw; the finding, if any, is returned. An account epoch or storage id other than
    it means the account was reseeded — registered again, after a wipe, when the storage
    changed, which only a device holding its auth keys can do — so this device reseeds too,
    as `sync` does on an epoch change; or, away longer than the relay's tombstone horizon
    (`horizon_ms`), adopts the relay instead (`SyncSession.adopt_relay`): what it holds and
    the relay lacks may have been collected meanwhile, and is set aside, not pushed back. A
    head below what it saw is not followed: `sync` reports it, and `sync --reseed` is the
    operator's call (refused onto a copy older than a collection run this device applied).
    """
    sync_session = replica.sync_session()
    try:
        sync_session.check_relay_state(session.state)
    except RollbackError as exc:
        if exc.reason in ("head", "before_run"):
            return RelayFinding(exc, "stop")
        return RelayFinding(exc, follow_reseed(replica, sync_session, horizon_ms))
    return None


def login_settings(
    replica_path: Path,
    relay_url: str | None,
    account: str | None,
    insecure: bool,
    cacert: str | None = None,
) -> RelaySettings:
    """Where `login` logs in: the flags, else the sidecar's relay and account (a device whose
    tokens were lost keeps its sidecar; a restored backup at a new path has none); with the
    session saved for that same relay and account, which names the device it was there."""
    saved = load_settings(replica_path) if sidecar_path(replica_path).exists() else None
    if saved is not None:
        same_relay = relay_url in (None, saved.url)  # --insecure was given for that URL only
        relay_url, account = relay_url or saved.url, account or saved.account
        insecure = insecure or (same_relay and saved.insecure)
        cacert = cacert or (saved.cacert if same_relay else None)
    if relay_url is None or account is None:
        raise InvalidArgumentError(
            f"no relay settings for {replica_path}",
            hint="give --relay URL and --account NAME",
        )
    url = check_relay_url(relay_url, insecure=insecure)
    relay = RelaySettings(url, account, insecure, cacert=cacert)
    if saved is not None and (saved.url, saved.account) == (relay.url, relay.account):
        return replace(relay, session=saved.session, device_name=saved.device_name)
    return relay
