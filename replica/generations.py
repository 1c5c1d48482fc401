"""Key generations: the format of key bundle version 2 (docs/key-generations.md §3, §5, §6).

Each generation has a random generation key that seals its secrets: the epoch keys (random
and stored), the Ed25519 signing key, and the keys carried for the account's life (index and
scope). The generation key is wrapped twice: under the passphrase's KEK, and to the recovery
key's X25519 public key (HPKE), so any device can wrap a new generation to the recovery key
without holding it. Every wrap binds the bundle's clear fields through their canonical digest
`C`, so a relay that swaps one gets a bundle that opens nothing.

This module is the pure core of that design: sealing, opening, rotating and migrating a
version-1 bundle. The replica and the relay do not use it yet (the next slices).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

import msgspec
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from replica.errors import ProtocolError, WrongKeyError
from replica.keys import (
    KEY_BYTES,
    AccountKeys,
    KeyBundle,
    RandomBytes,
    check_bundle_version,
    decode_bundle,
    hkdf,
    open_info,
    recovery_login_keys_from_raw,
    v1_epoch_key,
    v1_index_key,
    v1_scope_key,
)
from replica.wire import KdfParams, auth_key_hash, check_kdf_params

BUNDLE_VERSION_2 = 2
NONCE_BYTES = 12
PUBLIC_KEY_BYTES = 32
MAX_U32 = 2**32 - 1

PASSPHRASE_AD = b"sealsync wrap v2 passphrase\0"
RECOVERY_INFO = b"sealsync recovery v2\0"
SECRETS_AD = b"sealsync wrap v2 secrets\0"
SECRETS_KEY_INFO = b"sealsync secrets v2"
CHAIN_LABEL = b"sealsync chain v2\0"
RECOVERY_X25519_INFO = b"sealsync recovery x25519 v2"
CLEAR_LABEL = b"sealsync bundle v2\0"

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
_U32 = struct.Struct(">I")


class Frontier(msgspec.Struct, frozen=True):
    """What the device that retired an epoch knew: the union of every version vector it held,
    and the relay head it had pulled up to (docs/key-generations.md §6)."""

    vector: dict[int, int]
    head: int


class GenerationSecrets(msgspec.Struct, frozen=True):
    """Sealed in a bundle under its generation key. Never in a repr, a log or an error."""

    account_id: bytes
    generation: int
    key_epoch: int
    epoch_keys: dict[int, bytes]
    index_key: bytes
    scope_key: bytes
    signing_key: bytes
    """The Ed25519 private key's 32 seed bytes."""
    recovery_public: bytes
    recovery_auth_hash: bytes
    schema: bytes | None = None
    frontiers: dict[int, Frontier] = {}
    """For each retired epoch: the frontier recorded by the rotation that retired it."""
    revoked_device: str | None = None
    rotated_by: str = ""
    rotated_at_ms: int = 0

    def __repr__(self) -> str:
        return f"GenerationSecrets(generation={self.generation}, key_epoch={self.key_epoch})"

    def signing_public(self) -> bytes:
        return (
            Ed25519PrivateKey.from_private_bytes(self.signing_key).public_key().public_bytes_raw()
        )


class KeyBundleV2(msgspec.Struct, frozen=True):
    """The account's keys as the relay keeps them: the first seven fields are in clear for it
    (which generation, which keys verify pushes), the rest open only with a secret."""

    version: int
    generation: int
    key_epoch: int
    kdf: KdfParams
    signing_public: bytes
    recovery_public: bytes
    chain_signature: bytes | None
    passphrase_wrap: bytes
    recovery_wrap: bytes
    sealed_secrets: bytes

    def __repr__(self) -> str:
        return f"KeyBundleV2(generation={self.generation}, key_epoch={self.key_epoch})"


@dataclass(frozen=True)
class OpenedGeneration:
    """A bundle opened with a secret: its generation key (to re-wrap it) and its secrets."""

    key: bytes = field(repr=False)
    secrets: GenerationSecrets = field(repr=False)


def bundle_v2_to_bytes(bundle: KeyBundleV2) -> bytes:
    return msgspec.msgpack.encode(bundle)


def bundle_v2_from_bytes(data: bytes) -> KeyBundleV2:
    bundle = decode_bundle(data, KeyBundleV2)
    check_bundle_version(bundle.version, BUNDLE_VERSION_2)
    check_kdf_params(bundle.kdf)
    for name in ("generation", "key_epoch"):
        if not 0 <= getattr(bundle, name) <= MAX_U32:
            raise ProtocolError(f"key bundle {name} is not a u32")
    for name in ("signing_public", "recovery_public"):
        if len(getattr(bundle, name)) != PUBLIC_KEY_BYTES:
            raise ProtocolError(f"key bundle {name} is not {PUBLIC_KEY_BYTES} bytes")
    return bundle


