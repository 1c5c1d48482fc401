"""Account keys (specs/envelope.md §Keys): KDF bounds, wrong keys, recovery key, passphrase change.

Argon2id (about 0.2 s a run at the floor) runs only in the tests about passphrases; the others
reach the keys through the session account's raw key or recovery key (tests/conftest.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
import traceback
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id

from replica import (
    Collection,
    KdfParametersError,
    Replica,
    Schema,
    WeakPassphraseError,
    WrongKeyError,
)
from replica.bundles import (
    NewAccount,
    new_account,
    parse_bundle,
    unlock_by_key,
    unlock_by_recovery_key,
)
from replica.errors import ProtocolError, ReplicaLockedError, SealsyncError
from replica.generations import (
    bundle_v2_from_bytes,
    bundle_v2_to_bytes,
    clear_digest,
    open_with_generation_key,
    recovery_private_key,
)
from replica.kdfparams import (
    MAX_ITERATIONS,
    MAX_LANES,
    MAX_MEMORY_KIB,
    MIN_ITERATIONS,
    MIN_MEMORY_KIB,
    SALT_BYTES,
    KdfParams,
    check_kdf_params,
)
from replica.keys import (
    ACCOUNT_ID_BYTES,
    AccountInfo,
    AccountKeys,
    LoginKeys,
    format_recovery_key,
    hkdf,
    open_info,
    parse_recovery_key,
    passphrase_login_keys,
    recovery_login_keys,
)
from replica.schema import schema_to_bytes
from replica.wire import (
    PreloginResponse,
    RegisterRequest,
    auth_key_hash,
    decode_message,
    encode_message,
)
from tests.conftest import PASSPHRASE, Account, ReplicaFactory
from tests.replica.v1 import V1Account

SALT = bytes(range(SALT_BYTES))
BASE32_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
FIXED_RECOVERY_RAW = hashlib.sha256(b"sealsync test recovery key").digest()
NEW_PASSPHRASE = "a new and longer passphrase"

# ---- KDF parameter floors and ceilings ------------------------------------------------------------

ACCEPTED_PARAMS = [
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB, MIN_ITERATIONS, 1), id="floors"),
    pytest.param(KdfParams(SALT, MAX_MEMORY_KIB, MAX_ITERATIONS, MAX_LANES), id="ceilings"),
]
REFUSED_PARAMS = [
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB - 1, MIN_ITERATIONS, 1), id="memory-below-64MiB"),
    pytest.param(KdfParams(SALT, MAX_MEMORY_KIB + 1, MIN_ITERATIONS, 1), id="memory-above-1GiB"),
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB, MIN_ITERATIONS - 1, 1), id="iterations-below-3"),
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB, MAX_ITERATIONS + 1, 1), id="iterations-above-10"),
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB, MIN_ITERATIONS, 0), id="lanes-0"),
    pytest.param(KdfParams(SALT, MIN_MEMORY_KIB, MIN_ITERATIONS, MAX_LANES + 1), id="lanes-17"),
    pytest.param(KdfParams(SALT[:-1], MIN_MEMORY_KIB, MIN_ITERATIONS, 1), id="salt-15-bytes"),
    pytest.param(KdfParams(SALT + b"!", MIN_MEMORY_KIB, MIN_ITERATIONS, 1), id="salt-17-bytes"),
    pytest.param(KdfParams(b"", MIN_MEMORY_KIB, MIN_ITERATIONS, 1), id="salt-empty"),
]
COSTS = {"memory", "iterations", "lanes"}


@pytest.mark.parametrize("params", ACCEPTED_PARAMS)
def test_check_kdf_params_accepts_the_floors_and_ceilings(params: KdfParams) -> None:
    check_kdf_params(params)


@pytest.mark.parametrize("params", REFUSED_PARAMS)
def test_kdf_params_outside_the_bounds_are_refused_when_deriving(params: KdfParams) -> None:
    with pytest.raises(KdfParametersError, match="outside"):
        passphrase_login_keys(PASSPHRASE, params)


@pytest.mark.parametrize("params", REFUSED_PARAMS)
def test_kdf_params_outside_the_bounds_are_refused_when_served(params: KdfParams) -> None:
    served = decode_message(encode_message(PreloginResponse(kdf=params)), PreloginResponse)
    with pytest.raises(KdfParametersError):
        passphrase_login_keys(PASSPHRASE, served.kdf)


def with_kdf(account: Account, params: KdfParams) -> bytes:
    bundle = bundle_v2_from_bytes(account.bundle)
    return bundle_v2_to_bytes(msgspec.structs.replace(bundle, kdf=params))


@pytest.mark.parametrize("params", REFUSED_PARAMS)
def test_kdf_params_outside_the_bounds_are_refused_when_a_stored_bundle_carries_them(
    params: KdfParams, account: Account, tmp_path: Path
) -> None:
    bundle = with_kdf(account, params)
    with pytest.raises(KdfParametersError):
        parse_bundle(bundle)
    with pytest.raises(KdfParametersError):
        Replica.join(tmp_path / "refused.db", bundle)
    with replica_storing(tmp_path, account, bundle) as replica:
        with pytest.raises(KdfParametersError):
            replica.unlock(PASSPHRASE)
        assert replica.is_locked


def replica_storing(tmp_path: Path, account: Account, bundle: bytes) -> Replica:
    """A replica file whose stored bundle was replaced behind its back (join refuses it)."""
    path = tmp_path / "bad-kdf.db"
    Replica.join(path, account.bundle).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE name = 'bundle'", (bundle,))
    db.close()
    return Replica.open(path)


@pytest.mark.parametrize(
    "params", [p for p in REFUSED_PARAMS if any(c in str(p.id) for c in COSTS)]
)
def test_change_passphrase_refuses_to_carry_over_stored_costs_outside_the_bounds(
    params: KdfParams, account: Account, tmp_path: Path
) -> None:
    """The stored bundle is refused before any key is tried, the keyring's raw key too, so
    no passphrase change can start from it."""
    with replica_storing(tmp_path, account, with_kdf(account, params)) as replica:
        with pytest.raises(KdfParametersError):
            replica.unlock_with_key(account.key)
        with pytest.raises(KdfParametersError):
            replica.change_passphrase(NEW_PASSPHRASE)
        assert replica.is_locked


# ---- key derivation -------------------------------------------------------------------------------


def test_v1_account_keys_derive_with_the_spec_info_strings(v1: V1Account) -> None:
    keys, account_key = v1.keys, v1.keys.unlock_key
    assert keys.index_key == hkdf(account_key, b"sealsync index v1")
    assert keys.scope_key == hkdf(account_key, b"sealsync scope v1")
    assert len({keys.unlock_key, keys.index_key, keys.scope_key}) == 3
    info = open_info(account_key, v1.bundle.sealed_info)
    assert len(info.account_id) == ACCOUNT_ID_BYTES and info.key_epoch == 0


def test_a_new_account_is_generation_1_with_no_key_derived_from_another(
    account: Account,
) -> None:
    """Bundle version 2: the generation key seals random keys, so a device that once held
    it learns nothing of the next generation's (docs/key-generations.md §2)."""
    bundle = bundle_v2_from_bytes(account.bundle)
    assert (bundle.version, bundle.generation, bundle.key_epoch) == (2, 1, 0)
    assert bundle.chain_signature is None
    secrets = open_with_generation_key(bundle, account.key).secrets
    keys = [account.key, secrets.index_key, secrets.scope_key, secrets.signing_key]
    keys += [secrets.epoch_keys[0]]
    assert len(set(keys)) == len(keys) and list(secrets.epoch_keys) == [0]
    derived = {hkdf(account.key, b"sealsync " + label) for label in (b"index v1", b"scope v1")}
    assert not derived & set(keys) and hkdf(account.key, b"sealsync epoch v1 0") not in keys
    assert len(secrets.account_id) == ACCOUNT_ID_BYTES


