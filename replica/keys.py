"""Account keys: passphrase and recovery key → wrapped account key → index and epoch keys.

    passphrase ──Argon2id(salt, m, t, p)──▶ master ──HKDF──▶ auth key (relay login)
                                                     └─HKDF──▶ KEK ─wraps─▶ account key
    recovery key (random 256 bits) ─────────HKDF──▶ auth key, wrapping key ─wraps─▶ account key
    account key ──HKDF──▶ index key (opaque record keys), epoch keys (AES-256-GCM), info key

The key bundle holds the KDF parameters in clear and everything else sealed, so it can sit on
the relay. Changing the passphrase re-wraps the account key; no record is re-encrypted. Key
material never appears in a repr, a log or an error message.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import struct
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from replica.errors import (
    InvalidArgumentError,
    ProtocolError,
    ReplicaLockedError,
    UnknownEpochError,
    WrongKeyError,
)
from replica.kdfparams import SALT_BYTES, KdfParams, check_kdf_params
from replica.passphrase import check_new_passphrase
from replica.wire import RelayState, bundle_version

KEY_BYTES = 32
NONCE_BYTES = 12
ACCOUNT_ID_BYTES = 16
RECOVERY_CHECK_BYTES = 3
BUNDLE_VERSION = 1
MAX_PASSPHRASE_CHARS = 1024

RandomBytes = Callable[[int], bytes]
_Bundle = TypeVar("_Bundle", bound=msgspec.Struct)


_LENGTH = struct.Struct(">I")


def length_prefixed(*parts: str) -> bytes:
    """u32 byte length ‖ UTF-8, for each part: no two tuples of names give the same bytes."""
    pieces: list[bytes] = []
    for part in parts:
        data = part.encode()
        pieces += (_LENGTH.pack(len(data)), data)
    return b"".join(pieces)


def _record_message(profile: str, collection: str, id: str) -> bytes:
    """`length_prefixed(profile, collection, id)` unrolled: it runs once per opened envelope."""
    p, c, i = profile.encode(), collection.encode(), id.encode()
    return _LENGTH.pack(len(p)) + p + _LENGTH.pack(len(c)) + c + _LENGTH.pack(len(i)) + i


def hkdf(key: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 with no salt: every input key here is already uniformly random."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key)


def v1_index_key(account_key: bytes) -> bytes:
    return hkdf(account_key, b"sealsync index v1")


def v1_scope_key(account_key: bytes) -> bytes:
    return hkdf(account_key, b"sealsync scope v1")


def v1_epoch_key(account_key: bytes, epoch: int) -> bytes:
    """Version-1 epoch keys are derived; bundle version 2 stores them (replica/generations.py)."""
    return hkdf(account_key, b"sealsync epoch v1 " + str(epoch).encode())


@dataclass(frozen=True, slots=True)
class LoginKeys:
    """What a secret yields before the bundle is opened: relay auth key and wrapping key."""

    auth_key: bytes = field(repr=False)
    wrapping_key: bytes = field(repr=False)


def passphrase_login_keys(passphrase: str, params: KdfParams) -> LoginKeys:
    """Run Argon2id (after checking its bounds) and split the result with HKDF."""
    check_kdf_params(params)
    if not isinstance(passphrase, str) or not passphrase or len(passphrase) > MAX_PASSPHRASE_CHARS:
        raise InvalidArgumentError(f"passphrase must be 1..{MAX_PASSPHRASE_CHARS} characters")
    secret = unicodedata.normalize("NFC", passphrase).encode()
    master = Argon2id(
        salt=params.salt,
        length=KEY_BYTES,
        iterations=params.iterations,
        lanes=params.lanes,
        memory_cost=params.memory_kib,
    ).derive(secret)
    return LoginKeys(hkdf(master, b"sealsync auth v1"), hkdf(master, b"sealsync kek v1"))


def recovery_login_keys(recovery_key: str) -> LoginKeys:
    return recovery_login_keys_from_raw(parse_recovery_key(recovery_key))


def recovery_login_keys_from_raw(raw: bytes) -> LoginKeys:
    """The recovery key is full-entropy, so HKDF alone derives its keys."""
    return LoginKeys(
        hkdf(raw, b"sealsync recovery auth v1"), hkdf(raw, b"sealsync recovery kek v1")
    )


def format_recovery_key(raw: bytes) -> str:
    """Base32 in groups of four, with a 3-byte checksum that catches typing mistakes."""
    check = hashlib.sha256(raw).digest()[:RECOVERY_CHECK_BYTES]
    text = base64.b32encode(raw + check).decode()
    return "-".join(text[i : i + 4] for i in range(0, len(text), 4))


def parse_recovery_key(text: str) -> bytes:
    """The 32 key bytes of a recovery key as shown by `format_recovery_key`."""
    compact = "".join(text.split()).replace("-", "").upper()
    try:
        decoded = base64.b32decode(compact)
    except ValueError as exc:
        raise WrongKeyError("recovery key is not valid base32", hint="check for typos") from exc
    raw, check = decoded[:KEY_BYTES], decoded[KEY_BYTES:]
    expected = hashlib.sha256(raw).digest()[:RECOVERY_CHECK_BYTES]
    if len(raw) != KEY_BYTES or not hmac.compare_digest(check, expected):
        raise WrongKeyError("recovery key checksum does not match", hint="check for typos")
    return raw


class AccountInfo(msgspec.Struct, frozen=True):
    """Sealed inside the bundle: the account id, the newest key epoch, the app's schema, and
    the hash the relay keeps of the recovery key's auth key — so that any unlocked device can
    register the account again on a relay that lost it, without holding a secret that logs
    in (a device once unlocked, then revoked, must not keep a way back in). None in bundles
    made before it was kept; those devices need the recovery key itself to re-register."""

    account_id: bytes
    key_epoch: int
    schema: bytes | None = None
    recovery_auth_hash: bytes | None = None

    def __rich_repr__(self) -> list[tuple[str, int]]:  # rich would bypass __repr__
        return [("key_epoch", self.key_epoch)]

    def __repr__(self) -> str:
        return f"AccountInfo(key_epoch={self.key_epoch})"


class KeyBundle(msgspec.Struct, frozen=True):
    """The account's keys as stored in the replica and on the relay: opaque but for `kdf`."""

    version: int
    kdf: KdfParams
    passphrase_wrap: bytes
    recovery_wrap: bytes
    sealed_info: bytes

    def __repr__(self) -> str:
        return f"KeyBundle(version={self.version}, kdf={self.kdf!r})"


