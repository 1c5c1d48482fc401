"""Key bundle version 2 (replica/generations.py, docs/key-generations.md §3, §5, §6): every
secret opens what it should and nothing else, every clear field is bound into every wrap,
rotation and migration from version 1 keep old versions readable and new keys new.

No Argon2id runs here: the passphrase's KEK is a random 32-byte key, as it is after the KDF.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Any

import msgspec
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.pretty import pretty_repr

from replica.errors import ProtocolError, WrongKeyError
from replica.generations import (
    CHAIN_LABEL,
    PASSPHRASE_AD,
    SECRETS_AD,
    SECRETS_KEY_INFO,
    GenerationSecrets,
    KeyBundleV2,
    OpenedGeneration,
    bundle_v2_from_bytes,
    bundle_v2_to_bytes,
    clear_digest,
    migrate_v1,
    open_with_generation_key,
    open_with_kek,
    open_with_recovery_key,
    recovery_public_key,
    reseal_secrets,
    rotate,
    seal_generation,
    sign_chain,
    verify_chain,
)
from replica.keys import (
    Frontier,
    bundle_from_bytes,
    hkdf,
    open_info,
)
from replica.wire import KdfParams
from tests.replica.test_keys import assert_no_leak
from tests.replica.v1 import V1Account

KDF = KdfParams(salt=bytes(range(16)))
FRONTIER = Frontier({7: 1 << 20, 9: 3 << 16}, head=42)


def generation_one(recovery_raw: bytes, **changes: Any) -> OpenedGeneration:
    fields: dict[str, Any] = {
        "account_id": os.urandom(16),
        "generation": 1,
        "key_epoch": 0,
        "epoch_keys": {0: os.urandom(32)},
        "index_key": os.urandom(32),
        "scope_key": os.urandom(32),
        "signing_key": os.urandom(32),
        "recovery_public": recovery_public_key(recovery_raw),
        "recovery_auth_hash": os.urandom(32),
        "schema": b"\x90",
    }
    return OpenedGeneration(os.urandom(32), GenerationSecrets(**(fields | changes)))


@pytest.fixture
def recovery_raw() -> bytes:
    return os.urandom(32)


@pytest.fixture
def kek() -> bytes:
    return os.urandom(32)


@pytest.fixture
def sealed(recovery_raw: bytes, kek: bytes) -> tuple[OpenedGeneration, KeyBundleV2]:
    opened = generation_one(recovery_raw)
    return opened, seal_generation(opened, KDF, kek, os.urandom, None)


@settings(max_examples=25, deadline=None)
@given(
    epochs=st.dictionaries(
        st.integers(0, 2**32 - 1), st.binary(min_size=32, max_size=32), min_size=1, max_size=5
    ),
    schema=st.none() | st.binary(max_size=200),
    revoked=st.none() | st.text(max_size=40),
    vector=st.dictionaries(st.integers(0, 2**64 - 1), st.integers(0, 2**63 - 1), max_size=4),
)
def test_a_sealed_generation_opens_the_same_with_either_secret(
    epochs: dict[int, bytes], schema: bytes | None, revoked: str | None, vector: dict[int, int]
) -> None:
    recovery_raw, kek = os.urandom(32), os.urandom(32)
    opened = generation_one(
        recovery_raw,
        epoch_keys=epochs,
        key_epoch=max(epochs),
        schema=schema,
        revoked_device=revoked,
        frontiers={min(epochs): Frontier(vector, 3)},
    )
    bundle = bundle_v2_from_bytes(
        bundle_v2_to_bytes(seal_generation(opened, KDF, kek, os.urandom, None))
    )
    assert open_with_kek(bundle, kek) == opened
    assert open_with_recovery_key(bundle, recovery_raw) == opened
    assert bundle.signing_public == opened.secrets.signing_public()


def test_a_wrong_secret_opens_nothing(sealed: tuple[OpenedGeneration, KeyBundleV2]) -> None:
    _, bundle = sealed
    with pytest.raises(WrongKeyError, match="passphrase"):
        open_with_kek(bundle, os.urandom(32))
    with pytest.raises(WrongKeyError, match="recovery key"):
        open_with_recovery_key(bundle, os.urandom(32))


CLEAR_CHANGES = {
    "generation": {"generation": 2},
    "key_epoch": {"key_epoch": 1},
    "salt": {"kdf": KdfParams(salt=bytes(16))},
    "memory": {"kdf": KdfParams(salt=KDF.salt, memory_kib=KDF.memory_kib * 2)},
    "iterations": {"kdf": KdfParams(salt=KDF.salt, iterations=KDF.iterations + 1)},
    "lanes": {"kdf": KdfParams(salt=KDF.salt, lanes=2)},
    "signing_public": {"signing_public": bytes(32)},
    "recovery_public": {"recovery_public": recovery_public_key(bytes(32))},
}


@pytest.mark.parametrize("changes", CLEAR_CHANGES.values(), ids=CLEAR_CHANGES.keys())
def test_every_clear_field_is_bound_into_every_wrap(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
    recovery_raw: bytes,
    kek: bytes,
    changes: dict[str, Any],
) -> None:
    """A relay that swaps a clear field (a weaker KDF, its own recovery key to wrap the next
    generation to) gets a bundle that opens nothing (docs/key-generations.md §3)."""
    _, bundle = sealed
    swapped = msgspec.structs.replace(bundle, **changes)
    assert clear_digest(swapped) != clear_digest(bundle)
    with pytest.raises(WrongKeyError):
        open_with_kek(swapped, kek)
    with pytest.raises(WrongKeyError):
        open_with_recovery_key(swapped, recovery_raw)


@pytest.mark.parametrize("wrap", ["passphrase_wrap", "recovery_wrap", "sealed_secrets"])
def test_one_flipped_bit_in_a_wrap_opens_nothing(
    sealed: tuple[OpenedGeneration, KeyBundleV2], recovery_raw: bytes, kek: bytes, wrap: str
) -> None:
    _, bundle = sealed
    data = bytearray(getattr(bundle, wrap))
    data[len(data) // 2] ^= 1
    tampered = msgspec.structs.replace(bundle, **{wrap: bytes(data)})
    opens = {
        "passphrase_wrap": lambda: open_with_kek(tampered, kek),
        "recovery_wrap": lambda: open_with_recovery_key(tampered, recovery_raw),
        "sealed_secrets": lambda: open_with_kek(tampered, kek),
    }
    with pytest.raises(WrongKeyError):
        opens[wrap]()


def rotated(opened: OpenedGeneration, **changes: Any) -> OpenedGeneration:
    """`rotate` by the desk, behind FRONTIER, revoking nobody unless `changes` say."""
    options: dict[str, Any] = {
        "frontier": FRONTIER,
        "revoked_device": None,
        "rotated_by": "desk",
        "now_ms": 0,
    }
    return rotate(opened.secrets, os.urandom, **(options | changes))


def sealed_by_hand(bundle: KeyBundleV2, opened: OpenedGeneration, kek: bytes) -> KeyBundleV2:
    """Wrap and seal for `bundle`'s clear fields whatever they say: what a key holder with
    its own code could make."""
    c = clear_digest(bundle)
    n1, n2 = os.urandom(12), os.urandom(12)
    secrets_key = hkdf(opened.key, SECRETS_KEY_INFO)
    plain = msgspec.msgpack.encode(opened.secrets)
    return msgspec.structs.replace(
        bundle,
        passphrase_wrap=n1 + AESGCM(kek).encrypt(n1, opened.key, PASSPHRASE_AD + c),
        sealed_secrets=n2 + AESGCM(secrets_key).encrypt(n2, plain, SECRETS_AD + c),
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"signing_public": Ed25519PrivateKey.generate().public_key().public_bytes_raw()},
        {"recovery_public": recovery_public_key(bytes(32))},
        {"generation": 5},
        {"key_epoch": 1},
    ],
    ids=["signing_public", "recovery_public", "generation", "key_epoch"],
)
def test_secrets_that_contradict_the_clear_fields_are_refused(
    sealed: tuple[OpenedGeneration, KeyBundleV2], kek: bytes, changes: dict[str, Any]
) -> None:
    """Correctly wrapped, but the clear fields the relay verifies pushes with are not the
    generation's own: a device refuses it rather than trust the clear copy."""
    opened, bundle = sealed
    lying = sealed_by_hand(msgspec.structs.replace(bundle, **changes), opened, kek)
    with pytest.raises(ProtocolError, match="do not match"):
        open_with_kek(lying, kek)
    assert open_with_kek(sealed_by_hand(bundle, opened, kek), kek) == opened  # the control