def test_recovery_login_keys_are_hkdf_of_the_raw_recovery_key() -> None:
    login = recovery_login_keys(format_recovery_key(FIXED_RECOVERY_RAW))
    assert login.auth_key == hkdf(FIXED_RECOVERY_RAW, b"sealsync recovery auth v1")
    assert login.wrapping_key == hkdf(FIXED_RECOVERY_RAW, b"sealsync recovery kek v1")


def test_passphrase_login_keys_are_argon2id_of_the_nfc_passphrase_then_hkdf() -> None:
    params = KdfParams(SALT)
    nfc = "crème brûlée"
    master = Argon2id(
        salt=SALT,
        length=32,
        iterations=MIN_ITERATIONS,
        lanes=1,
        memory_cost=MIN_MEMORY_KIB,
    ).derive(nfc.encode())
    login = passphrase_login_keys(unicodedata.normalize("NFD", nfc), params)
    assert login.auth_key == hkdf(master, b"sealsync auth v1")
    assert login.wrapping_key == hkdf(master, b"sealsync kek v1")


def test_v1_key_bundle_layout_follows_the_spec(v1: V1Account) -> None:
    """Opened with the primitives alone: a MessagePack map, AES-256-GCM wraps with labels."""
    fields = msgspec.msgpack.decode(v1.bundle_bytes)
    assert list(fields) == ["version", "kdf", "passphrase_wrap", "recovery_wrap", "sealed_info"]
    assert list(fields["kdf"]) == ["salt", "memory_kib", "iterations", "lanes"]
    assert fields["version"] == 1 and len(fields["kdf"]["salt"]) == SALT_BYTES
    kek = hkdf(v1.recovery_raw, b"sealsync recovery kek v1")
    wrap = fields["recovery_wrap"]
    assert len(wrap) == 12 + 32 + 16
    account_key = AESGCM(kek).decrypt(wrap[:12], wrap[12:], b"sealsync wrap v1 recovery key")
    assert account_key == v1.keys.unlock_key
    sealed = fields["sealed_info"]
    info_key = hkdf(account_key, b"sealsync info v1")
    info = msgspec.msgpack.decode(
        AESGCM(info_key).decrypt(sealed[:12], sealed[12:], b"sealsync wrap v1 info")
    )
    assert list(info) == ["account_id", "key_epoch", "schema", "recovery_auth_hash"]
    assert len(info["account_id"]) == ACCOUNT_ID_BYTES and info["key_epoch"] == 0
    recovery_auth_key = hkdf(v1.recovery_raw, b"sealsync recovery auth v1")
    assert (
        info["recovery_auth_hash"]
        == hashlib.sha256(b"sealsync auth key v1\0" + recovery_auth_key).digest()
    )  # what the relay stores, never the key that logs in
    assert len(fields["passphrase_wrap"]) == 12 + 32 + 16


