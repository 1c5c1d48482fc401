"""Write specs/vectors/envelope.json, the envelope test vectors of specs/envelope.md.

A second implementation on purpose: it imports nothing from `replica` and builds every value
from the spec with the primitives alone (HKDF, HMAC, AES-256-GCM, SHA-256 and a small canonical
MessagePack encoder), so tests/replica/test_envelope.py checks the replica against an
independent reading of the spec. Deterministic: fixed keys, account ids and nonces (each nonce
is derived from its vector's name), so running it twice writes the same bytes.

    python specs/vectors/generate_envelope.py          # rewrite envelope.json
    python specs/vectors/generate_envelope.py --check  # exit 1 if envelope.json is stale
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import sys
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

OUTPUT = Path(__file__).with_name("envelope.json")
VECTORS_VERSION = 1
FORMAT_VERSION = 1
ALGORITHM_AES_256_GCM = 1
MIN_PADDED_BYTES = 64
KNOWN_EPOCH = 1
FIXED = struct.Struct(">BBI16sQQH")
ENTRY = struct.Struct(">QQ")
U32 = struct.Struct(">I")
EPOCH_OFFSET = 2
KEY_OFFSET = 6
HLC_OFFSET = 22
NODE_OFFSET = 30
COUNT_OFFSET = 38


def fixed_bytes(label: str, length: int) -> bytes:
    """A fixed, reproducible value: SHA-256 of a label, truncated."""
    return hashlib.sha256(b"sealsync test vector " + label.encode()).digest()[:length]


ACCOUNT_KEY = fixed_bytes("account key", 32)
ACCOUNT_ID = fixed_bytes("account id", 16)
OTHER_ACCOUNT_KEY = fixed_bytes("another account key", 32)
OTHER_ACCOUNT_ID = fixed_bytes("another account id", 16)


# ---- primitives, written from the spec ---------------------------------------------------------


def hkdf(key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(key)


def index_key(account_key: bytes) -> bytes:
    return hkdf(account_key, b"sealsync index v1")


def epoch_key(account_key: bytes, epoch: int) -> bytes:
    return hkdf(account_key, b"sealsync epoch v1 " + str(epoch).encode("ascii"))


def lp(text: str) -> bytes:
    """u32 big-endian byte length ‖ UTF-8."""
    data = text.encode("utf-8")
    return U32.pack(len(data)) + data


def opaque_key_input(profile: str, collection: str, record_id: str) -> bytes:
    return lp(profile) + lp(collection) + lp(record_id)


def opaque_key(profile: str, collection: str, record_id: str) -> bytes:
    key_input = opaque_key_input(profile, collection, record_id)
    return hmac.digest(index_key(ACCOUNT_KEY), key_input, "sha256")[:16]


def padme(length: int) -> int:
    """PADMÉ with a 64-byte floor, from Nikitin et al. (PETS 2019), §4."""
    length = max(length, MIN_PADDED_BYTES)
    exponent = length.bit_length() - 1  # floor(log2 L), exactly
    size_bits = exponent.bit_length()  # floor(log2 E) + 1
    last_bits = exponent - size_bits
    mask = (1 << last_bits) - 1
    return (length + mask) & ~mask


def pack(value: Any) -> bytes:
    """Canonical MessagePack: shortest int, str and container headers; floats as float64."""
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        return pack_int(value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return sized_header(len(data), 0xA0, 31, (0xD9, 0xDA, 0xDB)) + data
    if isinstance(value, list):
        header = sized_header(len(value), 0x90, 15, (None, 0xDC, 0xDD))
        return header + b"".join(pack(item) for item in value)
    if isinstance(value, dict):
        header = sized_header(len(value), 0x80, 15, (None, 0xDE, 0xDF))
        return header + b"".join(pack(k) + pack(v) for k, v in value.items())
    raise TypeError(f"not a JSON-compatible value: {type(value).__name__}")


def pack_int(value: int) -> bytes:
    if 0 <= value <= 0x7F:
        return bytes([value])
    if -32 <= value < 0:
        return struct.pack(">b", value)
    if value > 0:
        for marker, fmt in ((0xCC, ">B"), (0xCD, ">H"), (0xCE, ">I"), (0xCF, ">Q")):
            if value < 1 << (8 * struct.calcsize(fmt)):
                return bytes([marker]) + struct.pack(fmt, value)
    for marker, fmt in ((0xD0, ">b"), (0xD1, ">h"), (0xD2, ">i"), (0xD3, ">q")):
        bits = 8 * struct.calcsize(fmt) - 1
        if -(1 << bits) <= value:
            return bytes([marker]) + struct.pack(fmt, value)
    raise ValueError(f"integer {value} outside 64 bits")


def sized_header(size: int, fix: int, fix_max: int, markers: tuple[int | None, int, int]) -> bytes:
    if size <= fix_max:
        return bytes([fix | size])
    for marker, fmt in zip(markers, (">B", ">H", ">I"), strict=True):
        if marker is not None and size < 1 << (8 * struct.calcsize(fmt)):
            return bytes([marker]) + struct.pack(fmt, size)
    raise ValueError(f"size {size} too large")


# ---- one envelope, every step kept ------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """The inputs of one envelope."""

    name: str
    description: str
    profile: str
    collection: str
    record_id: str
    hlc: int
    node: int
    vector: dict[int, int]
    deleted: bool = False
    document: Any = None
    epoch: int = 0
    nonce: bytes = field(default=b"")

    def with_nonce(self) -> Case:
        return replace(self, nonce=fixed_bytes("nonce " + self.name, 12))


@dataclass(frozen=True)
class Sealed:
    """Every intermediate value of sealing one `Case`."""

    case: Case
    index_key: bytes
    epoch_key: bytes
    key_input: bytes
    opaque_key: bytes
    header: bytes
    associated_data: bytes
    body: bytes
    framed: bytes
    padded: bytes
    ciphertext: bytes

    @property
    def envelope(self) -> bytes:
        return self.header + self.case.nonce + self.ciphertext


def encode_header(epoch: int, key: bytes, hlc: int, node: int, vector: dict[int, int]) -> bytes:
    entries = sorted(vector.items())
    fixed = FIXED.pack(FORMAT_VERSION, ALGORITHM_AES_256_GCM, epoch, key, hlc, node, len(entries))
    return fixed + b"".join(ENTRY.pack(n, h) for n, h in entries)


def plaintext_fields(case: Case) -> list[Any]:
    pairs = [[n, h] for n, h in sorted(case.vector.items())]
    document = None if case.deleted else case.document
    return [case.profile, case.collection, case.record_id, case.deleted, document, pairs]


def seal_case(
    case: Case,
    *,
    header_key: bytes | None = None,
    header_vector: dict[int, int] | None = None,
    body: bytes | None = None,
    length_prefix: int | None = None,
) -> Sealed:
    """Seal by the spec; the keyword arguments make a key holder's inconsistent envelope."""
    for text in (case.profile, case.collection, case.record_id):
        assert unicodedata.is_normalized("NFC", text), text
    ikey = index_key(ACCOUNT_KEY)
    ekey = epoch_key(ACCOUNT_KEY, case.epoch)
    key_input = opaque_key_input(case.profile, case.collection, case.record_id)
    okey = hmac.digest(ikey, key_input, "sha256")[:16]
    vector = case.vector if header_vector is None else header_vector
    header = encode_header(case.epoch, header_key or okey, case.hlc, case.node, vector)
    body = pack(plaintext_fields(case)) if body is None else body
    framed = U32.pack(len(body) if length_prefix is None else length_prefix) + body
    padded = framed + bytes(padme(len(framed)) - len(framed))
    ad = header + ACCOUNT_ID
    ciphertext = AESGCM(ekey).encrypt(case.nonce, padded, ad)
    return Sealed(case, ikey, ekey, key_input, okey, header, ad, body, framed, padded, ciphertext)


