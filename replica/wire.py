"""Wire format shared by replicas and the relay: envelope headers, version vectors, messages.

Pure and key-free on purpose: the relay imports this module (and `replica.errors`) and nothing
else from `replica`, so it can index, compact and check envelopes without ever decrypting one.
The Argon2id parameters of prelogin live in `replica.kdfparams`, and what the relay is told
of tombstones (a push's tombstone bits, a page's collection markers) in `replica.wiremarks`,
as pure, read through here.

Envelope layout (big-endian; specs/envelope.md is normative)::

    offset  size  field
    0       1     format version (1)
    1       1     algorithm (1 = AES-256-GCM)
    2       4     key epoch
    6       16    opaque key
    22      8     hlc
    30      8     node
    38      2     n = version vector entries (1..MAX_VECTOR_ENTRIES)
    40      16n   entries (node u64, hlc u64), nodes strictly ascending, every hlc > 0
    40+16n  12    nonce
    52+16n  rest  AES-256-GCM ciphertext and 16-byte tag

A version vector lists, for every device that wrote the record, the highest hlc of that
device's writes this version descends from, its own dot included. Version A dominates B when
A's vector covers B's dot: ``A.vv[B.node] >= B.hlc`` (specs/merge.md).
"""

from __future__ import annotations

import enum
import hashlib
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from replica.errors import InvalidArgumentError, ProtocolError
from replica.kdfparams import KdfParams as KdfParams  # noqa: PLC0414 (re-exported)
from replica.kdfparams import check_kdf_params as check_kdf_params  # noqa: PLC0414
from replica.wiremarks import MAX_RUN_MARKERS as MAX_RUN_MARKERS  # noqa: PLC0414
from replica.wiremarks import CollectedRun as CollectedRun  # noqa: PLC0414
from replica.wiremarks import pack_markers as pack_markers  # noqa: PLC0414
from replica.wiremarks import tombstone_bits as tombstone_bits  # noqa: PLC0414
from replica.wiremarks import tombstone_flags as tombstone_flags  # noqa: PLC0414

PROTOCOL_VERSION = 5
FORMAT_VERSION = 1
ALGORITHM_AES_256_GCM = 1
KEY_BYTES = 16
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_VECTOR_ENTRIES = 1024
MAX_U64 = (1 << 64) - 1
MAX_ENVELOPE_BYTES = 1_100_000
"""Above the largest envelope a replica can seal: 1 MiB of padded content, 1024 vector entries."""
MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""The most a device reads of any one answer, decoded, whatever the relay advertises: a
relay's page (`max_page_bytes`, 8 MiB by default) must fit with room for its framing."""
PAGE_FRAMING_BYTES = 1024 * 1024
"""Room a page's framing takes beyond its envelopes' bytes, at the most."""
MAX_HLC = (1 << 63) - 1
"""An hlc (and a vector entry) is below 2^63: it must fit SQLite's signed integers."""

_FIXED = struct.Struct(">BBI16sQQH")
_ENTRY = struct.Struct(">QQ")
_FIXED_ONE_ENTRY = struct.Struct(">BBI16sQQHQQ")
"""The fixed header and a one-entry vector, read at once: the merge hot path's header."""
FIXED_HEADER_BYTES = _FIXED.size
_MIN_ENVELOPE_BYTES = FIXED_HEADER_BYTES + NONCE_BYTES + TAG_BYTES
_MIN_ONE_ENTRY_ENVELOPE_BYTES = _FIXED_ONE_ENTRY.size + NONCE_BYTES + TAG_BYTES
_ONE_ENTRY_COUNT = struct.pack(">H", 1)
"""The vector-count field (the fixed header's last two bytes) of a one-writer envelope."""
_LENGTH = struct.Struct(">I")
_U64 = struct.Struct(">Q")

VersionVector = dict[int, int]
"""node id → highest hlc of that node's writes a version descends from."""

Dot = tuple[int, int]
"""(node, hlc): names one version of a record; unique because a node's hlc never repeats."""


class Header(msgspec.Struct, frozen=True, gc=False):
    """The cleartext header of an envelope: everything the relay may know about a version.

    A msgspec Struct: built per inbound envelope on the merge hot path, where it is several
    times cheaper to build and read than a NamedTuple (and never tracked by the GC: it holds
    no container that could point back at it)."""

    epoch: int
    key: bytes
    hlc: int
    node: int
    vector: VersionVector
    header_bytes: bytes

    @property
    def dot(self) -> Dot:
        return (self.node, self.hlc)

    @property
    def vector_bytes(self) -> bytes:
        """The header's own encoding of the vector: u16 count ‖ (node u64, hlc u64)*."""
        return self.header_bytes[FIXED_HEADER_BYTES - 2 :]


