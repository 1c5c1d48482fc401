"""The envelope format (specs/envelope.md): vectors, round-trips, tampering, framing, padding."""

from __future__ import annotations

import functools
import importlib.util
import json
import struct
import sys
import unicodedata
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replica import InvalidArgumentError, Page, PageEntry, RelayState, RollbackError
from replica.envelope import (
    MIN_PADDED_BYTES,
    Identity,
    frame_plaintext,
    opaque_key,
    open_envelope,
    padme_length,
    seal,
)
from replica.errors import EnvelopeError, UnknownEpochError
from replica.keys import AccountInfo, AccountKeys, hkdf, length_prefixed
from replica.limits import MAX_INT, MIN_INT
from replica.wire import (
    FIXED_HEADER_BYTES,
    MAX_HLC,
    MAX_U64,
    NONCE_BYTES,
    TAG_BYTES,
    VersionVector,
    encode_header,
    parse_header,
)
from tests.conftest import ReplicaFactory

ROOT = Path(__file__).resolve().parents[2]
VECTORS_PATH = ROOT / "specs" / "vectors" / "envelope.json"
GENERATOR_PATH = ROOT / "specs" / "vectors" / "generate_envelope.py"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
ENVELOPES: list[dict[str, Any]] = VECTORS["envelopes"]
TAMPERED: list[dict[str, Any]] = VECTORS["tampered"]
ERROR_BY_NAME: dict[str, type[Exception]] = {
    "EnvelopeError": EnvelopeError,
    "UnknownEpochError": UnknownEpochError,
}
EPOCH_FIELD = range(2, 6)


def keys_for(account_key_hex: str, account_id_hex: str, epoch: int) -> AccountKeys:
    info = AccountInfo(account_id=bytes.fromhex(account_id_hex), key_epoch=epoch)
    return AccountKeys.v1(bytes.fromhex(account_key_hex), info)


ACCOUNT = VECTORS["account"]
READER = keys_for(ACCOUNT["account_key"], ACCOUNT["account_id"], ACCOUNT["known_epoch"])


def vector_from_json(pairs: list[list[str]]) -> VersionVector:
    return {int(node): int(hlc) for node, hlc in pairs}


def identity_from_json(fields: dict[str, Any]) -> Identity:
    return Identity(fields["profile"], fields["collection"], fields["id"])


def name_of(case: dict[str, Any]) -> str:
    return str(case["name"])


@functools.cache
def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_envelope", GENERATOR_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def seal_vector(vector: dict[str, Any]) -> bytes:
    given_ = vector["input"]
    keys = keys_for(ACCOUNT["account_key"], ACCOUNT["account_id"], given_["key_epoch"])
    return seal(
        keys,
        identity_from_json(given_),
        hlc=int(given_["hlc"]),
        node=int(given_["node"]),
        vector=vector_from_json(given_["vector"]),
        deleted=given_["deleted"],
        document=given_["document"],
        nonce=bytes.fromhex(given_["nonce"]),
    )


# ---- the vectors ------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", ENVELOPES, ids=name_of)
def test_envelope_vector_seals_to_the_same_bytes(vector: dict[str, Any]) -> None:
    assert seal_vector(vector).hex() == vector["envelope"]


@pytest.mark.parametrize("vector", ENVELOPES, ids=name_of)
def test_envelope_vector_intermediates_match_the_code(vector: dict[str, Any]) -> None:
    given_, steps = vector["input"], vector["intermediate"]
    keys = keys_for(steps["account_key"], steps["account_id"], given_["key_epoch"])
    identity = identity_from_json(given_)
    epoch = given_["key_epoch"]
    vv = vector_from_json(given_["vector"])
    assert keys.index_key.hex() == steps["index_key"] == ACCOUNT["index_key"]
    epoch_key = hkdf(keys.unlock_key, f"sealsync epoch v1 {epoch}".encode())
    assert epoch_key.hex() == steps["epoch_key"] == ACCOUNT["epoch_keys"][str(epoch)]
    key_input = length_prefixed(identity.profile, identity.collection, identity.id)
    assert key_input.hex() == steps["opaque_key_input"]
    assert opaque_key(keys.index_key, identity).hex() == steps["opaque_key"]
    header = encode_header(epoch, bytes.fromhex(steps["opaque_key"]), *dot_of(given_), vv)
    assert header.hex() == steps["header"]
    assert (header + keys.account_id).hex() == steps["associated_data"]
    document = None if given_["deleted"] else given_["document"]
    padded = frame_plaintext(identity, given_["deleted"], document, vv)
    assert padded.hex() == steps["padded_plaintext"]
    assert padded.hex().startswith(steps["framed_plaintext"])
    assert padme_length(steps["framed_bytes"]) == steps["padded_bytes"] == len(padded)
    nonce = bytes.fromhex(steps["nonce"])
    ciphertext = keys.aead(epoch).encrypt(nonce, padded, header + keys.account_id)
    assert ciphertext.hex() == steps["ciphertext_and_tag"]
    assert ciphertext[-TAG_BYTES:].hex() == steps["tag"]