# ---- the cases ----------------------------------------------------------------------------------

NODE_A = 0x1A2B3C4D5E6F7081
NODE_B = 0xF00DFACE12345678  # above 2**63: a MessagePack uint64 in the plaintext
NODE_C = 0x0000000000000003
HLC_1 = (1_800_000_000_000 << 16) | 0
HLC_2 = (1_800_000_000_123 << 16) | 7
HLC_3 = (1_800_000_004_000 << 16) | 1


def padding_case(name: str, description: str, framed_bytes: int) -> Case:
    """A document whose framed plaintext is exactly `framed_bytes` long."""
    base = Case(name, description, "default", "notes", "sized", HLC_1, NODE_A, {NODE_A: HLC_1})
    for filler in range(framed_bytes):
        case = replace(base, document={"text": "x" * filler})
        if 4 + len(pack(plaintext_fields(case))) == framed_bytes:
            return case.with_nonce()
    raise ValueError(f"no filler makes a framed plaintext of {framed_bytes} bytes")


def envelope_cases() -> list[Case]:
    cases = [
        Case(
            "small_document",
            "A small document, key epoch 0, a vector holding only its own dot.",
            "default",
            "notes",
            "n1",
            HLC_1,
            NODE_A,
            {NODE_A: HLC_1},
            document={"title": "Trip", "done": False, "count": 3, "score": 1.5, "tags": ["a"]},
        ),
        Case(
            "tombstone",
            "A tombstone: deleted is true and the document is nil.",
            "default",
            "notes",
            "n2",
            HLC_2,
            NODE_A,
            {NODE_A: HLC_2},
            deleted=True,
        ),
        Case(
            "non_ascii_ids",
            "Profile and id in NFC with 2-, 3- and 4-byte UTF-8 characters: lp counts bytes.",
            "família",
            "threads",
            "café-日本語-🙂",
            HLC_2,
            NODE_C,
            {NODE_C: HLC_2},
            document={"title": "Ünïcödé", "message_count": 12},
        ),
        Case(
            "multi_entry_vector",
            "A merge of three devices' writes: the vector has three entries, one node >= 2**63.",
            "default",
            "threads",
            "t1",
            HLC_3,
            NODE_B,
            {NODE_C: HLC_1, NODE_A: HLC_2, NODE_B: HLC_3},
            document={"title": "merged", "message_count": -2, "big": 1 << 40},
        ),
        Case(
            "key_epoch_1",
            "Sealed under key epoch 1 (after one rotation).",
            "work",
            "notes",
            "n3",
            HLC_3,
            NODE_A,
            {NODE_A: HLC_3},
            document={"nested": {"list": [None, True, -129, 65536, "s"]}},
            epoch=1,
        ),
    ]
    cases = [c.with_nonce() for c in cases]
    cases.append(
        padding_case(
            "padme_bucket_edge",
            "Framed plaintext of exactly 128 bytes: a PADMÉ bucket edge, no padding.",
            128,
        )
    )
    cases.append(
        padding_case(
            "padme_bucket_crossed",
            "Framed plaintext of 129 bytes: one over the edge, padded to the next bucket, 144.",
            129,
        )
    )
    return cases


