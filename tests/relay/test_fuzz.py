"""Schemathesis in process against the relay's own OpenAPI document: every operation, valid
and invalid inputs generated from the schemas, signed in with a real account, and not one
answer may be a server error.

`SEALSYNC_FUZZ_EXAMPLES` sets the examples per operation and generation mode (default 30,
which keeps the run well under a minute).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import jsonschema_rs
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.python import asgi
from schemathesis.specs.openapi.definitions import OPENAPI_31  # the official 3.1 meta-schema

from relay.app import ENDPOINTS
from replica.errors import ProtocolError
from replica.wire import (
    MAX_HLC,
    KdfParams,
    LoginRequest,
    PreloginRequest,
    PushBatch,
    PutKeyBundle,
    RegisterRequest,
    Session,
    encode_header,
)
from tests.relay.api import new_keys, register
from tests.relay.conftest import NOW_MS
from tests.relay.harness import BACKENDS, Relay, Relays, open_relays

EXAMPLES = int(os.environ.get("SEALSYNC_FUZZ_EXAMPLES", "30"))


class Limits(TypedDict):
    """The settings `UNLIMITED` overrides, typed per key so `relays(**UNLIMITED)` type-checks."""

    requests_per_second: float
    burst: int
    max_login_failures: int
    account_login_failures: int


UNLIMITED: Limits = {
    "requests_per_second": 1e9,
    "burst": 1_000_000_000,
    "max_login_failures": 1_000_000_000,
    "account_login_failures": 1_000_000_000,
}
"""Rate limits out of the way (the fake clock never moves), so every example reaches a handler."""


@pytest.fixture(params=BACKENDS)
def relays(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path, request.param)


@pytest.fixture
def relay(relays: Relays) -> Relay:
    return relays(**UNLIMITED)


@pytest.fixture
def session(relay: Relay) -> Session:
    return register(relay.client, "fuzz", new_keys())


@pytest.fixture
def relay_schema(relay: Relay) -> Any:
    schema = schemathesis.openapi.from_asgi("/v1/openapi.json", relay.app)
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=EXAMPLES,
        deterministic=True,
    )
    return schema


def test_the_openapi_document_is_valid_openapi_3_1(relay: Relay) -> None:
    document = relay.client.get("/v1/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    errors = [
        e.message for e in jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(document)
    ]
    assert not errors


def test_schemathesis_loads_every_operation(relay_schema: Any) -> None:
    loaded = {
        (o.method.upper(), o.path) for o in (r.ok() for r in relay_schema.get_all_operations())
    }
    assert loaded == {(e.method, e.path) for e in ENDPOINTS}
    with_bodies = {(e.method, e.path) for e in ENDPOINTS if e.body is not None}
    assert len(with_bodies) >= 8


CASES = [
    (e.method, e.path, mode)
    for e in ENDPOINTS
    if e.path != "/v1/events"
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or e.body or e.query or "{" in e.path
]
"""Every operation but the event stream, which never ends (its bad tokens are in test_authz);
invalid inputs wherever there is an input to break.

Driven with Hypothesis directly: schemathesis' own pytest parametrization (`from_fixture`)
fails under pytest 9 (it sets the private `Function._nodeid`)."""


@pytest.fixture
def asgi_client(relay: Relay) -> Iterator[Any]:
    """One in-process client for every case (schemathesis would start one per call)."""
    with asgi.get_client(relay.app) as client:  # type: ignore[arg-type]  # schemathesis' ASGIApp sends dicts, Starlette's a MutableMapping
        yield client


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=str)
def test_no_input_makes_a_server_error(
    relay_schema: Any,
    session: Session,
    asgi_client: Any,
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    headers = {"authorization": f"Bearer {session.access_token}"}
    operation = relay_schema[path][method]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: Any) -> None:
        case.call_and_validate(session=asgi_client, headers=headers, checks=[not_a_server_error])

    call()


# -- well-shaped bodies with hostile values ------------------------------------------------------
# Schemathesis rarely gets past the decoder on these routes (its base64 strings seldom decode to
# exactly 32 bytes), so Hypothesis builds the typed messages itself and sends them as MessagePack.

names = st.text(min_size=1, max_size=300)
kdfs = st.builds(
    KdfParams,
    st.binary(min_size=0, max_size=20),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.integers(-(1 << 63), (1 << 64) - 1),
    st.integers(-(1 << 63), (1 << 64) - 1),
)
keys = st.binary(min_size=32, max_size=32)
SHAPED = settings(
    max_examples=EXAMPLES * 2,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


def post(relay: Relay, path: str, value: object, session: Session | None = None) -> int:
    headers = {"content-type": "application/msgpack"}
    if session is not None:
        headers["authorization"] = f"Bearer {session.access_token}"
    data = msgspec.msgpack.encode(value)
    answer = relay.client.request(
        "PUT" if path == "/v1/keys" else "POST", path, content=data, headers=headers
    )
    assert answer.status_code < 500, answer.content
    return answer.status_code


def test_shaped_accounts_and_logins_never_make_a_server_error(
    relay: Relay, session: Session
) -> None:
    @SHAPED
    @given(
        name=names,
        device=names,
        auth=keys,
        kdf=kdfs,
        bundle=st.binary(min_size=0, max_size=70_000),
        version=st.integers(0, MAX_HLC),
    )
    def attempt(
        name: str, device: str, auth: bytes, kdf: KdfParams, bundle: bytes, version: int
    ) -> None:
        assume(unicodedata.normalize("NFC", name) == name or len(name) % 2)  # mostly valid names
        assert post(relay, "/v1/prelogin", PreloginRequest(name)) in (200, 422)
        registered = post(
            relay, "/v1/register", RegisterRequest(name, auth, auth, kdf, bundle, device)
        )
        assert registered in (201, 409, 422)
        assert post(relay, "/v1/login", LoginRequest(name, auth, device)) in (200, 401, 422, 429)
        change = PutKeyBundle(bundle, kdf, auth, version, auth)
        assert post(relay, "/v1/keys", change, session) in (200, 403, 409, 422)

    attempt()


def header_parts() -> st.SearchStrategy[tuple[int, bytes, int, int, dict[int, int]]]:
    u64 = st.integers(0, (1 << 64) - 1)
    hlcs = st.one_of(st.integers(1, MAX_HLC), st.integers(NOW_MS << 16, (NOW_MS + 600_000) << 16))
    return st.tuples(
        st.integers(0, (1 << 32) - 1),
        st.binary(min_size=16, max_size=16),
        hlcs,
        u64,
        st.dictionaries(u64, hlcs, max_size=4),
    )


@st.composite
def pushed_envelopes(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    epoch, key, hlc, node, vector = draw(header_parts())
    try:
        header = encode_header(epoch, key, hlc, node, {**vector, node: hlc})
    except ProtocolError:
        return draw(st.binary(max_size=200))
    return header + draw(st.binary(min_size=28, max_size=200))


def test_shaped_pushes_and_pulls_never_make_a_server_error(relay: Relay, session: Session) -> None:
    @SHAPED
    @given(
        batch=st.lists(pushed_envelopes(), max_size=20),
        cursor=st.integers(0, MAX_HLC),
    )
    def attempt(batch: list[bytes], cursor: int) -> None:
        assert post(relay, "/v1/push", PushBatch(batch), session) == 200
        answer = relay.client.get(
            f"/v1/pull?cursor={cursor % 50}",
            headers={"authorization": f"Bearer {session.access_token}"},
        )
        assert answer.status_code == 200

    attempt()