def test_resealing_refuses_secrets_that_would_contradict_the_clear_fields(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
) -> None:
    """A bundle whose secrets contradict its clear fields opens for nobody, so it is never
    made: resealing may change only what the wraps do not bind."""
    opened, bundle = sealed
    renamed = msgspec.structs.replace(opened.secrets, schema=b"\x91")
    resealed = reseal_secrets(bundle, OpenedGeneration(opened.key, renamed), os.urandom)
    assert open_with_generation_key(resealed, opened.key).secrets == renamed
    for change in ({"key_epoch": 1}, {"generation": 2}, {"signing_key": os.urandom(32)}):
        contradicting = msgspec.structs.replace(opened.secrets, **change)
        with pytest.raises(ValueError, match="clear fields"):
            reseal_secrets(bundle, OpenedGeneration(opened.key, contradicting), os.urandom)


def test_a_current_epoch_without_its_key_is_refused(recovery_raw: bytes, kek: bytes) -> None:
    no_epoch = generation_one(recovery_raw, key_epoch=3)
    with pytest.raises(ProtocolError, match="do not match"):
        open_with_kek(seal_generation(no_epoch, KDF, kek, os.urandom, None), kek)


def test_the_canonical_digest_follows_the_documented_layout(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
) -> None:
    """`C` recomputed from docs/key-generations.md §3 with struct alone."""
    _, b = sealed
    u32 = struct.Struct(">I").pack
    expected = hashlib.sha256(
        b"sealsync bundle v2\0"
        + u32(2)
        + u32(b.generation)
        + u32(b.key_epoch)
        + b.kdf.salt
        + u32(b.kdf.memory_kib)
        + u32(b.kdf.iterations)
        + u32(b.kdf.lanes)
        + b.signing_public
        + b.recovery_public
    ).digest()
    assert clear_digest(b) == expected
    kek_opened = AESGCM(b"\0" * 32)  # the passphrase wrap's AD, checked with the primitive
    nonce = os.urandom(12)
    sealed_key = kek_opened.encrypt(nonce, b"k" * 32, b"sealsync wrap v2 passphrase\0" + expected)
    probe = msgspec.structs.replace(b, passphrase_wrap=nonce + sealed_key)
    with pytest.raises(WrongKeyError, match="generation key"):  # the wrap opened; secrets did not
        open_with_kek(probe, b"\0" * 32)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("version", 1, "version 1 is not 2"),
        ("generation", 2**32, r"<= 4294967295 - at `\$.generation`"),
        ("signing_public", b"short", r"length >= 32 - at `\$.signing_public`"),
    ],
)
def test_a_malformed_bundle_is_a_protocol_error(
    sealed: tuple[OpenedGeneration, KeyBundleV2], field: str, value: object, message: str
) -> None:
    _, bundle = sealed
    data = msgspec.msgpack.encode(msgspec.structs.replace(bundle, **{field: value}))
    with pytest.raises(ProtocolError, match=message):
        bundle_v2_from_bytes(data)
    with pytest.raises(ProtocolError, match="malformed"):
        bundle_v2_from_bytes(b"\xc1")