def bundle_from_bytes(data: bytes) -> KeyBundle:
    return decode_bundle(data, KeyBundle, BUNDLE_VERSION)


def decode_bundle(data: bytes, kind: type[_Bundle], version: int) -> _Bundle:
    """A bundle of `version`, its version read first: a newer format says "upgrade" rather
    than failing on the first field it lacks."""
    try:
        found = bundle_version(data)
        if found != version:
            raise ProtocolError(
                f"key bundle version {found} is not {version}",
                hint="upgrade sealsync" if found > version else None,
            )
        return msgspec.msgpack.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed key bundle: {exc}") from exc


def _dropped() -> ReplicaLockedError:
    return ReplicaLockedError("the account keys were dropped", hint="unlock the replica")


class _HmacState(Protocol):
    def copy(self) -> _HmacState: ...
    def update(self, message: bytes) -> None: ...
    def digest(self) -> bytes: ...


def _keyed_state(key: bytes) -> _HmacState:
    """HMAC-SHA256 keyed once. The OpenSSL object behind hmac.HMAC copies without the Python
    wrapper's overhead; where the standard library has none, the wrapper itself serves."""
    state = hmac.new(key, digestmod=hashlib.sha256)
    inner: _HmacState | None = getattr(state, "_hmac", None)
    return inner if inner is not None else state