def dot_of(fields: dict[str, Any]) -> tuple[int, int]:
    return int(fields["hlc"]), int(fields["node"])


@pytest.mark.parametrize("vector", ENVELOPES, ids=name_of)
def test_envelope_vector_opens_to_its_decoded_fields(vector: dict[str, Any]) -> None:
    decoded = vector["decoded"]
    opened = open_envelope(READER, bytes.fromhex(vector["envelope"]))
    assert opened.identity == identity_from_json(decoded)
    assert opened.deleted is decoded["deleted"]
    assert opened.document == decoded["document"]
    assert opened.header.epoch == decoded["key_epoch"]
    assert opened.header.key.hex() == decoded["opaque_key"]
    assert (opened.header.hlc, opened.header.node) == dot_of(decoded)
    assert opened.header.vector == vector_from_json(decoded["vector"])


@pytest.mark.parametrize("case", TAMPERED, ids=name_of)
def test_tampered_vector_raises_exactly_its_error(case: dict[str, Any]) -> None:
    reader = case["open_with"]
    keys = keys_for(reader["account_key"], reader["account_id"], reader["known_epoch"])
    with pytest.raises((EnvelopeError, UnknownEpochError)) as raised:
        open_envelope(keys, bytes.fromhex(case["envelope"]))
    assert type(raised.value) is ERROR_BY_NAME[case["expect"]]


def test_tampered_vectors_cover_every_required_change() -> None:
    names = {case["name"] for case in TAMPERED}
    required = {
        "ciphertext_bit_flip",
        "tag_bit_flip",
        "nonce_bit_flip",
        "truncated_by_one_byte",
        "relabel_hlc",
        "relabel_node",
        "relabel_vector_entry",
        "relabel_epoch_1_to_0",
        "opaque_key_bit_flip",
        "moved_to_another_record",
        "another_account_id",
        "wrong_account_key",
        "sealed_under_another_record_key",
        "epoch_unknown_to_reader",
    }
    assert required <= names, required - names
    assert {case["expect"] for case in TAMPERED} == set(ERROR_BY_NAME)


def test_envelope_vectors_cover_the_required_shapes() -> None:
    by_name = {v["name"]: v for v in ENVELOPES}
    assert by_name["tombstone"]["input"]["deleted"] is True
    assert any(not v["input"]["id"].isascii() for v in ENVELOPES)
    assert any(len(v["input"]["vector"]) > 2 for v in ENVELOPES)
    assert any(v["input"]["key_epoch"] == 1 for v in ENVELOPES)
    steps = [v["intermediate"] for v in ENVELOPES]
    assert any(s["padded_bytes"] > s["framed_bytes"] > MIN_PADDED_BYTES for s in steps)
    assert any(s["padded_bytes"] == s["framed_bytes"] for s in steps)


def test_generator_output_equals_the_committed_vectors() -> None:
    generator = load_generator()
    assert generator.render(generator.build_vectors()) == VECTORS_PATH.read_text(encoding="utf-8")


# ---- round-trips --------------------------------------------------------------------------------


def is_valid_name(text: str) -> bool:
    return "\x00" not in text and 1 <= len(text) <= 256


names = (
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
    .map(lambda s: unicodedata.normalize("NFC", s))
    .filter(is_valid_name)
)
identities = st.builds(Identity, names, names, names)
u64s = st.integers(min_value=0, max_value=MAX_U64)
hlcs = st.integers(min_value=1, max_value=MAX_HLC)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=MIN_INT, max_value=MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=20)
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
nonces = st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES)
MAX_TEST_EPOCH = 3
KEYS_BY_EPOCH = [
    keys_for(ACCOUNT["account_key"], ACCOUNT["account_id"], epoch)
    for epoch in range(MAX_TEST_EPOCH + 1)
]


