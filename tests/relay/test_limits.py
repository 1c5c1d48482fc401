"""Every relay limit at max-1, max and max+1: each refusal a 4xx with a stable code, never a
500 (docs/architecture.md §8.5), and operator settings loaded in order with bad values refused."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from starlette.testclient import TestClient

from relay.app import create_app
from relay.config import RelayConfig, load_config
from replica.errors import InvalidArgumentError
from replica.wire import (
    FIXED_HEADER_BYTES,
    MAX_ENVELOPE_BYTES,
    LoginRequest,
    Page,
    PreloginRequest,
    PushBatch,
    PushResult,
)
from tests.relay.api import MSGPACK, bearer, body, decode, new_keys, register
from tests.relay.conftest import HLC, NOW_MS, envelope
from tests.relay.harness import Relay, Relays, call_asgi, code_of, open_relays

KIB = 1024
CHUNK = 64 * KIB
"""What a server hands the app per receive (uvicorn reads 64 KiB at a time)."""


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Relays]:
    yield from open_relays(tmp_path)


def sized_envelope(size: int, index: int, node: int = 1, hlc: int = HLC) -> bytes:
    """A valid envelope of exactly `size` bytes, of its own key."""
    header = FIXED_HEADER_BYTES + 16
    key = index.to_bytes(16, "big")
    return envelope(key, node, hlc + index, {node: hlc + index}, b"p" * (size - header))


def padded_json(value: object, size: int) -> bytes:
    """`value` as JSON, padded with trailing whitespace to exactly `size` bytes."""
    data = msgspec.json.encode(value)
    assert len(data) <= size
    return data + b" " * (size - len(data))


def stored(relay: Relay, account: str = "alice") -> int:
    return relay.storage.stored_versions(account)


# -- body size, counted as it streams ----------------------------------------------------------

BODY_LIMIT = 8 * KIB


@pytest.mark.parametrize(
    ("size", "status"), [(BODY_LIMIT - 1, 200), (BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)]
)
def test_body_size_with_a_content_length(relays: Relays, size: int, status: int) -> None:
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    data = padded_json({"account": "alice"}, size)
    answer = relay.client.post(
        "/v1/prelogin", content=data, headers={"content-type": "application/json"}
    )
    assert answer.status_code == status
    if status == 413:
        assert code_of(answer) == "body_too_large"


@pytest.mark.parametrize(
    ("size", "status"), [(BODY_LIMIT - 1, 200), (BODY_LIMIT, 200), (BODY_LIMIT + 1, 413)]
)
def test_body_size_when_chunked_without_a_content_length(
    relays: Relays, size: int, status: int
) -> None:
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    data = padded_json({"account": "alice"}, size)
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    answer = call_asgi(
        relay.app, "POST", "/v1/prelogin", chunks, {"content-type": "application/json"}
    )
    assert answer.status == status
    if status == 413:
        assert answer.code() == "body_too_large"


def endless(chunk_bytes: int) -> Iterator[bytes]:
    """A body that never ends: only what the app pulls is ever made."""
    yield b'{"account": "alice"'
    yield from itertools.repeat(b" " * chunk_bytes)


@pytest.mark.parametrize("declared", [None, "10", str(BODY_LIMIT)])
@pytest.mark.parametrize("chunk_bytes", [1, 4 * KIB, CHUNK])
def test_an_endless_body_is_cut_off_after_at_most_one_chunk_past_the_limit(
    relays: Relays, declared: str | None, chunk_bytes: int
) -> None:
    """No Content-Length, a lying small one, or one at the limit: the app pulls no more than
    the limit plus one chunk before it answers 413."""
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    headers = {"content-type": "application/json"}
    if declared is not None:
        headers["content-length"] = declared
    answer = call_asgi(relay.app, "POST", "/v1/prelogin", endless(chunk_bytes), headers)
    assert (answer.status, answer.code()) == (413, "body_too_large")
    assert answer.pulled_bytes <= BODY_LIMIT + CHUNK


def test_an_oversized_push_stores_nothing(relays: Relays) -> None:
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    session = register(relay.client, "alice", new_keys())
    batch = body(PushBatch([sized_envelope(3 * KIB, i) for i in range(3)]))
    assert len(batch) > BODY_LIMIT
    answer = relay.client.post("/v1/push", content=batch, headers=bearer(session))
    assert (answer.status_code, code_of(answer)) == (413, "body_too_large")
    streamed = call_asgi(
        relay.app,
        "POST",
        "/v1/push",
        [batch[i : i + 1000] for i in range(0, len(batch), 1000)],
        bearer(session),
    )
    assert (streamed.status, streamed.code()) == (413, "body_too_large")
    assert stored(relay) == 0


def test_a_declared_oversized_body_is_refused_before_it_is_read(relays: Relays) -> None:
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    headers = {"content-type": "application/json", "content-length": str(BODY_LIMIT + 1)}
    answer = call_asgi(relay.app, "POST", "/v1/prelogin", endless(CHUNK), headers)
    assert (answer.status, answer.code(), answer.pulled_bytes) == (413, "body_too_large", 0)


# -- envelopes, batches, pages ------------------------------------------------------------------


def test_envelope_size_is_refused_per_envelope_and_the_rest_stored(relays: Relays) -> None:
    limit = 1000
    relay = relays(max_envelope_bytes=limit)
    session = register(relay.client, "alice", new_keys())
    sizes = [limit - 1, limit, limit + 1, 200]
    batch = PushBatch([sized_envelope(size, i) for i, size in enumerate(sizes)])
    answer = relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    assert answer.status_code == 200
    receipts = decode(answer.content, PushResult).receipts
    assert [(r.status, r.seq, r.code) for r in receipts] == [
        ("stored", 1, None),
        ("stored", 2, None),
        ("refused", None, "too_large"),
        ("stored", 3, None),
    ]
    page = decode(relay.client.get("/v1/pull", headers=bearer(session)).content, Page)
    assert [len(e.envelope) for e in page.entries] == [limit - 1, limit, 200]


def test_the_envelope_limit_cannot_promise_more_than_the_wire_format_takes(relays: Relays) -> None:
    """An envelope limit above MAX_ENVELOPE_BYTES would be advertised in /v1/info while the
    larger envelopes were refused as malformed; at the wire maximum they are stored."""
    with pytest.raises(InvalidArgumentError):
        load_config(flags={"max_envelope_bytes": MAX_ENVELOPE_BYTES + 1})
    relay = relays(max_envelope_bytes=MAX_ENVELOPE_BYTES)
    session = register(relay.client, "alice", new_keys())
    sizes = [MAX_ENVELOPE_BYTES, MAX_ENVELOPE_BYTES + 1]
    batch = PushBatch([sized_envelope(size, i) for i, size in enumerate(sizes)])
    answer = relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    receipts = decode(answer.content, PushResult).receipts
    assert [(r.status, r.code) for r in receipts] == [("stored", None), ("refused", "too_large")]


@pytest.mark.parametrize(("count", "status"), [(4, 200), (5, 200), (6, 413)])
def test_envelopes_per_push(relays: Relays, count: int, status: int) -> None:
    relay = relays(max_push_envelopes=5)
    session = register(relay.client, "alice", new_keys())
    batch = PushBatch([sized_envelope(100, i) for i in range(count)])
    answer = relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    assert answer.status_code == status
    if status == 413:
        assert code_of(answer) == "too_large"
    assert stored(relay) == (count if status == 200 else 0)


@pytest.mark.parametrize(("limit", "status"), [("3", 200), ("4", 200), ("5", 422), ("0", 422)])
def test_page_size_bounds_the_limit_query(relays: Relays, limit: str, status: int) -> None:
    relay = relays(page_size=4)
    session = register(relay.client, "alice", new_keys())
    batch = PushBatch([sized_envelope(100, i) for i in range(6)])
    relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    answer = relay.client.get(f"/v1/pull?limit={limit}", headers=bearer(session))
    assert answer.status_code == status
    if status == 200:
        page = decode(answer.content, Page)
        assert len(page.entries) == int(limit) and page.has_more
    else:
        assert code_of(answer) == "invalid"
    default = decode(relay.client.get("/v1/pull", headers=bearer(session)).content, Page)
    assert len(default.entries) == 4 and default.next_cursor == 4


@pytest.mark.parametrize(("max_page_bytes", "entries"), [(299, 2), (300, 3), (301, 3), (99, 1)])
def test_page_bytes(relays: Relays, max_page_bytes: int, entries: int) -> None:
    """Pages hold at most max_page_bytes of envelopes — but always at least one."""
    relay = relays(max_page_bytes=max_page_bytes)
    session = register(relay.client, "alice", new_keys())
    batch = PushBatch([sized_envelope(100, i) for i in range(5)])
    relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    page = decode(relay.client.get("/v1/pull", headers=bearer(session)).content, Page)
    assert len(page.entries) == entries
    assert page.next_cursor == entries and page.has_more


@pytest.mark.parametrize(("quota", "status"), [(299, 413), (300, 200), (301, 200)])
def test_account_quota(relays: Relays, quota: int, status: int) -> None:
    """Over quota the whole batch rolls back, the versions that would fit included."""
    relay = relays(max_account_bytes=quota)
    session = register(relay.client, "alice", new_keys())
    batch = PushBatch([sized_envelope(100, i) for i in range(3)])
    answer = relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    assert answer.status_code == status
    if status == 413:
        assert code_of(answer) == "quota_exceeded"
        assert stored(relay) == 0 and relay.storage.state("alice").head == 0
    else:
        assert stored(relay) == 3


def test_quota_counts_what_is_already_stored(relays: Relays) -> None:
    relay = relays(max_account_bytes=300)
    session = register(relay.client, "alice", new_keys())
    first = PushBatch([sized_envelope(100, i) for i in range(2)])
    assert (
        relay.client.post("/v1/push", content=body(first), headers=bearer(session)).status_code
        == 200
    )
    second = PushBatch([sized_envelope(100, 2), sized_envelope(100, 3)])
    answer = relay.client.post("/v1/push", content=body(second), headers=bearer(session))
    assert (answer.status_code, code_of(answer)) == (413, "quota_exceeded")
    assert stored(relay) == 2 and relay.storage.state("alice").head == 2


@pytest.mark.parametrize(
    ("ahead_ms", "status"), [(999, "stored"), (1000, "stored"), (1001, "refused")]
)
def test_clock_drift(relays: Relays, ahead_ms: int, status: str) -> None:
    relay = relays(max_drift_ms=1000)
    session = register(relay.client, "alice", new_keys())
    hlc = (NOW_MS + ahead_ms) << 16
    batch = PushBatch([envelope(b"k" * 16, 1, hlc, {1: hlc})])
    answer = relay.client.post("/v1/push", content=body(batch), headers=bearer(session))
    receipt = decode(answer.content, PushResult).receipts[0]
    assert receipt.status == status
    if status == "refused":
        assert receipt.code == "clock_ahead" and stored(relay) == 0


# -- rate limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(("requests", "limited"), [(2, False), (3, False), (4, True)])
def test_requests_per_token(relays: Relays, requests: int, limited: bool) -> None:
    relay = relays(requests_per_second=1.0, burst=3)
    keys = new_keys()
    session = register(relay.client, "alice", keys)
    codes = [
        relay.client.get("/v1/state", headers=bearer(session)).status_code for _ in range(requests)
    ]
    assert codes[:3] == [200] * min(requests, 3)
    assert (codes[-1] == 429) == limited
    if limited:
        answer = relay.client.get("/v1/state", headers=bearer(session))
        assert (answer.status_code, code_of(answer)) == (429, "rate_limited")
        assert answer.headers["retry-after"] == "1"
        other = register(relay.client, "bob", new_keys())  # another token has its own bucket
        assert relay.client.get("/v1/state", headers=bearer(other)).status_code == 200
        relay.clock.advance(999)
        assert relay.client.get("/v1/state", headers=bearer(session)).status_code == 429
        relay.clock.advance(1)
        assert relay.client.get("/v1/state", headers=bearer(session)).status_code == 200
        assert relay.client.get("/v1/state", headers=bearer(session)).status_code == 429


def test_a_rate_limited_push_stores_nothing(relays: Relays) -> None:
    relay = relays(requests_per_second=1.0, burst=1)
    session = register(relay.client, "alice", new_keys())
    assert relay.client.get("/v1/state", headers=bearer(session)).status_code == 200
    batch = body(PushBatch([sized_envelope(100, 0)]))
    answer = relay.client.post("/v1/push", content=batch, headers=bearer(session))
    assert (answer.status_code, code_of(answer)) == (429, "rate_limited")
    assert stored(relay) == 0


def test_per_address_limits_behind_a_trusted_proxy(relays: Relays) -> None:
    relay = relays(requests_per_second=1.0, burst=3, trusted_proxies=("testclient",))

    def info(forwarded: str) -> int:
        return relay.client.get("/v1/info", headers={"x-forwarded-for": forwarded}).status_code

    assert [info("203.0.113.7") for _ in range(4)] == [200, 200, 200, 429]
    assert info("203.0.113.8") == 200  # another client behind the same proxy
    assert info("198.51.100.1, 203.0.113.7") == 429  # a forged left-hand entry changes nothing
    answer = relay.client.get("/v1/info", headers={"x-forwarded-for": "203.0.113.7"})
    assert (code_of(answer), answer.headers["retry-after"]) == ("rate_limited", "1")
    assert [info("203.0.113.9") for _ in range(3)] == [200] * 3
    own = [relay.client.get("/v1/info").status_code for _ in range(4)]
    assert own == [200, 200, 200, 429]  # no header: the proxy's own address has a bucket too


def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(relays: Relays) -> None:
    relay = relays(requests_per_second=1.0, burst=3, trusted_proxies=("192.0.2.1",))
    forged = [
        relay.client.get("/v1/info", headers={"x-forwarded-for": "192.0.2.1"}) for _ in range(10)
    ]
    assert [a.status_code for a in forged] == [200] * 10


@pytest.mark.parametrize(("failures", "status"), [(2, 200), (3, 429), (4, 429)])
def test_failed_logins(relays: Relays, failures: int, status: int) -> None:
    relay = relays(max_login_failures=3, login_window_s=60)
    keys = new_keys()
    register(relay.client, "alice", keys)
    answers: dict[str, list[bytes]] = {}
    for name in ("alice", "nobody"):
        wrong = body(LoginRequest(name, b"w" * 32, "x"))
        answers[name] = [
            relay.client.post("/v1/login", content=wrong, headers=MSGPACK).content
            for _ in range(failures)
        ]
    assert answers["alice"] == answers["nobody"]  # unknown accounts are throttled alike
    right = relay.client.post(
        "/v1/login", content=body(LoginRequest("alice", keys.auth_key, "x")), headers=MSGPACK
    )
    assert right.status_code == status
    if status == 429:
        assert code_of(right) == "rate_limited" and 1 <= int(right.headers["retry-after"]) <= 60


def login(client: TestClient, name: str, auth_key: bytes) -> int:
    answer = client.post(
        "/v1/login", content=body(LoginRequest(name, auth_key, "x")), headers=MSGPACK
    )
    return answer.status_code


def test_bad_logins_from_one_address_never_lock_out_another(relays: Relays) -> None:
    """Failing on purpose from one address (anyone who knows the name can) makes that
    address wait, never the person logging in from elsewhere with the right key."""
    relay = relays(max_login_failures=3, login_window_s=60)
    keys = new_keys()
    register(relay.client, "bob", keys)
    attacker = TestClient(relay.app, client=("203.0.113.66", 40000))
    assert [login(attacker, "bob", b"w" * 32) for _ in range(4)] == [401, 401, 401, 429]
    assert login(attacker, "bob", keys.auth_key) == 429  # this address waits out the window
    assert login(relay.client, "bob", keys.auth_key) == 200  # bob, from his own address


def test_failed_logins_from_every_address_slow_logins_but_never_refuse_them(
    relays: Relays,
) -> None:
    relay = relays(max_login_failures=3, account_login_failures=4, slow_login_ms=300)
    keys = new_keys()
    register(relay.client, "bob", keys)
    for n in range(4):  # a few from each of many addresses: none alone reaches its bound
        guesser = TestClient(relay.app, client=(f"198.51.100.{n}", 40000))
        assert login(guesser, "bob", b"w" * 32) == 401
    started = time.monotonic()
    assert login(relay.client, "bob", keys.auth_key) == 200  # slowed, still let in
    assert time.monotonic() - started >= 0.3


def test_failed_logins_outlive_the_relay_process_that_counted_them(relays: Relays) -> None:
    """Counted in the storage: a restarted relay process (or another one of a fleet) knows
    them, and no flood of other names can push one out."""
    relay = relays(max_login_failures=3, login_window_s=60, requests_per_second=1e6, burst=10**6)
    keys = new_keys()
    register(relay.client, "bob", keys)
    assert [login(relay.client, "bob", b"w" * 32) for _ in range(3)] == [401] * 3
    for n in range(300):
        login(relay.client, f"junk{n}", b"w" * 32)
    restarted = create_app(relay.storage, relay.config, clock_ms=relay.clock)
    with TestClient(restarted, client=("testclient", 50000)) as client:
        assert login(client, "bob", keys.auth_key) == 429
        relay.clock.advance(61_000)  # the window passes
        assert login(client, "bob", keys.auth_key) == 200


def test_unauthenticated_requests_are_limited_per_address_even_without_a_proxy(
    relays: Relays, caplog: pytest.LogCaptureFixture
) -> None:
    """Prelogin, register, login and refresh need no token, so a flood of them is limited
    per address: the peer's when no trusted proxy is set, whatever X-Forwarded-For claims
    (ignored, and said once in the log)."""
    relay = relays(requests_per_second=1.0, burst=3)

    def prelogin(client: TestClient, forwarded: str = "") -> int:
        headers = {**MSGPACK, **({"x-forwarded-for": forwarded} if forwarded else {})}
        content = body(PreloginRequest("bob"))
        return client.post("/v1/prelogin", content=content, headers=headers).status_code

    with caplog.at_level("WARNING", logger="sealsync.relay.gate"):
        statuses = [prelogin(relay.client, f"192.0.2.{n}") for n in range(4)]
    assert statuses == [200, 200, 200, 429]
    warned = [r for r in caplog.records if "X-Forwarded-For" in r.getMessage()]
    assert len(warned) == 1
    assert prelogin(TestClient(relay.app, client=("198.51.100.9", 40000))) == 200
    assert relay.client.get("/v1/info").status_code == 200  # info and health stay open


# -- settings -------------------------------------------------------------------------------


def test_settings_come_from_toml_then_environment_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "relay.toml"
    toml.write_text(
        '[relay]\npage_size = 10\nburst = 20\nmax_login_failures = 30\ntrusted_proxies = ["10.0.0.1"]\n'
    )
    environ = {
        "SEALSYNC_RELAY_BURST": "21",
        "SEALSYNC_RELAY_MAX_LOGIN_FAILURES": "31",
        "SEALSYNC_RELAY_OPEN_SIGNUP": "yes",
        "SEALSYNC_RELAY_TRUSTED_PROXIES": "10.0.0.2, 10.0.0.3",
        "OTHER_BURST": "99",
    }
    config = load_config(toml, environ, {"max_login_failures": 32, "page_size": None})
    assert (config.page_size, config.burst, config.max_login_failures) == (10, 21, 32)
    assert config.open_signup and config.trusted_proxies == ("10.0.0.2", "10.0.0.3")
    assert load_config() == RelayConfig()
    top_level = tmp_path / "top.toml"
    top_level.write_text("heartbeat_s = 2.5\n")
    assert load_config(top_level).heartbeat_s == 2.5


@pytest.mark.parametrize(
    "flags",
    [
        {"page_size": 0},
        {"page_size": -1},
        {"page_size": "ten"},
        {"page_size": 1.5},
        {"page_size": True},
        {"requests_per_second": "nan"},
        {"requests_per_second": "inf"},
        {"heartbeat_s": float("nan")},
        {"burst": "-3"},
        {"open_signup": "maybe"},
        {"trusted_proxies": 5},
        {"max_body_bytes": 1000, "max_envelope_bytes": 500},
        {"max_page_bytes": 63 * 1024 * 1024 + 1},  # devices read no answer over 64 MiB
    ],
    ids=repr,
)
def test_bad_settings_are_refused(flags: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        load_config(flags=flags)


@pytest.mark.parametrize(
    "text",
    ["page_size = 10\nno_such_setting = 1\n", "page_size = [", "relay = 5\n", 'page_size = "x"\n'],
    ids=repr,
)
def test_bad_config_files_are_refused(tmp_path: Path, text: str) -> None:
    toml = tmp_path / "relay.toml"
    toml.write_text(text)
    with pytest.raises(InvalidArgumentError):
        load_config(toml)


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        load_config(tmp_path / "absent.toml")


def test_a_bad_environment_value_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        load_config(environ={"SEALSYNC_RELAY_PAGE_SIZE": "lots"})


def test_a_body_sent_to_the_event_stream_ends_the_stream_not_in_an_error(relays: Relays) -> None:
    """The stream has answered before its body is read (only to see a hang-up): past the
    limit the relay hangs up — too late for a 413, and no reason for a server error."""
    relay = relays(max_body_bytes=BODY_LIMIT, max_envelope_bytes=4 * KIB)
    session = register(relay.client, "alice", new_keys())
    headers = {"authorization": f"Bearer {session.access_token}"}
    answer = call_asgi(relay.app, "GET", "/v1/events", itertools.repeat(b"x" * KIB), headers)
    assert answer.status == 200  # hung up, before or after the first hint
    assert answer.body == b"" or answer.body.startswith((b"id: 0", b"event: head"))
    assert BODY_LIMIT < answer.pulled_bytes <= BODY_LIMIT + CHUNK