V2_FIELDS = ["version", "generation", "key_epoch", "kdf", "signing_public", "recovery_public"]
V2_FIELDS += ["chain_signature", "passphrase_wrap", "recovery_wrap", "sealed_secrets"]


def test_v2_key_bundle_layout_follows_the_spec(account: Account) -> None:
    """specs/envelope.md §2.3, opened with the primitives alone: the recovery key's X25519
    key opens the HPKE wrap, the generation key the sealed secrets, both bound to `C`."""
    fields = msgspec.msgpack.decode(account.bundle)
    assert list(fields) == V2_FIELDS
    c = clear_digest(bundle_v2_from_bytes(account.bundle))
    raw = parse_recovery_key(account.recovery_key)
    x25519 = recovery_private_key(raw)
    assert x25519.private_bytes_raw() == hkdf(raw, b"sealsync recovery x25519 v2")
    assert fields["recovery_public"] == x25519.public_key().public_bytes_raw()
    assert len(fields["recovery_wrap"]) == 32 + 32 + 16
    suite = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
    info = b"sealsync recovery v2\0" + c
    assert suite.decrypt(fields["recovery_wrap"], x25519, info=info) == account.key
    assert len(fields["passphrase_wrap"]) == 12 + 32 + 16
    sealed = fields["sealed_secrets"]
    plain = AESGCM(hkdf(account.key, b"sealsync secrets v2")).decrypt(
        sealed[:12], sealed[12:], b"sealsync wrap v2 secrets\0" + c
    )
    secrets = msgspec.msgpack.decode(plain)
    assert list(secrets)[:9] == [
        "account_id",
        "generation",
        "key_epoch",
        "epoch_keys",
        "index_key",
        "scope_key",
        "signing_key",
        "recovery_public",
        "recovery_auth_hash",
    ]
    recovery_auth_key = hkdf(raw, b"sealsync recovery auth v1")
    assert secrets["recovery_auth_hash"] == auth_key_hash(recovery_auth_key)
    signing = Ed25519PrivateKey.from_private_bytes(secrets["signing_key"])
    assert signing.public_key().public_bytes_raw() == fields["signing_public"]


