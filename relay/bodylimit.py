"""Refuse a request body over the limit as it streams, before the app has read it all.

Counted at the ASGI receive channel, so a chunked body or one with a lying Content-Length is
cut off after at most the limit plus one chunk (uvicorn reads 64 KiB at a time).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay import codec
from relay.errors import TooLargeError
from replica.wire import ErrorBody, ErrorCode


class BodyTooLargeError(TooLargeError):
    code = ErrorCode.BODY_TOO_LARGE


class BodyLimit:
    """ASGI middleware: at most `max_bytes` of request body reach the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(scope, receive, send, self.max_bytes)
            return
        received, started = 0, False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if started:  # too late for a 413 (a stream reads only to see a hang-up)
                        return {"type": "http.disconnect"}
                    raise BodyTooLargeError(_message(self.max_bytes))
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)


def _message(max_bytes: int) -> str:
    return f"request body over {max_bytes} bytes"


async def _refuse(scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
    """413 in the relay's error shape and encoding, without reading the body."""
    error = ErrorBody(BodyTooLargeError.code, _message(max_bytes))
    response = codec.respond(Request(scope), error, 413, {"connection": "close"})
    await response(scope, receive, send)