# ---- tampered envelopes -----------------------------------------------------------------------


def flip(data: bytes, offset: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[offset] ^= 1 << bit
    return bytes(out)


def put(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


def relabel(sealed: Sealed, **header_fields: Any) -> bytes:
    """The envelope with a well-formed header that differs in `header_fields`, same ciphertext."""
    case = sealed.case
    values: dict[str, Any] = {
        "epoch": case.epoch,
        "key": sealed.opaque_key,
        "hlc": case.hlc,
        "node": case.node,
        "vector": case.vector,
    }
    values.update(header_fields)
    header = encode_header(**values)
    return header + case.nonce + sealed.ciphertext


@dataclass(frozen=True)
class Tampered:
    name: str
    description: str
    defence: str
    base: str
    envelope: bytes
    expect: str = "EnvelopeError"
    account_key: bytes = ACCOUNT_KEY
    account_id: bytes = ACCOUNT_ID
    known_epoch: int = KNOWN_EPOCH


def tampered_cases(by_name: dict[str, Sealed]) -> list[Tampered]:
    return [
        *damaged_cases(by_name),
        *relabelled_cases(by_name),
        *misdirected_cases(by_name),
        *malformed_cases(by_name),
    ]


def damaged_cases(by_name: dict[str, Sealed]) -> list[Tampered]:
    small = by_name["small_document"]
    env = small.envelope
    start = len(small.header) + 12
    return [
        Tampered("ciphertext_bit_flip", "Bit 0 of the first ciphertext byte flipped.",
                 "aead", small.case.name, flip(env, start)),
        Tampered("tag_bit_flip", "Bit 7 of the last tag byte flipped.",
                 "aead", small.case.name, flip(env, len(env) - 1, 7)),
        Tampered("nonce_bit_flip", "Bit 3 of the fifth nonce byte flipped.",
                 "aead", small.case.name, flip(env, len(small.header) + 4, 3)),
        Tampered("truncated_by_one_byte", "The last byte (of the tag) removed.",
                 "aead", small.case.name, env[:-1]),
        Tampered("truncated_to_header_nonce_tag", "The ciphertext removed, only the tag kept.",
                 "aead", small.case.name, env[:start] + env[-16:]),
        Tampered("truncated_inside_header", "Cut after 30 bytes: too short to hold a header.",
                 "header", small.case.name, env[:30]),
        Tampered("byte_appended", "One zero byte appended.",
                 "aead", small.case.name, env + b"\x00"),
        Tampered("format_version_changed", "Format version 1 → 2.",
                 "header", small.case.name, put(env, 0, b"\x02")),
        Tampered("algorithm_changed", "Algorithm 1 → 2.",
                 "header", small.case.name, put(env, 1, b"\x02")),
        Tampered("opaque_key_bit_flip", "Bit 0 of the first opaque key byte flipped.",
                 "aead", small.case.name, flip(env, KEY_OFFSET)),
        Tampered("hlc_changed_alone", "The header hlc + 1 without its vector entry: malformed.",
                 "header", small.case.name,
                 put(env, HLC_OFFSET, struct.pack(">Q", small.case.hlc + 1))),
        Tampered("vector_count_zero", "The vector entry count set to 0: malformed.",
                 "header", small.case.name, put(env, COUNT_OFFSET, b"\x00\x00")),
    ]  # fmt: skip


def relabelled_cases(by_name: dict[str, Sealed]) -> list[Tampered]:
    multi = by_name["multi_entry_vector"]
    case = multi.case
    later = {**case.vector, case.node: case.hlc + 1}
    moved_node = {n: h for n, h in case.vector.items() if n != case.node} | {NODE_B - 1: case.hlc}
    inflated = {**case.vector, NODE_C: HLC_3 + 5}
    without_c = {n: h for n, h in case.vector.items() if n != NODE_C}
    epoch_1 = by_name["key_epoch_1"]
    small = by_name["small_document"]
    return [
        Tampered("relabel_hlc", "hlc and its own vector entry both + 1: a well-formed header.",
                 "aead", case.name, relabel(multi, hlc=case.hlc + 1, vector=later)),
        Tampered("relabel_node", "node (and its vector entry) moved to another device.",
                 "aead", case.name, relabel(multi, node=NODE_B - 1, vector=moved_node)),
        Tampered("relabel_vector_entry", "Another device's entry raised: forged dominance.",
                 "aead", case.name, relabel(multi, vector=inflated)),
        Tampered("relabel_vector_entry_removed", "Another device's entry dropped.",
                 "aead", case.name, relabel(multi, vector=without_c)),
        Tampered("relabel_epoch_1_to_0", "Key epoch 1 relabelled 0, an epoch the reader knows.",
                 "aead", epoch_1.case.name, relabel(epoch_1, epoch=0)),
        Tampered("relabel_epoch_0_to_1", "Key epoch 0 relabelled 1, an epoch the reader knows.",
                 "aead", small.case.name, relabel(small, epoch=1)),
        Tampered("relabel_epoch_to_unknown", "Key epoch 0 relabelled 2, newer than the reader's "
                 "1: refused before authentication, so the reader holds it.",
                 "epoch", small.case.name, relabel(small, epoch=2), expect="UnknownEpochError"),
    ]  # fmt: skip


def misdirected_cases(by_name: dict[str, Sealed]) -> list[Tampered]:
    small = by_name["small_document"]
    case = small.case
    other_record = by_name["tombstone"].opaque_key
    other_profile = seal_case(replace(case, profile="work")).opaque_key
    other_collection = seal_case(replace(case, collection="threads")).opaque_key
    vector = {**case.vector, NODE_C: HLC_1}
    not_msgpack = b"\xc1 not MessagePack"
    epoch_1 = by_name["key_epoch_1"].envelope
    return [
        Tampered("moved_to_another_record", "The opaque key replaced by the tombstone's.",
                 "aead", case.name, relabel(small, key=other_record)),
        Tampered("moved_to_another_profile", "The opaque key of the same id in profile 'work'.",
                 "aead", case.name, relabel(small, key=other_profile)),
        Tampered("moved_to_another_collection", "The opaque key of the same id in 'threads'.",
                 "aead", case.name, relabel(small, key=other_collection)),
        Tampered("another_account_id", "Opened by an account with another id, same key.",
                 "aead", case.name, small.envelope, account_id=OTHER_ACCOUNT_ID),
        Tampered("wrong_account_key", "Opened with another account key, same account id.",
                 "aead", case.name, small.envelope, account_key=OTHER_ACCOUNT_KEY),
        Tampered("sealed_under_another_record_key", "A key holder sealed it with another "
                 "record's opaque key in the header: authentic, but the identity does not hash "
                 "to the key.", "identity re-check", case.name,
                 seal_case(case, header_key=other_record).envelope),
        Tampered("sealed_with_a_different_header_vector", "A key holder sealed it with a header "
                 "vector unlike the plaintext's: authentic, but they differ.",
                 "identity re-check", case.name, seal_case(case, header_vector=vector).envelope),
        Tampered("sealed_with_malformed_plaintext", "A key holder sealed bytes that are not "
                 "MessagePack: authentic, but malformed.",
                 "plaintext", case.name, seal_case(case, body=not_msgpack).envelope),
        Tampered("epoch_unknown_to_reader", "A genuine key epoch 1 envelope read by a device "
                 "that knows only epoch 0: it holds it until it learns the epoch.",
                 "epoch", "key_epoch_1", epoch_1, expect="UnknownEpochError", known_epoch=0),
    ]  # fmt: skip


def malformed_cases(by_name: dict[str, Sealed]) -> list[Tampered]:
    """A key holder's authentic envelopes whose header matches the plaintext, each breaking one
    rule of the plaintext alone (specs/envelope.md §7 step 4)."""
    small = by_name["small_document"]
    edge = by_name["padme_bucket_edge"]
    tombstone = by_name["tombstone"].case
    nfd = replace(small.case, record_id="e\u0301")  # "é" decomposed: not NFC
    nfd_key = opaque_key(nfd.profile, nfd.collection, nfd.record_id)
    integer_flag = plaintext_fields(tombstone)
    integer_flag[3] = 1
    tombstone_document = plaintext_fields(tombstone)
    tombstone_document[4] = {"title": "Trip"}
    return [
        Tampered("sealed_with_a_length_prefix_past_the_plaintext", "A key holder sealed a "
                 "length prefix of 2**32 - 1, past the end of the plaintext (4 + L wraps to 3 "
                 "in 32-bit arithmetic): refused, never read past the end.", "plaintext",
                 small.case.name, seal_case(small.case, length_prefix=0xFFFFFFFF).envelope),
        Tampered("sealed_without_padding_with_a_length_prefix_past_the_plaintext", "A key "
                 "holder sealed a body that fills its PADME bucket (no padding follows it) "
                 "under a length prefix one byte past the end: refused, not read to the end.",
                 "plaintext", edge.case.name,
                 seal_case(edge.case, length_prefix=len(pack(plaintext_fields(edge.case))) + 1)
                 .envelope),
        Tampered("sealed_with_a_name_not_in_nfc", "A key holder sealed the id 'e' + U+0301 "
                 "(not NFC) under its own opaque key: the header matches, the name is refused.",
                 "plaintext", small.case.name,
                 seal_case(small.case, header_key=nfd_key, body=pack(plaintext_fields(nfd)))
                 .envelope),
        Tampered("sealed_with_a_deleted_flag_that_is_an_integer", "A key holder sealed the "
                 "tombstone with deleted = 1 (an integer), not true: refused.", "plaintext",
                 tombstone.name, seal_case(tombstone, body=pack(integer_flag)).envelope),
        Tampered("sealed_tombstone_with_a_document", "A key holder sealed the tombstone with a "
                 "document instead of nil: refused.", "plaintext", tombstone.name,
                 seal_case(tombstone, body=pack(tombstone_document)).envelope),
    ]  # fmt: skip


# ---- JSON ---------------------------------------------------------------------------------------


def vector_json(vector: dict[int, int]) -> list[list[str]]:
    return [[str(n), str(h)] for n, h in sorted(vector.items())]


def envelope_json(sealed: Sealed) -> dict[str, Any]:
    case = sealed.case
    identity = {"profile": case.profile, "collection": case.collection, "id": case.record_id}
    fields = {
        **identity,
        "deleted": case.deleted,
        "document": None if case.deleted else case.document,
        "hlc": str(case.hlc),
        "node": str(case.node),
        "vector": vector_json(case.vector),
        "key_epoch": case.epoch,
    }
    return {
        "name": case.name,
        "description": case.description,
        "input": {**fields, "nonce": case.nonce.hex()},
        "identity_utf8": {k: v.encode("utf-8").hex() for k, v in identity.items()},
        "intermediate": {
            "account_key": ACCOUNT_KEY.hex(),
            "account_id": ACCOUNT_ID.hex(),
            "index_key": sealed.index_key.hex(),
            "epoch_key": sealed.epoch_key.hex(),
            "opaque_key_input": sealed.key_input.hex(),
            "opaque_key": sealed.opaque_key.hex(),
            "header": sealed.header.hex(),
            "nonce": case.nonce.hex(),
            "associated_data": sealed.associated_data.hex(),
            "messagepack": sealed.body.hex(),
            "framed_plaintext": sealed.framed.hex(),
            "framed_bytes": len(sealed.framed),
            "padded_plaintext": sealed.padded.hex(),
            "padded_bytes": len(sealed.padded),
            "ciphertext_and_tag": sealed.ciphertext.hex(),
            "tag": sealed.ciphertext[-16:].hex(),
        },
        "envelope": sealed.envelope.hex(),
        "decoded": {**fields, "opaque_key": sealed.opaque_key.hex()},
    }


def tampered_json(tampered: Tampered) -> dict[str, Any]:
    return {
        "name": tampered.name,
        "description": tampered.description,
        "defence": tampered.defence,
        "base": tampered.base,
        "open_with": {
            "account_key": tampered.account_key.hex(),
            "account_id": tampered.account_id.hex(),
            "known_epoch": tampered.known_epoch,
        },
        "envelope": tampered.envelope.hex(),
        "expect": tampered.expect,
    }


def build_vectors() -> dict[str, Any]:
    """The whole vector file as a JSON-ready value."""
    sealed = [seal_case(case) for case in envelope_cases()]
    by_name = {s.case.name: s for s in sealed}
    return {
        "spec": "specs/envelope.md",
        "vectors_version": VECTORS_VERSION,
        "format_version": FORMAT_VERSION,
        "generator": "specs/vectors/generate_envelope.py",
        "notes": [
            "Byte strings are lowercase hex. u64 values (hlc, node, vector entries) are decimal "
            "strings, since JSON numbers lose precision above 2**53.",
            "Documents are encoded with their map keys in the order listed here.",
            "Open every envelope, and every tampered one unless open_with says otherwise, with "
            "the account below: it knows key epochs 0..known_epoch.",
        ],
        "account": {
            "account_key": ACCOUNT_KEY.hex(),
            "account_id": ACCOUNT_ID.hex(),
            "known_epoch": KNOWN_EPOCH,
            "index_key": index_key(ACCOUNT_KEY).hex(),
            "epoch_keys": {str(e): epoch_key(ACCOUNT_KEY, e).hex() for e in range(3)},
        },
        "envelopes": [envelope_json(s) for s in sealed],
        "tampered": [tampered_json(t) for t in tampered_cases(by_name)],
    }


def render(vectors: dict[str, Any]) -> str:
    """The exact text of envelope.json."""
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
