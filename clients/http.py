"""`RelayClient`: the relay's HTTP API (specs/protocol.md §6) as typed Python calls.

One `httpx2.Client` with keep-alive and explicit timeouts; MessagePack both ways; answers
decoded by msgspec into `replica.wire` types. Foreign exceptions are translated once, here:
no complete answer is an `UnknownOutcomeError` (retryable), a 4xx a `RelayRefusedError` with
the relay's code — or a `ProtocolMismatchError` when its body is not the relay's error body
with a code of `ErrorCode` (a proxy answered, or a relay of another protocol). The client
holds the device's `Session`; an access token the relay no longer takes is refreshed once
and the request sent again, and `on_session` hears every new session so the caller can
store it. Retrying is the sync driver's job, not this module's.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import msgspec

from clients.errors import (
    InsecureRelayError,
    NoSessionError,
    ProtocolMismatchError,
    RelayRefusedError,
    UnknownOutcomeError,
    UntrustedCertificateError,
)
from replica.errors import InvalidArgumentError
from replica.wire import (
    MAX_ANSWER_BYTES,
    PROTOCOL_VERSION,
    DeleteAccount,
    DeviceList,
    ErrorBody,
    ErrorCode,
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
    RelayLimits,
    RelayState,
    RenameDevice,
    Session,
    decode_message,
    encode_message,
)

log = logging.getLogger(f"sealsync.{__name__}")
T = TypeVar("T")
MSGPACK = "application/msgpack"
_BODY_HEADERS = {"content-encoding", "content-length", "transfer-encoding"}
"""Headers of the body as it travelled, not of the body as read (decoded, whole)."""

HINT_BY_CODE: dict[ErrorCode, str] = {
    ErrorCode.UNAUTHORIZED: "this device's session ended (revoked, expired, or the relay was "
    "wiped): log in again",
    ErrorCode.BAD_CREDENTIALS: "check the account name and the passphrase or recovery key",
    ErrorCode.FORBIDDEN: "this takes an invite, or the account's current passphrase",
    ErrorCode.ACCOUNT_EXISTS: "choose another account name, or join the existing account",
    ErrorCode.VERSION_CONFLICT: "the key bundle changed on another device: read it again and retry",
    ErrorCode.QUOTA_EXCEEDED: "the account is at its storage quota on this relay: ask the operator",
    ErrorCode.TOO_LARGE: "the request is over the relay's limits (GET /v1/info)",
    ErrorCode.RATE_LIMITED: "wait a little and try again",
    ErrorCode.KEY_RETIRED: "the account's keys were rotated on another device: unlock with the "
    "new passphrase or the recovery key; this device's unsent writes are kept",
    ErrorCode.DEVICE_REVOKED: "another device removed this one from the account (`sealsync "
    "devices --revoke`): nothing more syncs here. This file keeps what it held; writes made "
    "here since reach no other device",
}
UNKNOWN_OUTCOME_HINT = "the relay may or may not have acted; sending the same request is safe"


@dataclass(frozen=True)
class Timeouts:
    """Seconds for each phase of a request. The live feed's read timeout outlasts the relay's
    heartbeat (15 s) with room to spare: a feed silent for longer than that is dead."""

    connect_s: float = 5.0
    read_s: float = 30.0
    write_s: float = 30.0
    pool_s: float = 5.0
    events_read_s: float = 60.0

    def for_requests(self) -> httpx2.Timeout:
        return httpx2.Timeout(
            connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s
        )

    def for_events(self) -> httpx2.Timeout:
        return httpx2.Timeout(
            connect=self.connect_s, read=self.events_read_s, write=self.write_s, pool=self.pool_s
        )


def check_relay_url(url: str, *, insecure: bool = False) -> str:
    """The URL without a trailing slash; plain http only to loopback unless `insecure`."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as exc:
        raise InvalidArgumentError(f"relay URL {url!r} is not a URL: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidArgumentError(
            f"relay URL {url!r} must be http:// or https:// with a host",
            hint="for example https://relay.example.org",
        )
    if parsed.userinfo:  # it would be kept in settings and shown in messages
        raise InvalidArgumentError(
            f"relay URL for {parsed.host} carries a user name or password",
            hint="the relay authenticates devices itself: give the URL without user:password@",
        )
    if parsed.scheme == "http" and not insecure and not is_loopback(parsed.host):
        raise InsecureRelayError(
            f"relay URL {url!r} is plain http to a host that is not loopback",
            hint="use https:// (a TLS-terminating proxy in front of the relay), or pass "
            "--insecure on a network you trust",
        )
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1: traffic that never leaves the machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def trust(ca_file: str | None) -> ssl.SSLContext | bool:
    """What the relay's certificate is verified against: `ca_file` alone, or the system."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgumentError(
            f"cannot read the CA certificate {ca_file}: {exc}",
            hint="give a PEM file holding the certificate the relay's was signed with",
        ) from exc


def untrusted_certificate(exc: BaseException) -> str | None:
    """Why the TLS handshake refused the relay's certificate, if that is what failed."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return str(cause.verify_message)
        cause = cause.__cause__ or cause.__context__
    return None


