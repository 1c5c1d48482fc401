"""A real HTTP transport with injected faults: replies lost after the relay acted, bodies cut
short, requests that never leave, a little jitter, and an optional relay restart — the network
the sync driver must beat.

Most faults strike after the relay answered, so the relay has done the work (a push is
committed) and only the device does not know it: the hard case for idempotent retries. A
share of the timeouts strikes before the request is sent. Each request carries an
`X-Request-Id`, and `struck` keeps the ids of the faulted ones, so a test can count on the
relay's side (its debug request log) which faults came after the relay had answered.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import httpx2


class CutStream(httpx2.SyncByteStream):
    """The first bytes of a body, then either a clean end (the Content-Length says more was
    due) or the error a connection closed mid-body raises."""

    def __init__(self, data: bytes, *, then_raise: bool) -> None:
        self._data = data
        self._then_raise = then_raise

    def __iter__(self) -> Iterator[bytes]:
        yield self._data
        if self._then_raise:
            raise httpx2.RemoteProtocolError("injected: peer closed the connection mid-body")


class ChaosTransport(httpx2.HTTPTransport):
    """`HTTPTransport` whose answers are lost (ReadTimeout) or truncated at the given rates.

    `strike(n, path)` may force a fault on the n-th request (1-based); `on_request` runs after
    the relay answered request n (the test restarts the relay from there).
    """

    def __init__(
        self,
        *,
        seed: int,
        timeout_rate: float = 0.05,
        truncate_rate: float = 0.05,
        unsent_share: float = 0.25,
        max_jitter_s: float = 0.005,
        strike: Callable[[int, str], bool] = lambda n, path: False,
        on_request: Callable[[int], None] = lambda n: None,
    ) -> None:
        super().__init__(trust_env=False)
        self.faults: Counter[str] = Counter()
        self.struck: dict[str, str] = {}
        """Request id → fault, for every faulted request."""
        self._name = f"chaos{seed}"
        self._unsent_share = unsent_share
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._rates = (timeout_rate, truncate_rate)
        self._max_jitter_s = max_jitter_s
        self._strike = strike
        self._on_request = on_request
        self._requests = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        with self._lock:
            self._requests += 1
            n = self._requests
            roll, cut, jitter, unsent = (self._random.random() for _ in range(4))
        request_id = f"{self._name}-{n}"
        request.headers["X-Request-Id"] = request_id
        time.sleep(jitter * self._max_jitter_s)
        timeout_rate, truncate_rate = self._rates
        streams = path == "/v1/events"  # the live feed streams; it is tested on its own
        if not streams and roll < timeout_rate and unsent < self._unsent_share:
            self._fault(request_id, f"unsent {path}")
            raise httpx2.ConnectTimeout("injected: the request never left", request=request)
        response = super().handle_request(request)
        if streams:
            return response
        body = response.read()
        response.close()
        self._on_request(n)
        if self._strike(n, path) or roll < timeout_rate:
            self._fault(request_id, f"lost {path}")
            raise httpx2.ReadTimeout("injected: the reply was lost", request=request)
        if roll < timeout_rate + truncate_rate and body:
            self._fault(request_id, f"cut {path}")
            stream = CutStream(body[: int(cut * len(body))], then_raise=cut < 0.5)
            return httpx2.Response(response.status_code, headers=response.headers, stream=stream)
        return httpx2.Response(response.status_code, headers=response.headers, content=body)

    def _fault(self, request_id: str, fault: str) -> None:
        with self._lock:
            self.faults[fault] += 1
            self.struck[request_id] = fault


class FirstReplyLost:
    """Makes transports for a `Fleet` whose one fault, across all of them, is the first reply
    to `path`: lost after the relay acted on the request. `lost` holds that request's number."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lost: list[int] = []

    def __call__(self) -> ChaosTransport:
        return ChaosTransport(seed=0, timeout_rate=0, truncate_rate=0, strike=self._strike)

    def _strike(self, n: int, path: str) -> bool:
        if path == self.path and not self.lost:
            self.lost.append(n)
            return True
        return False
