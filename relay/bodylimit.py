"""Refuse a request body over the limit as it streams, before the app has read it all.

Counted at the ASGI receive channel, so a chunked body or one with a lying Content-Length is
cut off after at most the limit plus one chunk (uvicorn reads 64 KiB at a time).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from relay.errors import TooLargeError


class BodyTooLargeError(TooLargeError):
    code = "body_too_large"


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
            await _refuse(send, self.max_bytes)
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


async def _refuse(send: Send, max_bytes: int) -> None:
    body = ('{"code":"body_too_large","message":"' + _message(max_bytes) + '"}').encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