def test_a_rotation_makes_new_keys_carries_old_epochs_and_chains(
    sealed: tuple[OpenedGeneration, KeyBundleV2], recovery_raw: bytes
) -> None:
    opened, first = sealed
    new_kek = os.urandom(32)
    second = rotated(opened, revoked_device="laptop", now_ms=1_800_000_000_000)
    chain = sign_chain(second.secrets, opened.secrets.signing_key)
    bundle = seal_generation(second, KDF, new_kek, os.urandom, chain)
    old, new = opened.secrets, second.secrets
    assert (new.generation, new.key_epoch) == (2, 1)
    assert second.key != opened.key and new.signing_key != old.signing_key
    assert (
        new.epoch_keys[0] == old.epoch_keys[0] and new.epoch_keys[1] not in old.epoch_keys.values()
    )
    assert new.frontiers == {0: FRONTIER} and new.revoked_device == "laptop"
    assert (new.account_id, new.index_key, new.scope_key) == (
        old.account_id,
        old.index_key,
        old.scope_key,
    )
    assert verify_chain(bundle, first.signing_public)
    assert not verify_chain(bundle, bundle.signing_public)  # its own key does not vouch
    assert not verify_chain(first, first.signing_public)  # generation 1 has no chain
    assert open_with_recovery_key(bundle, recovery_raw) == second  # recovery key carried
    old_secrets_key = AESGCM(hkdf(opened.key, SECRETS_KEY_INFO))  # what a revoked device holds
    sealed_secrets = bundle.sealed_secrets
    with pytest.raises(InvalidTag):
        old_secrets_key.decrypt(
            sealed_secrets[:12], sealed_secrets[12:], SECRETS_AD + clear_digest(bundle)
        )


