"""The key bundle in either format, behind the few operations a replica needs.

Version 1 wraps one account key from which every other key derives (replica/keys.py);
version 2 wraps a random generation key that seals stored keys (replica/generations.py).
New accounts start at version 2, generation 1. A version-1 account keeps unlocking, changing
its passphrase and declaring schemas as it is, until `upgraded` migrates it
(docs/key-generations.md §5); another device then takes the newer bundle (`is_newer`,
`check_same_account`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from replica.errors import InvalidArgumentError, ProtocolError
from replica.generations import (
    BUNDLE_VERSION_2,
    KeyBundleV2,
    OpenedGeneration,
    first_generation,
    generation_keys,
    migrate_v1,
    open_with_generation_key,
    open_with_kek,
    open_with_recovery_key,
    reseal_secrets,
    rotate,
    seal_generation,
    sign_chain,
    verify_chain,
)
from replica.kdfparams import KdfParams, check_kdf_params
from replica.keys import (
    BUNDLE_VERSION,
    KEY_BYTES,
    AccountKeys,
    Frontier,
    KeyBundle,
    LoginKeys,
    RandomBytes,
    change_passphrase,
    default_kdf_params,
    format_recovery_key,
    new_passphrase_login_keys,
    open_info,
    parse_recovery_key,
    passphrase_login_keys,
    recovery_account_key,
    unlock_with_account_key,
    unlock_with_login_keys,
    with_info,
)
from replica.passphrase import check_new_passphrase
from replica.wire import bundle_version

AnyBundle = KeyBundle | KeyBundleV2


@dataclass(frozen=True)
class NewAccount:
    """A fresh account: the bundle to store, the unlocked keys, and the secrets shown once."""

    bundle: KeyBundleV2
    keys: AccountKeys
    recovery_key: str = field(repr=False)
    auth_key: bytes = field(repr=False)
    recovery_auth_hash: bytes = field(repr=False)
    """What the relay stores to check the recovery key's logins (the bundle seals it too)."""


def new_account(
    passphrase: str,
    random_bytes: RandomBytes,
    params: KdfParams | None = None,
    schema: bytes | None = None,
) -> NewAccount:
    """Generation 1 of a new account, its key wrapped under the passphrase and to a new
    recovery key."""
    check_new_passphrase(passphrase)
    params = params or default_kdf_params(random_bytes)
    login = passphrase_login_keys(passphrase, params)
    recovery_raw = random_bytes(KEY_BYTES)
    opened = first_generation(random_bytes, recovery_raw, schema)
    bundle = seal_generation(opened, params, login.wrapping_key, random_bytes, None)
    return NewAccount(
        bundle,
        generation_keys(opened),
        format_recovery_key(recovery_raw),
        login.auth_key,
        opened.secrets.recovery_auth_hash,
    )


_KIND_BY_VERSION: dict[int, type[KeyBundle] | type[KeyBundleV2]] = {
    BUNDLE_VERSION: KeyBundle,
    BUNDLE_VERSION_2: KeyBundleV2,
}


def parse_bundle(data: bytes) -> AnyBundle:
    """A bundle of either version, its KDF parameters within bounds; any other version is
    refused, with "upgrade sealsync" when it is newer. The version is read first, so a newer
    format says so rather than failing on the first field it lacks."""
    try:
        version = bundle_version(data)
        kind = _KIND_BY_VERSION.get(version)
        if kind is None:
            raise ProtocolError(
                f"key bundle version {version} is not one of {sorted(_KIND_BY_VERSION)}",
                hint="upgrade sealsync" if version > BUNDLE_VERSION_2 else None,
            )
        bundle: AnyBundle = msgspec.msgpack.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed key bundle: {exc}") from exc
    check_kdf_params(bundle.kdf)
    return bundle


def generation_of(bundle: AnyBundle) -> int:
    """The bundle's key generation; 0 for version 1, which has none."""
    return bundle.generation if isinstance(bundle, KeyBundleV2) else 0


def bundle_bytes(bundle: AnyBundle) -> bytes:
    return msgspec.msgpack.encode(bundle)


def unlock_by_login(bundle: AnyBundle, login: LoginKeys) -> AccountKeys:
    """Unlock with the passphrase's keys, derived under `bundle.kdf`."""
    if isinstance(bundle, KeyBundleV2):
        return generation_keys(open_with_kek(bundle, login.wrapping_key))
    return unlock_with_login_keys(bundle, login)


