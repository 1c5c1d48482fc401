"""The key-chain vectors (specs/vectors/keys.json), written by an implementation that imports
nothing from `replica`, against the code: every derived key, the bundle opened with each
secret and sealed again to the same bytes, the local keys, and the signed push, which the
relay's check accepts.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from relay.signing import BundleKeys, Pusher, authorize_push
from replica.envelope import Identity, opaque_key, profile_key, scope_key
from replica.generations import (
    OpenedGeneration,
    PushSigner,
    bundle_v2_from_bytes,
    bundle_v2_to_bytes,
    clear_digest,
    generation_keys,
    open_with_kek,
    open_with_recovery_key,
    recovery_public_key,
    seal_generation,
    sign_chain,
    sign_push,
    verify_chain,
)
from replica.kdfparams import KdfParams
from replica.keys import (
    Frontier,
    hkdf,
    parse_recovery_key,
    passphrase_login_keys,
    recovery_login_keys,
)
from replica.wire import (
    PushBatch,
    RelayState,
    auth_key_hash,
    push_signed_bytes,
    tombstone_bits,
)

ROOT = Path(__file__).resolve().parents[2]
GENERATOR_PATH = ROOT / "specs" / "vectors" / "generate_keys.py"
VECTORS: dict[str, Any] = json.loads((ROOT / "specs" / "vectors" / "keys.json").read_text())
BUNDLE: dict[str, Any] = VECTORS["bundle_v2"]
PUSH: dict[str, Any] = VECTORS["signed_push"]


def hexed(value: str) -> bytes:
    return bytes.fromhex(value)


@functools.cache
def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_keys", GENERATOR_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_vector_file_is_what_the_generator_writes() -> None:
    generator = load_generator()
    assert (ROOT / "specs" / "vectors" / "keys.json").read_text() == generator.render(
        generator.build_vectors()
    )


def test_the_passphrase_and_the_recovery_key_derive_the_vectors_keys() -> None:
    kdf = BUNDLE["kdf"]
    params = KdfParams(hexed(kdf["salt"]), kdf["memory_kib"], kdf["iterations"], kdf["lanes"])
    login = passphrase_login_keys(BUNDLE["passphrase"], params)
    assert (login.auth_key.hex(), login.wrapping_key.hex()) == (
        BUNDLE["login"]["auth_key"],
        BUNDLE["login"]["kek"],
    )
    recovery = BUNDLE["recovery"]
    raw = parse_recovery_key(BUNDLE["recovery_key"])
    assert raw.hex() == recovery["raw"]
    auth_key = recovery_login_keys(BUNDLE["recovery_key"]).auth_key
    assert auth_key.hex() == recovery["auth_key"]
    assert auth_key_hash(auth_key).hex() == recovery["auth_key_hash"]
    assert hkdf(raw, b"sealsync recovery x25519 v2").hex() == recovery["x25519_private"]
    assert recovery_public_key(raw).hex() == recovery["x25519_public"]


def opened_by_each_secret() -> list[OpenedGeneration]:
    bundle = bundle_v2_from_bytes(hexed(BUNDLE["bundle"]))
    assert clear_digest(bundle).hex() == BUNDLE["clear_digest"]
    by_kek = open_with_kek(bundle, hexed(BUNDLE["login"]["kek"]))
    by_recovery = open_with_recovery_key(bundle, hexed(BUNDLE["recovery"]["raw"]))
    return [by_kek, by_recovery]


def test_the_vector_bundle_opens_with_each_secret_to_the_vectors_keys() -> None:
    """The recovery wrap is the generator's own RFC 9180 key schedule, opened here by the
    library's HPKE: two readings of the standard agree."""
    expected = BUNDLE["secrets"]
    for opened in opened_by_each_secret():
        assert opened.key.hex() == BUNDLE["generation_key"]
        secrets = opened.secrets
        assert msgspec.msgpack.encode(secrets).hex() == expected["messagepack"]
        fields = ("account_id", "index_key", "scope_key", "signing_key", "recovery_auth_hash")
        assert {f: getattr(secrets, f).hex() for f in fields} == {f: expected[f] for f in fields}
        assert {str(e): k.hex() for e, k in secrets.epoch_keys.items()} == expected["epoch_keys"]
        assert secrets.signing_public().hex() == expected["signing_public"]


def fixed_random(*values: bytes) -> Callable[[int], bytes]:
    """`random_bytes` that hands out `values` in order, each of the length asked."""
    pending = list(values)

    def take(length: int) -> bytes:
        value = pending.pop(0)
        assert len(value) == length
        return value

    return take


