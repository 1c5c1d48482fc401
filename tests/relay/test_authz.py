"""Authorization matrix: every authenticated route of the app, enumerated from the route table,
against every way a bearer token can be wrong — and another account's valid token.

Routes are account-implicit (the account is the one the token names), so a foreign token can
only ever reach its own account: device ids of another account look exactly like ids that do
not exist, and push/pull/state/keys/events show only the caller's data.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import msgspec
import pytest
from starlette.routing import Route

from relay import tokens
from relay.app import ENDPOINTS, Endpoint
from replica.wire import (
    DeleteAccount,
    DeviceList,
    KdfParams,
    KeyBundleValue,
    KeyProof,
    LoginRequest,
    Page,
    PushBatch,
    PushResult,
    PutKeyBundle,
    RefreshRequest,
    RegisterRequest,
    RelayState,
    RenameDevice,
    Session,
    auth_key_hash,
)
from tests.relay.api import KDF, MSGPACK, Keys, body, decode, login, new_keys, register
from tests.relay.conftest import HLC, envelope
from tests.relay.harness import BACKENDS, Relay, Relays, code_of, error_body, open_relays

PUBLIC_ROUTES = {
    ("GET", "/v1/info"),
    ("GET", "/v1/health"),
    ("POST", "/v1/prelogin"),
    ("POST", "/v1/register"),
    ("POST", "/v1/login"),
    ("POST", "/v1/refresh"),
    ("GET", "/v1/openapi.json"),
}
"""The only routes that answer without a bearer token; a new one must be added here on purpose."""

AUTHENTICATED = [e for e in ENDPOINTS if e.auth]
ALICE_BUNDLE = b"alice's wrapped account key"
UNAUTHORIZED = {"code": "unauthorized", "message": "a valid bearer token is required"}


@pytest.fixture(params=BACKENDS)
def relays(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path, request.param)


@dataclass
class World:
    """Alice (the victim: a laptop, a revoked phone, data) and Mallory (the attacker)."""

    relay: Relay
    alice_keys: Keys
    alice: Session
    revoked: Session
    mallory_keys: Keys
    mallory: Session
    alice_envelopes: list[bytes]
    alice_state: RelayState


@pytest.fixture
def world(relays: Relays) -> World:
    relay = relays()
    client = relay.client
    alice_keys, mallory_keys = new_keys(), new_keys()
    request = RegisterRequest(
        "alice",
        alice_keys.auth_key,
        auth_key_hash(alice_keys.recovery_auth_key),
        KDF,
        ALICE_BUNDLE,
        "alice-laptop",
    )
    registered = client.post("/v1/register", content=body(request), headers=MSGPACK)
    alice = decode(registered.content, Session)
    revoked = login(client, "alice", alice_keys.auth_key, "alice-old-phone")
    proof = body(KeyProof(alice_keys.auth_key))
    path = f"/v1/devices/{revoked.device_id}"
    assert client.request("DELETE", path, content=proof, headers=bearer(alice)).status_code == 204
    login(client, "alice", alice_keys.auth_key, "alice-tablet")
    envelopes = [envelope(bytes([i]) * 16, 7, HLC + i, {7: HLC + i}) for i in range(3)]
    pushed = client.post("/v1/push", content=body(PushBatch(envelopes)), headers=bearer(alice))
    assert pushed.status_code == 200
    mallory = register(client, "mallory", mallory_keys, device="mallory-box")
    state = relay.storage.state("alice")
    return World(relay, alice_keys, alice, revoked, mallory_keys, mallory, envelopes, state)


def bearer(session: Session) -> dict[str, str]:
    return {"authorization": f"Bearer {session.access_token}", **MSGPACK}


def request_body(endpoint: Endpoint, keys: Keys) -> bytes:
    """A body the endpoint would accept from the account whose `keys` these are — so a route
    that forgot its token check would act on it, and the matrix would see it."""
    bodies: dict[type | None, object] = {
        None: None,
        RenameDevice: RenameDevice("renamed-by-attacker"),
        PutKeyBundle: PutKeyBundle(
            b"attacker-bundle", KdfParams(b"m" * 16), b"x" * 32, 1, b"y" * 32
        ),
        DeleteAccount: DeleteAccount(keys.auth_key),
        KeyProof: KeyProof(keys.auth_key),
        PushBatch: PushBatch([envelope(b"m" * 16, 9, HLC, {9: HLC})]),
    }
    assert endpoint.body in bodies, f"add a valid body for {endpoint.body} to the matrix"
    value = bodies[endpoint.body]
    return b"" if value is None else body(value)


def send(
    relay: Relay, endpoint: Endpoint, headers: dict[str, str], device_id: str, data: bytes
) -> httpx2.Response:
    path = endpoint.path.replace("{device_id}", device_id)
    return relay.client.request(endpoint.method, path, content=data, headers=headers)


def alice_secrets(world: World) -> list[bytes]:
    """What must never appear in an answer to anybody but Alice."""
    state = world.relay.storage.state("alice")
    devices = world.relay.storage.devices("alice")
    values = [state.account_epoch, state.storage_id, "alice", *(d.name for d in devices)]
    values += [d.id for d in devices] + [world.revoked.device_id]
    return [v.encode() for v in values] + world.alice_envelopes + [ALICE_BUNDLE]


def assert_alice_untouched(world: World) -> None:
    storage = world.relay.storage
    record = storage.account("alice")
    assert record is not None and record.bundle == ALICE_BUNDLE and record.bundle_version == 1
    names = sorted(d.name for d in storage.devices("alice"))
    assert names == ["alice-laptop", "alice-tablet"]
    assert [e.envelope for e in storage.pull("alice", 0).entries] == world.alice_envelopes
    assert storage.state("alice") == world.alice_state  # not reseeded


# -- the route table covers the app ----------------------------------------------------------


def test_every_route_of_the_app_is_in_the_matrix_or_public(relays: Relays) -> None:
    app = relays().app
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert all(isinstance(route, Route) for route in app.routes), "a mount escapes the matrix"
    matrix = {(e.method, e.path) for e in AUTHENTICATED}
    assert served == matrix | PUBLIC_ROUTES
    assert not matrix & PUBLIC_ROUTES
    assert {(e.method, e.path) for e in ENDPOINTS if not e.auth} <= PUBLIC_ROUTES


def test_public_routes_are_documented_without_security(relays: Relays) -> None:
    document = relays().client.get("/v1/openapi.json").json()
    for endpoint in ENDPOINTS:
        operation = document["paths"][endpoint.path][endpoint.method.lower()]
        assert ("security" in operation) == endpoint.auth, endpoint.path


# -- every bad token, every route --------------------------------------------------------------


def bad_credentials(world: World) -> dict[str, dict[str, str]]:
    random_token = tokens.new_token()
    return {
        "none": dict(MSGPACK),
        "empty bearer": {"authorization": "Bearer ", **MSGPACK},
        "other scheme": {"authorization": f"Basic {world.alice.access_token}", **MSGPACK},
        "malformed": {"authorization": "Bearer not a token; DROP TABLE tokens", **MSGPACK},
        "too long": {"authorization": f"Bearer {world.alice.access_token}x", **MSGPACK},
        "random well-formed": {"authorization": f"Bearer {random_token}", **MSGPACK},
        "refresh token": {"authorization": f"Bearer {world.alice.refresh_token}", **MSGPACK},
    }


@pytest.mark.parametrize("endpoint", AUTHENTICATED, ids=lambda e: f"{e.method} {e.path}")
def test_every_bad_token_gets_one_identical_401_and_nothing_happens(
    endpoint: Endpoint, world: World
) -> None:
    relay = world.relay
    data = request_body(endpoint, world.alice_keys)
    reference = relay.client.get("/v1/state", headers=MSGPACK)
    assert reference.status_code == 401
    assert error_body(reference.content, reference.headers["content-type"]) == UNAUTHORIZED
    secrets = alice_secrets(world)
    for device_id in (world.alice.device_id, "0000000000000000"):
        for what, headers in bad_credentials(world).items():
            answer = send(relay, endpoint, headers, device_id, data)
            assert answer.status_code == 401, (what, answer.status_code, answer.content)
            assert answer.content == reference.content, what
            assert "retry-after" not in answer.headers
            assert not [s for s in secrets if s in answer.content], what
    assert_alice_untouched(world)


@pytest.mark.parametrize("endpoint", AUTHENTICATED, ids=lambda e: f"{e.method} {e.path}")
def test_a_revoked_devices_token_is_told_so_and_nothing_happens(
    endpoint: Endpoint, world: World
) -> None:
    """Its holder is that device: it should stop, not log in again as a new one. Its refresh
    token is told the same; a token of a device that never existed still gets the 401."""
    relay = world.relay
    data = request_body(endpoint, world.alice_keys)
    for device_id in (world.alice.device_id, world.revoked.device_id):
        answer = send(relay, endpoint, bearer(world.revoked), device_id, data)
        assert (answer.status_code, code_of(answer)) == (403, "device_revoked"), answer.content
    refresh = body(RefreshRequest(world.revoked.refresh_token))
    answer = relay.client.post("/v1/refresh", content=refresh, headers=MSGPACK)
    assert (answer.status_code, code_of(answer)) == (403, "device_revoked"), answer.content
    assert_alice_untouched(world)


@pytest.mark.parametrize("endpoint", AUTHENTICATED, ids=lambda e: f"{e.method} {e.path}")
def test_an_expired_token_gets_the_same_401(endpoint: Endpoint, world: World) -> None:
    relay = world.relay
    reference = relay.client.get("/v1/state", headers=MSGPACK).content
    assert relay.client.get("/v1/state", headers=bearer(world.alice)).status_code == 200
    relay.clock.advance(relay.config.access_token_s * 1000 - 1)
    assert relay.client.get("/v1/state", headers=bearer(world.alice)).status_code == 200
    relay.clock.advance(1)  # the instant it expires
    data = request_body(endpoint, world.alice_keys)
    answer = send(relay, endpoint, bearer(world.alice), world.alice.device_id, data)
    assert (answer.status_code, answer.content) == (401, reference)
    assert_alice_untouched(world)


def test_a_deleted_accounts_token_gets_the_same_401(world: World) -> None:
    client = world.relay.client
    reference = client.get("/v1/state", headers=MSGPACK).content
    gone = client.request(
        "DELETE",
        "/v1/account",
        content=body(DeleteAccount(world.mallory_keys.auth_key)),
        headers=bearer(world.mallory),
    )
    assert gone.status_code == 204
    for endpoint in AUTHENTICATED:
        data = request_body(endpoint, world.mallory_keys)
        answer = send(world.relay, endpoint, bearer(world.mallory), world.mallory.device_id, data)
        assert (answer.status_code, answer.content) == (401, reference), endpoint.path
    assert_alice_untouched(world)


# -- another account's valid token -------------------------------------------------------------


def test_another_accounts_device_ids_look_like_ids_that_do_not_exist(world: World) -> None:
    client = world.relay.client
    victims = [d.id for d in world.relay.storage.devices("alice")]
    rename = body(RenameDevice("pwned"))
    revoke = body(KeyProof(world.mallory_keys.auth_key))  # Mallory's own key: it opens her door
    for method, data in (("PATCH", rename), ("DELETE", revoke)):
        nonexistent = client.request(
            method, "/v1/devices/0123456789abcdef", content=data, headers=bearer(world.mallory)
        )
        assert nonexistent.status_code == 404
        for device_id in victims:
            answer = client.request(
                method, f"/v1/devices/{device_id}", content=data, headers=bearer(world.mallory)
            )
            assert (answer.status_code, answer.content) == (404, nonexistent.content)
    assert_alice_untouched(world)
    assert client.get("/v1/state", headers=bearer(world.alice)).status_code == 200


def test_another_accounts_token_only_ever_sees_its_own_account(world: World) -> None:
    client, mallory = world.relay.client, bearer(world.mallory)
    secrets = alice_secrets(world)
    storage_id = world.relay.storage.storage_id.encode()
    answers = [
        client.get("/v1/state", headers=mallory),
        client.get("/v1/pull?cursor=0", headers=mallory),
        client.post(
            "/v1/keys/read", content=body(KeyProof(world.mallory_keys.auth_key)), headers=mallory
        ),
        client.get("/v1/devices", headers=mallory),
    ]
    for answer in answers:
        assert answer.status_code == 200
        leaked = [s for s in secrets if s in answer.content and s != storage_id]
        assert not leaked, (answer.url, leaked)
    state = decode(answers[0].content, RelayState)
    assert (
        state.head == 0 and state.account_epoch != world.relay.storage.state("alice").account_epoch
    )
    assert decode(answers[1].content, Page).entries == []
    devices = decode(answers[3].content, DeviceList).devices
    assert [(d.name, d.current) for d in devices] == [("mallory-box", True)]

    mine = envelope(b"m" * 16, 9, HLC, {9: HLC})
    pushed = client.post("/v1/push", content=body(PushBatch([mine])), headers=mallory)
    assert [r.seq for r in decode(pushed.content, PushResult).receipts] == [1]  # Mallory's seq
    page = decode(client.get("/v1/pull", headers=mallory).content, Page)
    assert [e.envelope for e in page.entries] == [mine]
    current = world.mallory_keys.auth_key
    change = PutKeyBundle(b"mallory-bundle", KdfParams(b"m" * 16), b"x" * 32, 1, current)
    put = client.put("/v1/keys", content=body(change), headers=mallory)
    assert decode(put.content, KeyBundleValue) == KeyBundleValue(b"mallory-bundle", 2)
    alices = PutKeyBundle(b"x", KdfParams(b"m" * 16), b"x" * 32, 2, world.alice_keys.auth_key)
    assert client.put("/v1/keys", content=body(alices), headers=mallory).status_code == 403
    with_alices_key = client.request(
        "DELETE",
        "/v1/account",
        content=body(DeleteAccount(world.alice_keys.auth_key)),
        headers=mallory,
    )
    assert with_alices_key.status_code == 403
    assert error_body(with_alices_key.content, with_alices_key.headers["content-type"])["code"] == (
        "forbidden"
    )
    with_alices = client.post(
        "/v1/reseed", content=body(KeyProof(world.alice_keys.auth_key)), headers=mallory
    )
    assert with_alices.status_code == 403
    new_passphrase_key = body(KeyProof(b"x" * 32))  # the key her bundle change installed
    own = client.post("/v1/reseed", content=new_passphrase_key, headers=mallory)
    assert own.status_code == 200
    assert_alice_untouched(world)
    assert world.relay.storage.state("alice").head == 3


def test_a_token_alone_cannot_revoke_reseed_or_read_the_key_bundle(world: World) -> None:
    """Alice's own valid access token, stolen: without her current auth key it revokes no
    device, makes no device reseed and reads no key bundle (issue 12: it could do all three)."""
    client, alice = world.relay.client, bearer(world.alice)
    tablet = next(d.id for d in world.relay.storage.devices("alice") if d.name == "alice-tablet")
    guessed, recovered = body(KeyProof(b"g" * 32)), body(KeyProof(world.mallory_keys.auth_key))
    answers = [
        client.request("DELETE", f"/v1/devices/{tablet}", content=proof, headers=alice)
        for proof in (guessed, recovered)
    ] + [
        client.post(path, content=proof, headers=alice)
        for path in ("/v1/reseed", "/v1/keys/read")
        for proof in (guessed, recovered)
    ]
    assert [(a.status_code, code_of(a)) for a in answers] == [(403, "forbidden")] * 6
    assert not any(ALICE_BUNDLE in a.content for a in answers)
    bare = [
        client.request("DELETE", f"/v1/devices/{tablet}", headers=alice),
        client.post("/v1/reseed", headers=alice),
        client.post("/v1/keys/read", headers=alice),
    ]
    assert [a.status_code for a in bare] == [400] * 3
    assert_alice_untouched(world)


def test_the_event_feed_only_tells_the_callers_own_head(world: World) -> None:
    client = world.relay.client
    with client.stream("GET", "/v1/events", headers=bearer(world.mallory)) as events:
        lines = events.iter_lines()
        assert {next(lines) for _ in range(3)} == {"event: head", "id: 0", "data: 0"}
        more = [envelope(b"z" * 16, 7, HLC + 9, {7: HLC + 9})]
        alice_push = client.post(
            "/v1/push", content=body(PushBatch(more)), headers=bearer(world.alice)
        )
        assert decode(alice_push.content, PushResult).state.head == 4
        mine = [envelope(b"m" * 16, 9, HLC, {9: HLC})]
        client.post("/v1/push", content=body(PushBatch(mine)), headers=bearer(world.mallory))
        assert next(lines) == ""
        assert {next(lines) for _ in range(3)} == {"event: head", "id: 1", "data: 1"}


def test_one_accounts_tokens_are_not_anothers_refresh_or_session(world: World) -> None:
    client = world.relay.client
    decoded = msgspec.msgpack.encode({"refresh_token": world.alice.access_token})
    refreshed = client.post("/v1/refresh", content=decoded, headers=MSGPACK)
    assert refreshed.status_code == 401  # an access token is not a refresh token
    assert client.get("/v1/state", headers=bearer(world.alice)).status_code == 200


def test_logging_in_as_another_accounts_device_makes_a_new_device(world: World) -> None:
    """A login names the device it was (to keep its one entry): Mallory naming Alice's
    laptop gets a new device of her own, and Alice's laptop keeps its tokens."""
    client = world.relay.client
    request = LoginRequest("mallory", world.mallory_keys.auth_key, "x", world.alice.device_id)
    answer = client.post("/v1/login", content=body(request), headers=MSGPACK)
    session = decode(answer.content, Session)
    assert answer.status_code == 200 and session.device_id != world.alice.device_id
    assert client.get("/v1/state", headers=bearer(world.alice)).status_code == 200
    assert_alice_untouched(world)
    own = LoginRequest("mallory", world.mallory_keys.auth_key, "x", session.device_id)
    again = decode(client.post("/v1/login", content=body(own), headers=MSGPACK).content, Session)
    assert again.device_id == session.device_id  # her own device: kept, one entry
    mallorys = world.relay.storage.devices("mallory")
    assert sorted(d.id for d in mallorys) == sorted({world.mallory.device_id, session.device_id})
