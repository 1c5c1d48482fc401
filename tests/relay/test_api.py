"""The HTTP API in process (Starlette's TestClient over the real app and a real SQLite file):
accounts, devices, tokens, key bundle, push/pull, reseed, deletion, the live feed."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from relay import accesslog, tokens
from relay.app import create_app
from relay.config import RelayConfig
from relay.errors import StoreFailedError
from relay.memory import MemoryRelay
from relay.signing import Pusher
from relay.sqlite import SQLiteStorage
from relay.storage import Storage
from replica.wire import (
    PROTOCOL_VERSION,
    DeleteAccount,
    DeviceList,
    ErrorCode,
    KdfParams,
    KeyBundleValue,
    KeyProof,
    LoginRequest,
    Page,
    PreloginRequest,
    PreloginResponse,
    PushBatch,
    PushResult,
    PutKeyBundle,
    RefreshRequest,
    RegisterRequest,
    RelayInfo,
    RelayState,
    RenameDevice,
    Session,
)
from tests.conftest import FakeClock
from tests.relay.api import (
    MSGPACK,
    bearer,
    body,
    decode,
    error_code,
    login,
    new_keys,
    register,
)
from tests.relay.conftest import HLC, NOW_MS, envelope

AppFactory = Callable[..., TestClient]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_MS)


@pytest.fixture
def make_client(tmp_path: Path, clock: FakeClock) -> Iterator[AppFactory]:
    clients: list[TestClient] = []

    def make(**settings: Any) -> TestClient:
        config = RelayConfig(**{"open_signup": True, "accept_unsigned_pushes": True, **settings})
        rules = config.version_rules(clock)
        storage = SQLiteStorage(tmp_path / f"relay{len(clients)}.db", rules)
        client = TestClient(create_app(storage, config, clock_ms=clock))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    return make_client()


def test_info_tells_the_protocol_version_and_limits(make_client: AppFactory) -> None:
    info = decode(make_client(page_size=7).get("/v1/info").content, RelayInfo)
    assert info.protocol_version == PROTOCOL_VERSION == 5
    assert info.limits.page_size == 7 and info.open_signup


def test_prelogin_answers_unknown_accounts_with_stable_fake_parameters(client: TestClient) -> None:
    def prelogin(name: str) -> KdfParams:
        answer = client.post("/v1/prelogin", content=body(PreloginRequest(name)), headers=MSGPACK)
        return decode(answer.content, PreloginResponse).kdf

    register(client, "alice", new_keys())
    assert prelogin("alice").salt == b"s" * 16
    fake = prelogin("nobody")
    assert fake == prelogin("nobody") and fake != prelogin("somebody-else")
    assert (fake.memory_kib, fake.iterations, fake.lanes) == (65536, 3, 1)


def test_register_login_and_refresh_give_working_device_tokens(
    client: TestClient, clock: FakeClock
) -> None:
    keys = new_keys()
    first = register(client, "alice", keys)
    second = login(client, "alice", keys.recovery_auth_key, "phone")  # the recovery key works too
    listed = decode(client.get("/v1/devices", headers=bearer(second)).content, DeviceList)
    assert sorted((d.name, d.current) for d in listed.devices) == [
        ("laptop", False),
        ("phone", True),
    ]
    clock.now_ms += 3600_000 + 1  # the access token expired
    assert client.get("/v1/state", headers=bearer(first)).status_code == 401
    answer = client.post(
        "/v1/refresh", content=body(RefreshRequest(first.refresh_token)), headers=MSGPACK
    )
    renewed = decode(answer.content, Session)
    assert client.get("/v1/state", headers=bearer(renewed)).status_code == 200

    def refresh(session: Session) -> int:
        request = RefreshRequest(session.refresh_token)
        return client.post("/v1/refresh", content=body(request), headers=MSGPACK).status_code

    # the reply may have been lost: within its grace the used token works again and the
    # successors it gave first stop working
    assert refresh(first) == 200
    assert client.get("/v1/state", headers=bearer(renewed)).status_code == 401
    assert refresh(renewed) == 401
    clock.now_ms += 300_000  # past the grace (refresh_grace_s)
    assert refresh(first) == 401


def test_wrong_keys_and_unknown_accounts_get_one_answer(client: TestClient) -> None:
    register(client, "alice", new_keys())
    answers = [
        client.post("/v1/login", content=body(LoginRequest(name, b"k" * 32, "x")), headers=MSGPACK)
        for name in ("alice", "nobody")
    ]
    assert [a.status_code for a in answers] == [401, 401]
    assert answers[0].content == answers[1].content


def test_failed_logins_are_throttled_alike_for_known_and_unknown_accounts(
    make_client: AppFactory, clock: FakeClock
) -> None:
    client = make_client(max_login_failures=3, login_window_s=60)
    keys = new_keys()
    register(client, "alice", keys)
    for name in ("alice", "nobody"):
        request = body(LoginRequest(name, b"k" * 32, "x"))
        codes = [
            client.post("/v1/login", content=request, headers=MSGPACK).status_code for _ in range(4)
        ]
        assert codes == [401, 401, 401, 429]
    wait = client.post(
        "/v1/login", content=body(LoginRequest("alice", keys.auth_key, "x")), headers=MSGPACK
    )
    assert wait.status_code == 429 and int(wait.headers["retry-after"]) == 60
    clock.now_ms += 60_001
    login(client, "alice", keys.auth_key)


def test_invite_only_relays_need_a_valid_invite(make_client: AppFactory) -> None:
    client = make_client(open_signup=False)
    answer = client.post("/v1/info")
    assert answer.status_code == 405
    request = RegisterRequest("alice", b"a" * 32, b"r" * 32, KdfParams(b"s" * 16), b"b", "laptop")
    refused = client.post("/v1/register", content=body(request), headers=MSGPACK)
    assert refused.status_code == 403
    app = client.app
    assert isinstance(app, Starlette)
    storage: Storage = app.state.api.storage
    invite = tokens.new_token()
    digest = tokens.token_hash(invite)
    assert digest is not None
    storage.add_invite(digest, NOW_MS + 1000)
    register(client, "alice", new_keys(), invite=invite)
    again = client.post(
        "/v1/register",
        content=body(
            RegisterRequest("bob", b"a" * 32, b"r" * 32, KdfParams(b"s" * 16), b"b", "x", invite)
        ),
        headers=MSGPACK,
    )
    assert again.status_code == 403  # used once


def test_push_pull_reseed_over_http(client: TestClient) -> None:
    keys = new_keys()
    session = register(client, "alice", keys)
    envelopes = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(3)]
    pushed = client.post("/v1/push", content=body(PushBatch(envelopes)), headers=bearer(session))
    result = decode(pushed.content, PushResult)
    assert [r.seq for r in result.receipts] == [1, 2, 3]
    page = decode(client.get("/v1/pull?cursor=1", headers=bearer(session)).content, Page)
    assert [e.envelope for e in page.entries] == envelopes[1:] and page.cursor == 1
    assert page.state == result.state
    by_token = client.post("/v1/reseed", content=body(KeyProof(b"w" * 32)), headers=bearer(session))
    assert (by_token.status_code, error_code(by_token)) == (403, "forbidden")  # a token alone
    proof = body(KeyProof(keys.auth_key))
    reseeded = decode(
        client.post("/v1/reseed", content=proof, headers=bearer(session)).content, RelayState
    )
    assert reseeded.account_epoch != result.state.account_epoch
    state = decode(client.get("/v1/state", headers=bearer(session)).content, RelayState)
    assert state == reseeded


def test_pages_are_cut_to_the_byte_bound_and_resume(make_client: AppFactory) -> None:
    client = make_client(max_page_bytes=250)
    session = register(client, "alice", new_keys())
    envelopes = [envelope(bytes([i]) * 16, 1, HLC + i, {1: HLC + i}) for i in range(5)]
    client.post("/v1/push", content=body(PushBatch(envelopes)), headers=bearer(session))
    seen, cursor = [], 0
    while True:
        page = decode(
            client.get(f"/v1/pull?cursor={cursor}", headers=bearer(session)).content, Page
        )
        assert 1 <= len(page.entries) <= 2  # 100-byte envelopes, 250 bytes a page
        seen += [e.envelope for e in page.entries]
        cursor = page.next_cursor
        if not page.has_more:
            break
    assert seen == envelopes


def test_json_bodies_carry_bytes_as_base64(client: TestClient) -> None:
    session = register(client, "alice", new_keys())
    e = envelope(b"j" * 16, 1, HLC, {1: HLC})
    answer = client.post(
        "/v1/push",
        json={"envelopes": [base64.b64encode(e).decode()]},
        headers={"authorization": f"Bearer {session.access_token}", "accept": "application/json"},
    )
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["receipts"] == [{"status": "stored", "seq": 1, "code": None}]


def test_key_bundle_compare_and_set_and_passphrase_change(client: TestClient) -> None:
    keys = new_keys()
    session = register(client, "alice", keys)
    read = client.post("/v1/keys/read", content=body(KeyProof(b"w" * 32)), headers=bearer(session))
    assert (read.status_code, error_code(read)) == (
        403,
        "forbidden",
    )  # a token alone learns nothing
    proof = body(KeyProof(keys.auth_key))
    current = decode(
        client.post("/v1/keys/read", content=proof, headers=bearer(session)).content, KeyBundleValue
    )
    assert current == KeyBundleValue(b"bundle", 1)
    new_auth = b"n" * 32
    stolen = PutKeyBundle(b"evil", KdfParams(b"t" * 16), new_auth, 1, b"w" * 32)
    refused = client.put("/v1/keys", content=body(stolen), headers=bearer(session))
    assert (refused.status_code, error_code(refused)) == (403, "forbidden")  # a token is not enough
    change = PutKeyBundle(b"bundle2", KdfParams(b"t" * 16), new_auth, 1, keys.auth_key)
    answer = client.put("/v1/keys", content=body(change), headers=bearer(session))
    assert decode(answer.content, KeyBundleValue) == KeyBundleValue(b"bundle2", 2)
    stale = PutKeyBundle(b"bundle3", KdfParams(b"t" * 16), new_auth, 1, keys.recovery_auth_key)
    lost = client.put("/v1/keys", content=body(stale), headers=bearer(session))
    assert (lost.status_code, error_code(lost)) == (409, "version_conflict")
    refused = client.post(
        "/v1/login", content=body(LoginRequest("alice", keys.auth_key, "x")), headers=MSGPACK
    )
    assert refused.status_code == 401  # the old passphrase no longer logs in
    login(client, "alice", new_auth)
    login(client, "alice", keys.recovery_auth_key)


def test_devices_are_renamed_and_revoked(client: TestClient) -> None:
    keys = new_keys()
    laptop = register(client, "alice", keys)
    phone = login(client, "alice", keys.auth_key)
    rename = client.patch(
        f"/v1/devices/{phone.device_id}",
        content=body(RenameDevice("old phone")),
        headers=bearer(laptop),
    )
    assert rename.status_code == 204
    path = f"/v1/devices/{phone.device_id}"
    by_token = client.request(
        "DELETE", path, content=body(KeyProof(b"w" * 32)), headers=bearer(laptop)
    )
    assert (by_token.status_code, error_code(by_token)) == (403, "forbidden")  # a token alone
    assert client.get("/v1/state", headers=bearer(phone)).status_code == 200
    proof = body(KeyProof(keys.auth_key))
    revoked = client.request("DELETE", path, content=proof, headers=bearer(laptop))
    assert revoked.status_code == 204
    state = client.get("/v1/state", headers=bearer(phone))
    assert (state.status_code, error_code(state)) == (403, "device_revoked")
    refresh = client.post(
        "/v1/refresh", content=body(RefreshRequest(phone.refresh_token)), headers=MSGPACK
    )
    assert (refresh.status_code, error_code(refresh)) == (403, "device_revoked")
    listed = decode(client.get("/v1/devices", headers=bearer(laptop)).content, DeviceList)
    assert [d.id for d in listed.devices] == [laptop.device_id]


def test_account_deletion_takes_the_auth_key(client: TestClient) -> None:
    keys = new_keys()
    session = register(client, "alice", keys)
    wrong = client.request(
        "DELETE", "/v1/account", content=body(DeleteAccount(b"w" * 32)), headers=bearer(session)
    )
    assert wrong.status_code == 403
    deleted = client.request(
        "DELETE", "/v1/account", content=body(DeleteAccount(keys.auth_key)), headers=bearer(session)
    )
    assert deleted.status_code == 204
    assert client.get("/v1/state", headers=bearer(session)).status_code == 401
    register(client, "alice", new_keys())  # the name is free again


def test_the_live_feed_says_head_is_now_n(client: TestClient) -> None:
    session = register(client, "alice", new_keys())
    client.post(
        "/v1/push",
        content=body(PushBatch([envelope(b"a" * 16, 1, HLC, {1: HLC})])),
        headers=bearer(session),
    )
    with client.stream("GET", "/v1/events", headers=bearer(session)) as events:
        lines = events.iter_lines()
        assert {next(lines) for _ in range(3)} == {"event: head", "id: 1", "data: 1"}
        client.post(
            "/v1/push",
            content=body(PushBatch([envelope(b"b" * 16, 1, HLC + 1, {1: HLC + 1})])),
            headers=bearer(session),
        )
        assert next(lines) == ""
        assert {next(lines) for _ in range(3)} == {"event: head", "id: 2", "data: 2"}
    resumed = {**bearer(session), "last-event-id": "2"}
    with client.stream("GET", "/v1/events", headers=resumed) as events:
        lines = events.iter_lines()
        client.post(
            "/v1/push",
            content=body(PushBatch([envelope(b"c" * 16, 1, HLC + 2, {1: HLC + 2})])),
            headers=bearer(session),
        )
        assert {next(lines) for _ in range(3)} == {"event: head", "id: 3", "data: 3"}


def test_the_live_feed_ends_when_its_token_stops_being_valid(
    make_client: AppFactory, clock: FakeClock
) -> None:
    client = make_client(heartbeat_s=0.05)
    keys = new_keys()
    laptop = register(client, "alice", keys)
    phone = login(client, "alice", keys.auth_key)
    with client.stream("GET", "/v1/events", headers=bearer(phone)) as events:
        proof = body(KeyProof(keys.auth_key))
        path = f"/v1/devices/{phone.device_id}"
        assert (
            client.request("DELETE", path, content=proof, headers=bearer(laptop)).status_code == 204
        )
        lines = [line for line in events.iter_lines() if line.startswith(("data", "id"))]
    assert lines == ["id: 0", "data: 0"] or sorted(lines) == ["data: 0", "id: 0"]
    with client.stream("GET", "/v1/events", headers=bearer(laptop)) as events:
        clock.now_ms += 3600_000  # the access token expires while the stream is open
        assert all(not line.startswith("data: 1") for line in events.iter_lines())


def test_the_debug_request_log_has_status_and_request_id_and_no_token(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    session = register(client, "alice", new_keys())
    with caplog.at_level("DEBUG", logger=accesslog.log.name):
        client.get("/v1/state?x=1", headers={**bearer(session), "X-Request-Id": "dev-1.a_b"})
        client.get("/v1/state", headers={"X-Request-Id": 'no spaces or quotes"'})
        client.get("/v1/nowhere")
    lines = [r for r in caplog.records if r.name == accesslog.log.name]
    seen = [(r.__dict__["path"], r.__dict__["status"], r.__dict__["request_id"]) for r in lines]
    assert seen == [
        ("/v1/state", 200, "dev-1.a_b"),
        ("/v1/state", 401, None),  # an id that is not a short plain token is not logged
        ("/v1/nowhere", 404, None),
    ]
    assert session.access_token not in caplog.text and "x=1" not in caplog.text


def test_the_openapi_document_lists_every_error_code(client: TestClient) -> None:
    """An error body's code is one of `ErrorCode` in the published schema, so a generated
    client (or schemathesis) knows every code and nothing else."""
    schemas = client.get("/v1/openapi.json").json()["components"]["schemas"]
    assert schemas["ErrorBody"]["properties"]["code"] == {"$ref": "#/components/schemas/ErrorCode"}
    assert schemas["ErrorCode"]["enum"] == sorted(code.value for code in ErrorCode)


class FailingDiskRelay(MemoryRelay):
    """The reference storage over a disk that fails every push's commit."""

    def push(self, name: str, batch: PushBatch, pusher: Pusher | None = None) -> PushResult:
        raise StoreFailedError("the commit this push joined failed")


def test_a_storage_failure_is_a_500_not_a_refusal(clock: FakeClock) -> None:
    """`StoreFailedError` joined the one exception tree but is no refusal: the app answers it
    with a 500 (a device's unknown outcome, retried), never with an error code; answered, not
    raised on to the server (uvicorn would close the device's connection)."""
    app = create_app(
        FailingDiskRelay(clock_ms=clock), RelayConfig(open_signup=True), clock_ms=clock
    )
    with TestClient(app) as client:  # an exception raised on would fail the request here
        session = register(client, "alice", new_keys())
        batch = PushBatch([envelope(b"k" * 16, 1, HLC, {1: HLC})])
        pushed = client.post("/v1/push", content=body(batch), headers=bearer(session))
    assert (pushed.status_code, pushed.text) == (500, "the relay's storage failed\n")