def test_declaring_a_schema_reseals_the_secrets_and_keeps_both_wraps(
    make_replica: ReplicaFactory, account: Account
) -> None:
    """The schema is not a clear field, so declaring one leaves C and both wraps as they are."""
    replica = make_replica()
    before = bundle_v2_from_bytes(replica.key_bundle())
    declared = Schema((*replica.schema.collections, Collection("later", "lww")))
    replica.declare(declared)
    after = bundle_v2_from_bytes(replica.key_bundle())
    assert after.sealed_secrets != before.sealed_secrets
    assert msgspec.structs.replace(after, sealed_secrets=b"") == msgspec.structs.replace(
        before, sealed_secrets=b""
    )
    secrets = open_with_generation_key(after, account.key).secrets
    assert secrets.schema == schema_to_bytes(declared)
    assert unlock_by_recovery_key(after, account.recovery_key).unlock_key == account.key


def test_the_recovery_auth_hash_sealed_in_the_bundle_survives_a_declare_and_a_passwd(
    make_replica: ReplicaFactory, account: Account
) -> None:
    """Any unlocked device can register the account again with it (protocol §4.6)."""
    replica = make_replica()
    expected = auth_key_hash(recovery_login_keys(account.recovery_key).auth_key)
    assert replica.recovery_auth_hash() == expected
    replica.declare(replica.schema)
    replica.change_passphrase(NEW_PASSPHRASE)
    assert replica.recovery_auth_hash() == expected
    replica.lock()
    with pytest.raises(ReplicaLockedError):
        replica.recovery_auth_hash()


def test_a_bundle_sealed_before_the_recovery_auth_hash_was_kept_opens_without_it(
    account: Account,
) -> None:
    old_info = {"account_id": bytes(ACCOUNT_ID_BYTES), "key_epoch": 2, "schema": None}
    info_key = hkdf(account.key, b"sealsync info v1")
    nonce = os.urandom(12)
    plain = msgspec.msgpack.encode(old_info)
    sealed = nonce + AESGCM(info_key).encrypt(nonce, plain, b"sealsync wrap v1 info")
    info = open_info(account.key, sealed)
    assert (info.key_epoch, info.recovery_auth_hash) == (2, None)


def test_account_keys_after_drop_refuse_with_locked_error(account: Account) -> None:
    keys = unlock_by_key(parse_bundle(account.bundle), account.key)
    keys.drop()
    for read in (lambda: keys.unlock_key, lambda: keys.index_key, lambda: keys.aead(0)):
        with pytest.raises(ReplicaLockedError):
            read()


@pytest.mark.parametrize(("version", "hint"), [(0, None), (3, "upgrade sealsync")])
def test_key_bundle_of_another_version_is_refused(
    account: Account, version: int, hint: str | None
) -> None:
    bundle = msgspec.structs.replace(bundle_v2_from_bytes(account.bundle), version=version)
    with pytest.raises(ProtocolError, match=f"version {version}") as refused:
        parse_bundle(bundle_v2_to_bytes(bundle))
    assert refused.value.hint == hint


def test_a_v1_account_still_unlocks_by_each_secret_and_changes_its_passphrase(
    v1: V1Account, tmp_path: Path
) -> None:
    """Accounts made before version 2 keep working as they are until they migrate."""
    with Replica.join(tmp_path / "old.db", v1.bundle_bytes) as replica:
        replica.unlock_with_login_keys(v1.login)
        replica.put("threads", "t1", {"title": "kept"})
        assert replica.unlock_key() == v1.keys.unlock_key
        expected = auth_key_hash(recovery_login_keys(v1.recovery_key).auth_key)
        assert replica.recovery_auth_hash() == expected
        replica.change_passphrase(NEW_PASSPHRASE)
        assert parse_bundle(replica.key_bundle()).version == 1
        unlocks: list[Callable[[], None]] = [
            lambda: replica.unlock(NEW_PASSPHRASE),
            lambda: replica.unlock_with_recovery_key(v1.recovery_key),
            lambda: replica.unlock_with_key(v1.keys.unlock_key),
        ]
        for unlock in unlocks:
            replica.lock()
            unlock()
            record = replica.get("threads", "t1")
            assert record is not None and record.document == {"title": "kept"}


# ---- wrong keys -------------------------------------------------------------------------------------


def test_unlock_with_a_wrong_passphrase_raises_wrong_key(make_replica: ReplicaFactory) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(WrongKeyError):
        replica.unlock("not the passphrase")
    assert replica.is_locked


