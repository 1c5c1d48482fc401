"""Key generations: the format of key bundle version 2 (docs/key-generations.md §3, §5, §6).

Each generation has a random generation key that seals its secrets: the epoch keys (random
and stored), the Ed25519 signing key, and the keys carried for the account's life (index and
scope). The generation key is wrapped twice: under the passphrase's KEK, and to the recovery
key's X25519 public key (HPKE), so any device can wrap a new generation to the recovery key
without holding it. Every wrap binds the bundle's clear fields through their canonical digest
`C`, so a relay that swaps one gets a bundle that opens nothing.

This module is the pure core of that design: making, sealing, opening, rotating and migrating
a version-1 bundle, and signing pushes. New accounts start at generation 1, version-1 ones
migrate to it (replica/bundles.py), and the relay verifies every push of a version-2
account (relay/signing.py); nothing rotates to a generation 2 yet (the next slice).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from dataclasses import dataclass, field

import msgspec
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from replica.errors import ProtocolError, UnknownEpochError, WrongKeyError
from replica.keys import (
    ACCOUNT_ID_BYTES,
    KEY_BYTES,
    AccountKeys,
    Frontier,
    KeyBundle,
    RandomBytes,
    decode_bundle,
    hkdf,
    open_aead,
    open_info,
    recovery_account_key,
    recovery_login_keys_from_raw,
    seal_aead,
    v1_epoch_key,
    v1_index_key,
    v1_scope_key,
)
from replica.wire import (
    U32,
    KdfParams,
    Key32,
    PushBatch,
    Redacted,
    RelayState,
    auth_key_hash,
    check_kdf_params,
    push_signed_bytes,
)

BUNDLE_VERSION_2 = 2

PASSPHRASE_AD = b"sealsync wrap v2 passphrase\0"
RECOVERY_INFO = b"sealsync recovery v2\0"
SECRETS_AD = b"sealsync wrap v2 secrets\0"
SECRETS_KEY_INFO = b"sealsync secrets v2"
CHAIN_LABEL = b"sealsync chain v2\0"
RECOVERY_X25519_INFO = b"sealsync recovery x25519 v2"
CLEAR_LABEL = b"sealsync bundle v2\0"

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
_U32 = struct.Struct(">I")

Key = Key32


class GenerationSecrets(Redacted, frozen=True):
    """Sealed in a bundle under its generation key; `repr` and rich show two numbers."""

    account_id: bytes
    generation: U32
    key_epoch: U32
    epoch_keys: dict[U32, Key]
    index_key: Key
    scope_key: Key
    signing_key: Key
    """The Ed25519 private key's 32 seed bytes."""
    recovery_public: Key
    recovery_auth_hash: bytes
    schema: bytes | None = None
    frontiers: dict[U32, Frontier] = msgspec.field(default_factory=dict)
    """For each retired epoch: the frontier recorded by the rotation that retired it."""
    revoked_device: str | None = None
    rotated_by: str = ""
    rotated_at_ms: int = 0

    shown = ("generation", "key_epoch")

    def signing_public(self) -> bytes:
        return (
            Ed25519PrivateKey.from_private_bytes(self.signing_key).public_key().public_bytes_raw()
        )


class KeyBundleV2(msgspec.Struct, frozen=True):
    """The account's keys as the relay keeps them: the first seven fields are in clear for it
    (which generation, which keys verify pushes), the rest open only with a secret."""

    version: int
    generation: U32
    key_epoch: U32
    kdf: KdfParams
    signing_public: Key
    recovery_public: Key
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
    secrets: GenerationSecrets


def bundle_v2_to_bytes(bundle: KeyBundleV2) -> bytes:
    return msgspec.msgpack.encode(bundle)


def bundle_v2_from_bytes(data: bytes) -> KeyBundleV2:
    bundle = decode_bundle(data, KeyBundleV2, BUNDLE_VERSION_2)
    check_kdf_params(bundle.kdf)
    return bundle


def clear_digest(bundle: KeyBundleV2) -> bytes:
    """`C`: SHA-256 over the clear fields in one canonical form (MessagePack has several);
    the salt is always 16 bytes (`check_kdf_params`)."""
    kdf = bundle.kdf
    numbers = (bundle.version, bundle.generation, bundle.key_epoch)
    costs = (kdf.memory_kib, kdf.iterations, kdf.lanes)
    return hashlib.sha256(
        CLEAR_LABEL
        + b"".join(map(_U32.pack, numbers))
        + kdf.salt
        + b"".join(map(_U32.pack, costs))
        + bundle.signing_public
        + bundle.recovery_public
    ).digest()