def encode_header(epoch: int, key: bytes, hlc: int, node: int, vector: VersionVector) -> bytes:
    """The header bytes for one version; validated exactly as `parse_header` checks them."""
    if len(key) != KEY_BYTES:
        raise ProtocolError(f"opaque key is {len(key)} bytes, expected {KEY_BYTES}")
    check_vector(vector, node, hlc)
    fixed = _FIXED.pack(FORMAT_VERSION, ALGORITHM_AES_256_GCM, epoch, key, hlc, node, len(vector))
    return fixed[:-2] + encode_vector(vector)


def check_vector(vector: VersionVector, node: int, hlc: int) -> None:
    """Raise unless the vector is well formed and carries the version's own dot."""
    if not 1 <= len(vector) <= MAX_VECTOR_ENTRIES:
        raise ProtocolError(
            f"version vector has {len(vector)} entries, bounds 1..{MAX_VECTOR_ENTRIES}"
        )
    if hlc <= 0:
        raise ProtocolError(f"hlc {hlc} must be positive")
    if vector.get(node) != hlc:
        raise ProtocolError(f"version vector does not carry the version's own dot ({node}, {hlc})")
    for n, h in vector.items():
        if not (0 <= n <= MAX_U64 and 0 < h <= MAX_HLC):
            raise ProtocolError(f"version vector entry ({n}, {h}) out of range")


def parse_header(envelope: bytes) -> Header:
    """Parse and check an envelope's cleartext header; raise `ProtocolError` if malformed."""
    size = len(envelope)
    if not _MIN_ENVELOPE_BYTES <= size <= MAX_ENVELOPE_BYTES:
        raise ProtocolError(
            f"envelope of {size} bytes outside {_MIN_ENVELOPE_BYTES}..{MAX_ENVELOPE_BYTES}"
        )
    count_bytes = envelope[FIXED_HEADER_BYTES - 2 : FIXED_HEADER_BYTES]
    if count_bytes == _ONE_ENTRY_COUNT and size >= _MIN_ONE_ENTRY_ENVELOPE_BYTES:
        return _one_writer_header(envelope)  # the common case, on the merge hot path
    version, algorithm, epoch, key, hlc, node, count = _FIXED.unpack_from(envelope)
    if version != FORMAT_VERSION or algorithm != ALGORITHM_AES_256_GCM:
        raise ProtocolError(f"unknown envelope format {version} / algorithm {algorithm}")
    end = FIXED_HEADER_BYTES + count * _ENTRY.size
    if not 1 <= count <= MAX_VECTOR_ENTRIES or size < end + NONCE_BYTES + TAG_BYTES:
        raise ProtocolError(f"envelope version vector of {count} entries does not fit")
    vector = _vector_entries(envelope[FIXED_HEADER_BYTES:end])
    if not 0 < hlc <= MAX_HLC or vector.get(node) != hlc:
        raise ProtocolError(f"envelope vector does not carry its own dot ({node}, {hlc})")
    return Header(epoch, key, hlc, node, vector, envelope[:end])


def _one_writer_header(envelope: bytes) -> Header:
    """`parse_header` of an envelope whose vector has one entry (its length checked): the
    same checks, with one struct read instead of two."""
    version, algorithm, epoch, key, hlc, node, _, entry_node, entry_hlc = (
        _FIXED_ONE_ENTRY.unpack_from(envelope)
    )
    if version != FORMAT_VERSION or algorithm != ALGORITHM_AES_256_GCM:
        raise ProtocolError(f"unknown envelope format {version} / algorithm {algorithm}")
    if not 0 < hlc <= MAX_HLC or entry_node != node or entry_hlc != hlc:
        raise ProtocolError(f"envelope vector does not carry its own dot ({node}, {hlc})")
    return Header(epoch, key, hlc, node, {node: hlc}, envelope[: _FIXED_ONE_ENTRY.size])


def _vector_entries(data: bytes) -> VersionVector:
    vector: VersionVector = {}
    previous = -1
    for n, h in _ENTRY.iter_unpack(data):
        if n <= previous or not 0 < h <= MAX_HLC:
            raise ProtocolError(
                "envelope vector is not ascending by node or has an hlc out of range"
            )
        vector[n] = h
        previous = n
    return vector


def encode_vector(vector: VersionVector) -> bytes:
    """A vector as the header encodes it (entries sorted by node)."""
    entries = sorted(vector.items())
    return struct.pack(">H", len(entries)) + b"".join(_ENTRY.pack(n, h) for n, h in entries)


