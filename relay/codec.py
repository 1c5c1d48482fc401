"""Request and response bodies: MessagePack by default, the same types as JSON on request;
and the values a request carries in its path, query and headers.

JSON carries bytes as base64 (msgspec's convention), for debugging and fuzzing. A body that
does not parse is a 400 `malformed`; one that parses but breaks a type or bound is a 422
`invalid`; names must also be NFC with no NUL (the relay cannot import the replica's checks).
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable
from typing import TypeVar

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from relay import tokens
from relay.errors import (
    CounterStaleError,
    InvalidError,
    MalformedError,
    NotFoundError,
    RelayError,
    UnsupportedMediaError,
)
from replica.wire import ErrorBody, ErrorCode

log = logging.getLogger(f"sealsync.{__name__}")
MSGPACK = "application/msgpack"
JSON = "application/json"
_MSGPACK_TYPES = {MSGPACK, "application/x-msgpack", "application/vnd.msgpack"}
_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()

T = TypeVar("T")


def decode_body(body: bytes, content_type: str | None, kind: type[T]) -> T:
    media = (content_type or MSGPACK).split(";", 1)[0].strip().lower()
    try:
        if media in _MSGPACK_TYPES:
            return msgspec.msgpack.decode(body, type=kind)
        if media == JSON:
            return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidError(f"invalid {kind.__name__}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MalformedError(f"malformed {kind.__name__}: {exc}") from exc
    except RecursionError as exc:  # nesting too deep, in a field the type skips unread
        raise MalformedError(f"malformed {kind.__name__}: nested too deeply") from exc
    raise UnsupportedMediaError(f"send {MSGPACK} or {JSON}, not {media!r}")


async def read(request: Request, kind: type[T]) -> T:
    return decode_body(await request.body(), request.headers.get("content-type"), kind)


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return JSON in accept and MSGPACK not in accept


def respond(
    request: Request, value: object, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    if wants_json(request):
        return Response(_json.encode(value), status, headers, media_type=JSON)
    return Response(_msgpack.encode(value), status, headers, media_type=MSGPACK)


def error_response(request: Request, exc: Exception) -> Response:
    """A refusal (`RelayError`) as its status and the relay's error body."""
    assert isinstance(exc, RelayError)
    headers = {"retry-after": str(exc.retry_after_s)} if exc.retry_after_s else None
    last_counter = exc.last_counter if isinstance(exc, CounterStaleError) else None
    body = ErrorBody(exc.code, exc.message, last_counter)
    return respond(request, body, exc.status, headers)


_CODE_BY_HTTP_STATUS = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in the relay's error shape."""
    assert isinstance(exc, HTTPException)
    code = _CODE_BY_HTTP_STATUS.get(exc.status_code, ErrorCode.BAD_REQUEST)
    return respond(request, ErrorBody(code, str(exc.detail)), exc.status_code)


def storage_failure(count: Callable[[], None]) -> Callable[[Request, Exception], Response]:
    """The handler of `StoreFailedError`: logged with its cause, `count`ed, answered 500 (a
    device's unknown outcome, retried). Answered here, not raised on to the server, which
    would close the connection a device keeps alive."""

    def answer(request: Request, exc: Exception) -> Response:
        log.error("storage failed", exc_info=exc)
        count()
        return PlainTextResponse("the relay's storage failed\n", status_code=500)

    return answer


def check_name(value: str, what: str) -> str:
    """Refuse names a replica would refuse: NUL or not in Unicode NFC."""
    if "\0" in value:
        raise InvalidError(f"{what} contains NUL")
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidError(f"{what} contains a lone surrogate") from exc
    if unicodedata.normalize("NFC", value) != value:
        raise InvalidError(f"{what} is not in Unicode NFC")
    return value


def device_id(request: Request) -> str:
    """A device id as the relay makes them (`tokens.new_device_id`); anything else cannot
    name a device, so it is not found — and never reaches a SQL TEXT column."""
    device_id: str = request.path_params["device_id"]
    if not tokens.is_device_id(device_id):
        raise NotFoundError("no such device")
    return device_id


def last_event_id(request: Request) -> int | None:
    value = request.headers.get("last-event-id", "")
    return int(value) if is_decimal(value) and len(value) < 20 else None


def is_decimal(value: str) -> bool:
    """ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and U+0661, the
    Arabic-Indic one (which int() reads as 1)."""
    return value.isascii() and value.isdigit()


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (is_decimal(raw) and len(raw) <= 19) or not low <= int(raw) <= high:
        raise InvalidError(f"query {name}={raw[:32]!r} must be an integer in {low}..{high}")
    return int(raw)