def clear_digest(bundle: KeyBundleV2) -> bytes:
    """`C`: SHA-256 over the clear fields in one canonical form (MessagePack has several)."""
    kdf = bundle.kdf
    return hashlib.sha256(
        CLEAR_LABEL
        + b"".join(_U32.pack(n) for n in (bundle.version, bundle.generation, bundle.key_epoch))
        + _U32.pack(len(kdf.salt))
        + kdf.salt
        + b"".join(_U32.pack(n) for n in (kdf.memory_kib, kdf.iterations, kdf.lanes))
        + bundle.signing_public
        + bundle.recovery_public
    ).digest()


def generation_identity(bundle: KeyBundleV2) -> bytes:
    """What the chain signature covers: the generation and its keys, not the KDF parameters,
    so a passphrase change does not need the previous generation's signing key."""
    numbers = _U32.pack(bundle.generation) + _U32.pack(bundle.key_epoch)
    return CHAIN_LABEL + numbers + bundle.signing_public + bundle.recovery_public


def recovery_private_key(recovery_raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hkdf(recovery_raw, RECOVERY_X25519_INFO))


def recovery_public_key(recovery_raw: bytes) -> bytes:
    return recovery_private_key(recovery_raw).public_key().public_bytes_raw()


def seal_generation(
    opened: OpenedGeneration,
    kdf: KdfParams,
    kek: bytes,
    random_bytes: RandomBytes,
    previous_signing_key: bytes | None,
) -> KeyBundleV2:
    """The bundle of `opened`: its key wrapped under `kek` and to the recovery key, its
    secrets sealed, and signed by the previous generation's key (none for generation 1)."""
    check_kdf_params(kdf)
    secrets = opened.secrets
    unsealed = b""
    draft = KeyBundleV2(
        version=BUNDLE_VERSION_2,
        generation=secrets.generation,
        key_epoch=secrets.key_epoch,
        kdf=kdf,
        signing_public=secrets.signing_public(),
        recovery_public=secrets.recovery_public,
        chain_signature=None,
        passphrase_wrap=unsealed,
        recovery_wrap=unsealed,
        sealed_secrets=unsealed,
    )  # the clear fields first: every wrap binds their digest
    c = clear_digest(draft)
    recipient = X25519PublicKey.from_public_bytes(secrets.recovery_public)
    chain = None
    if previous_signing_key is not None:
        signer = Ed25519PrivateKey.from_private_bytes(previous_signing_key)
        chain = signer.sign(generation_identity(draft))
    return msgspec.structs.replace(
        draft,
        chain_signature=chain,
        passphrase_wrap=_seal(kek, opened.key, PASSPHRASE_AD + c, random_bytes),
        recovery_wrap=SUITE.encrypt(opened.key, recipient, info=RECOVERY_INFO + c),
        sealed_secrets=_seal(
            _secrets_key(opened.key), msgspec.msgpack.encode(secrets), SECRETS_AD + c, random_bytes
        ),
    )


def open_with_kek(bundle: KeyBundleV2, kek: bytes) -> OpenedGeneration:
    """Open with the passphrase's KEK (`LoginKeys.wrapping_key` under `bundle.kdf`)."""
    c = clear_digest(bundle)
    key = _open(kek, bundle.passphrase_wrap, PASSPHRASE_AD + c, "passphrase")
    return _open_secrets(bundle, key, c)


def open_with_recovery_key(bundle: KeyBundleV2, recovery_raw: bytes) -> OpenedGeneration:
    """Open with the recovery key. This proves nothing about who made the generation (anyone
    can wrap to `recovery_public`): docs/key-generations.md §7 says what that allows."""
    c = clear_digest(bundle)
    try:
        key = SUITE.decrypt(
            bundle.recovery_wrap, recovery_private_key(recovery_raw), info=RECOVERY_INFO + c
        )
    except (InvalidTag, ValueError):
        raise WrongKeyError("the recovery key does not open this key generation") from None
    return _open_secrets(bundle, key, c)


