"""RelayClient against real servers on loopback: URLs, protocol version, tokens, errors."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from clients.device import device_client, load_settings
from clients.errors import (
    InsecureRelayError,
    NoSessionError,
    ProtocolMismatchError,
    RelayRefusedError,
    UnknownOutcomeError,
)
from clients.http import HINT_BY_CODE, RelayClient, check_relay_url
from clients.keys import rotate_revoking
from replica import LoginKeys
from replica.errors import InvalidArgumentError, ProtocolError
from replica.wire import PROTOCOL_VERSION, ErrorCode, PushBatch
from tests.clients.chaos import FirstReplyLost
from tests.clients.conftest import Fleet
from tests.clients.test_cli import Cli
from tests.relay.server import RelayProcess, free_port


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8787", "http://127.8.9.10", "http://localhost:1/", "http://[::1]:5",
     "https://relay.example.org"],
)  # fmt: skip
def test_loopback_and_https_urls_are_accepted(url: str) -> None:
    assert check_relay_url(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://relay.example.org", "http://10.0.0.2:8787"])
def test_plain_http_to_another_host_is_refused_unless_insecure(url: str) -> None:
    with pytest.raises(InsecureRelayError) as refused:
        RelayClient(url)
    assert refused.value.hint and "--insecure" in refused.value.hint
    RelayClient(url, insecure=True).close()


@pytest.fixture
def foreign_server() -> Iterator[Callable[[bytes, int], str]]:
    """A real HTTP server on loopback answering every request with the bytes a test gives."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def serve(info: bytes, status: int = 200, gzipped: bool = False) -> str:
        async def answer(request: Request) -> Response:
            headers = {"retry-after": "7"}  # read only with a 429
            if gzipped:
                headers["content-encoding"] = "gzip"
            return Response(info, status, headers=headers, media_type="application/msgpack")

        port = free_port()
        config = uvicorn.Config(
            Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])]),
            host="127.0.0.1", port=port,
            log_config=None, lifespan="off",
        )  # fmt: skip
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_relay_of_another_protocol_version_is_refused(
    foreign_server: Callable[[bytes, int], str],
) -> None:
    newer = msgspec.msgpack.encode({"protocol_version": PROTOCOL_VERSION + 1, "limits": "new"})
    with (
        RelayClient(foreign_server(newer, 200)) as client,
        pytest.raises(ProtocolMismatchError) as e,
    ):
        client.info()
    assert f"protocol {PROTOCOL_VERSION + 1}" in str(e.value) and e.value.hint
    with (
        RelayClient(foreign_server(b"<html>", 404)) as client,
        pytest.raises(ProtocolMismatchError),
    ):
        client.info()


NOT_AN_ERROR_BODY = pytest.mark.parametrize(
    "answer",
    [b"<html>Stopped by the proxy</html>", msgspec.msgpack.encode({"code": "new", "message": "m"})],
    ids=["a proxy's page", "a code outside ErrorCode"],
)


@NOT_AN_ERROR_BODY
def test_a_4xx_without_the_relays_error_body_is_a_protocol_mismatch(
    foreign_server: Callable[[bytes, int], str], answer: bytes
) -> None:
    """Not the relay's word: a proxy answered, or a relay of another protocol version (a new
    code comes with a new version). Never a guess at what the code would have meant."""
    with (
        RelayClient(foreign_server(answer, 403)) as client,
        pytest.raises(ProtocolMismatchError) as e,
    ):
        client.prelogin("ann")
    assert "/v1/prelogin: HTTP 403 without the relay's error body" in str(e.value)
    assert e.value.hint and "proxy" in e.value.hint and not e.value.retryable


@NOT_AN_ERROR_BODY
def test_a_429_without_the_relays_error_body_is_still_a_rate_limit(
    foreign_server: Callable[[bytes, int], str], answer: bytes
) -> None:
    """A proxy in front of the relay that rate-limits says so with the status itself: the
    request waits for its Retry-After and is sent again, as with the relay's own 429."""
    with RelayClient(foreign_server(answer, 429)) as client, pytest.raises(RelayRefusedError) as e:
        client.info()
    assert e.value.code is ErrorCode.RATE_LIMITED and e.value.retryable
    assert e.value.retry_after_s == 7 and "not the relay's answer" in str(e.value)


def test_a_known_code_is_a_typed_refusal_with_its_hint(
    foreign_server: Callable[[bytes, int], str],
) -> None:
    answer = msgspec.msgpack.encode({"code": "rate_limited", "message": "slow down"})
    with RelayClient(foreign_server(answer, 429)) as client, pytest.raises(RelayRefusedError) as e:
        client.info()
    assert e.value.code is ErrorCode.RATE_LIMITED and e.value.retryable
    assert e.value.hint == HINT_BY_CODE[ErrorCode.RATE_LIMITED]
    assert str(e.value) == "relay refused (429 rate_limited): slow down"


def test_an_unreachable_relay_is_an_unknown_outcome() -> None:
    client = RelayClient(f"http://127.0.0.1:{free_port()}")
    with client, pytest.raises(UnknownOutcomeError) as e:
        client.info()
    assert e.value.retryable and e.value.hint