def unlock_by_recovery_key(bundle: AnyBundle, recovery_key: str) -> AccountKeys:
    raw = parse_recovery_key(recovery_key)
    if isinstance(bundle, KeyBundleV2):
        return generation_keys(open_with_recovery_key(bundle, raw))
    return unlock_with_account_key(bundle, recovery_account_key(bundle, raw))


def unlock_by_key(bundle: AnyBundle, unlock_key: bytes) -> AccountKeys:
    """The keyring path: `AccountKeys.unlock_key` of an earlier unlock."""
    if isinstance(bundle, KeyBundleV2):
        return generation_keys(open_with_generation_key(bundle, unlock_key))
    return unlock_with_account_key(bundle, unlock_key)


class Rotation(NamedTuple):
    """Who made a generation by revoking a device, when, and which device it revoked."""

    generation: int
    rotated_by: str
    revoked_device: str
    rotated_at_ms: int


def rotation_of(bundle: AnyBundle, unlock_key: bytes) -> Rotation | None:
    """The revocation that made the bundle's generation; None when none did (a version-1
    bundle, a new account's first generation, an upgrade)."""
    if not isinstance(bundle, KeyBundleV2):
        return None
    secrets = open_with_generation_key(bundle, unlock_key).secrets
    if secrets.revoked_device is None:
        return None
    return Rotation(
        secrets.generation, secrets.rotated_by, secrets.revoked_device, secrets.rotated_at_ms
    )


def sealed_schema(bundle: AnyBundle, keys: AccountKeys) -> bytes | None:
    """The schema the bundle seals (the account's, as last declared), if any."""
    if isinstance(bundle, KeyBundleV2):
        return _reopened(bundle, keys).secrets.schema
    return open_info(keys.unlock_key, bundle.sealed_info).schema


def recovery_auth_hash(bundle: AnyBundle, keys: AccountKeys) -> bytes | None:
    """The relay's hash of the recovery key's auth key, if the bundle seals it."""
    if isinstance(bundle, KeyBundleV2):
        return _reopened(bundle, keys).secrets.recovery_auth_hash
    return open_info(keys.unlock_key, bundle.sealed_info).recovery_auth_hash


def with_schema(
    bundle: AnyBundle, keys: AccountKeys, schema: bytes, random_bytes: RandomBytes
) -> AnyBundle:
    """The bundle sealing a new schema; its keys and wraps stay as they are."""
    if isinstance(bundle, KeyBundleV2):
        opened = _reopened(bundle, keys)
        secrets = msgspec.structs.replace(opened.secrets, schema=schema)
        return reseal_secrets(bundle, OpenedGeneration(opened.key, secrets), random_bytes)
    info = msgspec.structs.replace(open_info(keys.unlock_key, bundle.sealed_info), schema=schema)
    return with_info(bundle, keys, info, random_bytes)


def with_new_passphrase(
    bundle: AnyBundle, keys: AccountKeys, new_passphrase: str, random_bytes: RandomBytes
) -> tuple[AnyBundle, LoginKeys]:
    """The bundle wrapped under a new passphrase (and salt), and that passphrase's keys; no
    record is re-encrypted, and a version-2 bundle stays in its generation."""
    if not isinstance(bundle, KeyBundleV2):
        return change_passphrase(bundle, keys, new_passphrase, random_bytes)
    params, login = new_passphrase_login_keys(bundle.kdf, new_passphrase, random_bytes)
    opened = _reopened(bundle, keys)
    sealed = seal_generation(
        opened, params, login.wrapping_key, random_bytes, bundle.chain_signature
    )
    return sealed, login


def upgraded(
    bundle: AnyBundle, login: LoginKeys, recovery_key: str, change: KeyChange
) -> KeyBundleV2:
    """Generation 1 of a version-1 account (docs/key-generations.md §5): its derived keys
    stored, a new random epoch for new writes, wrapped under the same passphrase and to the
    account's own recovery key (`WrongKeyError` for another's)."""
    if isinstance(bundle, KeyBundleV2):
        raise InvalidArgumentError(f"the account is at key bundle version {bundle.version}")
    keys = unlock_with_login_keys(bundle, login)  # WrongKeyError for another passphrase
    opened = migrate_v1(
        bundle,
        keys,
        parse_recovery_key(recovery_key),
        change.random_bytes,
        new_recovery_key=False,
        frontier=change.frontier,
        rotated_by=change.rotated_by,
        now_ms=change.now_ms,
    )
    return seal_generation(opened, bundle.kdf, login.wrapping_key, change.random_bytes, None)


