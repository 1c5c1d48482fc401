"""Schemathesis in process against the relay's own OpenAPI document: every operation, valid
and invalid inputs generated from the schemas, signed in with a real account, and not one
answer may be a server error.

`SEALSYNC_FUZZ_EXAMPLES` sets the examples per operation and generation mode (default 30,
which keeps the run well under a minute).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.definitions import OPENAPI_31  # the official 3.1 meta-schema

from relay.app import ENDPOINTS
from replica.wire import Session
from tests.relay.api import new_keys, register
from tests.relay.harness import Relay, Relays, open_relays

EXAMPLES = int(os.environ.get("SEALSYNC_FUZZ_EXAMPLES", "30"))
UNLIMITED = {
    "requests_per_second": 1e9,
    "burst": 1_000_000_000,
    "max_login_failures": 1_000_000_000,
}
"""Rate limits out of the way (the fake clock never moves), so every example reaches a handler."""


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path)


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
    with schemathesis.python.asgi.get_client(relay.app) as client:
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
    headers = {"authorization": f"Bearer {session.access_token}", "accept": "application/json"}
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
