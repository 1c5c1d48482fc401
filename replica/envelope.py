"""Seal and open one version of a record (specs/envelope.md is normative).

    envelope  = header ‖ nonce (12) ‖ AES-256-GCM(epoch key, nonce, plaintext, AD)
    AD        = header ‖ account id (16)
    plaintext = u32 length ‖ MessagePack [profile, collection, id, deleted, document, vector]
                ‖ zero padding to the PADMÉ length (at least 64 bytes)
    key       = HMAC-SHA256(index key, lp(profile) ‖ lp(collection) ‖ lp(id))[:16]
                lp(s) = u32 byte length ‖ UTF-8 of s (NFC)

Opening re-derives the key from the decrypted identity and compares the decrypted vector with
the header's, so an envelope moved to another record, relabelled, truncated or sealed under
another account's key raises `EnvelopeError`, whatever was changed. An envelope of a key epoch
this account has not reached raises `UnknownEpochError`: the caller holds it.
"""

from __future__ import annotations

import hmac
import struct
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag

from replica.errors import EnvelopeError, ProtocolError
from replica.keys import AccountKeys, length_prefixed
from replica.limits import MAX_ID_CHARS, check_document_size, check_name
from replica.wire import NONCE_BYTES, Header, VersionVector, encode_header, parse_header

MIN_PADDED_BYTES = 64
_LENGTH = struct.Struct(">I")


class Identity(msgspec.Struct, frozen=True, gc=False):
    """Where a record lives: a profile, one of its collections, and the record's id.

    A msgspec Struct rather than a frozen dataclass: one is built per opened envelope, on
    the merge hot path, at a fraction of the cost."""

    profile: str
    collection: str
    id: str


class Opened(msgspec.Struct, frozen=True):
    """A decrypted version: its header, identity, tombstone flag and document (a Struct, as
    cheap to build as the others; tracked by the GC, since a document may hold anything)."""

    header: Header
    identity: Identity
    deleted: bool
    document: Any


def opaque_key(index_key: bytes, identity: Identity) -> bytes:
    """The 16-byte record key the relay sees in place of profile, collection and id.

    The reference form; `AccountKeys.record_key` computes the same bytes faster."""
    message = length_prefixed(identity.profile, identity.collection, identity.id)
    return hmac.digest(index_key, message, "sha256")[:16]


def scope_key(keys: AccountKeys, profile: str, collection: str) -> bytes:
    """The local index key of one collection in one profile (never sent anywhere)."""
    return keys.local_key(length_prefixed(profile, collection))


def profile_key(keys: AccountKeys, profile: str) -> bytes:
    """What a profile-wide lock names locally (distinct from every scope and record key)."""
    return keys.local_key(b"profile" + length_prefixed(profile))


def padme_length(length: int) -> int:
    """PADMÉ: leaks O(log log L) bits of a length, costs at most 12 % overhead."""
    length = max(length, MIN_PADDED_BYTES)
    exponent = length.bit_length() - 1
    size_bits = exponent.bit_length()
    mask = (1 << (exponent - size_bits)) - 1
    return (length + mask) & ~mask


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def frame_plaintext(
    identity: Identity, deleted: bool, document: Any, vector: VersionVector
) -> bytes:
    """Length-framed, padded MessagePack of the version's content."""
    pairs = [[node, hlc] for node, hlc in sorted(vector.items())]
    body = _encoder.encode(
        [identity.profile, identity.collection, identity.id, deleted, document, pairs]
    )
    check_document_size(len(body))
    framed = _LENGTH.pack(len(body)) + body
    return framed + bytes(padme_length(len(framed)) - len(framed))


def seal(
    keys: AccountKeys,
    identity: Identity,
    *,
    hlc: int,
    node: int,
    vector: VersionVector,
    deleted: bool,
    document: Any,
    nonce: bytes,
) -> bytes:
    """Seal one version under the account's newest key epoch."""
    key = keys.record_key(identity.profile, identity.collection, identity.id)
    header = encode_header(keys.key_epoch, key, hlc, node, vector)
    plaintext = frame_plaintext(identity, deleted, None if deleted else document, vector)
    ciphertext = keys.aead(keys.key_epoch).encrypt(nonce, plaintext, header + keys.account_id)
    return header + nonce + ciphertext


def open_envelope(keys: AccountKeys, envelope: bytes, header: Header | None = None) -> Opened:
    """Decrypt and check one envelope; `EnvelopeError` for any damage, whatever its kind."""
    if header is None:
        try:
            header = parse_header(envelope)
        except ProtocolError as exc:
            raise EnvelopeError(f"envelope header is malformed: {exc}") from None
    aead = keys.aead(header.epoch)
    header_bytes = header.header_bytes
    start = len(header_bytes)
    nonce = envelope[start : start + NONCE_BYTES]
    try:
        plaintext = aead.decrypt(
            nonce, envelope[start + NONCE_BYTES :], header_bytes + keys.account_id
        )
    except InvalidTag:
        raise EnvelopeError("envelope failed authentication (tampered, or another key)") from None
    return _check_plaintext(keys, header, plaintext)


def _check_names(profile: object, collection: object, record_id: object) -> None:
    """`limits.check_name` for the three names; its common case first, cheaply: short ASCII
    names without NUL are valid (ASCII is always NFC and always encodes)."""
    if type(profile) is str and type(collection) is str and type(record_id) is str:
        joined = profile + collection + record_id
        if (
            0 < len(profile) <= MAX_ID_CHARS
            and 0 < len(collection) <= MAX_ID_CHARS
            and 0 < len(record_id) <= MAX_ID_CHARS
            and joined.isascii()
            and "\x00" not in joined
        ):
            return
    check_name("profile", profile)
    check_name("collection", collection)
    check_name("id", record_id)


def _pairs_match(pairs: Any, header: Header) -> bool:
    """The decrypted vector is exactly the header's: integer pairs, ascending by node."""
    if type(pairs) is not list:
        return False
    if len(pairs) == 1:  # one writer: the common case
        (pair,) = pairs
        return (
            type(pair) is list
            and len(pair) == 2
            and type(pair[0]) is int
            and type(pair[1]) is int
            and pair[0] == header.node
            and pair[1] == header.hlc
            and len(header.vector) == 1
        )
    expected = [[node, hlc] for node, hlc in sorted(header.vector.items())]
    return pairs == expected and all(type(v) is int for pair in pairs for v in pair)


def _check_plaintext(keys: AccountKeys, header: Header, plaintext: bytes) -> Opened:
    try:
        (length,) = _LENGTH.unpack_from(plaintext)
        if length > len(plaintext) - 4:  # a slice would stop at the end instead of failing
            raise ValueError("the length prefix points past the plaintext")
        fields = _decoder.decode(plaintext[4 : 4 + length])
        profile, collection, record_id, deleted, document, pairs = fields
        _check_names(profile, collection, record_id)
        key = keys.record_key(profile, collection, record_id)
    except (struct.error, msgspec.DecodeError, ValueError, TypeError, AttributeError):
        raise EnvelopeError("envelope plaintext is malformed") from None
    if (
        not hmac.compare_digest(key, header.key)
        or not _pairs_match(pairs, header)
        or type(deleted) is not bool
        or (deleted and document is not None)
    ):
        raise EnvelopeError("envelope content does not match its header")
    return Opened(header, Identity(profile, collection, record_id), deleted, document)
