"""One log line per request, at debug level: method, path, status, milliseconds, request id.

For operators chasing a slow or failing device (`relay serve --log-level debug`), and for
tests that must count, on the relay's side, which requests it answered. No query string,
header or body is logged — they may carry cursors, tokens or ciphertext sizes worth keeping
out of logs — except `X-Request-Id` when it is a short, plain token a client chose to send.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(f"sealsync.{__name__}")

REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")


class AccessLog:
    """ASGI middleware: logs each HTTP request once it has been answered (or has failed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.DEBUG):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            log.debug(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "ms": round((time.perf_counter() - started) * 1000, 1),
                    "request_id": _request_id(scope),
                },
            )


def _request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and REQUEST_ID.fullmatch(value):
            return str(value.decode("ascii"))
    return None