def test_tokens_refresh_transparently_and_the_caller_hears_each_session(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    relay = start_relay("access_token_s=1")
    fleet = fleets(relay.url)
    a = fleet.add("a")
    a.replica.put("notes", "n1", {"text": "one"})
    time.sleep(1.2)  # the access token has expired
    report = a.driver.sync()
    assert report.stored == 1 and report.retries == 0
    assert len(a.sessions) >= 2  # register, then at least one refresh
    assert a.sessions[-1].access_token != a.sessions[0].access_token
    assert a.client.session is a.sessions[-1]
    time.sleep(1.2)
    assert a.client.devices().devices[0].current


def test_a_lost_refresh_reply_does_not_log_the_device_out(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    """The relay spent the refresh token but its reply was lost: the client sends the same
    token again and, within the relay's grace, gets a working session."""
    relay = start_relay("access_token_s=1")
    first_refresh = FirstReplyLost("/v1/refresh")
    a = fleets(relay.url, transport=first_refresh).add("a")
    a.replica.put("notes", "n1", {"text": "one"})
    time.sleep(1.2)  # the access token has expired: the next request refreshes
    report = a.driver.sync()
    assert first_refresh.lost and report.stored == 1 and report.retries >= 1
    assert a.client.devices().devices[0].current  # the session adopted after the retry works


def test_refusals_are_definitive_typed_and_name_no_secret(
    start_relay: Callable[..., RelayProcess], fleets: Callable[..., Fleet]
) -> None:
    relay = start_relay()
    fleet = fleets(relay.url)
    a, b = fleet.add("a"), fleet.add("b")
    b_id = b.client.session.device_id if b.client.session else ""
    login = LoginKeys(fleet.auth_key, b"")  # the rotation proves the auth key alone
    rotate_revoking(a.client, a.replica, login, "a new passphrase, long enough", b_id,
                    catch_up=a.driver.sync)  # fmt: skip
    b.replica.put("notes", "n1", {"text": "one"})
    with pytest.raises(RelayRefusedError) as refused:
        b.driver.sync()  # no retry, and no login: the device was revoked
    assert refused.value.code == "device_revoked" and not refused.value.retryable
    assert refused.value.hint and "removed this one" in refused.value.hint
    with pytest.raises(RelayRefusedError) as too_many:
        a.client.push(PushBatch([b"x" * 40] * (a.client.limits().max_push_envelopes + 1)))
    assert (too_many.value.status, too_many.value.code) == (413, "too_large")
    for session in (*a.sessions, *b.sessions):
        for text in (repr(a.client), repr(b.client), str(refused.value), repr(session)):
            assert session.access_token not in text and session.refresh_token not in text
    with RelayClient(relay.url) as anonymous, pytest.raises(NoSessionError):
        anonymous.state()


def test_a_relay_url_with_credentials_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="user name or password") as refused:
        check_relay_url("https://ann:secret@relay.example.org")
    assert "secret" not in str(refused.value) and refused.value.hint


def test_two_processes_of_one_device_take_turns_on_its_session(
    start_relay: Callable[..., RelayProcess], cli: Cli, tmp_path: Path
) -> None:
    """`sync --watch` and a one-off command hold the device's session from one sidecar: when
    both access tokens expire, the second to notice takes the session the first saved instead
    of refreshing with the spent refresh token (a replay, which would cost the first its
    tokens, or out of turn, the whole device's)."""
    relay = start_relay("access_token_s=1")
    replica = tmp_path / "a.db"
    cli.ok(replica, "init", "--relay", relay.url, "--account", "ann")
    settings = load_settings(replica)
    with device_client(replica, settings) as first, device_client(replica, settings) as second:
        time.sleep(1.2)  # both access tokens have expired
        first.state()  # refreshes, and the new session is saved in the sidecar
        second.state()  # takes that one
        assert second.session == first.session == load_settings(replica).session
        time.sleep(1.2)
        second.state()
        first.state()
        assert first.devices().devices[0].current and second.devices().devices[0].current
        time.sleep(1.2)
        first.state()  # refreshes and saves; then the saved session's token expires too
        time.sleep(1.2)
        second.state()  # takes the saved session, refused, refreshes with its refresh token
        assert second.session == load_settings(replica).session != first.session
        first.state()


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "a gzip bomb"])
def test_an_answer_is_read_no_further_than_the_clients_own_bound(
    foreign_server: Callable[..., str], gzipped: bool
) -> None:
    """The client bounds what it reads of an answer itself (`max_answer_bytes`), not by
    what the relay says: a huge body, or a small one that a proxy's gzip inflates, is
    refused once past the bound, never read whole into memory."""
    body = bytes(2 * 1024 * 1024)  # 2 MiB of zeros: about 2 KiB gzipped
    sent = gzip.compress(body) if gzipped else body
    url = foreign_server(sent, 200, gzipped=gzipped)
    with (
        RelayClient(url, max_answer_bytes=64 * 1024) as client,
        pytest.raises(ProtocolMismatchError) as refused,
    ):
        client.prelogin("ann")
    assert "over 65536 bytes" in str(refused.value) and refused.value.hint
    with (
        RelayClient(url, max_answer_bytes=4 * 1024 * 1024) as client,
        pytest.raises(ProtocolError),  # read whole, then not a PreloginResponse
    ):
        client.prelogin("ann")