def decode_vector(data: bytes) -> VersionVector:
    """The inverse of `encode_vector`, for vectors the replica stored itself."""
    if len(data) == 2 + _ENTRY.size:  # one writer: the common case, on the merge hot path
        node, hlc = _ENTRY.unpack_from(data, 2)
        return {node: hlc}
    return dict(_ENTRY.iter_unpack(data[2:]))


def hlc_ms(hlc: int) -> int:
    """The millisecond part of an hlc (its low 16 bits count events within a millisecond)."""
    return hlc >> 16


def system_clock_ms() -> int:
    """The wall clock in an hlc's unit (milliseconds since the Unix epoch): the default clock
    of replicas and relays alike, each of which takes its clock injected."""
    return time.time_ns() // 1_000_000


def node_to_i64(node: int) -> int:
    """A node id (unsigned 64-bit) as SQL stores it: integer columns are signed 64-bit."""
    return node - (1 << 64) if node >= 1 << 63 else node  # constants folded: a hot path


def node_from_i64(value: int) -> int:
    """The node id a signed 64-bit SQL integer stores (`node_to_i64`'s inverse)."""
    return value + (1 << 64) if value < 0 else value


def peek_dot(envelope: bytes) -> tuple[bytes, int, int] | None:
    """(key, node, hlc) from an envelope's fixed header, unchecked; None if too short.

    Enough to tell a version the replica already covers; anything else gets `parse_header`."""
    if len(envelope) < FIXED_HEADER_BYTES:
        return None
    _, _, _, key, hlc, node, _ = _FIXED.unpack_from(envelope)
    return key, node, hlc


def dominates(vector: VersionVector, dot: Dot) -> bool:
    """True when a version with `vector` descends from the version named by `dot`."""
    return vector.get(dot[0], 0) >= dot[1]


def merge_vectors(vectors: Iterable[VersionVector]) -> VersionVector:
    """The element-wise maximum of vectors (a local write's causal past)."""
    merged: VersionVector = {}
    for vector in vectors:
        for node, hlc in vector.items():
            if merged.get(node, 0) < hlc:
                merged[node] = hlc
    return merged


# ---- Messages between a device and the relay (specs/protocol.md) ------------------------------

Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_HLC)]
"""A sequence number or cursor: non-negative, within SQLite's signed integers."""


class RelayState(msgspec.Struct, frozen=True):
    """Carried by every relay answer so a device can tell a wipe or a rollback."""

    storage_id: str
    account_epoch: str
    head: Seq


class ErrorCode(enum.StrEnum):
    """Every machine-readable code the relay sends: in an `ErrorBody` with a 4xx status, or in
    a refused `Receipt`. One type for both sides, so a client's hint tables and comparisons
    are checked by mypy against the codes the relay can actually send.

    A code travels as its string (msgspec encodes a StrEnum as its value), and a device decodes
    only these. So a new member is a protocol change: `PROTOCOL_VERSION` goes up with it, and
    a device of the older version is refused at `/v1/info` instead of meeting a code it cannot
    name. specs/protocol.md §3 and §6.1 say when each is sent."""

    BAD_REQUEST = "bad_request"
    MALFORMED = "malformed"
    INVALID = "invalid"
    UNAUTHORIZED = "unauthorized"
    BAD_CREDENTIALS = "bad_credentials"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    ACCOUNT_EXISTS = "account_exists"
    VERSION_CONFLICT = "version_conflict"
    BODY_TOO_LARGE = "body_too_large"
    TOO_LARGE = "too_large"
    QUOTA_EXCEEDED = "quota_exceeded"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    RATE_LIMITED = "rate_limited"
    CLOCK_AHEAD = "clock_ahead"
    IDENTITY_CONFLICT = "identity_conflict"
    EPOCH_AHEAD = "epoch_ahead"
    KEY_RETIRED = "key_retired"
    DEVICE_REVOKED = "device_revoked"
    COUNTER_STALE = "counter_stale"
    RESYNC_REQUIRED = "resync_required"


U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
Key32 = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
"""32 bytes: a symmetric key, an Ed25519 seed or public key, an X25519 public key."""
Signature = Annotated[bytes, msgspec.Meta(min_length=64, max_length=64)]
PUSH_LABEL = b"sealsync push v2\0"