@st.composite
def versions(draw: st.DrawFn) -> tuple[int, int, VersionVector]:
    """A dot and a well-formed vector that carries it."""
    node, hlc = draw(u64s), draw(hlcs)
    others = draw(st.dictionaries(u64s, hlcs, max_size=5))
    return node, hlc, {**others, node: hlc}


@st.composite
def sealed_envelopes(draw: st.DrawFn) -> tuple[bytes, int]:
    """A random envelope and the key epoch it was sealed under."""
    node, hlc, vector = draw(versions())
    epoch = draw(st.integers(min_value=0, max_value=MAX_TEST_EPOCH))
    envelope = seal(
        KEYS_BY_EPOCH[epoch],
        draw(identities),
        hlc=hlc,
        node=node,
        vector=vector,
        deleted=draw(st.booleans()),
        document=draw(documents),
        nonce=draw(nonces),
    )
    return envelope, epoch


@given(
    identity=identities,
    version=versions(),
    deleted=st.booleans(),
    document=documents,
    epoch=st.integers(min_value=0, max_value=MAX_TEST_EPOCH),
    nonce=nonces,
)
def test_seal_then_open_round_trips(
    identity: Identity,
    version: tuple[int, int, VersionVector],
    deleted: bool,
    document: Any,
    epoch: int,
    nonce: bytes,
) -> None:
    node, hlc, vector = version
    envelope = seal(
        KEYS_BY_EPOCH[epoch],
        identity,
        hlc=hlc,
        node=node,
        vector=vector,
        deleted=deleted,
        document=document,
        nonce=nonce,
    )
    opened = open_envelope(KEYS_BY_EPOCH[MAX_TEST_EPOCH], envelope)
    assert opened.identity == identity
    assert opened.deleted is deleted
    assert opened.document == (None if deleted else document)
    header = opened.header
    assert (header.epoch, header.hlc, header.node, header.vector) == (epoch, hlc, node, vector)
    assert header.key == opaque_key(KEYS_BY_EPOCH[0].index_key, identity)


@given(identity=identities, version=versions(), document=documents)
def test_frame_plaintext_is_length_framed_and_zero_padded_to_padme(
    identity: Identity, version: tuple[int, int, VersionVector], document: Any
) -> None:
    _, _, vector = version
    padded = frame_plaintext(identity, False, document, vector)
    (length,) = struct.unpack_from(">I", padded)
    framed_bytes = 4 + length
    assert len(padded) == padme_length(framed_bytes)
    assert padded[framed_bytes:] == bytes(len(padded) - framed_bytes)
    fields = msgspec.msgpack.decode(padded[4:framed_bytes])
    pairs = [[n, h] for n, h in sorted(vector.items())]
    assert fields == [identity.profile, identity.collection, identity.id, False, document, pairs]


@given(envelope=sealed_envelopes())
def test_envelope_length_reveals_only_the_padded_size(envelope: tuple[bytes, int]) -> None:
    sealed, _ = envelope
    header = parse_header(sealed)
    padded_bytes = len(sealed) - len(header.header_bytes) - NONCE_BYTES - TAG_BYTES
    assert padded_bytes >= MIN_PADDED_BYTES
    assert padme_length(padded_bytes) == padded_bytes


@given(document=documents)
def test_generator_messagepack_encoder_matches_msgspec(document: Any) -> None:
    """The generator's own encoder is the canonical form the reference sealer writes."""
    assert load_generator().pack(document) == msgspec.msgpack.encode(document)


def test_generator_padme_matches_padme_length() -> None:
    padme = load_generator().padme
    assert all(padme(n) == padme_length(n) for n in range(1 << 14))


# ---- tampering: every single bit --------------------------------------------------------------


def expected_error(envelope: bytes, bit: int, known_epoch: int) -> type[Exception]:
    """UnknownEpochError only when the flip is in the epoch field and makes it newer."""
    flipped = flip_bit(envelope, bit)
    if bit // 8 in EPOCH_FIELD:
        (epoch,) = struct.unpack_from(">I", flipped, EPOCH_FIELD.start)
        if epoch > known_epoch:
            return UnknownEpochError
    return EnvelopeError