def verify_chain(bundle: KeyBundleV2, previous_signing_public: bytes) -> bool:
    """Whether the previous generation's signing key vouches for this bundle's generation."""
    if bundle.chain_signature is None:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(previous_signing_public).verify(
            bundle.chain_signature, generation_identity(bundle)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def rotate(
    opened: OpenedGeneration,
    random_bytes: RandomBytes,
    *,
    frontier: Frontier,
    revoked_device: str | None,
    rotated_by: str,
    now_ms: int,
    new_recovery_raw: bytes | None = None,
) -> OpenedGeneration:
    """Generation g + 1: a new random key, epoch key and signing key; the old epochs carried
    and retired behind `frontier`; a new recovery key only when one is given."""
    old = opened.secrets
    epoch = old.key_epoch + 1
    retired = {e: frontier for e in old.epoch_keys if e not in old.frontiers}
    secrets = msgspec.structs.replace(
        old,
        generation=old.generation + 1,
        key_epoch=epoch,
        epoch_keys={**old.epoch_keys, epoch: random_bytes(KEY_BYTES)},
        signing_key=random_bytes(KEY_BYTES),
        frontiers={**old.frontiers, **retired},
        revoked_device=revoked_device,
        rotated_by=rotated_by,
        rotated_at_ms=now_ms,
        **_recovery_fields(new_recovery_raw, old),
    )
    return OpenedGeneration(random_bytes(KEY_BYTES), secrets)


def migrate_v1(
    bundle: KeyBundle,
    keys: AccountKeys,
    recovery_raw: bytes,
    random_bytes: RandomBytes,
    *,
    new_recovery_key: bool,
    frontier: Frontier,
    rotated_by: str,
    now_ms: int,
) -> OpenedGeneration:
    """Generation 1 of a version-1 account: a rotation without a revoked device (§5). The v1
    epochs, index and scope keys are stored as derived; the recovery key must be the
    account's own (checked against the v1 wrap) unless `new_recovery_key` replaces it."""
    account_key = keys.account_key
    if not new_recovery_key and not _opens_v1_recovery_wrap(bundle, recovery_raw, account_key):
        raise WrongKeyError("the recovery key does not open this account", hint="check for typos")
    info = open_info(account_key, bundle.sealed_info)
    epochs = {e: v1_epoch_key(account_key, e) for e in range(info.key_epoch + 1)}
    v1 = GenerationSecrets(
        account_id=info.account_id,
        generation=0,
        key_epoch=info.key_epoch,
        epoch_keys=epochs,
        index_key=v1_index_key(account_key),
        scope_key=v1_scope_key(account_key),
        signing_key=random_bytes(KEY_BYTES),
        recovery_public=recovery_public_key(recovery_raw),
        recovery_auth_hash=_recovery_auth_hash(recovery_raw),
        schema=info.schema,
    )
    return rotate(
        OpenedGeneration(account_key, v1),
        random_bytes,
        frontier=frontier,
        revoked_device=None,
        rotated_by=rotated_by,
        now_ms=now_ms,
    )


def _recovery_fields(new_recovery_raw: bytes | None, old: GenerationSecrets) -> dict[str, bytes]:
    if new_recovery_raw is None:
        return {
            "recovery_public": old.recovery_public,
            "recovery_auth_hash": old.recovery_auth_hash,
        }
    return {
        "recovery_public": recovery_public_key(new_recovery_raw),
        "recovery_auth_hash": _recovery_auth_hash(new_recovery_raw),
    }


def _recovery_auth_hash(recovery_raw: bytes) -> bytes:
    return auth_key_hash(recovery_login_keys_from_raw(recovery_raw).auth_key)


def _opens_v1_recovery_wrap(bundle: KeyBundle, recovery_raw: bytes, account_key: bytes) -> bool:
    wrapping_key = recovery_login_keys_from_raw(recovery_raw).wrapping_key
    wrapped = bundle.recovery_wrap
    try:
        opened = AESGCM(wrapping_key).decrypt(
            wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], b"sealsync wrap v1 recovery key"
        )
    except (InvalidTag, ValueError):
        return False
    return hmac.compare_digest(opened, account_key)


def _secrets_key(generation_key: bytes) -> bytes:
    return hkdf(generation_key, SECRETS_KEY_INFO)


def _open_secrets(bundle: KeyBundleV2, key: bytes, c: bytes) -> OpenedGeneration:
    plain = _open(_secrets_key(key), bundle.sealed_secrets, SECRETS_AD + c, "generation key")
    try:
        secrets = msgspec.msgpack.decode(plain, type=GenerationSecrets)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed generation secrets: {exc}") from None
    clear = (bundle.generation, bundle.key_epoch, bundle.signing_public, bundle.recovery_public)
    sealed = (
        secrets.generation,
        secrets.key_epoch,
        secrets.signing_public(),
        secrets.recovery_public,
    )
    if clear != sealed or secrets.key_epoch not in secrets.epoch_keys:
        raise ProtocolError("the key bundle's clear fields do not match its sealed secrets")
    return OpenedGeneration(key, secrets)


def _seal(key: bytes, plain: bytes, ad: bytes, random_bytes: RandomBytes) -> bytes:
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plain, ad)


def _open(key: bytes, sealed: bytes, ad: bytes, what: str) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], ad)
    except (InvalidTag, ValueError):
        raise WrongKeyError(f"the {what} does not open this key generation") from None