class PushBatch(msgspec.Struct, frozen=True):
    """Envelopes a device pushes; the relay answers one receipt per envelope, in order. A
    version-2 account's are signed (`push_signed_bytes`) under a counter above every one this
    device used, so a captured request cannot be sent again (specs/protocol.md §4.7). `ack`:
    the device's pull cursor, every version up to it merged, held or covered there;
    `tombstones`: which envelopes are tombstones (`tombstone_bits`)."""

    envelopes: list[bytes]
    generation: U32 = 0
    counter: Seq = 0
    signature: Signature | None = None
    ack: Seq | None = None
    tombstones: bytes = b""

    def __repr__(self) -> str:  # not every envelope's bytes
        return f"PushBatch({len(self.envelopes)} envelopes, counter={self.counter})"


def push_signed_bytes(
    account: str,
    device_id: str,
    state: RelayState,
    batch: PushBatch,
    digests: Sequence[bytes],
    tombstones: bytes,
) -> bytes:
    """What a push's signature covers: who pushes to which relay and account epoch, with which
    generation, counter and ack, and the SHA-256 of each envelope and the tombstones as sent
    (a relay refuses an oversized envelope before storage: the batch it stores is shorter)."""
    names = (account, device_id, state.storage_id, state.account_epoch)
    named = b"".join(_LENGTH.pack(len(b)) + b for b in (n.encode() for n in names))
    ack = 0 if batch.ack is None else batch.ack + 1
    numbers = _LENGTH.pack(batch.generation) + _U64.pack(batch.counter) + _U64.pack(ack)
    sent = _LENGTH.pack(len(digests)) + b"".join(digests) + _LENGTH.pack(len(tombstones))
    return PUSH_LABEL + named + numbers + sent + tombstones


ReceiptStatus = Literal["stored", "superseded", "refused"]


class Receipt(msgspec.Struct, frozen=True):
    """The relay's word on one pushed envelope, given only after a durable commit."""

    status: ReceiptStatus
    seq: Seq | None = None
    code: ErrorCode | None = None

    def __post_init__(self) -> None:
        if (self.status == "stored") != (self.seq is not None):
            raise InvalidArgumentError("a stored receipt carries a seq, and only a stored one")
        if (self.status == "refused") != (self.code is not None):
            raise InvalidArgumentError("a refused receipt carries a code, and only a refused one")


class PushResult(msgspec.Struct, frozen=True):
    receipts: list[Receipt]
    state: RelayState


class PageEntry(msgspec.Struct, frozen=True):
    seq: Seq
    envelope: bytes


class Page(msgspec.Struct, frozen=True):
    """Envelopes with seq > `cursor`, in seq order; `cursor` echoes the request. A page
    ends at a collection run (`collected`, whose seq is `next_cursor`) when it reaches one.
    `last_run`: the seq of the account's latest run, 0 if it never ran one."""

    cursor: Seq
    entries: list[PageEntry]
    next_cursor: Seq
    has_more: bool
    state: RelayState
    collected: CollectedRun | None = None
    last_run: Seq = 0


class Redacted(msgspec.Struct, frozen=True):
    """A message that carries a secret: `repr`, `str` and rich's pretty printer show only the
    fields named in `shown` (rich reads `__rich_repr__`, which would bypass `__repr__`)."""

    shown: ClassVar[tuple[str, ...]] = ()

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.shown]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.__rich_repr__())
        return f"{type(self).__name__}({fields})"


AccountName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
"""An account name: 1..256 characters, NFC, no NUL (the relay checks the last two)."""
DeviceName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
AuthKey = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MAX_BUNDLE_BYTES = 64 * 1024
Bundle = Annotated[bytes, msgspec.Meta(min_length=1, max_length=MAX_BUNDLE_BYTES)]
Version = Annotated[int, msgspec.Meta(ge=0, le=MAX_HLC)]


class PreloginRequest(msgspec.Struct, frozen=True):
    account: AccountName


class PreloginResponse(msgspec.Struct, frozen=True):
    kdf: KdfParams


def auth_key_hash(auth_key: bytes) -> bytes:
    """How the relay stores an auth key: a fast hash is enough for a 256-bit derived key (a
    slow one would only make logins a DoS target)."""
    return hashlib.sha256(b"sealsync auth key v1\0" + auth_key).digest()


class RegisterRequest(Redacted, frozen=True):
    """A new account: the passphrase's auth key and the recovery key's auth key hash (the
    relay stores a hash of each: the recovery key's is sent already hashed, so a device can
    register the account again without holding a secret that logs in), and the opaque key
    bundle."""

    account: AccountName
    auth_key: AuthKey
    recovery_auth_hash: AuthKey
    kdf: KdfParams
    bundle: Bundle
    device_name: DeviceName
    invite: Token | None = None

    shown = ("account", "device_name")