class Frontier(msgspec.Struct, frozen=True):
    """What the device that retired an epoch knew (docs/key-generations.md §6): the union of
    every version vector it held, and the relay it had pulled from — its storage id, the
    account's epoch there, and the head it had pulled up to (sent as `expected_head` with the
    change). One recorded before `expected_head` existed has no storage id, and is not
    enforced: versions stored meanwhile could lie beyond it."""

    vector: dict[int, int]
    head: int
    storage_id: str = ""
    account_epoch: str = ""

    @property
    def is_enforced(self) -> bool:
        return bool(self.storage_id)

    def trusts(self, vector: Mapping[int, int], seq: int | None, relay: RelayState | None) -> bool:
        """Whether a version under the retired epoch, with this vector, is trusted: its whole
        vector within the frontier, and, pulled from the same relay storage and account
        epoch (seqs are renumbered when an account is registered again or reseeded), a seq
        the changing device had pulled: the relay took nothing under the old key after it."""
        if any(self.vector.get(node, 0) < hlc for node, hlc in vector.items()):
            return False
        if seq is None or relay is None:
            return True
        same = (relay.storage_id, relay.account_epoch) == (self.storage_id, self.account_epoch)
        return not same or seq <= self.head


class AccountKeys:
    """An unlocked account's keys; `drop()` forgets all of them.

    `unlock_key` is what a keyring keeps in place of the passphrase: the account key of a
    version-1 bundle, from which everything else derives, or the generation key of a
    version-2 one, which seals stored keys (replica/generations.py)."""

    def __init__(
        self,
        *,
        unlock_key: bytes,
        account_id: bytes,
        key_epoch: int,
        epoch_key: Callable[[int], bytes],
        index_key: bytes,
        scope_key: bytes,
        signing_key: bytes | None = None,
        generation: int = 0,
        retired_epochs: Mapping[int, Frontier] | None = None,
    ) -> None:
        self._unlock_key: bytes | None = unlock_key
        self._signing_key = signing_key
        self.generation = generation
        """The key generation (0: a version-1 account, which signs nothing)."""
        self.retired_epochs: Mapping[int, Frontier] = retired_epochs or {}
        """Each epoch a rotation retired behind an enforced frontier: a version sealed under
        one is trusted only within it (docs/key-generations.md §6)."""
        self.account_id = account_id
        self.key_epoch = key_epoch
        self._epoch_key: Callable[[int], bytes] | None = epoch_key
        self._index_key: bytes | None = index_key
        self._scope_key: bytes | None = scope_key
        # Keyed HMAC states, copied per use: a fraction of hmac.digest's cost on hot paths.
        self._index_hmac: _HmacState | None = _keyed_state(index_key)
        self._scope_hmac: _HmacState | None = _keyed_state(scope_key)
        self._blind_hmac: _HmacState | None = _keyed_state(hkdf(index_key, b"sealsync blind v1"))
        self._aead_by_epoch: dict[int, AESGCM] = {}

    @classmethod
    def v1(cls, account_key: bytes, info: AccountInfo) -> AccountKeys:
        """A version-1 account's keys, each derived from its account key (specs §2.4)."""
        return cls(
            unlock_key=account_key,
            account_id=info.account_id,
            key_epoch=info.key_epoch,
            epoch_key=functools.partial(v1_epoch_key, account_key),
            index_key=v1_index_key(account_key),
            scope_key=v1_scope_key(account_key),
        )

    def __repr__(self) -> str:
        return f"AccountKeys(key_epoch={self.key_epoch}, unlocked={self._unlock_key is not None})"

    @property
    def unlock_key(self) -> bytes:
        if self._unlock_key is None:
            raise _dropped()
        return self._unlock_key

    @property
    def signing_key(self) -> bytes | None:
        """The generation's Ed25519 seed, which signs pushes; None for a version-1 account."""
        if self._unlock_key is None:
            raise _dropped()
        return self._signing_key

    @property
    def index_key(self) -> bytes:
        if self._index_key is None:
            raise _dropped()
        return self._index_key

    @property
    def scope_key(self) -> bytes:
        """Keys the local index of (profile, collection) scopes; never leaves the device."""
        if self._scope_key is None:
            raise _dropped()
        return self._scope_key

    def record_key(self, profile: str, collection: str, id: str) -> bytes:
        """The opaque key of a record: HMAC-SHA256(index key, lp(profile, collection, id))[:16]."""
        return self._keyed(self._index_hmac, _record_message(profile, collection, id))

    def local_key(self, message: bytes) -> bytes:
        """HMAC-SHA256(scope key, message)[:16]: names scopes and profiles in the local file."""
        return self._keyed(self._scope_hmac, message)

    def blind_key(self, message: bytes) -> bytes:
        """HMAC-SHA256(HKDF(index key, "sealsync blind v1"), message)[:16]: a blind index
        entry (replica/blind.py). The index key survives rotations, and so does the index."""
        return self._keyed(self._blind_hmac, message)

    @staticmethod
    def _keyed(state: _HmacState | None, message: bytes) -> bytes:
        if state is None:
            raise _dropped()
        mac = state.copy()
        mac.update(message)
        return mac.digest()[:16]

    def aead(self, epoch: int) -> AESGCM:
        """The AES-256-GCM cipher of a key epoch this account has reached."""
        cipher = self._aead_by_epoch.get(epoch)
        if cipher is None:
            if epoch > self.key_epoch or epoch < 0:
                raise UnknownEpochError(f"key epoch {epoch} is newer than {self.key_epoch}")
            if self._epoch_key is None:
                raise _dropped()
            cipher = AESGCM(self._epoch_key(epoch))
            self._aead_by_epoch[epoch] = cipher
        return cipher

    def keeps_epochs_of(self, other: AccountKeys) -> bool:
        """Whether these keys hold every epoch key of `other`, unchanged: a newer generation
        carries the old epochs, so records sealed under them stay readable."""
        if self._epoch_key is None or other._epoch_key is None:
            raise _dropped()
        if self.key_epoch < other.key_epoch:
            return False
        mine, theirs = self._epoch_key, other._epoch_key
        return all(hmac.compare_digest(mine(e), theirs(e)) for e in range(other.key_epoch + 1))

    def drop(self) -> None:
        """Forget the key material (best effort: Python cannot zero immutable bytes)."""
        self._unlock_key = None
        self._signing_key = None
        self._epoch_key = None
        self._index_key = None
        self._scope_key = None
        self._index_hmac = None
        self._scope_hmac = None
        self._blind_hmac = None
        self._aead_by_epoch.clear()