def test_a_chain_signature_by_another_key_does_not_verify(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
) -> None:
    opened, first = sealed
    second = rotated(opened)
    forged_chain = sign_chain(second.secrets, os.urandom(32))
    forged = seal_generation(second, KDF, os.urandom(32), os.urandom, forged_chain)
    assert not verify_chain(forged, first.signing_public)
    signed = Ed25519PrivateKey.from_private_bytes(opened.secrets.signing_key).sign(
        CHAIN_LABEL + b"something else"
    )
    assert not verify_chain(
        msgspec.structs.replace(forged, chain_signature=signed), first.signing_public
    )


def test_a_new_recovery_key_at_rotation_replaces_the_old_one(
    sealed: tuple[OpenedGeneration, KeyBundleV2], recovery_raw: bytes
) -> None:
    opened, _ = sealed
    fresh = os.urandom(32)
    second = rotated(opened, new_recovery_raw=fresh)
    chain = sign_chain(second.secrets, opened.secrets.signing_key)
    bundle = seal_generation(second, KDF, os.urandom(32), os.urandom, chain)
    assert open_with_recovery_key(bundle, fresh) == second
    assert second.secrets.recovery_auth_hash != opened.secrets.recovery_auth_hash
    with pytest.raises(WrongKeyError):
        open_with_recovery_key(bundle, recovery_raw)


def migrate(v1: V1Account, recovery_raw: bytes, *, new: bool = False) -> OpenedGeneration:
    return migrate_v1(
        v1.bundle,
        v1.keys,
        recovery_raw,
        os.urandom,
        new_recovery_key=new,
        frontier=FRONTIER,
        rotated_by="desk",
        now_ms=0,
    )