def test_sealing_the_vectors_generation_gives_the_same_bytes_but_for_the_hpke_wrap() -> None:
    """HPKE draws its own ephemeral key, so only its wrap differs (and it opens the same)."""
    opened = opened_by_each_secret()[0]
    given = bundle_v2_from_bytes(hexed(BUNDLE["bundle"]))
    nonces = BUNDLE["nonces"]
    random = fixed_random(hexed(nonces["passphrase_wrap"]), hexed(nonces["sealed_secrets"]))
    sealed = seal_generation(opened, given.kdf, hexed(BUNDLE["login"]["kek"]), random, None)
    assert msgspec.structs.replace(sealed, recovery_wrap=b"") == msgspec.structs.replace(
        given, recovery_wrap=b""
    )
    reopened = open_with_recovery_key(sealed, hexed(BUNDLE["recovery"]["raw"]))
    assert reopened == opened
    assert bundle_v2_to_bytes(given).hex() == BUNDLE["bundle"]


def test_the_stored_keys_give_the_vectors_local_keys() -> None:
    keys = generation_keys(opened_by_each_secret()[0])
    local = BUNDLE["local_keys"]
    notes = Identity("default", "notes", "n1")
    assert opaque_key(keys.index_key, notes).hex() == local["opaque_key(default, notes, n1)"]
    assert (
        keys.record_key("default", "notes", "n1").hex() == local["opaque_key(default, notes, n1)"]
    )
    assert scope_key(keys, "default", "notes").hex() == local["scope(default, notes)"]
    assert profile_key(keys, "work").hex() == local["profile(work)"]
    schema_key = hkdf(keys.scope_key, b"sealsync local schema v1")
    assert schema_key.hex() == local["local_schema_key"]


def test_the_signed_push_vector_is_what_the_device_signs_and_the_relay_accepts() -> None:
    """Ed25519 is deterministic: the device's signature is the vector's, byte for byte."""
    envelopes = [hexed(e) for e in PUSH["envelopes"]]
    state = RelayState(PUSH["storage_id"], PUSH["account_epoch"], 0)
    signer = PushSigner(PUSH["account"], PUSH["device_id"], state)
    signing_key = hexed(BUNDLE["secrets"]["signing_key"])
    unsigned = PushBatch(envelopes, ack=PUSH["ack"], tombstones=hexed(PUSH["tombstones"]))
    assert unsigned.tombstones == tombstone_bits([False, True])
    batch = sign_push(unsigned, signing_key, PUSH["generation"], PUSH["counter"], signer)
    pusher = Pusher.of(PUSH["device_id"], batch)
    signed = push_signed_bytes(
        PUSH["account"], PUSH["device_id"], state, batch, pusher.digests, pusher.tombstones
    )
    assert signed.hex() == PUSH["signed_bytes"]
    assert batch.signature is not None and batch.signature.hex() == PUSH["signature"]
    assert msgspec.msgpack.encode(batch).hex() == PUSH["push_batch"]
    keys = BundleKeys(hexed(BUNDLE["secrets"]["signing_public"]), PUSH["generation"], 0)
    assert authorize_push(PUSH["account"], keys, state, batch, pusher, accept_unsigned=False)


ROTATION: dict[str, Any] = VECTORS["rotation"]


def test_the_rotation_vector_opens_chains_and_seals_again_to_the_same_bytes() -> None:
    """Generation 2: the new passphrase and the recovery key open it, generation 1's signing
    key vouches for it, its secrets keep epoch 0 behind the vector's frontier, and the code
    seals it to the same bytes but for the HPKE wrap."""
    given = bundle_v2_from_bytes(hexed(ROTATION["bundle"]))
    assert clear_digest(given).hex() == ROTATION["clear_digest"]
    kdf = ROTATION["kdf"]
    params = KdfParams(hexed(kdf["salt"]), kdf["memory_kib"], kdf["iterations"], kdf["lanes"])
    login = passphrase_login_keys(ROTATION["passphrase"], params)
    assert login.wrapping_key.hex() == ROTATION["login"]["kek"]
    by_kek = open_with_kek(given, login.wrapping_key)
    assert by_kek == open_with_recovery_key(given, hexed(BUNDLE["recovery"]["raw"]))
    assert by_kek.key.hex() == ROTATION["generation_key"]
    assert msgspec.msgpack.encode(by_kek.secrets).hex() == ROTATION["secrets_messagepack"]
    previous = hexed(ROTATION["previous_signing_public"])
    assert previous.hex() == BUNDLE["secrets"]["signing_public"]
    assert verify_chain(given, previous)
    assert (
        sign_chain(by_kek.secrets, hexed(BUNDLE["secrets"]["signing_key"])).hex()
        == (ROTATION["chain_signature"])
    )
    expected = ROTATION["frontier"]
    frontier = generation_keys(by_kek).retired_epochs[expected["epoch"]]
    assert frontier == Frontier(
        {int(node): hlc for node, hlc in expected["vector"].items()},
        expected["head"],
        expected["storage_id"],
        expected["account_epoch"],
    )
    nonces = BUNDLE["nonces"]
    random = fixed_random(hexed(nonces["passphrase_wrap"]), hexed(nonces["sealed_secrets"]))
    sealed = seal_generation(by_kek, given.kdf, login.wrapping_key, random, given.chain_signature)
    assert msgspec.structs.replace(sealed, recovery_wrap=b"") == msgspec.structs.replace(
        given, recovery_wrap=b""
    )