def generation_identity(
    generation: int, key_epoch: int, signing_public: bytes, recovery_public: bytes
) -> bytes:
    """What the chain signature covers: the generation and its keys, not the KDF parameters,
    so a passphrase change keeps the signature without the previous generation's key."""
    numbers = _U32.pack(generation) + _U32.pack(key_epoch)
    return CHAIN_LABEL + numbers + signing_public + recovery_public


def sign_chain(secrets: GenerationSecrets, previous_signing_key: bytes) -> bytes:
    """The previous generation's signature vouching for `secrets`' generation."""
    identity = generation_identity(
        secrets.generation, secrets.key_epoch, secrets.signing_public(), secrets.recovery_public
    )
    return Ed25519PrivateKey.from_private_bytes(previous_signing_key).sign(identity)


def verify_chain(bundle: KeyBundleV2, previous_signing_public: bytes) -> bool:
    """Whether the previous generation's signing key vouches for this bundle's generation."""
    if bundle.chain_signature is None:
        return False
    identity = generation_identity(
        bundle.generation, bundle.key_epoch, bundle.signing_public, bundle.recovery_public
    )
    try:
        Ed25519PublicKey.from_public_bytes(previous_signing_public).verify(
            bundle.chain_signature, identity
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def recovery_private_key(recovery_raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hkdf(recovery_raw, RECOVERY_X25519_INFO))


def recovery_public_key(recovery_raw: bytes) -> bytes:
    return recovery_private_key(recovery_raw).public_key().public_bytes_raw()


def seal_generation(
    opened: OpenedGeneration,
    kdf: KdfParams,
    kek: bytes,
    random_bytes: RandomBytes,
    chain_signature: bytes | None,
) -> KeyBundleV2:
    """The bundle of `opened`: its key wrapped under `kek` and to the recovery key, its
    secrets sealed, with the chain signature (`sign_chain`; none for generation 1; the same
    one again when only the passphrase changed)."""
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
        chain_signature=chain_signature,
        passphrase_wrap=unsealed,
        recovery_wrap=unsealed,
        sealed_secrets=unsealed,
    )  # the clear fields first: every wrap binds their digest
    c = clear_digest(draft)
    recipient = X25519PublicKey.from_public_bytes(secrets.recovery_public)
    plain = msgspec.msgpack.encode(secrets)
    return msgspec.structs.replace(
        draft,
        passphrase_wrap=seal_aead(kek, opened.key, PASSPHRASE_AD + c, random_bytes),
        recovery_wrap=SUITE.encrypt(opened.key, recipient, info=RECOVERY_INFO + c),
        sealed_secrets=seal_aead(_secrets_key(opened.key), plain, SECRETS_AD + c, random_bytes),
    )


def open_with_kek(bundle: KeyBundleV2, kek: bytes) -> OpenedGeneration:
    """Open with the passphrase's KEK (`LoginKeys.wrapping_key` under `bundle.kdf`)."""
    c = clear_digest(bundle)
    refusal = f"the passphrase does not unlock this account (key generation {bundle.generation})"
    key = open_aead(kek, bundle.passphrase_wrap, PASSPHRASE_AD + c, refusal)
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
        raise WrongKeyError(
            f"the recovery key does not unlock this account (key generation {bundle.generation})"
        ) from None
    return _open_secrets(bundle, key, c)


def first_generation(
    random_bytes: RandomBytes, recovery_raw: bytes, schema: bytes | None
) -> OpenedGeneration:
    """Generation 1 of a new account: every key random, none derived from another."""
    secrets = GenerationSecrets(
        account_id=random_bytes(ACCOUNT_ID_BYTES),
        generation=1,
        key_epoch=0,
        epoch_keys={0: random_bytes(KEY_BYTES)},
        index_key=random_bytes(KEY_BYTES),
        scope_key=random_bytes(KEY_BYTES),
        signing_key=random_bytes(KEY_BYTES),
        recovery_public=recovery_public_key(recovery_raw),
        recovery_auth_hash=_recovery_auth_hash(recovery_raw),
        schema=schema,
    )
    return OpenedGeneration(random_bytes(KEY_BYTES), secrets)


@dataclass(frozen=True)
class PushSigner:
    """Whom a push is signed for: the account, this device, and the relay state last seen."""

    account: str
    device_id: str
    state: RelayState


