"""The account's keys across its devices: replacing the relay's key bundle, moving a
version-1 account to version 2, and taking newer keys another device installed.

A version-1 account's pushes go unsigned (specs/protocol.md §4.7). `upgrade_keys` makes
generation 1 of key bundle version 2 from it (docs/key-generations.md §5) and installs it on
the relay by compare-and-set; from then on the relay takes only signed pushes, and another
device's unsigned push is refused `forbidden`. That device then reads the relay's bundle with
its passphrase and takes it (`adopt_relay_keys`): only a newer bundle, only one the
passphrase opens, only the same account's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from clients.errors import (
    KeysChangedError,
    RelayClientError,
    RelayRefusedError,
    UnknownOutcomeError,
)
from clients.http import RelayClient
from replica import LoginKeys, Replica, recovery_login_keys
from replica.bundles import parse_bundle, rotation_of
from replica.wire import ErrorCode, KeyBundleValue, PutKeyBundle, auth_key_hash


def send_key_change(
    client: RelayClient, request: PutKeyBundle, *, revoke: str | None = None
) -> None:
    """PUT the bundle (with `revoke`: rotate, revoking that device); when the answer is lost,
    ask whether the relay holds it now under the new auth key (sending again would be
    refused: the relay then holds the new bundle's version, or the new auth key)."""
    try:
        if revoke is None:
            client.put_key_bundle(request)
        else:
            client.rotate_keys(revoke, request)
    except UnknownOutcomeError:
        if not relay_holds(client, request.auth_key, request.bundle):
            raise


def relay_holds(client: RelayClient, auth_key: bytes, bundle: bytes) -> bool:
    """After a lost answer: whether the relay holds `bundle` under `auth_key` now."""
    try:
        return client.key_bundle(auth_key).bundle == bundle
    except RelayRefusedError as exc:
        if exc.code != ErrorCode.FORBIDDEN:
            raise
        return False


def same_keys(
    client: RelayClient, replica: Replica, login: LoginKeys, then: str
) -> tuple[KeyBundleValue, str]:
    """The relay's bundle (for its compare-and-set version) and this device's id, once the
    relay is found to hold this device's keys: changing keys another device already changed
    would strand one of the two."""
    current = client.key_bundle(login.auth_key)
    if current.bundle != replica.key_bundle():
        raise KeysChangedError(
            "the relay holds other keys than this device's: another device changed them",
            hint=f"`sealsync sync` takes them; then {then}",
        )
    session = client.session
    return current, session.device_id if session is not None else ""


def upgrade_keys(
    client: RelayClient,
    replica: Replica,
    login: LoginKeys,
    recovery_key: str,
    *,
    catch_up: Callable[[], object],
) -> None:
    """Generation 1 of the unlocked version-1 account, installed on the relay; the local
    change commits only once the relay took it, and the new keys are unlocked then. Its
    frontier retires the version-1 epochs, so it is made after `catch_up`, like a rotation
    (`rotate_revoking`); `catch_up` pulls only: the relay takes no unsigned push."""
    catch_up()
    current, device = same_keys(client, replica, login, "upgrade, if still needed")
    with replica.batch():
        head = replica.sync_session().cursor  # the frontier's: read in the same transaction
        replica.upgrade_keys(login, recovery_key, device=device)
        request = PutKeyBundle(replica.key_bundle(), replica.kdf_params(), login.auth_key,
                               current.version, login.auth_key, expected_head=head)  # fmt: skip
        send_key_change(client, request)
    replica.unlock_with_login_keys(login)


def rotate_revoking(
    client: RelayClient,
    replica: Replica,
    login: LoginKeys,
    new_passphrase: str,
    revoked: str,
    new_recovery_key: str | None = None,
    *,
    catch_up: Callable[[], object],
) -> None:
    """Revoke a device by rotating the account's keys (docs/key-generations.md §6): the next
    generation, under `new_passphrase`, installed with the revocation in one relay request;
    the local change commits only once the relay took it, and is unlocked then. With
    `new_recovery_key`, the relay takes its auth hash in place of the old one's.

    `catch_up` (a sync) comes first, so the frontier covers what the relay holds; what
    another device stores before the change commits, it seals again once it takes the
    change (the relay refuses no rotation for it: that would let the device being revoked
    hold it off by pushing)."""
    catch_up()
    current, device = same_keys(client, replica, login, "revoke again")
    with replica.batch():
        head = replica.sync_session().cursor  # the frontier's: read in the same transaction
        new_login = replica.rotate_keys(
            new_passphrase, revoked_device=revoked, device=device, new_recovery_key=new_recovery_key
        )
        request = PutKeyBundle(replica.key_bundle(), replica.kdf_params(), new_login.auth_key,
                               current.version, login.auth_key, expected_head=head,
                               recovery_auth_hash=_recovery_auth_hash(new_recovery_key))  # fmt: skip
        send_key_change(client, request, revoke=revoked)
    replica.unlock_with_login_keys(new_login)


def _recovery_auth_hash(recovery_key: str | None) -> bytes | None:
    """What the relay keeps of a new recovery key (its auth key's hash), if there is one."""
    return (
        None if recovery_key is None else auth_key_hash(recovery_login_keys(recovery_key).auth_key)
    )


def needs_newer_keys(exc: RelayClientError) -> bool:
    """A push refused for keys behind the account's: unsigned, or signed by another key,
    where the relay holds a version-2 bundle (`forbidden`), or by a retired generation."""
    return isinstance(exc, RelayRefusedError) and exc.code in (
        ErrorCode.FORBIDDEN,
        ErrorCode.KEY_RETIRED,
    )


def adopt_relay_keys(client: RelayClient, replica: Replica, login: LoginKeys) -> bool:
    """Take the relay's key bundle if it is newer than this device's and the passphrase
    opens it; False when there is nothing newer to take, or the relay does not take this
    passphrase (it was changed on another device)."""
    try:
        value = client.key_bundle(login.auth_key)
    except RelayRefusedError as exc:
        if exc.code != ErrorCode.FORBIDDEN:
            raise
        return False
    return replica.adopt_bundle(value.bundle, login)


def describe_rotation(client: RelayClient | None, replica: Replica) -> str | None:
    """Who made the keys this unlocked device holds by revoking a device, when, and which
    device that was (shown when a device takes them: the person should know); None when no
    revocation made them. The relay's `client` names the devices (a folder's are ids)."""
    rotation = rotation_of(parse_bundle(replica.key_bundle()), replica.unlock_key())
    if rotation is None:
        return None
    try:
        listed = [] if client is None else client.devices().devices
    except RelayClientError:  # only the names are missing: the ids say it
        listed = []
    names = {device.id: device.name for device in listed}
    by = names.get(rotation.rotated_by)
    rotated_by = rotation.rotated_by + (f" ({by!r})" if by is not None else "")
    when = datetime.datetime.fromtimestamp(rotation.rotated_at_ms / 1000, datetime.UTC)
    return (
        f"generation {rotation.generation}, made by device {rotated_by} on "
        f"{when:%Y-%m-%d %H:%M} UTC, revoking device {rotation.revoked_device}"
    )
