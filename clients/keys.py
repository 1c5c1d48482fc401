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

from collections.abc import Callable

from clients.errors import (
    KeysChangedError,
    RelayClientError,
    RelayRefusedError,
    UnknownOutcomeError,
)
from clients.http import RelayClient
from replica import LoginKeys, Replica
from replica.wire import ErrorCode, PutKeyBundle


def put_key_bundle(
    client: RelayClient, request: PutKeyBundle, is_stored: Callable[[], bool]
) -> None:
    """PUT the bundle; when the answer is lost, ask whether the relay stored it (a second PUT
    would be refused: the relay then holds the new bundle's version, or a new auth key)."""
    try:
        client.put_key_bundle(request)
    except UnknownOutcomeError:
        if not is_stored():
            raise


def upgrade_keys(
    client: RelayClient, replica: Replica, login: LoginKeys, recovery_key: str
) -> None:
    """Generation 1 of the unlocked version-1 account, installed on the relay; the local
    change commits only once the relay took it, and the new keys are unlocked then."""
    current = client.key_bundle(login.auth_key)
    if current.bundle != replica.key_bundle():
        raise KeysChangedError(
            "the relay holds other keys than this device's: another device changed them",
            hint="`sealsync sync` takes them (then upgrade, if still needed)",
        )
    session = client.session
    device = session.device_id if session is not None else ""
    with replica.batch():
        replica.upgrade_keys(login, recovery_key, device=device)
        bundle = replica.key_bundle()
        request = PutKeyBundle(
            bundle, replica.kdf_params(), login.auth_key, current.version, login.auth_key
        )
        put_key_bundle(client, request, lambda: client.key_bundle(login.auth_key).bundle == bundle)
    replica.unlock_with_login_keys(login)


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
