"""The relay's HTTP API under /v1 (specs/protocol.md §6): a Starlette app over a `Storage`.

Handlers decode a typed body, check it, call storage off the event loop and encode a typed
answer. Every refusal is a `RelayError` turned into a 4xx with a stable code; the account is
always the one the bearer token names, so no request can reach another account's data.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relay import codec, tokens
from relay.accesslog import AccessLog
from relay.bodylimit import BodyLimit
from relay.collector import collection_runs
from relay.config import RelayConfig
from relay.errors import (
    BadCredentialsError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    RelayError,
    StoreFailedError,
    TooLargeError,
    UnauthorizedError,
    VersionConflictError,
)
from relay.feed import HeadHub
from relay.gate import Caller, Gate, in_worker_thread
from relay.metrics import MetricsMiddleware, RelayMetrics, metrics_route
from relay.openapi import openapi_document
from relay.signing import Pusher, bundle_keys, check_key_change, check_plain_revoke
from relay.storage import AccountRecord, Device, Storage, TokenRecord
from relay.versions import with_oversized, within_bound
from replica.errors import KdfParametersError
from replica.wire import (
    MAX_HLC,
    PROTOCOL_VERSION,
    DeleteAccount,
    DeviceInfo,
    DeviceList,
    Health,
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
    auth_key_hash,
    check_kdf_params,
    system_clock_ms,
)

log = logging.getLogger(f"sealsync.{__name__}")
T = TypeVar("T")
Handler = Callable[["RelayApi", Request], Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    """One route: the table the app, its OpenAPI document and the auth tests are built from."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type | None = None
    answer: type | None = None
    status: int = 200
    auth: bool = True
    query: tuple[str, ...] = ()