def test_unlock_with_login_keys_takes_the_passphrases_keys_only(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(WrongKeyError):
        replica.unlock_with_login_keys(passphrase_login_keys("wrong", replica.kdf_params()))
    assert replica.is_locked
    replica.unlock_with_login_keys(passphrase_login_keys(PASSPHRASE, replica.kdf_params()))
    assert not replica.is_locked and replica.get("notes", "absent") is None


def test_unlock_with_another_accounts_recovery_key_raises_wrong_key(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(WrongKeyError, match="does not unlock"):
        replica.unlock_with_recovery_key(format_recovery_key(FIXED_RECOVERY_RAW))
    assert replica.is_locked


@pytest.mark.parametrize("length", [32, 0, 16, 31, 33])
def test_unlock_with_a_wrong_raw_key_raises_wrong_key(
    make_replica: ReplicaFactory, length: int
) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(WrongKeyError):
        replica.unlock_with_key(os.urandom(length))
    assert replica.is_locked


def test_unlock_with_the_recovery_key_yields_the_generation_key(account: Account) -> None:
    keys = unlock_by_recovery_key(parse_bundle(account.bundle), account.recovery_key)
    assert keys.unlock_key == account.key


# ---- recovery key checksum ------------------------------------------------------------------------


def typos(text: str) -> list[str]:
    """Every recovery key one substituted character away from `text`."""
    out: list[str] = []
    for index, char in enumerate(text):
        if char == "-":
            continue
        out.extend(text[:index] + c + text[index + 1 :] for c in BASE32_ALPHABET if c != char)
    return out


def mistype(text: str) -> str:
    """`text` with its first character replaced by another base32 character."""
    return ("A" if text[0] != "A" else "B") + text[1:]


def test_recovery_key_is_base32_in_dashed_groups_of_four() -> None:
    text = format_recovery_key(FIXED_RECOVERY_RAW)
    groups = text.split("-")
    assert len(groups) == 14 and all(len(g) == 4 for g in groups)
    check = hashlib.sha256(FIXED_RECOVERY_RAW).digest()[:3]
    assert base64.b32decode("".join(groups)) == FIXED_RECOVERY_RAW + check


def test_recovery_key_with_any_one_typo_fails_its_checksum() -> None:
    text = format_recovery_key(FIXED_RECOVERY_RAW)
    mistyped = typos(text)
    assert len(mistyped) == 56 * 31
    for typo in mistyped:
        with pytest.raises(WrongKeyError, match="checksum"):
            parse_recovery_key(typo)


def test_recovery_key_with_two_characters_swapped_fails_its_checksum() -> None:
    compact = format_recovery_key(FIXED_RECOVERY_RAW).replace("-", "")
    for i in range(len(compact) - 1):
        swapped = compact[:i] + compact[i + 1] + compact[i] + compact[i + 2 :]
        if swapped != compact:
            with pytest.raises(WrongKeyError, match="checksum"):
                parse_recovery_key(swapped)


@pytest.mark.parametrize("bad", ["1", "0", "8", "!"])
def test_recovery_key_with_a_character_outside_base32_is_refused(bad: str) -> None:
    text = format_recovery_key(FIXED_RECOVERY_RAW)
    with pytest.raises(WrongKeyError, match="base32"):
        parse_recovery_key(bad + text[1:])


def test_recovery_key_parses_whatever_its_case_spaces_and_dashes() -> None:
    text = format_recovery_key(FIXED_RECOVERY_RAW)
    relaxed = " ".join(text.lower().split("-"))
    assert parse_recovery_key(relaxed) == FIXED_RECOVERY_RAW


def test_replica_unlock_with_a_mistyped_recovery_key_raises_wrong_key(
    make_replica: ReplicaFactory, account: Account
) -> None:
    replica = make_replica()
    replica.lock()
    with pytest.raises(WrongKeyError, match="checksum"):
        replica.unlock_with_recovery_key(mistype(account.recovery_key))
    replica.unlock_with_recovery_key(account.recovery_key)
    assert not replica.is_locked


# ---- passphrase change ----------------------------------------------------------------------------


RECORD_TABLES = ("versions", "local", "history")
"""The tables the test fills with sealed records: a passphrase change must rewrite none."""


def row_digests(path: Path) -> dict[str, list[str]]:
    """SHA-256 of every row of each record table, read straight from the file."""
    db = sqlite3.connect(path)
    try:
        rows = {table: db.execute(f"SELECT * FROM {table}").fetchall() for table in RECORD_TABLES}
    finally:
        db.close()
    return {
        table: sorted(hashlib.sha256(repr(row).encode()).hexdigest() for row in table_rows)
        for table, table_rows in rows.items()
    }


def test_change_passphrase_rewraps_the_key_and_rewrites_no_record(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    replica = make_replica("changing")
    replica.put("notes", "n1", {"title": "one"})
    replica.put("notes", "n2", {"title": "two"})
    replica.delete("notes", "n2")
    replica.put("threads", "t1", {"title": "t", "message_count": 3})
    replica.put("drafts", "d1", {"text": "unsent"})
    replica.put("versioned", "v1", {"v": 1})
    replica.put("versioned", "v1", {"v": 2})
    path = replica.path
    before = row_digests(path)
    old_bundle = bundle_v2_from_bytes(replica.key_bundle())

    login = replica.change_passphrase(NEW_PASSPHRASE)

    assert row_digests(path) == before
    assert [len(before[t]) for t in ("versions", "local", "history")] == [4, 1, 1]
    new_bundle = bundle_v2_from_bytes(replica.key_bundle())
    assert new_bundle.passphrase_wrap != old_bundle.passphrase_wrap
    assert new_bundle.kdf.salt != old_bundle.kdf.salt
    same = ("generation", "key_epoch", "signing_public", "recovery_public", "chain_signature")
    assert [getattr(new_bundle, f) for f in same] == [getattr(old_bundle, f) for f in same]
    replica.close()
    with Replica.open(path) as reopened:
        with pytest.raises(WrongKeyError) as wrong:
            reopened.unlock(PASSPHRASE)
        reopened.unlock(NEW_PASSPHRASE)
        assert reopened.unlock_key() == account.key
        record = reopened.get("notes", "n1")
        assert record is not None and record.document == {"title": "one"}
        reopened.lock()
        reopened.unlock_with_recovery_key(account.recovery_key)
        assert reopened.unlock_key() == account.key
    assert row_digests(path) == before
    secrets = {
        "auth key": login.auth_key,
        "wrapping key": login.wrapping_key,
        **secrets_of(account),
    }
    assert_no_leak(error_text(wrong.value), secrets)
    assert_no_leak(repr(login) + str(login), secrets)


# ---- no key material in any repr, str or error message ------------------------------------------

WINDOW_BYTES = 8


def secrets_of(account: Account) -> dict[str, bytes]:
    """Every key of the session account, and the recovery key as bytes and as text."""
    recovery = recovery_login_keys(account.recovery_key)
    opened = open_with_generation_key(bundle_v2_from_bytes(account.bundle), account.key)
    return {
        "generation key": account.key,
        "index key": opened.secrets.index_key,
        "scope key": opened.secrets.scope_key,
        "epoch 0 key": opened.secrets.epoch_keys[0],
        "signing key": opened.secrets.signing_key,
        "secrets key": hkdf(account.key, b"sealsync secrets v2"),
        "recovery key raw": parse_recovery_key(account.recovery_key),
        "recovery key as shown": account.recovery_key.encode(),
        "recovery key compact": account.recovery_key.replace("-", "").encode(),
        "recovery auth key": recovery.auth_key,
        "recovery wrapping key": recovery.wrapping_key,
    }


def leaks(text: str, secret: bytes) -> list[str]:
    """The forms of `secret` (or of any 8-byte window of it) that appear in `text`."""
    raw = text.encode("utf-8", "surrogateescape")
    found = []
    whole_forms = {
        "repr": repr(secret)[2:-1],
        "base64": base64.b64encode(secret).decode(),
        "base32": base64.b32encode(secret).decode().rstrip("="),
        "latin-1": secret.decode("latin-1"),
    }
    found += [name for name, form in whole_forms.items() if form in text]
    for start in range(len(secret) - WINDOW_BYTES + 1):
        window = secret[start : start + WINDOW_BYTES]
        if window.hex() in text.lower():
            found.append(f"hex of bytes {start}..{start + WINDOW_BYTES}")
        if window in raw:
            found.append(f"raw bytes {start}..{start + WINDOW_BYTES}")
        if window.isascii() and window.decode().upper() in text.upper():
            found.append(f"text {start}..{start + WINDOW_BYTES}")
    return found


def assert_no_leak(text: str, secrets: dict[str, bytes]) -> None:
    found = {name: forms for name, secret in secrets.items() if (forms := leaks(text, secret))}
    assert not found, f"key material in {text!r}: {found}"


def error_text(error: SealsyncError) -> str:
    """Everything a log could show of an error: message, hint, repr and the chained traceback."""
    return "\n".join([str(error), repr(error), str(error.hint), *traceback.format_exception(error)])


def test_leak_check_finds_a_key_in_a_default_dataclass_repr() -> None:
    """The check below can fail: a plain dataclass shows its bytes, in full or in part."""

    @dataclass
    class Careless:
        key: bytes

    key = os.urandom(32)
    assert leaks(repr(Careless(key)), key)
    assert leaks(f"key={key.hex()[:20]}", key)
    assert leaks(f"key={key[5:20].hex().upper()}", key)
    assert not leaks(repr(Careless(b"")), key)


def test_no_key_material_in_any_repr_or_str(make_replica: ReplicaFactory, account: Account) -> None:
    secrets = secrets_of(account)
    bundle = bundle_v2_from_bytes(account.bundle)
    keys = unlock_by_key(bundle, account.key)
    keys.aead(0)
    recovery = recovery_login_keys(account.recovery_key)
    new = NewAccount(bundle, keys, account.recovery_key, os.urandom(32), recovery.auth_key)
    secrets["new account auth key"] = new.auth_key
    replica = make_replica()
    secrets["recovery auth hash"] = auth_key_hash(recovery.auth_key)
    request = RegisterRequest(
        "alice", new.auth_key, secrets["recovery auth hash"], bundle.kdf, account.bundle, "laptop"
    )
    info = AccountInfo(bytes(ACCOUNT_ID_BYTES), 0, recovery_auth_hash=secrets["recovery auth hash"])
    shown: list[object] = [keys, new, bundle, recovery, LoginKeys(account.key, keys.index_key)]
    shown += [replica, request, bundle.kdf, info, AccountKeys.v1(account.key, info)]
    for value in shown:
        assert_no_leak(repr(value) + "\n" + str(value), secrets)


def test_no_key_material_in_wrong_key_errors(
    make_replica: ReplicaFactory, account: Account
) -> None:
    secrets = secrets_of(account)
    wrong_raw = os.urandom(32)
    mistyped = mistype(account.recovery_key)
    secrets |= {"wrong raw key": wrong_raw, "mistyped": mistyped.encode()}
    replica = make_replica()
    replica.lock()
    attempts: list[Callable[[], None]] = [
        lambda: replica.unlock_with_key(wrong_raw),
        lambda: replica.unlock_with_key(wrong_raw[:31]),
        lambda: replica.unlock_with_recovery_key(mistyped),
        lambda: replica.unlock_with_recovery_key("1" + account.recovery_key[1:]),
        lambda: replica.unlock_with_recovery_key(format_recovery_key(FIXED_RECOVERY_RAW)),
    ]
    for attempt in attempts:
        with pytest.raises(WrongKeyError) as raised:
            attempt()
        assert_no_leak(error_text(raised.value), secrets)


@pytest.mark.parametrize("weak", ["a", "hunter2", "password123456", "sealsync2026", "qwerty123"])
def test_a_new_passphrase_too_easy_to_guess_is_refused_with_why_and_how(
    make_replica: ReplicaFactory, weak: str
) -> None:
    """An account, or a passphrase change, never takes a passphrase an offline guesser would
    find soon; the error says why and how to do better, never the passphrase."""
    with pytest.raises(WeakPassphraseError) as refused:
        new_account(weak, os.urandom)
    message = f"{refused.value} {refused.value.hint}"
    assert "too easy to guess" in message and refused.value.hint
    assert len(weak) < 4 or weak not in message
    replica = make_replica()
    bundle = replica.key_bundle()
    with pytest.raises(WeakPassphraseError):
        replica.change_passphrase(weak)
    assert replica.key_bundle() == bundle  # nothing changed


def test_a_passphrase_long_enough_to_be_judged_by_its_start_is_judged_not_refused() -> None:
    """zxcvbn judges 72 characters at most: a longer passphrase is judged by its start,
    not refused for its length."""
    floor = KdfParams(SALT, MIN_MEMORY_KIB, MIN_ITERATIONS, 1)
    account = new_account("correct horse battery staple " * 4, os.urandom, floor)
    assert account.recovery_key