def test_migrating_a_v1_account_keeps_its_epochs_and_names_but_no_v1_secret_opens_it(
    v1: V1Account,
) -> None:
    """docs/key-generations.md §5: a device that held the v1 account key (revoked before the
    migration, say) opens nothing of generation 1; versions sealed under v1 stay readable,
    and the same passphrase opens the new bundle."""
    one = migrate(v1, v1.recovery_raw)
    info = open_info(v1.keys.unlock_key, v1.bundle.sealed_info)
    s = one.secrets
    assert (s.generation, s.key_epoch, s.account_id) == (1, info.key_epoch + 1, info.account_id)
    assert (s.index_key, s.scope_key) == (v1.keys.index_key, v1.keys.scope_key)
    assert s.schema == info.schema and s.recovery_auth_hash == info.recovery_auth_hash
    nonce, header = os.urandom(12), b"a v1 envelope header"
    v1_sealed = v1.keys.aead(0).encrypt(nonce, b"plaintext", header)
    assert AESGCM(s.epoch_keys[0]).decrypt(nonce, v1_sealed, header) == b"plaintext"
    assert s.frontiers == {e: FRONTIER for e in range(info.key_epoch + 1)}
    assert v1.keys.unlock_key not in (one.key, s.signing_key, s.epoch_keys[s.key_epoch])
    bundle = seal_generation(one, v1.bundle.kdf, v1.login.wrapping_key, os.urandom, None)
    assert open_with_kek(bundle, v1.login.wrapping_key) == one
    assert open_with_recovery_key(bundle, v1.recovery_raw) == one
    with pytest.raises(WrongKeyError):
        open_with_kek(bundle, v1.keys.unlock_key)


def test_migrating_with_a_recovery_key_of_another_account_is_refused(v1: V1Account) -> None:
    with pytest.raises(WrongKeyError, match="recovery key"):
        migrate(v1, os.urandom(32))
    fresh = os.urandom(32)
    one = migrate(v1, fresh, new=True)
    assert one.secrets.recovery_public == recovery_public_key(fresh)
    assert (
        one.secrets.recovery_auth_hash
        != open_info(v1.keys.unlock_key, v1.bundle.sealed_info).recovery_auth_hash
    )


def test_no_secret_shows_in_a_repr_or_to_rich(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
) -> None:
    """rich reads msgspec's `__rich_repr__`, which would bypass a `__repr__` override."""
    opened, bundle = sealed
    secrets = opened.secrets
    shown = "\n".join(
        text for obj in (opened, secrets, bundle) for text in (repr(obj), pretty_repr(obj))
    )
    assert "generation=1" in shown  # what they do show
    assert_no_leak(
        shown,
        {
            "generation key": opened.key,
            "signing key": secrets.signing_key,
            "epoch key": secrets.epoch_keys[0],
            "index key": secrets.index_key,
            "scope key": secrets.scope_key,
        },
    )


def test_a_passphrase_change_keeps_the_chain_signature(
    sealed: tuple[OpenedGeneration, KeyBundleV2], kek: bytes
) -> None:
    """The chain covers the generation's identity, not the KDF parameters: re-wrapping under
    a new passphrase and salt carries it over without the previous generation's key."""
    opened, first = sealed
    second = rotated(opened)
    bundle = seal_generation(
        second, KDF, kek, os.urandom, sign_chain(second.secrets, opened.secrets.signing_key)
    )
    new_kdf, new_kek = KdfParams(salt=os.urandom(16)), os.urandom(32)
    rewrapped = seal_generation(second, new_kdf, new_kek, os.urandom, bundle.chain_signature)
    assert verify_chain(rewrapped, first.signing_public)
    assert open_with_kek(rewrapped, new_kek) == second
    with pytest.raises(WrongKeyError):
        open_with_kek(rewrapped, kek)


def test_a_newer_bundle_version_asks_for_an_upgrade(
    sealed: tuple[OpenedGeneration, KeyBundleV2],
) -> None:
    """Read by code that knows only version 1, a version-2 bundle says "upgrade", rather than
    failing on the first version-1 field it lacks."""
    _, bundle = sealed
    with pytest.raises(ProtocolError, match="version 2 is not 1") as refused:
        bundle_from_bytes(bundle_v2_to_bytes(bundle))
    assert refused.value.hint == "upgrade sealsync"