def seal_aead(key: bytes, plain: bytes, ad: bytes, random_bytes: RandomBytes) -> bytes:
    """`nonce(12) ‖ AES-256-GCM(key, plain, ad)`: every wrap and sealed field of a bundle."""
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plain, ad)


def open_aead(key: bytes, sealed: bytes, ad: bytes, refusal: str) -> bytes:
    """What `seal_aead` sealed, or `WrongKeyError(refusal)` for a wrong key or altered bytes."""
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], ad)
    except (InvalidTag, ValueError):
        raise WrongKeyError(refusal) from None


def _wrap(key: bytes, secret: bytes, label: bytes, random_bytes: RandomBytes) -> bytes:
    return seal_aead(key, secret, b"sealsync wrap v1 " + label, random_bytes)


def _unwrap(key: bytes, wrapped: bytes, label: bytes, what: str | None = None) -> bytes:
    refusal = f"the {what or label.decode()} does not unlock this account"
    return open_aead(key, wrapped, b"sealsync wrap v1 " + label, refusal)


def _info_key(account_key: bytes) -> bytes:
    return hkdf(account_key, b"sealsync info v1")


def seal_info(account_key: bytes, info: AccountInfo, random_bytes: RandomBytes) -> bytes:
    return _wrap(_info_key(account_key), msgspec.msgpack.encode(info), b"info", random_bytes)


