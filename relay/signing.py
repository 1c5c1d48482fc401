"""Signed pushes (specs/protocol.md §4.7): which key an account's bundle registers, and
whether a push may be stored.

A version-2 key bundle names its generation's Ed25519 public key in clear. The relay keeps
it, with the generation and the newest key epoch, and from then on stores a push only when
that key signed it for this device, relay, account epoch and counter: a stolen token alone
can no longer make the relay store, compact or acknowledge anything. The relay holds no
secret that signs. A version-1 account registers no key and pushes unsigned until it
migrates (docs/key-generations.md §5).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from relay.errors import ConflictError, ForbiddenError, InvalidError, KeyRetiredError
from replica.wire import (
    BundleHead,
    ErrorCode,
    Header,
    PushBatch,
    PutKeyBundle,
    Receipt,
    RelayState,
    bundle_version,
    push_signed_bytes,
)

EPOCH_AHEAD = Receipt("refused", code=ErrorCode.EPOCH_AHEAD)


@dataclass(frozen=True)
class BundleKeys:
    """What the relay knows of an account's keys: none for a version-1 bundle."""

    signing_public: bytes | None = None
    generation: int = 0
    key_epoch: int = 0


def reseal_epoch(keys: BundleKeys) -> int | None:
    """The key epoch a push may re-seal stored versions into (`relay.versions.decide`): the
    current one of a version-2 account, whose pushes are all signed by its key; None for a
    version-1 account, whose pushes nobody signs (an operator may take them unsigned)."""
    return None if keys.signing_public is None else keys.key_epoch


@dataclass(frozen=True)
class Pusher:
    """Who sent a push, as the relay knows it before storage is read: the device of the
    token, and what the signature covers of the batch as sent: the SHA-256 of each envelope
    (hashed outside the account's lock) and the tombstones."""

    device_id: str
    digests: list[bytes] = field(repr=False)
    tombstones: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, device_id: str, batch: PushBatch) -> Pusher:
        """Hashes only what a signature covers: an unsigned push needs no digests."""
        if batch.signature is None:
            return cls(device_id, [])
        digests = [hashlib.sha256(e).digest() for e in batch.envelopes]
        return cls(device_id, digests, batch.tombstones)


def bundle_keys(bundle: bytes) -> BundleKeys:
    """The keys a bundle registers. A bundle that is not a version-2 map stays opaque and
    registers none; a version-2 one with malformed clear fields is refused."""
    try:
        version = bundle_version(bundle)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return BundleKeys()
    if version < 2:
        return BundleKeys()
    try:
        head = msgspec.msgpack.decode(bundle, type=BundleHead)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidError(f"the key bundle's clear fields are malformed: {exc}") from None
    if head.generation < 1:
        raise InvalidError("a version-2 key bundle starts at generation 1")
    return BundleKeys(head.signing_public, head.generation, head.key_epoch)


def check_plain_revoke(keys: BundleKeys, device_id: str, caller_device_id: str) -> None:
    """A version-2 account revokes another device only with a rotation, so that the device
    keeps nothing that opens what is written next (docs/key-generations.md §6); a device
    may still end its own access (`clients.access` does, on an account it refuses)."""
    if keys.generation and device_id != caller_device_id:
        raise ConflictError(
            "a version-2 account revokes a device by rotating its keys: "
            f"POST /v1/devices/{device_id}/rotate (`sealsync devices --revoke`)"
        )


def check_key_change(old: BundleKeys, body: PutKeyBundle, *, rotation: bool) -> None:
    """`check_bundle_change` for a request that replaces the bundle."""
    checked = body.expected_head is not None
    check_bundle_change(old, bundle_keys(body.bundle), rotation=rotation, head_checked=checked)


def check_bundle_change(
    old: BundleKeys, new: BundleKeys, *, rotation: bool = False, head_checked: bool
) -> None:
    """Refuse a replacement that would step back: a lower generation or key epoch, a signing
    key changed within a generation, or a version-2 account's key dropped; a rotation (one
    that revokes a device) that is not exactly the next generation; and a new generation
    whose request names no head (`expected_head`): it comes from a client that records no
    frontier, which every device needs once the old epochs retire (docs/key-generations.md
    §6)."""
    if new.generation > old.generation and not head_checked:
        raise ConflictError(
            "a new key generation must name the relay head its frontier covers "
            "(expected_head): update sealsync"
        )
    if rotation and old.signing_public is None:
        raise ConflictError(
            "a version-1 account has no key generations to rotate: `sealsync upgrade` it first"
        )
    if rotation and new.generation != old.generation + 1:
        raise ConflictError(
            f"a rotation installs generation {old.generation + 1}, not {new.generation}"
        )
    if old.signing_public is None:
        return  # a version-1 account may migrate, or stay
    if new.signing_public is None:
        raise ConflictError("a key bundle with a signing key cannot be replaced by one without")
    if new.generation < old.generation:
        raise ConflictError(
            f"the key bundle is at generation {old.generation}; "
            f"generation {new.generation} would go back"
        )
    if new.generation == old.generation and new.signing_public != old.signing_public:
        raise ConflictError("a new signing key takes a new key generation")
    if new.key_epoch < old.key_epoch:
        raise ConflictError(
            f"the key bundle is at key epoch {old.key_epoch}; epoch {new.key_epoch} would go back"
        )


def authorize_push(
    name: str,
    keys: BundleKeys,
    state: RelayState,
    batch: PushBatch,
    pusher: Pusher | None,
    accept_unsigned: bool,
) -> bool:
    """Raise unless the account's key signed `batch` for `pusher` and this relay state;
    whether the push was signed (so its counter must be recorded). Decided from the clear
    `generation` first: a retired key costs no verification. An account without a signing
    key (version 1) gets no push accepted unless the relay is set to `accept_unsigned`."""
    if keys.signing_public is None:
        if accept_unsigned:
            return False
        raise ForbiddenError(
            f"account {name!r} has no signing key, and this relay takes only signed pushes: "
            "one of its devices runs `sealsync upgrade` (it asks for the recovery key once)"
        )
    if batch.signature is None or pusher is None:
        raise ForbiddenError("this account takes only signed pushes")
    if batch.generation < keys.generation:
        raise KeyRetiredError(
            f"the push is signed by generation {batch.generation}; "
            f"the account is at generation {keys.generation}"
        )
    if batch.generation > keys.generation:
        raise ForbiddenError(
            f"the push is signed by generation {batch.generation}; "
            f"the account is at generation {keys.generation}"
        )
    message = push_signed_bytes(
        name, pusher.device_id, state, batch, pusher.digests, pusher.tombstones
    )
    try:
        Ed25519PublicKey.from_public_bytes(keys.signing_public).verify(batch.signature, message)
    except InvalidSignature:
        raise ForbiddenError("the push's signature does not verify") from None
    return True


def refuse_epochs_ahead(
    keys: BundleKeys, checked: list[Header | Receipt]
) -> list[Header | Receipt]:
    """Refuse every envelope of a key epoch the account has not reached: held forever by
    every device, it would hide the record it names (only known for version-2 accounts)."""
    if keys.signing_public is None:
        return checked
    return [
        EPOCH_AHEAD if isinstance(h, Header) and h.epoch > keys.key_epoch else h for h in checked
    ]