def flip_bit(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


def assert_flip_fails(keys: AccountKeys, envelope: bytes, bit: int) -> None:
    expected = expected_error(envelope, bit, keys.key_epoch)
    with pytest.raises((EnvelopeError, UnknownEpochError)) as raised:
        open_envelope(keys, flip_bit(envelope, bit))
    assert type(raised.value) is expected, f"bit {bit}"


@pytest.mark.parametrize("vector", ENVELOPES, ids=name_of)
def test_every_single_bit_flip_of_a_vector_envelope_fails_to_open(vector: dict[str, Any]) -> None:
    envelope = bytes.fromhex(vector["envelope"])
    for bit in range(len(envelope) * 8):
        assert_flip_fails(READER, envelope, bit)


@settings(max_examples=200)
@given(envelope=sealed_envelopes(), data=st.data())
def test_any_single_bit_flip_fails_to_open(
    envelope: tuple[bytes, int], data: st.DataObject
) -> None:
    sealed, _ = envelope
    header_bits = len(parse_header(sealed).header_bytes) * 8
    # Half the draws aim at the header, where the parsing and epoch paths are.
    bit = data.draw(
        st.integers(min_value=0, max_value=header_bits - 1)
        | st.integers(min_value=0, max_value=len(sealed) * 8 - 1)
    )
    assert_flip_fails(KEYS_BY_EPOCH[MAX_TEST_EPOCH], sealed, bit)


@given(envelope=sealed_envelopes(), cut=st.integers(min_value=1, max_value=4096))
def test_any_truncation_fails_to_open(envelope: tuple[bytes, int], cut: int) -> None:
    sealed, _ = envelope
    with pytest.raises(EnvelopeError):
        open_envelope(KEYS_BY_EPOCH[MAX_TEST_EPOCH], sealed[: max(0, len(sealed) - cut)])


def test_flip_in_the_epoch_field_to_a_newer_epoch_raises_unknown_epoch() -> None:
    """The one exception to 'every damage is EnvelopeError': the reader holds the envelope."""
    envelope = bytes.fromhex(ENVELOPES[0]["envelope"])
    newest_epoch_bit = EPOCH_FIELD.start * 8  # the top bit of the u32 epoch
    assert expected_error(envelope, newest_epoch_bit, READER.key_epoch) is UnknownEpochError
    with pytest.raises(UnknownEpochError):
        open_envelope(READER, flip_bit(envelope, newest_epoch_bit))


# ---- opaque key: length prefixes ----------------------------------------------------------------


def split_length_prefixed(data: bytes) -> list[str]:
    parts, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        parts.append(data[offset + 4 : offset + 4 + length].decode("utf-8"))
        offset += 4 + length
    return parts


def test_length_prefix_separates_ab_c_from_a_bc() -> None:
    assert "ab" + "c" == "a" + "bc"  # what a plain concatenation would confuse
    assert length_prefixed("p", "ab", "c") != length_prefixed("p", "a", "bc")
    index_key = READER.index_key
    assert opaque_key(index_key, Identity("p", "ab", "c")) != opaque_key(
        index_key, Identity("p", "a", "bc")
    )
    assert opaque_key(index_key, Identity("ab", "c", "x")) != opaque_key(
        index_key, Identity("a", "bc", "x")
    )


def test_length_prefix_counts_utf8_bytes_not_characters() -> None:
    assert length_prefixed("é") == b"\x00\x00\x00\x02\xc3\xa9"
    assert length_prefixed("🙂") == b"\x00\x00\x00\x04" + "🙂".encode()


@given(parts=st.lists(st.text(st.characters(codec="utf-8"), max_size=12), min_size=3, max_size=3))
def test_length_prefixed_decodes_back_to_its_parts(parts: list[str]) -> None:
    """Decodable, hence injective: no two identities share an opaque-key input."""
    assert split_length_prefixed(length_prefixed(*parts)) == parts


@given(text=st.text(st.characters(codec="utf-8"), min_size=2, max_size=20), data=st.data())
def test_opaque_key_differs_for_every_split_of_one_string(text: str, data: st.DataObject) -> None:
    first = data.draw(st.integers(min_value=1, max_value=len(text) - 1))
    second = data.draw(
        st.integers(min_value=1, max_value=len(text) - 1).filter(lambda s: s != first)
    )
    left = Identity("p", text[:first], text[first:])
    right = Identity("p", text[:second], text[second:])
    assert opaque_key(READER.index_key, left) != opaque_key(READER.index_key, right)


@given(identity=identities)
def test_record_key_equals_the_reference_opaque_key(identity: Identity) -> None:
    """`AccountKeys.record_key` (unrolled, keyed state copied) is `opaque_key`, byte for byte."""
    assert READER.record_key(identity.profile, identity.collection, identity.id) == opaque_key(
        READER.index_key, identity
    )


# ---- PADMÉ ----------------------------------------------------------------------------------------

lengths = st.integers(min_value=0, max_value=1 << 24)


@given(length=lengths)
def test_padme_length_is_at_least_the_input_and_the_floor(length: int) -> None:
    padded = padme_length(length)
    assert padded >= length
    assert padded >= MIN_PADDED_BYTES


@given(length=st.integers(min_value=MIN_PADDED_BYTES + 1, max_value=1 << 24))
@example(length=129)  # the worst case: 144 / 129 ≈ 1.116
def test_padme_length_overhead_is_at_most_12_percent_above_64_bytes(length: int) -> None:
    assert padme_length(length) <= length * 1.12


@given(a=lengths, b=lengths)
def test_padme_length_is_monotone(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert padme_length(low) <= padme_length(high)


@given(length=lengths)
def test_padme_length_is_a_fixed_point_of_its_own_output(length: int) -> None:
    padded = padme_length(length)
    assert padme_length(padded) == padded


def test_padme_length_buckets_up_to_256_bytes_are_the_spec_table() -> None:
    buckets = sorted({padme_length(n) for n in range(257)})
    assert buckets == [*range(64, 128, 8), *range(128, 257, 16)]


# ---- threat model: what the relay can do with what it sees ----------------------------------------


def page_of(entries: list[PageEntry], state: RelayState, cursor: int = 0) -> Page:
    next_cursor = max((e.seq for e in entries), default=cursor)
    return Page(cursor, entries, next_cursor, False, state)


def test_replayed_older_version_is_superseded_and_changes_nothing(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n1", {"v": 1})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None and len(batch.envelopes) == 1
    replica.put("notes", "n1", {"v": 2})
    replay = page_of([PageEntry(1, batch.envelopes[0])], RelayState("s", "e", 1))
    applied = session.apply_page(replay)
    assert (applied.superseded, applied.merged, applied.quarantined) == (1, 0, 0)
    record = replica.get("notes", "n1")
    assert record is not None and record.document == {"v": 2} and not record.conflicts


def test_relay_state_change_exposes_a_wiped_or_restored_relay(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n1", {"v": 1})
    session = replica.sync_session()
    batch = session.next_batch()
    assert batch is not None
    seen = RelayState("storage-1", "epoch-1", 5)
    session.apply_page(page_of([PageEntry(5, batch.envelopes[0])], seen))
    for changed in (
        RelayState("storage-2", "epoch-1", 5),  # wiped or replaced
        RelayState("storage-1", "epoch-2", 5),  # reseeded or restored
        RelayState("storage-1", "epoch-1", 4),  # restored from an older copy
    ):
        with pytest.raises(RollbackError):
            session.apply_page(page_of([], changed, cursor=5))
    session.apply_page(page_of([], seen, cursor=5))


# ---- regressions: bugs once found in replica/ ----------------------------------------


def test_replica_put_refuses_a_lone_surrogate_id_as_invalid_argument(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError):
        replica.put("notes", "\ud800", {})


def test_replica_put_refuses_a_lone_surrogate_in_a_document_as_invalid_argument(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    with pytest.raises(InvalidArgumentError):
        replica.put("notes", "n1", {"text": "\udfff"})


def seal_raw_fields(fields: list[Any], nonce: bytes) -> bytes:
    """What a key holder (a buggy sealer in another language) could seal: any plaintext fields."""
    identity = Identity(fields[0], fields[1], fields[2])
    vector = {node: hlc for node, hlc in fields[5]}
    node, hlc = next(iter(vector.items()))
    header = encode_header(0, opaque_key(READER.index_key, identity), hlc, node, vector)
    body = msgspec.msgpack.encode(fields)
    framed = struct.pack(">I", len(body)) + body
    padded = framed + bytes(padme_length(len(framed)) - len(framed))
    ciphertext = AESGCM(hkdf(READER.unlock_key, b"sealsync epoch v1 0")).encrypt(
        nonce, padded, header + READER.account_id
    )
    return header + nonce + ciphertext


def test_seal_raw_fields_matches_seal_for_well_formed_fields() -> None:
    """The helper above is faithful, so the refusals below come from the field checked."""
    fields = ["default", "notes", "n1", True, None, [[7, 9]]]
    nonce = bytes(12)
    envelope = seal_raw_fields(fields, nonce)
    keys = KEYS_BY_EPOCH[0]
    identity = Identity("default", "notes", "n1")
    expected = seal(
        keys, identity, hlc=9, node=7, vector={7: 9}, deleted=True, document=None, nonce=nonce
    )
    assert envelope == expected


def test_open_refuses_a_deleted_flag_that_is_not_a_boolean() -> None:
    envelope = seal_raw_fields(["default", "notes", "n1", 1, None, [[7, 9]]], bytes(12))
    with pytest.raises(EnvelopeError):
        open_envelope(READER, envelope)


def test_open_refuses_a_tombstone_that_carries_a_document() -> None:
    envelope = seal_raw_fields(["default", "notes", "n1", True, {"x": 1}, [[7, 9]]], bytes(12))
    with pytest.raises(EnvelopeError):
        open_envelope(READER, envelope)


def forged_page(node: int) -> Page:
    """What a hostile relay can make without any key: a well-formed header, zeros after it."""
    hlc = 1 << 40
    forged = encode_header(0, bytes(16), hlc, node, {node: hlc}) + bytes(NONCE_BYTES + 80)
    return Page(0, [PageEntry(1, forged)], 1, False, RelayState("storage", "epoch", 1))


def test_forged_envelope_is_quarantined_and_changes_no_record(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n1", {"x": 1})
    applied = replica.sync_session().apply_page(forged_page(node=12345))
    assert (applied.quarantined, applied.merged) == (1, 0)
    record = replica.get("notes", "n1")
    assert record is not None and record.document == {"x": 1}


def test_forged_header_with_this_devices_node_does_not_change_its_node(
    make_replica: ReplicaFactory,
) -> None:
    replica = make_replica()
    replica.put("notes", "n1", {"x": 1})
    node = replica.node
    replica.sync_session().apply_page(forged_page(node))
    assert replica.node == node


def test_fixed_header_size_matches_the_spec() -> None:
    assert FIXED_HEADER_BYTES == 40  # the fixed part, vector count included
    assert NONCE_BYTES == 12
    assert TAG_BYTES == 16


@pytest.mark.parametrize(
    "fields",
    [
        ["default", "notes", "", False, None, [[7, 9]]],
        ["default", "notes", "e\u0301", False, None, [[7, 9]]],
        ["default", "no\x00tes", "n1", False, None, [[7, 9]]],
        ["default", "notes", "n1", False, None, [[7, 9.0]]],
        ["default", "notes", "n1", False, None, [["7", 9]]],
        ["default", "notes", "n1", False, None, [[7, 9], [7, 9]]],
        ["default", "notes", "n1", False, None, 7],
        ["default", "notes", "n1", False, None, [7]],
        ["default", "notes", "n1", False, None, [[7, 9, 1]]],
    ],
    ids=[
        "empty-id",
        "not-nfc",
        "nul",
        "float-hlc",
        "string-node",
        "repeated-pair",
        "pairs-not-a-list",
        "pair-not-a-list",
        "pair-of-three",
    ],
)
def test_open_refuses_names_and_pairs_that_break_the_format(fields: list[Any]) -> None:
    header_fields = ["default", "notes", "n1", False, None, [[7, 9]]]
    header_fields[:3] = [f if isinstance(f, str) else "x" for f in fields[:3]]
    envelope = seal_raw_fields_with_header(fields, header_fields, bytes(12))
    with pytest.raises(EnvelopeError):
        open_envelope(READER, envelope)


def seal_raw_fields_with_header(fields: list[Any], header_fields: list[Any], nonce: bytes) -> bytes:
    """Seal `fields` under the header `seal_raw_fields` would make for `header_fields`."""
    header = seal_raw_fields(header_fields, nonce)[: FIXED_HEADER_BYTES + 16]
    body = msgspec.msgpack.encode(fields)
    framed = struct.pack(">I", len(body)) + body
    padded = framed + bytes(padme_length(len(framed)) - len(framed))
    ciphertext = AESGCM(hkdf(READER.unlock_key, b"sealsync epoch v1 0")).encrypt(
        nonce, padded, header + READER.account_id
    )
    return header + nonce + ciphertext