def sign_push(
    batch: PushBatch, signing_key: bytes, generation: int, counter: int, signed_for: PushSigner
) -> PushBatch:
    """`batch` signed by a generation's key (specs/protocol.md §4.7): for one device of one
    account on one relay and account epoch, under `counter`."""
    unsigned = msgspec.structs.replace(batch, generation=generation, counter=counter)
    digests = [hashlib.sha256(e).digest() for e in batch.envelopes]
    message = push_signed_bytes(
        signed_for.account,
        signed_for.device_id,
        signed_for.state,
        unsigned,
        digests,
        batch.tombstones,
    )
    signature = Ed25519PrivateKey.from_private_bytes(signing_key).sign(message)
    return msgspec.structs.replace(unsigned, signature=signature)


def generation_keys(opened: OpenedGeneration) -> AccountKeys:
    """The keys a replica works with, taken from a generation's secrets (none derived)."""
    secrets = opened.secrets
    return AccountKeys(
        unlock_key=opened.key,
        account_id=secrets.account_id,
        key_epoch=secrets.key_epoch,
        epoch_key=functools.partial(_stored_epoch_key, dict(secrets.epoch_keys)),
        index_key=secrets.index_key,
        scope_key=secrets.scope_key,
        signing_key=secrets.signing_key,
        generation=secrets.generation,
        retired_epochs={e: f for e, f in secrets.frontiers.items() if f.is_enforced},
    )


def _stored_epoch_key(epoch_keys: dict[int, bytes], epoch: int) -> bytes:
    key = epoch_keys.get(epoch)
    if key is None:
        raise UnknownEpochError(f"key epoch {epoch} is not kept in this key generation")
    return key


def open_with_generation_key(bundle: KeyBundleV2, key: bytes) -> OpenedGeneration:
    """Open with the generation key itself (the keyring path, and re-sealing while unlocked)."""
    if len(key) != KEY_BYTES:
        raise WrongKeyError(f"a generation key is {KEY_BYTES} bytes, got {len(key)}")
    return _open_secrets(bundle, key, clear_digest(bundle))


def reseal_secrets(
    bundle: KeyBundleV2, opened: OpenedGeneration, random_bytes: RandomBytes
) -> KeyBundleV2:
    """The bundle with new sealed secrets of the same generation (a new schema). The clear
    fields stay, so both wraps still open: only what they do not bind may change."""
    old = opened.secrets
    kept = (old.generation, old.key_epoch, old.signing_public(), old.recovery_public)
    if kept != (bundle.generation, bundle.key_epoch, bundle.signing_public, bundle.recovery_public):
        raise ValueError("resealing may not change a generation's clear fields")  # a bug here
    plain = msgspec.msgpack.encode(old)
    ad = SECRETS_AD + clear_digest(bundle)
    sealed = seal_aead(_secrets_key(opened.key), plain, ad, random_bytes)
    return msgspec.structs.replace(bundle, sealed_secrets=sealed)


def rotate(
    old: GenerationSecrets,
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
    account's own (it must unwrap the v1 account key) unless `new_recovery_key` replaces it."""
    account_key = keys.unlock_key
    if not new_recovery_key:
        _check_recovery_key(bundle, recovery_raw, account_key)
    info = open_info(account_key, bundle.sealed_info)
    v1 = GenerationSecrets(
        account_id=info.account_id,
        generation=0,
        key_epoch=info.key_epoch,
        epoch_keys={e: v1_epoch_key(account_key, e) for e in range(info.key_epoch + 1)},
        index_key=v1_index_key(account_key),
        scope_key=v1_scope_key(account_key),
        signing_key=bytes(KEY_BYTES),  # v1 had none; the rotation below makes one
        recovery_public=recovery_public_key(recovery_raw),
        recovery_auth_hash=_recovery_auth_hash(recovery_raw),
        schema=info.schema,
    )
    return rotate(
        v1,
        random_bytes,
        frontier=frontier,
        revoked_device=None,
        rotated_by=rotated_by,
        now_ms=now_ms,
    )


def _check_recovery_key(bundle: KeyBundle, recovery_raw: bytes, account_key: bytes) -> None:
    unwrapped = recovery_account_key(bundle, recovery_raw)  # WrongKeyError if it does not
    if not hmac.compare_digest(unwrapped, account_key):
        raise WrongKeyError("the recovery key belongs to another account")


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


def _secrets_key(generation_key: bytes) -> bytes:
    return hkdf(generation_key, SECRETS_KEY_INFO)


def _open_secrets(bundle: KeyBundleV2, key: bytes, c: bytes) -> OpenedGeneration:
    refusal = "the generation key does not open this key generation's secrets"
    plain = open_aead(_secrets_key(key), bundle.sealed_secrets, SECRETS_AD + c, refusal)
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
        raise ProtocolError(
            "the key bundle's clear fields do not match its sealed secrets",
            hint="the bundle was not made by sealsync: ask the account's owner",
        )
    return OpenedGeneration(key, secrets)