@dataclass(frozen=True)
class KeyChange:
    """Who changes an account's keys, when, and what the replica knew then."""

    frontier: Frontier
    rotated_by: str
    now_ms: int
    random_bytes: RandomBytes


def rotated(
    bundle: AnyBundle,
    keys: AccountKeys,
    new_passphrase: str,
    change: KeyChange,
    revoked_device: str | None,
    new_recovery_key: str | None = None,
) -> tuple[KeyBundleV2, LoginKeys]:
    """Generation g + 1 (docs/key-generations.md §6): a new generation key, epoch and signing
    key, the old epochs retired behind the frontier, wrapped under a new passphrase and to
    the same recovery key, vouched for by generation g's signing key; and the new
    passphrase's keys. With `new_recovery_key` it is wrapped to that one instead: the revoked
    device may have seen the old."""
    if not isinstance(bundle, KeyBundleV2):
        raise InvalidArgumentError(
            "a version-1 account has no key generations to rotate",
            hint="`sealsync upgrade` moves it to version 2 first",
        )
    current = _reopened(bundle, keys)
    params, login = new_passphrase_login_keys(bundle.kdf, new_passphrase, change.random_bytes)
    following = rotate(
        current.secrets,
        change.random_bytes,
        frontier=change.frontier,
        revoked_device=revoked_device,
        rotated_by=change.rotated_by,
        now_ms=change.now_ms,
        new_recovery_raw=parse_recovery_key(new_recovery_key) if new_recovery_key else None,
    )
    chain = sign_chain(following.secrets, current.secrets.signing_key)
    sealed = seal_generation(following, params, login.wrapping_key, change.random_bytes, chain)
    return sealed, login


def is_foreign(candidate: AnyBundle, current: AnyBundle) -> bool:
    """Whether a relay's bundle is not this account as this device knows it: an older version
    or generation, or this device's generation under another signing key — an account
    another device (perhaps a revoked one) registered after the relay lost it. A version-1
    device cannot tell (docs/key-generations.md §9)."""
    if not isinstance(current, KeyBundleV2):
        return False
    if not isinstance(candidate, KeyBundleV2) or candidate.generation < current.generation:
        return True
    same_generation = candidate.generation == current.generation
    return same_generation and candidate.signing_public != current.signing_public


def is_newer(candidate: AnyBundle, current: AnyBundle) -> bool:
    """Whether a device may take `candidate` for `current`: a later version, or a later
    generation of version 2. Never an older one."""
    if not isinstance(candidate, KeyBundleV2):
        return False
    return not isinstance(current, KeyBundleV2) or candidate.generation > current.generation


def check_successor(
    candidate: KeyBundleV2, keys: AccountKeys, current: AnyBundle, current_keys: AccountKeys
) -> None:
    """A newer bundle keeps the account's id, its index and scope keys and every epoch key
    (each generation carries them), and the next generation is vouched for by the current
    one's signing key: anything else is another account's, or a fork, and taking it would
    strand every record. A device that missed rotations cannot check the chain past its own
    generation (no bundle keeps the signing keys between): it takes a later generation on
    the passphrase alone, which every rotation changes, with a new salt, and a revoked
    device does not know; one under this device's own salt was not made by a rotation."""
    kept = ("account_id", "index_key", "scope_key")
    if any(getattr(keys, k) != getattr(current_keys, k) for k in kept):
        raise ProtocolError(
            "the relay's key bundle opens with the passphrase but is another account's",
            hint="nothing was changed; check the relay and the account name",
        )
    if not keys.keeps_epochs_of(current_keys):
        raise ProtocolError(
            "the relay's key bundle drops or replaces epoch keys this account's records need",
            hint="nothing was changed; ask the device that changed the keys to run again",
        )
    _check_generation_step(candidate, current)


def _check_generation_step(candidate: KeyBundleV2, current: AnyBundle) -> None:
    forged = "nothing was changed; it was not made by a device holding this account's keys"
    if isinstance(current, KeyBundleV2) and candidate.generation == current.generation + 1:
        if not verify_chain(candidate, current.signing_public):
            raise ProtocolError(
                f"key generation {candidate.generation} is not vouched for by generation "
                f"{current.generation}",
                hint=forged,
            )
    elif candidate.generation > 1 and candidate.kdf.salt == current.kdf.salt:
        raise ProtocolError(
            f"key generation {candidate.generation} under this device's own passphrase salt "
            "was not made by a rotation (each draws a new one)",
            hint=forged,
        )


def _reopened(bundle: KeyBundleV2, keys: AccountKeys) -> OpenedGeneration:
    return open_with_generation_key(bundle, keys.unlock_key)
