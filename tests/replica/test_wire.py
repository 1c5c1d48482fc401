"""Wire values (specs/protocol.md): MessagePack round trips, and malformed values refused."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import Page, PageEntry, ProtocolError, PushBatch, PushResult, Receipt, RelayState
from replica.wire import (
    MAX_HLC,
    ErrorBody,
    ErrorCode,
    KdfParams,
    PreloginResponse,
    RegisterRequest,
    decode_message,
    decode_vector,
    encode_message,
    encode_vector,
)

seqs = st.integers(0, MAX_HLC)
states = st.builds(RelayState, st.text(max_size=40), st.text(max_size=40), seqs)
receipts = st.one_of(
    st.builds(Receipt, st.just("stored"), seqs),
    st.builds(Receipt, st.just("superseded")),
    st.builds(Receipt, st.just("refused"), st.none(), st.sampled_from(ErrorCode)),
)
pages = st.builds(
    Page,
    seqs,
    st.lists(st.builds(PageEntry, seqs, st.binary(max_size=64)), max_size=5),
    seqs,
    st.booleans(),
    states,
)


@given(
    st.one_of(
        pages,
        st.builds(PushResult, st.lists(receipts, max_size=5), states),
        st.builds(PushBatch, st.lists(st.binary(max_size=64), max_size=5)),
        st.builds(PreloginResponse, st.builds(KdfParams, st.binary(min_size=16, max_size=16))),
    )
)
def test_wire_values_round_trip(value: msgspec.Struct) -> None:
    assert decode_message(encode_message(value), type(value)) == value


@given(st.dictionaries(st.integers(0, 2**64 - 1), st.integers(1, MAX_HLC), min_size=1, max_size=20))
def test_vectors_round_trip_in_header_encoding(vector: dict[int, int]) -> None:
    assert decode_vector(encode_vector(vector)) == vector


@pytest.mark.parametrize(
    "raw",
    [
        {"storage_id": "s", "account_epoch": "e", "head": -1},
        {"storage_id": "s", "account_epoch": "e", "head": 2**63},
        {"storage_id": "s", "account_epoch": 5, "head": 1},
    ],
)
def test_malformed_relay_state_is_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="malformed RelayState"):
        decode_message(msgspec.msgpack.encode(raw), RelayState)


@pytest.mark.parametrize(
    "raw",
    [
        {"status": "stored"},
        {"status": "superseded", "seq": 3},
        {"status": "refused"},
        {"status": "lost"},
    ],
)
def test_inconsistent_receipts_are_refused(raw: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="malformed Receipt"):
        decode_message(msgspec.msgpack.encode(raw), Receipt)


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_error_codes_travel_as_their_strings(code: ErrorCode) -> None:
    """`ErrorCode` changed no byte on the wire: a code is the string it was before, in an
    error body and in a refused receipt, as MessagePack and as JSON."""
    as_strings = {"code": code.value, "message": "m"}
    assert encode_message(ErrorBody(code, "m")) == msgspec.msgpack.encode(as_strings)
    assert msgspec.json.encode(ErrorBody(code, "m")) == msgspec.json.encode(as_strings)
    receipt = {"status": "refused", "seq": None, "code": code.value}
    assert encode_message(Receipt("refused", code=code)) == msgspec.msgpack.encode(receipt)
    assert decode_message(msgspec.msgpack.encode(receipt), Receipt).code is code


def test_error_body_bytes_are_unchanged() -> None:
    """The exact bytes, written out: a regression here would break every deployed client."""
    assert encode_message(ErrorBody(ErrorCode.TOO_LARGE, "over")) == (
        b"\x82\xa4code\xa9too_large\xa7message\xa4over"
    )
    assert encode_message(Receipt("refused", code=ErrorCode.CLOCK_AHEAD)) == (
        b"\x83\xa6status\xa7refused\xa3seq\xc0\xa4code\xabclock_ahead"
    )


@pytest.mark.parametrize("kind", [ErrorBody, Receipt])
def test_a_code_outside_the_enum_is_malformed(kind: type[msgspec.Struct]) -> None:
    """Only a relay of another protocol version sends one (a new code comes with a new
    version): a device refuses the message rather than guess what the code means."""
    raw = {"status": "refused", "code": "from_the_future", "message": "m"}
    with pytest.raises(ProtocolError, match="from_the_future"):
        decode_message(msgspec.msgpack.encode(raw), kind)


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode_message(b"\xc1", Page)


def test_register_request_repr_holds_no_key() -> None:
    request = RegisterRequest(
        "alice", b"\x11" * 32, b"\x22" * 32, KdfParams(b"s" * 16), b"b", "laptop"
    )
    text = repr(request)
    assert "alice" in text and "11" * 4 not in text and "\\x11" not in text