def open_info(account_key: bytes, sealed: bytes) -> AccountInfo:
    plain = _unwrap(_info_key(account_key), sealed, b"info", "account key")
    return msgspec.msgpack.decode(plain, type=AccountInfo)


def _schema_key(keys: AccountKeys) -> bytes:
    """Under the scope key, which bundle version 2 carries unchanged across generations, so a
    rotation does not re-seal the file's schema (docs/key-generations.md §2)."""
    return hkdf(keys.scope_key, b"sealsync local schema v1")


def seal_local_schema(keys: AccountKeys, schema: bytes, random_bytes: RandomBytes) -> bytes:
    """The schema as a replica file keeps it: its collection names are the app's own words."""
    return _wrap(_schema_key(keys), schema, b"local schema", random_bytes)


def open_local_schema(keys: AccountKeys, sealed: bytes) -> bytes:
    """Raises `WrongKeyError` when the sealed schema does not open under this account's keys."""
    return _unwrap(_schema_key(keys), sealed, b"local schema", "account key")


def default_kdf_params(random_bytes: RandomBytes) -> KdfParams:
    return KdfParams(salt=random_bytes(SALT_BYTES))


def unlock_with_login_keys(bundle: KeyBundle, login: LoginKeys) -> AccountKeys:
    """The passphrase path with its keys already derived under `bundle.kdf`."""
    return unlock_with_account_key(
        bundle, _unwrap(login.wrapping_key, bundle.passphrase_wrap, b"passphrase")
    )


def recovery_account_key(bundle: KeyBundle, recovery_raw: bytes) -> bytes:
    """The account key the recovery key unwraps, or `WrongKeyError`."""
    wrapping_key = recovery_login_keys_from_raw(recovery_raw).wrapping_key
    return _unwrap(wrapping_key, bundle.recovery_wrap, b"recovery key")


def unlock_with_account_key(bundle: KeyBundle, account_key: bytes) -> AccountKeys:
    """The keyring path: the raw account key, checked against the bundle's sealed info."""
    if len(account_key) != KEY_BYTES:
        raise WrongKeyError(f"a raw account key is {KEY_BYTES} bytes, got {len(account_key)}")
    return AccountKeys.v1(account_key, open_info(account_key, bundle.sealed_info))


def new_passphrase_login_keys(
    old: KdfParams, new_passphrase: str, random_bytes: RandomBytes
) -> tuple[KdfParams, LoginKeys]:
    """A new passphrase's parameters (a fresh salt, the same costs) and keys, if it is strong
    enough."""
    check_new_passphrase(new_passphrase)
    params = KdfParams(
        salt=random_bytes(SALT_BYTES),
        memory_kib=old.memory_kib,
        iterations=old.iterations,
        lanes=old.lanes,
    )
    return params, passphrase_login_keys(new_passphrase, params)


def change_passphrase(
    bundle: KeyBundle, keys: AccountKeys, new_passphrase: str, random_bytes: RandomBytes
) -> tuple[KeyBundle, LoginKeys]:
    """Re-wrap the account key under a new passphrase and salt; records stay as they are."""
    params, login = new_passphrase_login_keys(bundle.kdf, new_passphrase, random_bytes)
    wrapped = _wrap(login.wrapping_key, keys.unlock_key, b"passphrase", random_bytes)
    return msgspec.structs.replace(bundle, kdf=params, passphrase_wrap=wrapped), login


def with_info(
    bundle: KeyBundle, keys: AccountKeys, info: AccountInfo, random_bytes: RandomBytes
) -> KeyBundle:
    """The bundle with new sealed info (a new key epoch or schema)."""
    return msgspec.structs.replace(
        bundle, sealed_info=seal_info(keys.unlock_key, info, random_bytes)
    )