class RelayApi:
    """The handlers, bound to one storage, configuration and clock."""

    def __init__(self, storage: Storage, config: RelayConfig, clock_ms: Callable[[], int]):
        self.storage = storage
        self.config = config
        self.clock_ms = clock_ms
        self.hub = HeadHub()
        self.gate = Gate(storage, config, clock_ms)
        self.metrics = RelayMetrics()
        storage.observe_commits(self.metrics.committed)

    call = staticmethod(in_worker_thread)

    def new_session(
        self, account: str, device_id: str, state: RelayState
    ) -> tuple[Session, list[TokenRecord]]:
        now = self.clock_ms()
        access_until = now + self.config.access_token_s * 1000
        refresh_until = now + self.config.refresh_token_s * 1000
        access, access_record = tokens.issue(account, device_id, "access", access_until)
        refresh, refresh_record = tokens.issue(account, device_id, "refresh", refresh_until)
        session = Session(account, device_id, access, access_until, refresh, refresh_until, state)
        return session, [access_record, refresh_record]

    # -- unauthenticated --------------------------------------------------------------------

    async def info(self, request: Request) -> Response:
        self.gate.limit_address(request)
        info = RelayInfo(PROTOCOL_VERSION, self.config.limits(), self.config.open_signup)
        return codec.respond(request, info)

    async def health(self, request: Request) -> Response:
        await self.call(self.storage.token, bytes(32))  # a real read: the storage answers
        return codec.respond(request, Health("ok"))

    async def prelogin(self, request: Request) -> Response:
        self.gate.limit_unauthenticated(request)
        body = await codec.read(request, PreloginRequest)
        name = codec.check_name(body.account, "account name")
        record = await self.call(self.storage.account, name)
        kdf = record.kdf if record else tokens.fake_kdf(self.storage.secret, name)
        return codec.respond(request, PreloginResponse(kdf))

    async def register(self, request: Request) -> Response:
        self.gate.limit_unauthenticated(request)
        body = await codec.read(request, RegisterRequest)
        name = codec.check_name(body.account, "account name")
        device_name = codec.check_name(body.device_name, "device name")
        try:
            check_kdf_params(body.kdf)
        except KdfParametersError as exc:
            raise InvalidError(str(exc)) from exc
        bundle_keys(body.bundle)  # a version-2 bundle's clear fields must be well formed
        invite = None
        if not self.config.open_signup:
            invite = tokens.token_hash(body.invite) if body.invite else None
            if invite is None:
                raise ForbiddenError("this relay takes new accounts by invite only")
        now = self.clock_ms()
        record = AccountRecord(
            name,
            auth_key_hash(body.auth_key),
            body.recovery_auth_hash,
            body.kdf,
            body.bundle,
            1,
            now,
        )
        device_id = tokens.new_device_id()
        placeholder = RelayState(self.storage.storage_id, "", 0)  # replaced once created
        session, records = self.new_session(name, device_id, placeholder)
        state = await self.call(
            self.storage.create_account,
            record,
            Device(device_id, device_name, now),
            records,
            invite,
            now,
        )
        log.info("account registered", extra={"device": device_id})
        return codec.respond(request, msgspec.structs.replace(session, state=state), 201)

    async def login(self, request: Request) -> Response:
        address = self.gate.limit_unauthenticated(request)
        body = await codec.read(request, LoginRequest)
        name = codec.check_name(body.account, "account name")
        device_name = codec.check_name(body.device_name, "device name")
        failures = await self.gate.throttle_login(name, address)
        record = await self.call(self.storage.account, name)
        known = (record.auth_hash, record.recovery_hash) if record else (None, None)
        if not tokens.key_matches(body.auth_key, *known) or record is None:
            await self.gate.login_failed(name, address)
            raise BadCredentialsError()
        if failures.from_address:  # a write only when there is something to forget
            await self.call(self.storage.clear_login_failures, name, address)
        state = await self.call(self.storage.state, name)
        if body.device_id is not None and tokens.is_device_id(body.device_id):
            session, records = self.new_session(name, body.device_id, state)
            if await self.call(self.storage.renew_device, name, body.device_id, records):
                log.info("device logged in again", extra={"device": body.device_id})
                return codec.respond(request, session)
        device_id = tokens.new_device_id()
        session, records = self.new_session(name, device_id, state)
        await self.call(
            self.storage.add_device, name, Device(device_id, device_name, self.clock_ms()), records
        )
        log.info("device logged in", extra={"device": device_id})
        return codec.respond(request, session)

    async def refresh(self, request: Request) -> Response:
        self.gate.limit_unauthenticated(request)
        body = await codec.read(request, RefreshRequest)
        digest = tokens.token_hash(body.refresh_token)
        record = await self.call(self.storage.token, digest) if digest else None
        if record is None and digest:
            await self.gate.refuse_revoked(digest)
        now = self.clock_ms()
        if record is None or record.kind == "access" or record.expires_ms <= now:
            raise UnauthorizedError()
        state = await self.call(self.storage.state, record.account)
        session, records = self.new_session(record.account, record.device_id, state)
        grace_until_ms = now + self.config.refresh_grace_s * 1000
        if not await self.call(self.storage.replace_token, record.hash, records, grace_until_ms):
            raise UnauthorizedError()
        return codec.respond(request, session)

    # -- account and devices ----------------------------------------------------------------

    async def devices(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        devices = await self.call(self.storage.devices, caller.account)
        listed = [DeviceInfo(d.id, d.name, d.created_ms, d.id == caller.device_id) for d in devices]
        return codec.respond(request, DeviceList(listed))

    async def rename_device(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, RenameDevice)
        new_name = codec.check_name(body.name, "device name")
        device_id = codec.device_id(request)
        if not await self.call(self.storage.rename_device, caller.account, device_id, new_name):
            raise NotFoundError("no such device")
        return Response(status_code=204)

    async def revoke_device(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, KeyProof)
        record = await self.prove(caller, body.auth_key, "revoking a device")
        device_id = codec.device_id(request)
        check_plain_revoke(record.keys, device_id, caller.device_id)
        own = device_id == caller.device_id
        revoke = functools.partial(self.storage.revoke_device, own=own)
        if not await self.call(revoke, caller.account, device_id):
            raise NotFoundError("no such device")
        log.info("device revoked", extra={"device": device_id})
        return Response(status_code=204)

    async def read_keys(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, KeyProof)
        record = await self.prove(caller, body.auth_key, "reading the key bundle")
        return codec.respond(request, KeyBundleValue(record.bundle, record.bundle_version))

    async def put_keys(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, PutKeyBundle)
        only = caller.device_id if body.end_other_sessions else None
        version = await self.replace_bundle(caller, body, only_device=only)
        return codec.respond(request, KeyBundleValue(body.bundle, version))

    async def rotate_keys(self, request: Request) -> Response:
        """Revoke a device and install the account's next key generation, in one transaction
        (docs/key-generations.md §6): the revoked device keeps nothing that opens the new
        one, and its pushes under the old key are `key_retired`."""
        caller = await self.gate.caller(request)
        body = await codec.read(request, PutKeyBundle)
        device_id = codec.device_id(request)
        if device_id == caller.device_id:
            raise InvalidError("a device cannot revoke itself")
        version = await self.replace_bundle(caller, body, revoke_device=device_id)
        log.info("keys rotated, device revoked", extra={"device": device_id})
        return codec.respond(request, KeyBundleValue(body.bundle, version))

    async def replace_bundle(
        self,
        caller: Caller,
        body: PutKeyBundle,
        *,
        only_device: str | None = None,
        revoke_device: str | None = None,
    ) -> int:
        """Compare-and-set the bundle with the current auth key; a rotation (one that revokes)
        installs exactly the next generation (checked if the stored bundle is the expected)."""
        try:
            check_kdf_params(body.kdf)
        except KdfParametersError as exc:
            raise InvalidError(str(exc)) from exc
        record = await self.prove(caller, body.current_auth_key, "replacing the key bundle")
        if record.bundle_version == body.expected_version:
            check_key_change(record.keys, body, rotation=revoke_device is not None)
        store = functools.partial(
            self.storage.put_key_bundle,
            only_device=only_device,
            revoke_device=revoke_device,
            recovery_hash=body.recovery_auth_hash,
        )
        version = await self.call(
            store,
            caller.account,
            body.expected_version,
            body.bundle,
            body.kdf,
            auth_key_hash(body.auth_key),
        )
        if version is None:
            raise VersionConflictError(
                f"the key bundle is no longer at version {body.expected_version}"
            )
        return version

    async def delete_account(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, DeleteAccount)
        await self.prove(caller, body.auth_key, "deleting the account")
        await self.call(self.storage.delete_account, caller.account)
        log.info("account deleted", extra={"device": caller.device_id})
        return Response(status_code=204)

    async def prove(self, caller: Caller, auth_key: bytes, what: str) -> AccountRecord:
        """The caller's account, once `auth_key` proves the caller holds one of its secrets
        now (the passphrase's or the recovery key's): a token alone is not enough for `what`."""
        record = await self.call(self.storage.account, caller.account)
        known = (record.auth_hash, record.recovery_hash) if record else (None, None)
        if record is None or not tokens.key_matches(auth_key, *known):
            raise ForbiddenError(f"{what} takes the account's current auth key")
        return record

    # -- versions ---------------------------------------------------------------------------

    async def state(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        return codec.respond(request, await self.call(self.storage.state, caller.account))

    async def reseed(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        body = await codec.read(request, KeyProof)
        await self.prove(caller, body.auth_key, "a reseed")
        state = await self.call(self.storage.reseed, caller.account)
        log.info("account reseeded", extra={"device": caller.device_id})
        return codec.respond(request, state)

    async def push(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        batch = await codec.read(request, PushBatch)
        if len(batch.envelopes) > self.config.max_push_envelopes:
            raise TooLargeError(
                f"{len(batch.envelopes)} envelopes in one push, bound "
                f"{self.config.max_push_envelopes}"
            )
        result = await self.call(self._store_push, caller, batch)
        self.metrics.moved("push", batch.envelopes)
        return codec.respond(request, result)

    def _store_push(self, caller: Caller, batch: PushBatch) -> PushResult:
        """In a worker thread: hashing the envelopes for the signature takes time too."""
        pusher = Pusher.of(caller.device_id, batch)  # signed over every envelope, fitting or not
        limit = self.config.max_envelope_bytes
        result = self.storage.push(caller.account, within_bound(batch, limit), pusher)
        return with_oversized(batch, result, limit)

    async def pull(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        cursor = codec.query_int(request, "cursor", 0, 0, MAX_HLC)
        limit = codec.query_int(request, "limit", self.config.page_size, 1, self.config.page_size)
        resync = codec.query_int(request, "resync", 0, 0, 1) == 1
        pull = functools.partial(self.storage.pull, device_id=caller.device_id, resync=resync)
        page = await self.call(pull, caller.account, cursor, limit)
        self.metrics.moved("pull", [entry.envelope for entry in page.entries])
        return codec.respond(request, page)

    async def events(self, request: Request) -> Response:
        caller = await self.gate.caller(request)
        seen = codec.last_event_id(request)
        self.hub.bind(asyncio.get_running_loop())

        async def hints() -> AsyncIterator[ServerSentEvent]:
            """Head hints for as long as the token stays valid: it is checked again every
            heartbeat, so a revoked device or a deleted account stops hearing at once."""
            queue = self.hub.subscribe(caller.account)
            self.metrics.stream(opened=True)
            try:
                head = (await self.call(self.storage.state, caller.account)).head
                if head != seen:
                    yield _head_event(head)
                while (left_ms := caller.expires_ms - self.clock_ms()) > 0:
                    wait_s = min(self.config.heartbeat_s, left_ms / 1000)
                    try:
                        head = await asyncio.wait_for(queue.get(), wait_s)
                    except TimeoutError:
                        if await self.call(self.storage.token, caller.token_hash) is None:
                            return
                        continue
                    yield _head_event(head)
            finally:
                self.metrics.stream(opened=False)
                self.hub.unsubscribe(caller.account, queue)

        return EventSourceResponse(hints(), ping=self.config.heartbeat_s)


def _head_event(head: int) -> ServerSentEvent:
    return ServerSentEvent(data=str(head), id=str(head), event="head")


ENDPOINTS = (
    Endpoint(
        "GET",
        "/v1/info",
        RelayApi.info,
        "protocol version and limits",
        answer=RelayInfo,
        auth=False,
    ),
    Endpoint("GET", "/v1/health", RelayApi.health, "liveness", answer=Health, auth=False),
    Endpoint(
        "POST",
        "/v1/prelogin",
        RelayApi.prelogin,
        "KDF parameters of an account",
        PreloginRequest,
        PreloginResponse,
        auth=False,
    ),
    Endpoint(
        "POST",
        "/v1/register",
        RelayApi.register,
        "new account and first device",
        RegisterRequest,
        Session,
        201,
        auth=False,
    ),
    Endpoint(
        "POST", "/v1/login", RelayApi.login, "new device session", LoginRequest, Session, auth=False
    ),
    Endpoint(
        "POST",
        "/v1/refresh",
        RelayApi.refresh,
        "new tokens for a refresh token",
        RefreshRequest,
        Session,
        auth=False,
    ),
    Endpoint("GET", "/v1/devices", RelayApi.devices, "the account's devices", answer=DeviceList),
    Endpoint(
        "PATCH",
        "/v1/devices/{device_id}",
        RelayApi.rename_device,
        "rename a device",
        RenameDevice,
        status=204,
    ),
    Endpoint(
        "DELETE",
        "/v1/devices/{device_id}",
        RelayApi.revoke_device,
        "revoke a device and its tokens (takes the current auth key)",
        KeyProof,
        status=204,
    ),
    Endpoint(
        "POST",
        "/v1/devices/{device_id}/rotate",
        RelayApi.rotate_keys,
        "revoke a device and install the next key generation (compare-and-set)",
        PutKeyBundle,
        KeyBundleValue,
    ),
    Endpoint(
        "POST",
        "/v1/keys/read",
        RelayApi.read_keys,
        "the key bundle (takes the current auth key)",
        KeyProof,
        KeyBundleValue,
    ),
    Endpoint(
        "PUT",
        "/v1/keys",
        RelayApi.put_keys,
        "replace the key bundle (compare-and-set)",
        PutKeyBundle,
        KeyBundleValue,
    ),
    Endpoint(
        "DELETE",
        "/v1/account",
        RelayApi.delete_account,
        "delete the account and all its data",
        DeleteAccount,
        status=204,
    ),
    Endpoint("GET", "/v1/state", RelayApi.state, "relay state of the account", answer=RelayState),
    Endpoint(
        "POST",
        "/v1/reseed",
        RelayApi.reseed,
        "a new account epoch (takes the current auth key)",
        KeyProof,
        RelayState,
    ),
    Endpoint(
        "POST",
        "/v1/push",
        RelayApi.push,
        "store envelopes; one receipt each",
        PushBatch,
        PushResult,
    ),
    Endpoint(
        "GET",
        "/v1/pull",
        RelayApi.pull,
        "envelopes after a cursor",
        answer=Page,
        query=("cursor", "limit", "resync"),
    ),
    Endpoint("GET", "/v1/events", RelayApi.events, "Server-Sent Events: head is now N"),
)


def create_app(
    storage: Storage,
    config: RelayConfig | None = None,
    *,
    clock_ms: Callable[[], int] = system_clock_ms,
    on_shutdown: Callable[[], None] | None = None,
) -> Starlette:
    """The relay as an ASGI app; `clock_ms` is injectable (token expiry, drift, limits);
    `on_shutdown` runs after the server stopped taking requests (closes the storage)."""
    config = config or RelayConfig()
    api = RelayApi(storage, config, clock_ms)
    storage.listen(api.hub.publish_threadsafe)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with collection_runs(storage, config, api.call):
            yield
        if on_shutdown is not None:
            await api.call(on_shutdown)

    app = Starlette(
        routes=_routes(api, config),
        middleware=[
            Middleware(AccessLog),
            Middleware(MetricsMiddleware, metrics=api.metrics),
            Middleware(BodyLimit, max_bytes=config.max_body_bytes),
        ],
        exception_handlers={
            RelayError: codec.error_response,
            HTTPException: codec.http_error,
            StoreFailedError: codec.storage_failure(api.metrics.storage_error),
        },
        lifespan=lifespan,
    )
    app.state.api = api
    return app


def _routes(api: RelayApi, config: RelayConfig) -> list[Route]:
    """A route per endpoint, bound to `api`, and the OpenAPI document describing them."""
    bounds = {"cursor": (0, MAX_HLC), "limit": (1, config.page_size), "resync": (0, 1)}
    document = openapi_document(ENDPOINTS, bounds)

    def bind(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await endpoint.handler(api, request)

        return handle

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes = [Route(e.path, bind(e), methods=[e.method]) for e in ENDPOINTS]
    routes.append(Route("/v1/openapi.json", openapi, methods=["GET"]))
    if config.metrics:
        routes.append(metrics_route(api.metrics))
    return routes