class _Version(msgspec.Struct):
    """Just the protocol version of `/v1/info`, read before the rest: another version's
    limits may have another shape, and the mismatch is the error worth reporting."""

    protocol_version: int


class RelayClient:
    """One relay, one device session; thread-safe (the live feed reads in another thread)."""

    def __init__(
        self,
        url: str,
        *,
        session: Session | None = None,
        on_session: Callable[[Session], None] | None = None,
        saved_session: Callable[[], Session | None] | None = None,
        insecure: bool = False,
        ca_file: str | None = None,
        timeouts: Timeouts = Timeouts(),
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        """`saved_session` reads the session where `on_session` keeps it: before refreshing,
        the client takes a newer one another process saved there (two processes refreshing
        from one refresh token would look like a stolen copy, and end the device's tokens).
        `ca_file` (PEM) is the only CA the relay's certificate is checked against (a
        self-signed one); else the system's. `transport` is the seam for tests (a real
        transport with injected faults)."""
        self.url = check_relay_url(url, insecure=insecure)
        verify = trust(ca_file)
        self._session = session
        self._on_session = on_session
        self._saved_session = saved_session
        self._max_bytes = max_answer_bytes
        """The client's own bound on what it reads of an answer, not the relay's word."""
        self._timeouts = timeouts
        self._refresh_lock = threading.Lock()
        self._info: RelayInfo | None = None
        self._http = httpx2.Client(
            base_url=self.url,
            timeout=timeouts.for_requests(),
            transport=transport,
            headers={"accept": MSGPACK},
            limits=httpx2.Limits(max_keepalive_connections=4, keepalive_expiry=30.0),
            follow_redirects=False,
            trust_env=False,  # libraries take explicit arguments; only the CLI reads the world
            verify=verify,
        )

    def __repr__(self) -> str:
        account = self._session.account if self._session else None
        return f"RelayClient(url={self.url!r}, account={account!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RelayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def session(self) -> Session | None:
        return self._session

    # -- relay -------------------------------------------------------------------------------

    def info(self) -> RelayInfo:
        """Protocol version and limits, asked once per client; another version is refused."""
        if self._info is None:
            response = self._send("GET", "/v1/info", auth=False)
            if response.status_code >= 500 or response.status_code == 429:
                _raise_for(response)  # a relay having trouble, not a stranger
            version = _protocol_version(response)
            if version is None:
                raise ProtocolMismatchError(
                    f"{self.url} did not answer /v1/info as a sealsync relay "
                    f"(HTTP {response.status_code})",
                    hint="check the relay URL",
                )
            if version != PROTOCOL_VERSION:
                raise ProtocolMismatchError(
                    f"relay at {self.url} speaks protocol {version}, this device {PROTOCOL_VERSION}",
                    hint="upgrade whichever side is older",
                )
            self._info = self._decode(response, RelayInfo)
        return self._info

    def limits(self) -> RelayLimits:
        return self.info().limits

    # -- accounts and devices ----------------------------------------------------------------

    def prelogin(self, account: str) -> PreloginResponse:
        response = self._send("POST", "/v1/prelogin", body=PreloginRequest(account), auth=False)
        return self._decode(response, PreloginResponse)

    def register(self, request: RegisterRequest) -> Session:
        response = self._send("POST", "/v1/register", body=request, auth=False)
        return self._adopt(self._decode(response, Session, status=201))

    def login(self, request: LoginRequest) -> Session:
        response = self._send("POST", "/v1/login", body=request, auth=False)
        return self._adopt(self._decode(response, Session))

    def refresh(self) -> Session:
        """New tokens for the refresh token; its successor is adopted. A refresh whose reply
        was lost may be sent again: the relay honours a spent token for a short grace."""
        session = self._require_session()
        request = RefreshRequest(session.refresh_token)
        response = self._send("POST", "/v1/refresh", body=request, auth=False)
        return self._adopt(self._decode(response, Session))

    def devices(self) -> DeviceList:
        return self._decode(self._send("GET", "/v1/devices"), DeviceList)

    def rename_device(self, device_id: str, name: str) -> None:
        path = f"/v1/devices/{device_id}"
        self._expect_empty(self._send("PATCH", path, body=RenameDevice(name)))

    def revoke_device(self, device_id: str, auth_key: bytes) -> None:
        """End another device's access; takes the account's current auth key."""
        path = f"/v1/devices/{device_id}"
        self._expect_empty(self._send("DELETE", path, body=KeyProof(auth_key)))

    def key_bundle(self, auth_key: bytes) -> KeyBundleValue:
        """The account's key bundle and its version; takes the current auth key."""
        answer = self._send("POST", "/v1/keys/read", body=KeyProof(auth_key))
        return self._decode(answer, KeyBundleValue)

    def put_key_bundle(self, request: PutKeyBundle) -> KeyBundleValue:
        return self._decode(self._send("PUT", "/v1/keys", body=request), KeyBundleValue)

    def rotate_keys(self, device_id: str, request: PutKeyBundle) -> KeyBundleValue:
        """Revoke `device_id` and install the next key generation, in one relay transaction."""
        answer = self._send("POST", f"/v1/devices/{device_id}/rotate", body=request)
        return self._decode(answer, KeyBundleValue)

    def delete_account(self, request: DeleteAccount) -> None:
        self._expect_empty(self._send("DELETE", "/v1/account", body=request))

    # -- versions ----------------------------------------------------------------------------

    def state(self) -> RelayState:
        return self._decode(self._send("GET", "/v1/state"), RelayState)

    def reseed(self, auth_key: bytes) -> RelayState:
        """A new account epoch (specs/protocol.md §4.5): every other device will reseed.
        Takes the account's current auth key."""
        answer = self._send("POST", "/v1/reseed", body=KeyProof(auth_key))
        return self._decode(answer, RelayState)

    def push(self, batch: PushBatch) -> PushResult:
        return self._decode(self._send("POST", "/v1/push", body=batch), PushResult)

    def pull(self, cursor: int, limit: int | None = None, *, resync: bool = False) -> Page:
        """A page after `cursor`; `resync`: as part of pulling everything again, which a
        device the relay flagged (`resync_required`) must do before anything else."""
        params = {"cursor": str(cursor)}
        if limit is not None:
            params["limit"] = str(limit)
        if resync:
            params["resync"] = "1"
        return self._decode(self._send("GET", "/v1/pull", params=params), Page)

    @contextmanager
    def events(self, last_event_id: int | None = None) -> Iterator[Iterator[int]]:
        """The live feed, open: iterate for head hints ("pull now") until the relay ends it.

        Resumes after `last_event_id` (the relay says the head at once if it moved since).
        A broken feed raises `UnknownOutcomeError` from the iteration.
        """
        headers = {"accept": "text/event-stream"}
        if last_event_id is not None:
            headers["last-event-id"] = str(last_event_id)
        response = self._send("GET", "/v1/events", headers=headers, stream=True)
        if response.status_code != 200:
            _raise_for(response)
        try:
            yield _heads(response)
        finally:
            response.close()

    # -- plumbing ----------------------------------------------------------------------------

    def _require_session(self) -> Session:
        if self._session is None:
            raise NoSessionError(
                "this relay call needs a device session", hint="register or log in first"
            )
        return self._session

    def _adopt(self, session: Session) -> Session:
        self._session = session
        if self._on_session is not None:
            self._on_session(session)
        return session

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: msgspec.Struct | None = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
        stream: bool = False,
    ) -> httpx2.Response:
        """Send; on a refused access token, again after one refresh (and before it, once with
        a session another process saved, whose token may have expired too); any status
        returned."""
        content = None if body is None else encode_message(body)
        refreshed = False
        for attempt in (1, 2, 3):
            session = self._require_session() if auth else None
            sent = dict(headers or {})
            if content is not None:
                sent["content-type"] = MSGPACK
            if session is not None:
                sent["authorization"] = f"Bearer {session.access_token}"
            response = self._exchange(method, path, content, params, sent, stream)
            if (
                response.status_code == 401
                and session is not None
                and not refreshed
                and attempt < 3
            ):
                response.close()
                refreshed = self._refresh_after(session)
                continue
            if stream and response.status_code != 200:  # an error, not a stream: read it
                return self._read_whole(method, path, response)
            return response
        raise AssertionError("unreachable: the third attempt returns")

    def _exchange(
        self,
        method: str,
        path: str,
        content: bytes | None,
        params: Mapping[str, str] | None,
        headers: dict[str, str],
        stream: bool,
    ) -> httpx2.Response:
        timeout = self._timeouts.for_events() if stream else self._timeouts.for_requests()
        request = self._http.build_request(
            method, path, content=content, params=params, headers=headers, timeout=timeout
        )
        response = self._http_errors_translated(method, path, self._http.send, request, stream=True)
        log.debug("%s %s -> %s", method, path, response.status_code)
        return response if stream else self._read_whole(method, path, response)

    def _read_whole(self, method: str, path: str, response: httpx2.Response) -> httpx2.Response:
        """The answer with its whole body, decoded, but never more than `max_answer_bytes` of
        it, whatever the relay (or a proxy's compression) would send; cut short is unknown."""
        chunks = self._http_errors_translated(method, path, _capped, response, self._max_bytes)
        body = b"".join(chunks)
        declared = response.headers.get("content-length", "")
        encoded = "content-encoding" in response.headers  # the length is of the encoded body
        if declared.isdigit() and not encoded and int(declared) != len(body):
            raise UnknownOutcomeError(
                f"{method} {path}: answer truncated ({len(body)} of {declared} bytes)",
                hint=UNKNOWN_OUTCOME_HINT,
            )
        headers = [(k, v) for k, v in response.headers.multi_items() if k not in _BODY_HEADERS]
        return httpx2.Response(
            response.status_code, headers=headers, content=body, request=response.request
        )

    def _http_errors_translated(
        self, method: str, path: str, function: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """httpx2's errors, translated once: no complete answer is an unknown outcome."""
        try:
            return function(*args, **kwargs)
        except httpx2.TimeoutException as exc:
            raise UnknownOutcomeError(
                f"{method} {path}: no answer within the timeout", hint=UNKNOWN_OUTCOME_HINT
            ) from exc
        except httpx2.ConnectError as exc:
            reason = untrusted_certificate(exc)
            if reason is not None:
                raise UntrustedCertificateError(
                    f"{method} {path}: the certificate of {self.url} is not trusted: {reason}",
                    hint="for a relay whose certificate a CA of its own signed, pass --cacert "
                    "with that CA's certificate (PEM)",
                ) from exc
            raise UnknownOutcomeError(
                f"{method} {path}: {type(exc).__name__} talking to {self.url}",
                hint=UNKNOWN_OUTCOME_HINT,
            ) from exc
        except httpx2.RequestError as exc:
            raise UnknownOutcomeError(
                f"{method} {path}: {type(exc).__name__} talking to {self.url}",
                hint=UNKNOWN_OUTCOME_HINT,
            ) from exc

    def _refresh_after(self, used: Session) -> bool:
        """Refresh the tokens `used` was refused with — unless another thread already did, or
        another process (its newer session is saved): a second refresh with the spent token
        would be a replay out of turn, which ends every token of the device. Whether this
        refreshed; if not, a refusal of the session taken refreshes with its own token."""
        with self._refresh_lock:
            if self._session is not used:
                return False
            saved = self._saved_session() if self._saved_session is not None else None
            if saved is not None and saved.refresh_token != used.refresh_token:
                self._session = saved
                return False
            self.refresh()
            return True

    def _decode(self, response: httpx2.Response, kind: type[T], *, status: int = 200) -> T:
        if response.status_code != status:
            _raise_for(response)
        return decode_message(response.content, kind)

    def _expect_empty(self, response: httpx2.Response) -> None:
        if response.status_code != 204:
            _raise_for(response)


def _capped(response: httpx2.Response, max_bytes: int) -> list[bytes]:
    """The decoded body's chunks, refused past `max_bytes`; the response is closed."""
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > max_bytes:
                path = response.request.url.path
                raise ProtocolMismatchError(
                    f"{path}: the answer is over {max_bytes} bytes, more than a relay sends",
                    hint="check the relay URL: a proxy or another server may be answering",
                )
            chunks.append(chunk)
    finally:
        response.close()
    return chunks


def _protocol_version(response: httpx2.Response) -> int | None:
    if response.status_code != 200:
        return None
    try:
        return msgspec.msgpack.decode(response.content, type=_Version).protocol_version
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _raise_for(response: httpx2.Response) -> None:
    """An answer other than the expected one: 4xx refused, 5xx unknown, anything else odd."""
    status = response.status_code
    path = response.request.url.path
    if status >= 500:
        raise UnknownOutcomeError(f"{path}: relay answered {status}", hint=UNKNOWN_OUTCOME_HINT)
    if 400 <= status < 500:
        error = _error_body(response)
        retry_after = response.headers.get("retry-after", "")
        raise RelayRefusedError(
            status,
            error.code,
            error.message,
            retry_after_s=float(retry_after) if retry_after.isdigit() else None,
            hint=HINT_BY_CODE.get(error.code),
            last_counter=error.last_counter,
        )
    raise ProtocolMismatchError(f"{path}: unexpected HTTP status {status} from the relay")


def _error_body(response: httpx2.Response) -> ErrorBody:
    """The relay's error body of a 4xx. Anything else did not come from a relay of this
    protocol: a proxy's own page, or a code outside `ErrorCode`, which only a relay of
    another protocol version sends (a new code comes with a new version) — except a 429,
    which says what it means in any body (a proxy's rate limit is retried like the relay's)."""
    path, status = response.request.url.path, response.status_code
    try:
        return msgspec.msgpack.decode(response.content, type=ErrorBody)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        if status == 429:  # HTTP's own word, whoever said it: wait as told, then send again
            return ErrorBody(ErrorCode.RATE_LIMITED, "too many requests (not the relay's answer)")
        raise ProtocolMismatchError(
            f"{path}: HTTP {status} without the relay's error body ({exc})",
            hint="a proxy in front of the relay may have answered, or the relay speaks a "
            "newer protocol: check the relay URL, then upgrade whichever side is older",
        ) from exc


def _heads(response: httpx2.Response) -> Iterator[int]:
    """Head hints from a Server-Sent Events stream (`event: head`, `data: N`)."""
    try:
        for event in httpx2.EventSource(response):
            if event.event == "head" and event.data.isascii() and event.data.isdigit():
                yield int(event.data)
    except httpx2.RequestError as exc:
        raise UnknownOutcomeError(
            f"live feed broken: {type(exc).__name__}", hint="it reconnects on its own"
        ) from exc
