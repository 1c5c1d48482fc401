"""Write specs/vectors/keys.json, the key-chain test vectors of specs/envelope.md §2 and the
signed push of specs/protocol.md §4.7.

A second implementation on purpose, as generate_envelope.py: it imports nothing from
`replica` and builds every value from the specs with the primitives alone (Argon2id, HKDF,
HMAC, AES-256-GCM, X25519, Ed25519, SHA-256 and a small MessagePack encoder). HPKE's
key schedule (RFC 9180, base mode) is written out here too, so that the recovery wrap can
use a fixed ephemeral key; tests/replica/test_key_vectors.py opens it with the library's HPKE.
Deterministic: every key and nonce is fixed, so running it twice writes the same bytes.

    python specs/vectors/generate_keys.py          # rewrite keys.json
    python specs/vectors/generate_keys.py --check  # exit 1 if keys.json is stale
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
import sys
import unicodedata
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

OUTPUT = Path(__file__).with_name("keys.json")
VECTORS_VERSION = 1
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")

PASSPHRASE = "correct horse battery staple, crème brûlée"
KDF = {"memory_kib": 65536, "iterations": 3, "lanes": 1}


def fixed_bytes(label: str, length: int) -> bytes:
    """A fixed, reproducible value: SHA-256 of a label, truncated."""
    return hashlib.sha256(b"sealsync key vector " + label.encode()).digest()[:length]


def hkdf(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def lp(text: str) -> bytes:
    """u32 big-endian byte length ‖ UTF-8."""
    data = text.encode("utf-8")
    return U32.pack(len(data)) + data


# ---- MessagePack, as msgspec writes these values ---------------------------------------------


def pack(value: Any) -> bytes:
    """Shortest forms; bytes as bin, str as str, dicts in their order."""
    if value is None:
        return b"\xc0"
    if isinstance(value, int):
        return pack_uint(value)
    if isinstance(value, bytes):
        return sized(len(value), None, 0, (0xC4, 0xC5, 0xC6)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return sized(len(data), 0xA0, 31, (0xD9, 0xDA, 0xDB)) + data
    if isinstance(value, list):
        return sized(len(value), 0x90, 15, (None, 0xDC, 0xDD)) + b"".join(map(pack, value))
    if isinstance(value, dict):
        items = b"".join(pack(k) + pack(v) for k, v in value.items())
        return sized(len(value), 0x80, 15, (None, 0xDE, 0xDF)) + items
    raise TypeError(f"cannot pack {type(value).__name__}")


def pack_uint(value: int) -> bytes:
    """The unsigned forms only: every integer of these messages is non-negative."""
    if 0 <= value <= 0x7F:
        return bytes([value])
    for marker, fmt in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q")):
        if 0 <= value < 1 << (8 * struct.calcsize(fmt)):
            return bytes([marker]) + struct.pack(fmt, value)
    raise ValueError(f"{value} is not a u64")


def sized(size: int, fix: int | None, fix_max: int, markers: tuple[int | None, int, int]) -> bytes:
    if fix is not None and size <= fix_max:
        return bytes([fix | size])
    for marker, fmt in zip(markers, (">B", ">H", ">I"), strict=True):
        if marker is not None and size < 1 << (8 * struct.calcsize(fmt)):
            return bytes([marker]) + struct.pack(fmt, size)
    raise ValueError(f"size {size} too large")


# ---- HPKE base mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM (RFC 9180) ---------

KEM_ID, KDF_ID, AEAD_ID = 0x0020, 0x0001, 0x0002


def labeled_extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt or bytes(32), b"HPKE-v1" + suite + label + ikm, "sha256").digest()


def labeled_expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    labeled = struct.pack(">H", length) + b"HPKE-v1" + suite + label + info
    return HKDFExpand(algorithm=hashes.SHA256(), length=length, info=labeled).derive(prk)


def hpke_seal(recipient: bytes, ephemeral: X25519PrivateKey, info: bytes, plain: bytes) -> bytes:
    """`enc ‖ ciphertext ‖ tag` of RFC 9180 §6.1 SealBase with an empty AAD."""
    kem_suite = b"KEM" + struct.pack(">H", KEM_ID)
    enc = ephemeral.public_key().public_bytes_raw()
    dh = ephemeral.exchange(X25519PublicKey.from_public_bytes(recipient))
    eae_prk = labeled_extract(kem_suite, b"", b"eae_prk", dh)
    shared = labeled_expand(kem_suite, eae_prk, b"shared_secret", enc + recipient, 32)
    suite = b"HPKE" + struct.pack(">HHH", KEM_ID, KDF_ID, AEAD_ID)
    psk_id_hash = labeled_extract(suite, b"", b"psk_id_hash", b"")
    info_hash = labeled_extract(suite, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = labeled_extract(suite, shared, b"secret", b"")
    key = labeled_expand(suite, secret, b"key", context, 32)
    nonce = labeled_expand(suite, secret, b"base_nonce", context, 12)
    return enc + AESGCM(key).encrypt(nonce, plain, b"")


# ---- the key chain ---------------------------------------------------------------------------


def login_keys(passphrase: str, salt: bytes) -> dict[str, bytes]:
    secret = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    master = Argon2id(
        salt=salt,
        length=32,
        iterations=KDF["iterations"],
        lanes=KDF["lanes"],
        memory_cost=KDF["memory_kib"],
    ).derive(secret)
    return {
        "master": master,
        "auth_key": hkdf(master, b"sealsync auth v1"),
        "kek": hkdf(master, b"sealsync kek v1"),
    }


def recovery_text(raw: bytes) -> str:
    text = base64.b32encode(raw + hashlib.sha256(raw).digest()[:3]).decode()
    return "-".join(text[i : i + 4] for i in range(0, len(text), 4))


def auth_key_hash(auth_key: bytes) -> bytes:
    return hashlib.sha256(b"sealsync auth key v1\0" + auth_key).digest()


def public_of(seed: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()


def clear_digest(clear: dict[str, Any]) -> bytes:
    """C of envelope.md §2.3.1."""
    kdf = clear["kdf"]
    numbers = (clear["version"], clear["generation"], clear["key_epoch"])
    costs = (kdf["memory_kib"], kdf["iterations"], kdf["lanes"])
    return hashlib.sha256(
        b"sealsync bundle v2\0"
        + b"".join(map(U32.pack, numbers))
        + kdf["salt"]
        + b"".join(map(U32.pack, costs))
        + clear["signing_public"]
        + clear["recovery_public"]
    ).digest()


def secrets_map(recovery_public: bytes, recovery_auth_hash: bytes) -> dict[str, Any]:
    """GenerationSecrets of generation 1, every field in order (envelope.md §2.3.1)."""
    return {
        "account_id": fixed_bytes("account id", 16),
        "generation": 1,
        "key_epoch": 0,
        "epoch_keys": {0: fixed_bytes("epoch key 0", 32)},
        "index_key": fixed_bytes("index key", 32),
        "scope_key": fixed_bytes("scope key", 32),
        "signing_key": fixed_bytes("signing key", 32),
        "recovery_public": recovery_public,
        "recovery_auth_hash": recovery_auth_hash,
        "schema": None,
        "frontiers": {},
        "revoked_device": None,
        "rotated_by": "",
        "rotated_at_ms": 0,
    }


NONCES = {
    "passphrase_wrap": fixed_bytes("wrap nonce", 12),
    "sealed_secrets": fixed_bytes("secrets nonce", 12),
}
EPHEMERAL = fixed_bytes("hpke ephemeral", 32)


def recovery_keys(raw: bytes) -> dict[str, bytes]:
    """What a recovery key derives (envelope.md §2.2)."""
    auth_key = hkdf(raw, b"sealsync recovery auth v1")
    x25519 = hkdf(raw, b"sealsync recovery x25519 v2")
    public = X25519PrivateKey.from_private_bytes(x25519).public_key().public_bytes_raw()
    return {
        "raw": raw,
        "auth_key": auth_key,
        "auth_key_hash": auth_key_hash(auth_key),
        "x25519_private": x25519,
        "x25519_public": public,
    }


def wrapped(
    generation_key: bytes, kek: bytes, recipient: bytes, secrets: dict[str, Any], c: bytes
) -> dict[str, bytes]:
    """The three sealed fields of a version-2 bundle, under the fixed nonces."""
    passphrase_nonce, secrets_nonce = NONCES["passphrase_wrap"], NONCES["sealed_secrets"]
    ephemeral = X25519PrivateKey.from_private_bytes(EPHEMERAL)
    secrets_key = hkdf(generation_key, b"sealsync secrets v2")
    passphrase_ad, secrets_ad = (
        b"sealsync wrap v2 passphrase\0" + c,
        b"sealsync wrap v2 secrets\0" + c,
    )
    return {
        "passphrase_wrap": passphrase_nonce
        + AESGCM(kek).encrypt(passphrase_nonce, generation_key, passphrase_ad),
        "recovery_wrap": hpke_seal(
            recipient, ephemeral, b"sealsync recovery v2\0" + c, generation_key
        ),
        "sealed_secrets": secrets_nonce
        + AESGCM(secrets_key).encrypt(secrets_nonce, pack(secrets), secrets_ad),
    }


def sealed_bundle(
    secrets: dict[str, Any],
    salt: bytes,
    kek: bytes,
    generation_key: bytes,
    chain_signature: bytes | None,
) -> tuple[bytes, bytes]:
    """(C, the bundle's MessagePack) of a generation's secrets, wrapped under `kek` and to
    the secrets' recovery public key."""
    clear: dict[str, Any] = {
        "version": 2,
        "generation": secrets["generation"],
        "key_epoch": secrets["key_epoch"],
        "kdf": {"salt": salt, **KDF},
        "signing_public": public_of(secrets["signing_key"]),
        "recovery_public": secrets["recovery_public"],
        "chain_signature": chain_signature,
    }
    c = clear_digest(clear)
    wraps = wrapped(generation_key, kek, secrets["recovery_public"], secrets, c)
    return c, pack({**clear, **wraps})


def bundle_vector() -> dict[str, Any]:
    salt, generation_key = fixed_bytes("salt", 16), fixed_bytes("generation key", 32)
    login = login_keys(PASSPHRASE, salt)
    recovery = recovery_keys(fixed_bytes("recovery key", 32))
    secrets = secrets_map(recovery["x25519_public"], recovery["auth_key_hash"])
    signing_public = public_of(secrets["signing_key"])
    c, bundle = sealed_bundle(secrets, salt, login["kek"], generation_key, None)
    return {
        "description": "generation 1 of a new account (envelope.md §2.1-§2.4)",
        "passphrase": PASSPHRASE,
        "kdf": {"salt": salt.hex(), **KDF},
        "login": {name: value.hex() for name, value in login.items()},
        "recovery_key": recovery_text(recovery["raw"]),
        "recovery": {name: value.hex() for name, value in recovery.items()}
        | {"hpke_ephemeral_private": EPHEMERAL.hex()},
        "generation_key": generation_key.hex(),
        "secrets_key": hkdf(generation_key, b"sealsync secrets v2").hex(),
        "clear_digest": c.hex(),
        "nonces": {name: nonce.hex() for name, nonce in NONCES.items()},
        "secrets": {k: v.hex() for k, v in secrets.items() if isinstance(v, bytes)}
        | {
            "epoch_keys": {"0": secrets["epoch_keys"][0].hex()},
            "signing_public": signing_public.hex(),
            "messagepack": pack(secrets).hex(),
        },
        "local_keys": local_keys(secrets["scope_key"], secrets["index_key"]),
        "bundle": bundle.hex(),
    }


NEW_PASSPHRASE = "a new passphrase for generation two"
FRONTIER = {
    "vector": {7: 123_456_789, 2**63 + 5: 987_654_321},
    "head": 42,
    "storage_id": "st-9",
    "account_epoch": "ep-4",
}


def rotation_vector() -> dict[str, Any]:
    """Generation 2, made by a rotation that revoked a device (docs/key-generations.md §6):
    a new generation key, epoch and signing key, the old epoch kept behind its frontier, a
    new passphrase under a new salt, and generation 1's signing key vouching for it."""
    salt, generation_key = fixed_bytes("salt 2", 16), fixed_bytes("generation key 2", 32)
    login = login_keys(NEW_PASSPHRASE, salt)
    recovery = recovery_keys(fixed_bytes("recovery key", 32))
    secrets = secrets_map(recovery["x25519_public"], recovery["auth_key_hash"]) | {
        "generation": 2,
        "key_epoch": 1,
        "epoch_keys": {0: fixed_bytes("epoch key 0", 32), 1: fixed_bytes("epoch key 1", 32)},
        "signing_key": fixed_bytes("signing key 2", 32),
        "frontiers": {0: FRONTIER},
        "revoked_device": "dev-2",
        "rotated_by": "dev-1",
        "rotated_at_ms": 1_800_000_000_000,
    }
    signing_public = public_of(secrets["signing_key"])
    identity = b"sealsync chain v2\0" + U32.pack(2) + U32.pack(1)
    identity += signing_public + recovery["x25519_public"]
    previous = Ed25519PrivateKey.from_private_bytes(fixed_bytes("signing key", 32))
    chain_signature = previous.sign(identity)
    c, bundle = sealed_bundle(secrets, salt, login["kek"], generation_key, chain_signature)
    return {
        "description": "generation 2, by a rotation that revoked dev-2 (key-generations.md §6)",
        "passphrase": NEW_PASSPHRASE,
        "kdf": {"salt": salt.hex(), **KDF},
        "login": {name: value.hex() for name, value in login.items()},
        "generation_key": generation_key.hex(),
        "clear_digest": c.hex(),
        "chain_identity": identity.hex(),
        "chain_signature": chain_signature.hex(),
        "previous_signing_public": public_of(fixed_bytes("signing key", 32)).hex(),
        "frontier": {
            "epoch": 0,
            "vector": {str(node): hlc for node, hlc in FRONTIER["vector"].items()},
            "head": FRONTIER["head"],
            "storage_id": FRONTIER["storage_id"],
            "account_epoch": FRONTIER["account_epoch"],
        },
        "secrets_messagepack": pack(secrets).hex(),
        "bundle": bundle.hex(),
    }


def local_keys(scope_key: bytes, index_key: bytes) -> dict[str, str]:
    """The keys a replica derives from the stored ones (envelope.md §4, replica.md §3)."""

    def mac(key: bytes, message: bytes) -> str:
        return hmac.new(key, message, "sha256").digest()[:16].hex()

    return {
        "opaque_key(default, notes, n1)": mac(index_key, lp("default") + lp("notes") + lp("n1")),
        "scope(default, notes)": mac(scope_key, lp("default") + lp("notes")),
        "profile(work)": mac(scope_key, b"profile" + lp("work")),
        "local_schema_key": hkdf(scope_key, b"sealsync local schema v1").hex(),
    }


def push_vector() -> dict[str, Any]:
    """A signed push (protocol.md §4.7) by the bundle's signing key."""
    envelopes = [fixed_bytes("envelope one", 32) * 3, fixed_bytes("envelope two", 32) * 2]
    who = {"account": "ann", "device_id": "dev-1", "storage_id": "st-9", "account_epoch": "ep-4"}
    generation, counter, ack = 1, 7, 41
    tombstones = bytes([0b10])  # envelope two (bit 1 of byte 0) is a tombstone
    signed = (
        b"sealsync push v2\0"
        + b"".join(lp(text) for text in who.values())
        + U32.pack(generation)
        + U64.pack(counter)
        + U64.pack(ack + 1)
        + U32.pack(len(envelopes))
        + b"".join(hashlib.sha256(e).digest() for e in envelopes)
        + U32.pack(len(tombstones))
        + tombstones
    )
    signing_key = Ed25519PrivateKey.from_private_bytes(fixed_bytes("signing key", 32))
    signature = signing_key.sign(signed)
    batch = {
        "envelopes": envelopes,
        "generation": generation,
        "counter": counter,
        "signature": signature,
        "ack": ack,
        "tombstones": tombstones,
    }
    return {
        "description": "a push signed by the bundle's generation-1 signing key",
        **who,
        "generation": generation,
        "counter": counter,
        "ack": ack,
        "tombstones": tombstones.hex(),
        "envelopes": [e.hex() for e in envelopes],
        "signed_bytes": signed.hex(),
        "signature": signature.hex(),
        "push_batch": pack(batch).hex(),
    }


def build_vectors() -> dict[str, Any]:
    return {
        "vectors_version": VECTORS_VERSION,
        "bundle_v2": bundle_vector(),
        "rotation": rotation_vector(),
        "signed_push": push_vector(),
    }


def render(vectors: dict[str, Any]) -> str:
    """The exact text of keys.json."""
    return json.dumps(vectors, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render(build_vectors())
    if "--check" in argv:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
