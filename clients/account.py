"""Making an account and adding a device to one: the relay exchanges of `init` and `join`.

`init` makes the account locally first (`Replica.create` derives every key) and then registers
it: the relay receives auth keys and the sealed key bundle, never the passphrase or a key
that opens it. `join` goes the other way: prelogin for the KDF parameters, login with the auth
key the secret derives, fetch the bundle, make the replica from it and unlock it. `login`
(an existing replica logging in again as a new device) is the first half of `join`. Each
runs Argon2id once: the keys a passphrase derives both log in and unlock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clients.http import RelayClient
from replica import (
    KdfParams,
    LoginKeys,
    NewAccount,
    Replica,
    ReplicaOptions,
    passphrase_login_keys,
    recovery_login_keys,
)
from replica.wire import LoginRequest, RegisterRequest, Session


@dataclass(frozen=True)
class Secret:
    """What the user gave to prove the account: its passphrase, or its recovery key."""

    value: str = field(repr=False)
    is_recovery_key: bool = False

    def login_keys(self, kdf: KdfParams) -> LoginKeys:
        """The relay auth key (Argon2id for a passphrase; HKDF alone for a recovery key)."""
        if self.is_recovery_key:
            return recovery_login_keys(self.value)
        return passphrase_login_keys(self.value, kdf)

    def unlock(self, replica: Replica, keys: LoginKeys) -> None:
        """Unlock with `keys`, which this secret derived under the replica's KDF parameters
        (no second Argon2id run)."""
        if self.is_recovery_key:
            replica.unlock_with_recovery_key(self.value)
        else:
            replica.unlock_with_login_keys(keys)


def register_account(
    client: RelayClient,
    account: str,
    new: NewAccount,
    bundle: bytes,
    device_name: str,
    invite: str | None,
) -> Session:
    """Register a new account with its first device; the client adopts the session."""
    request = RegisterRequest(
        account=account,
        auth_key=new.auth_key,
        recovery_auth_hash=new.recovery_auth_hash,
        kdf=new.bundle.kdf,
        bundle=bundle,
        device_name=device_name,
        invite=invite,
    )
    return client.register(request)


def log_in(
    client: RelayClient,
    account: str,
    keys: LoginKeys,
    device_name: str,
    *,
    device_id: str | None = None,
) -> Session:
    """A device session for the auth key of `keys`; the client adopts the session. With the
    `device_id` this device had, it keeps its one entry in the account's devices."""
    return client.login(LoginRequest(account, keys.auth_key, device_name, device_id))


def join_account(
    client: RelayClient,
    path: Path,
    account: str,
    secret: Secret,
    device_name: str,
    options: ReplicaOptions,
) -> Replica:
    """Log a new device in and make its replica from the account's key bundle, unlocked.

    Nothing is written locally before the relay accepted the secret, so a wrong passphrase
    leaves no file behind.
    """
    keys = secret.login_keys(client.prelogin(account).kdf)  # the relay's KDF parameters
    log_in(client, account, keys, device_name)
    replica = Replica.join(path, client.key_bundle(keys.auth_key).bundle, options=options)
    try:
        secret.unlock(replica, keys)
    except BaseException:
        replica.close()
        raise
    return replica