class LoginRequest(Redacted, frozen=True):
    """A device session: the passphrase's or the recovery key's auth key. `device_id`, the id
    this device had before, keeps its one entry in the account's devices (its old tokens
    end); without it, or when it is not one of the account's, the device is a new one."""

    account: AccountName
    auth_key: AuthKey
    device_name: DeviceName
    device_id: Annotated[str, msgspec.Meta(max_length=64)] | None = None

    shown = ("account", "device_name", "device_id")


class RefreshRequest(Redacted, frozen=True):
    refresh_token: Token


class Session(Redacted, frozen=True):
    """Bearer tokens of one device: a short-lived access token and a single-use refresh one."""

    account: AccountName
    device_id: str
    access_token: str
    access_expires_ms: int
    refresh_token: str
    refresh_expires_ms: int
    state: RelayState

    shown = ("account", "device_id")


class DeviceInfo(msgspec.Struct, frozen=True):
    id: str
    name: str
    created_ms: int
    current: bool
    """True for the device whose token asked."""


class DeviceList(msgspec.Struct, frozen=True):
    devices: list[DeviceInfo]


class RenameDevice(msgspec.Struct, frozen=True):
    name: DeviceName


class KeyProof(Redacted, frozen=True):
    """The account's current auth key, sent again with what a token alone must not do:
    revoke a device, ask for a reseed, read the key bundle. A stolen access token then
    changes nothing of the account and learns nothing of its keys."""

    auth_key: AuthKey


class DeleteAccount(Redacted, frozen=True):
    """Deleting everything takes the auth key again, not just a (possibly stolen) token."""

    auth_key: AuthKey


class KeyBundleValue(msgspec.Struct, frozen=True):
    """The opaque key bundle and its version, for compare-and-set replacement."""

    bundle: bytes
    version: Version


class PutKeyBundle(Redacted, frozen=True):
    """A new bundle (a passphrase change re-wraps the account key) and the new passphrase's
    auth key; refused unless the stored bundle is still `expected_version`, and unless
    `current_auth_key` is the account's passphrase or recovery auth key — a stolen token
    alone must not be able to take the account over."""

    bundle: Bundle
    kdf: KdfParams
    auth_key: AuthKey
    expected_version: Version
    current_auth_key: AuthKey
    end_other_sessions: bool = False
    """Every other device's tokens end with the change: they log in again with the new
    passphrase (a device that may be in someone else's hands)."""
    recovery_auth_hash: AuthKey | None = None
    """A new recovery key's auth hash, replacing the old one's (a rotation: see devices)."""
    expected_head: Seq | None = None
    """A new generation's: the head its frontier covers; required, so that only a client that
    records a frontier retires epochs (docs/key-generations.md §6)."""

    shown = ("expected_version", "end_other_sessions")


class RelayLimits(msgspec.Struct, frozen=True):
    """The bounds a relay enforces, so clients size batches and pages to fit."""

    max_body_bytes: int
    max_envelope_bytes: int
    max_push_envelopes: int
    page_size: int
    max_page_bytes: int
    max_account_bytes: int
    max_drift_ms: int
    requests_per_second: float
    burst: int
    tombstone_horizon_ms: int = 90 * 24 * 3600 * 1000
    """Its collection leaves out devices silent this long: one away longer may hold what a
    run took, and must not reseed it back (specs/protocol.md §5.1)."""


class RelayInfo(msgspec.Struct, frozen=True):
    protocol_version: int
    limits: RelayLimits
    open_signup: bool


class Health(msgspec.Struct, frozen=True):
    status: Literal["ok"]


class ErrorBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every refusal: a stable machine-readable code and a message naming the bound."""

    code: ErrorCode
    message: str
    last_counter: Seq | None = None
    """With `counter_stale`: the highest counter the relay has seen from this device."""


class _Versioned(msgspec.Struct):
    version: int


def bundle_version(data: bytes) -> int:
    """The `version` of an encoded key bundle of any format (`msgspec.DecodeError` if none)."""
    return msgspec.msgpack.decode(data, type=_Versioned).version


class BundleHead(msgspec.Struct, frozen=True):
    """What the relay reads of a version-2 key bundle (envelope.md §2.3.1); the rest of it,
    and all of a version-1 one, is opaque to the relay."""

    version: int
    generation: U32
    key_epoch: U32
    signing_public: Key32


_encoder = msgspec.msgpack.Encoder()


def encode_message(value: msgspec.Struct) -> bytes:
    """MessagePack bytes of a wire value."""
    return _encoder.encode(value)


T = TypeVar("T")


def decode_message(data: bytes, kind: type[T]) -> T:
    """Parse MessagePack bytes as `kind`; raise `ProtocolError` naming what was wrong."""
    try:
        return msgspec.msgpack.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed {kind.__name__}: {exc}") from exc
