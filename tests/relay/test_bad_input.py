"""Hostile and broken input: every refusal a 400/413/415/422 with a stable code, never a 500,
and nothing stored.

Unknown fields are ignored when decoding (msgspec's default, and specs: decoding ignores
unknown keys, so a newer client can talk to an older relay); the tests here show that is safe:
an extra field can neither reach another account nor set anything the relay decides.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from relay.storage import Storage
from replica.wire import MAX_HLC, Page, PushBatch, PushResult, Session
from tests.relay.api import Keys, new_keys, register
from tests.relay.conftest import HLC, envelope
from tests.relay.harness import BACKENDS, Relay, Relays, call_asgi, error_body, open_relays

JSON = "application/json"
MSGPACK = "application/msgpack"
DEEP = 100_000
"""Nesting far past any recursion limit."""


@pytest.fixture(params=BACKENDS)
def relays(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path, request.param)


@dataclass
class Alice:
    relay: Relay
    keys: Keys
    session: Session

    def headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"authorization": f"Bearer {self.session.access_token}"}
        if content_type is not None:
            headers["content-type"] = content_type
        return headers


@pytest.fixture
def alice(relays: Relays) -> Alice:
    relay = relays()
    keys = new_keys()
    return Alice(relay, keys, register(relay.client, "alice", keys))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def register_json(alice: Alice, **fields: Any) -> dict[str, Any]:
    """A valid registration of a new account as JSON, with `fields` replaced."""
    value: dict[str, Any] = {
        "account": "bob",
        "auth_key": b64(b"a" * 32),
        "recovery_auth_hash": b64(b"r" * 32),
        "kdf": {"salt": b64(b"s" * 16)},
        "bundle": b64(b"bob's bundle"),
        "device_name": "bob-laptop",
    }
    value.update(fields)
    return value


def assert_nothing_stored(alice: Alice) -> None:
    storage: Storage = alice.relay.storage
    assert [a.name for a in storage.accounts()] == ["alice"]
    assert storage.stored_versions("alice") == 0 and storage.state("alice").head == 0
    record = storage.account("alice")
    assert record is not None and (record.bundle, record.bundle_version) == (b"bundle", 1)
    assert [d.name for d in storage.devices("alice")] == ["laptop"]


def unknown_field_nested(depth: int) -> bytes:
    return b'{"envelopes": [], "x": ' + b"[" * depth + b"]" * depth + b"}"


def known_field_nested(depth: int) -> bytes:
    return b'{"envelopes": ' + b"[" * depth + b"]" * depth + b"}"


PUSH = ("POST", "/v1/push")
KEYS = ("PUT", "/v1/keys")
REGISTER = ("POST", "/v1/register")
LOGIN = ("POST", "/v1/login")
RENAME = ("PATCH", "/v1/devices/{device}")

# (route, content type, body, status, code)
CASES: dict[str, tuple[tuple[str, str], str | None, bytes, int, str]] = {
    "empty msgpack": (PUSH, MSGPACK, b"", 400, "malformed"),
    "never-used msgpack byte": (PUSH, MSGPACK, b"\xc1", 400, "malformed"),
    "truncated msgpack": (
        PUSH,
        MSGPACK,
        msgspec.msgpack.encode(PushBatch([envelope(b"k" * 16, 1, HLC, {1: HLC})]))[:-5],
        400,
        "malformed",
    ),
    "trailing bytes": (
        PUSH,
        MSGPACK,
        msgspec.msgpack.encode(PushBatch([])) + b"\x00",
        400,
        "malformed",
    ),
    "array of 2^32-1 announced": (
        PUSH,
        MSGPACK,
        b"\x81\xa9envelopes\xdd\xff\xff\xff\xff",
        400,
        "malformed",
    ),
    "bin of 4 GiB announced": (
        PUSH,
        MSGPACK,
        b"\x81\xa9envelopes\x91\xc6\xff\xff\xff\xff",
        400,
        "malformed",
    ),
    "str of 4 GiB announced": (
        LOGIN,
        MSGPACK,
        b"\x81\xa7account\xdb\xff\xff\xff\xff",
        400,
        "malformed",
    ),
    "no content type means msgpack": (PUSH, None, b'{"envelopes": []}', 422, "invalid"),
    "JSON garbage": (PUSH, JSON, b"{", 400, "malformed"),
    "JSON not an object": (PUSH, JSON, b"[]", 422, "invalid"),
    "JSON wrong type": (PUSH, JSON, b'{"envelopes": "abc"}', 422, "invalid"),
    "JSON null": (PUSH, JSON, b'{"envelopes": null}', 422, "invalid"),
    "JSON bad base64": (PUSH, JSON, b'{"envelopes": ["!!not base64"]}', 422, "invalid"),
    "JSON missing field": (PUSH, JSON, b"{}", 422, "invalid"),
    "JSON deep nesting in an unknown field": (
        PUSH,
        JSON,
        unknown_field_nested(DEEP),
        400,
        "malformed",
    ),
    "JSON deep nesting in a known field": (PUSH, JSON, known_field_nested(DEEP), 422, "invalid"),
    "msgpack deep nesting in an unknown field": (
        PUSH,
        MSGPACK,
        b"\x82\xa9envelopes\x90\xa1x" + b"\x91" * DEEP + b"\xc0",
        400,
        "malformed",
    ),
    "text/plain": (PUSH, "text/plain", b"envelopes", 415, "unsupported_media_type"),
    "xml": (PUSH, "application/xml", b"<envelopes/>", 415, "unsupported_media_type"),
    "JSON invalid UTF-8": (LOGIN, JSON, b'{"account": "\xff\xfe"}', 400, "malformed"),
    "msgpack invalid UTF-8": (LOGIN, MSGPACK, b"\x81\xa7account\xa2\xff\xfe", 400, "malformed"),
    "msgpack encoded surrogate": (
        LOGIN,
        MSGPACK,
        b"\x81\xa7account\xa3\xed\xa0\x80",
        400,
        "malformed",
    ),
}


def json_case(route: tuple[str, str], value: object, status: int, code: str) -> tuple[Any, ...]:
    return (route, JSON, msgspec.json.encode(value), status, code)


def keys_change(**fields: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "bundle": b64(b"new bundle"),
        "kdf": {"salt": b64(b"t" * 16)},
        "auth_key": b64(b"n" * 32),
        "expected_version": 1,
    }
    value.update(fields)
    return value


JSON_CASES: dict[str, tuple[tuple[str, str], dict[str, Any], int, str]] = {
    "expected version negative": (KEYS, keys_change(expected_version=-1), 422, "invalid"),
    "expected version 2^63": (KEYS, keys_change(expected_version=MAX_HLC + 1), 422, "invalid"),
    "expected version 2^64": (KEYS, keys_change(expected_version=1 << 64), 422, "invalid"),
    "expected version a float": (KEYS, keys_change(expected_version=1.5), 422, "invalid"),
    "expected version a string": (KEYS, keys_change(expected_version="1"), 422, "invalid"),
    "kdf memory negative": (
        KEYS,
        keys_change(kdf={"salt": b64(b"t" * 16), "memory_kib": -1}),
        422,
        "invalid",
    ),
    "kdf memory huge": (
        KEYS,
        keys_change(kdf={"salt": b64(b"t" * 16), "memory_kib": 1 << 62}),
        422,
        "invalid",
    ),
    "kdf salt short": (KEYS, keys_change(kdf={"salt": b64(b"t" * 15)}), 422, "invalid"),
    "bundle empty": (KEYS, keys_change(bundle=""), 422, "invalid"),
    "bundle over 64 KiB": (KEYS, keys_change(bundle=b64(b"b" * (64 * 1024 + 1))), 422, "invalid"),
    "auth key 31 bytes": (KEYS, keys_change(auth_key=b64(b"n" * 31)), 422, "invalid"),
    "account with NUL": (REGISTER, {"account": "b\x00ob"}, 422, "invalid"),
    "account empty": (REGISTER, {"account": ""}, 422, "invalid"),
    "account over 256": (REGISTER, {"account": "b" * 257}, 422, "invalid"),
    "account not NFC": (REGISTER, {"account": "e\u0301"}, 422, "invalid"),
    "account a number": (REGISTER, {"account": 5}, 422, "invalid"),
    "device name with NUL": (REGISTER, {"device_name": "\x00"}, 422, "invalid"),
    "device name over 128": (REGISTER, {"device_name": "d" * 129}, 422, "invalid"),
    "invite over 128": (REGISTER, {"invite": "i" * 129}, 422, "invalid"),
    "rename with NUL": (RENAME, {"name": "ph\x00one"}, 422, "invalid"),
    "rename over 128": (RENAME, {"name": "p" * 129}, 422, "invalid"),
    "rename empty": (RENAME, {"name": ""}, 422, "invalid"),
}


def send(alice: Alice, route: tuple[str, str], content_type: str | None, data: bytes) -> Any:
    method, path = route
    path = path.replace("{device}", alice.session.device_id)
    return alice.relay.client.request(
        method, path, content=data, headers=alice.headers(content_type)
    )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_broken_bodies_are_refused_with_a_code_and_store_nothing(alice: Alice, case: str) -> None:
    route, content_type, data, status, code = CASES[case]
    answer = send(alice, route, content_type, data)
    assert answer.status_code == status, answer.content[:300]
    assert error_body(answer.content, answer.headers["content-type"])["code"] == code
    assert_nothing_stored(alice)


@pytest.mark.parametrize("case", JSON_CASES, ids=str)
def test_values_out_of_bounds_are_refused_and_store_nothing(alice: Alice, case: str) -> None:
    route, fields, status, code = JSON_CASES[case]
    value = register_json(alice, **fields) if route == REGISTER else fields
    data = msgspec.json.encode(value)
    answer = send(alice, route, JSON, data)
    assert answer.status_code == status, answer.content[:300]
    assert error_body(answer.content, answer.headers["content-type"])["code"] == code
    assert_nothing_stored(alice)


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00", b"\\ud800x", b"\\udbff\\u0041"])
def test_lone_surrogates_in_json_strings_are_refused(alice: Alice, escape: bytes) -> None:
    for route in (REGISTER, LOGIN, RENAME):
        field = b"name" if route == RENAME else b"account"
        data = b'{"' + field + b'": "a' + escape + b'"}'
        answer = send(alice, route, JSON, data)
        assert answer.status_code in (400, 422), (route, answer.content)
        assert error_body(answer.content, answer.headers["content-type"])["code"] in {
            "malformed",
            "invalid",
        }
    assert_nothing_stored(alice)


def test_names_at_their_bound_are_taken(alice: Alice) -> None:
    value = register_json(alice, account="b" * 256, device_name="d" * 128)
    answer = alice.relay.client.post(
        "/v1/register", content=msgspec.json.encode(value), headers={"content-type": JSON}
    )
    assert answer.status_code == 201
    assert sorted(a.name for a in alice.relay.storage.accounts()) == ["alice", "b" * 256]


def test_unknown_fields_are_ignored_and_decide_nothing(alice: Alice) -> None:
    """Extra keys naming another account, a seq, an epoch or a bundle version change nothing."""
    client = alice.relay.client
    bob = register_json(
        alice,
        bundle_version=99,
        account_epoch="chosen-epoch",
        storage_id="chosen-storage",
        head=1000,
        is_admin=True,
        devices=["alice"],
    )
    registered = client.post(
        "/v1/register", content=msgspec.json.encode(bob), headers={"content-type": JSON}
    )
    assert registered.status_code == 201
    state = alice.relay.storage.state("bob")
    assert (state.head, state.account_epoch == "chosen-epoch") == (0, False)
    assert state.storage_id == alice.relay.storage.storage_id
    record = alice.relay.storage.account("bob")
    assert record is not None and record.bundle_version == 1
    mine = envelope(b"k" * 16, 1, HLC, {1: HLC})
    push = {"envelopes": [b64(mine)], "account": "bob", "seq": 77, "receipts": []}
    pushed = client.post("/v1/push", content=msgspec.json.encode(push), headers=alice.headers(JSON))
    result = msgspec.msgpack.decode(pushed.content, type=PushResult)
    assert [r.seq for r in result.receipts] == [1]
    assert alice.relay.storage.stored_versions("alice") == 1
    assert alice.relay.storage.stored_versions("bob") == 0


BAD_INTEGERS = [
    "-1",
    "abc",
    str(1 << 63),
    str(10**30),
    "",
    "+1",
    " 1",
    "1e3",
    "0x10",
    "1.0",
    "%C2%B2",
    "%D9%A1",
    "%EF%BC%91",
]
"""Not integers in range: negative, too large, not digits, and Unicode digits (², Arabic-Indic
one, fullwidth one) that str.isdigit() accepts and int() does not, or does."""


@pytest.mark.parametrize("raw", BAD_INTEGERS)
@pytest.mark.parametrize("name", ["cursor", "limit"])
def test_bad_query_integers_are_refused(alice: Alice, name: str, raw: str) -> None:
    answer = alice.relay.client.get(f"/v1/pull?{name}={raw}", headers=alice.headers(None))
    assert answer.status_code == 422, answer.content
    assert error_body(answer.content, answer.headers["content-type"])["code"] == "invalid"


def test_the_largest_cursor_is_taken(alice: Alice) -> None:
    answer = alice.relay.client.get(f"/v1/pull?cursor={MAX_HLC}", headers=alice.headers(None))
    assert answer.status_code == 200
    page = msgspec.msgpack.decode(answer.content, type=Page)
    assert (page.cursor, page.entries, page.has_more) == (MAX_HLC, [], False)


@pytest.mark.parametrize("device_id", ["%00", "x" * 10_000, "%ED%A0%80", "..%2F..%2Fstate", "%FF"])
def test_odd_device_ids_are_not_found(alice: Alice, device_id: str) -> None:
    client = alice.relay.client
    proof = msgspec.msgpack.encode({"auth_key": alice.keys.auth_key})
    for method, data in (("PATCH", msgspec.msgpack.encode({"name": "x"})), ("DELETE", proof)):
        answer = client.request(
            method, f"/v1/devices/{device_id}", content=data, headers=alice.headers(MSGPACK)
        )
        assert answer.status_code == 404, answer.content
        assert error_body(answer.content, answer.headers["content-type"])["code"] == "not_found"
    assert_nothing_stored(alice)


@pytest.mark.parametrize(
    "last_event_id", [b"\xb2", "\u0661".encode(), b"-1", b"abc", b"9" * 40, b"\xff", b""]
)
def test_odd_last_event_ids_are_ignored(alice: Alice, last_event_id: bytes) -> None:
    """Sent as raw bytes, as a server passes them on ("²" is one latin-1 byte)."""
    answer = call_asgi(
        alice.relay.app,
        "GET",
        "/v1/events",
        [b""],
        alice.headers(None),
        raw_headers=[(b"last-event-id", last_event_id)],
        hang_up_after_first_body=True,
    )
    assert answer.status == 200
    assert set(answer.body.decode().split("\r\n")[:3]) == {"event: head", "id: 0", "data: 0"}
