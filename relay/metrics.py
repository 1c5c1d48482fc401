"""The relay's metrics, in Prometheus' text format (`relay serve --metrics`: GET /metrics).

Counted always (a lock and a few additions a request), served only when the operator turns
them on. Labels are a route's template, a method and a status, never an account, a device,
a token or a cursor: a scrape tells nothing of any one account, and the series stay few.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMIT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
STREAMING_ROUTES = frozenset({"/v1/events"})
"""Requests that last as long as a device listens: counted, but not in the latency."""
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods counted by name; any other a client makes up is "other" (a label per invented
method would let anyone grow the relay's memory and every scrape)."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "sealsync_relay_"


class Histogram:
    """Counts per upper bound (cumulative when rendered), their sum and their count."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str = "") -> Iterable[str]:
        running = 0
        bounds = [*map(_number, self.buckets), "+Inf"]
        for bound, count in zip(bounds, self.counts, strict=True):
            running += count
            yield f'{name}_bucket{{{labels}{"," if labels else ""}le="{bound}"}} {running}'
        yield f"{name}_sum{_braced(labels)} {_number(self.sum)}"
        yield f"{name}_count{_braced(labels)} {running}"


class RelayMetrics:
    """What the relay counts, safe to update from its worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, str, int]] = Counter()
        self._latency: dict[str, Histogram] = {}
        self._moved: Counter[tuple[str, str]] = Counter()
        """(push or pull, envelopes or bytes) → how many."""
        self._commits = Histogram(COMMIT_BUCKETS)
        self._streams = 0
        self._storage_errors = 0

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[route, method, status] += 1
            if route not in STREAMING_ROUTES:
                self._latency.setdefault(route, Histogram(LATENCY_BUCKETS_S)).observe(seconds)

    def moved(self, direction: str, envelopes: Sequence[bytes]) -> None:
        """Envelopes a push stored or a pull sent, and their bytes."""
        with self._lock:
            self._moved[direction, "envelopes"] += len(envelopes)
            self._moved[direction, "bytes"] += sum(map(len, envelopes))

    def committed(self, pushes: int) -> None:
        """One commit of `pushes` pushes (SQLite's group commit joins several)."""
        with self._lock:
            self._commits.observe(pushes)

    def stream(self, opened: bool) -> None:
        with self._lock:
            self._streams += 1 if opened else -1

    def storage_error(self) -> None:
        with self._lock:
            self._storage_errors += 1

    def render(self) -> str:
        with self._lock:
            return "\n".join([*self._lines(), ""])

    def _lines(self) -> Iterable[str]:
        yield from _header("requests_total", "counter", "HTTP requests answered, by route")
        for (route, method, status), count in sorted(self._requests.items()):
            yield f'{PREFIX}requests_total{{route="{route}",method="{method}",status="{status}"}} {count}'
        yield from _header("request_seconds", "histogram", "time to answer, by route")
        for route, histogram in sorted(self._latency.items()):
            yield from histogram.lines(f"{PREFIX}request_seconds", f'route="{route}"')
        for (direction, unit), count in sorted(self._moved.items()):
            name = f"{direction}_{unit}_total"
            what = "envelopes" if unit == "envelopes" else "bytes of envelopes"
            yield from _header(name, "counter", f"{what} {direction}ed")
            yield f"{PREFIX}{name} {count}"
        yield from _header("pushes_per_commit", "histogram", "pushes one commit made durable")
        yield from self._commits.lines(f"{PREFIX}pushes_per_commit")
        yield from _header("event_streams", "gauge", "devices listening for new versions")
        yield f"{PREFIX}event_streams {self._streams}"
        yield from _header("storage_errors_total", "counter", "requests the storage failed")
        yield f"{PREFIX}storage_errors_total {self._storage_errors}"


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]


def _braced(labels: str) -> str:
    return f"{{{labels}}}" if labels else ""


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class MetricsMiddleware:
    """ASGI middleware: counts each HTTP request under its route's template once answered."""

    def __init__(self, app: ASGIApp, metrics: RelayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before it starts a response

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope.get("route")
            template = route.path if isinstance(route, Route) else "unmatched"
            seconds = time.perf_counter() - started
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.request(template, method, status, seconds)


def metrics_route(metrics: RelayMetrics) -> Route:
    async def scrape(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    return Route("/metrics", scrape, methods=["GET"])
