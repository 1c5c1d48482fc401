"""The load generator of the HTTP benchmarks: keep-alive HTTP/1.1 over raw sockets, several
processes, closed-loop (as fast as answers come) or open-loop (requests fall due at a fixed
rate whether or not earlier ones were answered).

Why not an HTTP client library: httpx's async client was measured here slower with 16
concurrent tasks than with 1, so it would have measured itself. Each generator process runs
one `selectors` loop over plain sockets; a request is a few `bytes` joins and one `sendall`,
an answer is parsed only for its status and Content-Length.

How a run shows that the generator kept up (reported by every load line):
- `generator_lag_*`: for each request, how long after it could have been sent (its due time,
  or the moment its connection became free) it actually went out. A generator that falls
  behind shows it here, not as server latency.
- `generator_cpu`: CPU seconds ÷ wall seconds of the busiest generator process; near 1.0
  means that process was saturated.

Latency is measured from each request's *due* time, so time spent queued behind a slow
answer on the same connection counts (no coordinated omission).
"""

from __future__ import annotations

import heapq
import multiprocessing
import selectors
import socket
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from typing import Any, Protocol

HOST = "127.0.0.1"
RECV_BYTES = 1 << 18
START_DELAY_S = 0.3
"""Between every process reporting ready and the common start: enough to read the go."""


class LoadError(Exception):
    """The server answered something that is not HTTP/1.1, or a generator process failed."""


# ---- HTTP/1.1 bytes -------------------------------------------------------------------------


def request_bytes(method: str, target: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """One keep-alive request; Content-Length always set, so the server never waits for EOF."""
    lines = [f"{method} {target} HTTP/1.1", f"host: {HOST}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class ResponseReader:
    """Splits a byte stream into (status, body) answers; Content-Length framing only."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._status = 0
        self._need = -1  # body bytes of the current answer, or -1 while its head is incomplete

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        answers: list[tuple[int, bytes]] = []
        while True:
            if self._need < 0 and not self._read_head():
                return answers
            if len(self._buffer) < self._need:
                return answers
            answers.append((self._status, bytes(self._buffer[: self._need])))
            del self._buffer[: self._need]
            self._need = -1

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        if not head[0].startswith("HTTP/1.1 "):
            raise LoadError(f"not an HTTP/1.1 answer: {head[0][:80]!r}")
        self._status = int(head[0][9:12])
        lengths = [h.split(":", 1)[1] for h in head[1:] if h.lower().startswith("content-length:")]
        if not lengths and self._status not in (204, 304):
            raise LoadError(f"answer {self._status} has no content-length (chunked?)")
        self._need = int(lengths[0]) if lengths else 0
        return True


class Connection:
    """One blocking keep-alive connection, for setup and for sequential benchmarks."""

    def __init__(self, port: int) -> None:
        self._sock = connect(port)
        self._reader = ResponseReader()

    def call(self, request: bytes) -> tuple[int, bytes]:
        self._sock.sendall(request)
        while True:
            data = self._sock.recv(RECV_BYTES)
            if not data:
                raise LoadError("the server closed the connection mid-answer")
            answers = self._reader.feed(data)
            if answers:
                return answers[0]

    def close(self) -> None:
        self._sock.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# ---- one generator process ------------------------------------------------------------------


class Client(Protocol):
    """One simulated client: one connection, one request at a time, in the order they fall due.

    Clients are built in the parent and pickled into a generator process; `report` is what
    goes back (receipts, counts)."""

    def next_request(self) -> bytes: ...

    def on_answer(self, status: int, body: bytes) -> str | None:
        """None if the answer is what was asked for, else a short error kind."""
        ...

    def report(self) -> Any: ...


@dataclass(frozen=True)
class Plan:
    """When requests fall due: every `interval_s` per client (open loop), or, when None, as
    soon as the previous answer came (closed loop); for `duration_s`, then up to `drain_s`
    to finish what fell due."""

    port: int
    duration_s: float
    interval_s: float | None
    drain_s: float = 30.0


@dataclass
class WorkerResult:
    """What one generator process measured."""

    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latency_ms: list[float] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    reports: list[Any] = field(default_factory=list)


class Slot:
    """A client and its connection: what fell due and waits, and what is in flight."""

    def __init__(self, client: Client, sock: socket.socket) -> None:
        self.client = client
        self.sock: socket.socket | None = sock
        self.reader = ResponseReader()
        self.pending: deque[float] = deque()
        self.in_flight: float | None = None  # due time of the request on the wire
        self.free_at = 0.0


class Loop:
    """The event loop of one generator process."""

    def __init__(self, clients: Sequence[Client], plan: Plan, phases: Sequence[float]) -> None:
        self.plan = plan
        self.selector = selectors.DefaultSelector()
        self.slots = [Slot(client, connect(plan.port)) for client in clients]
        for slot in self.slots:
            assert slot.sock is not None
            self.selector.register(slot.sock, selectors.EVENT_READ, slot)
        self.phases = phases
        self.result = WorkerResult()
        self.due: list[tuple[float, int]] = []
        self.end = 0.0

    def run(self, start: float) -> WorkerResult:
        """Run from `start` (a `perf_counter` time of this process) to the end of the drain."""
        cpu0 = time.process_time()
        self.end = start + self.plan.duration_s
        self.due = [(start + phase, i) for i, phase in enumerate(self.phases)]
        heapq.heapify(self.due)
        deadline = self.end + self.plan.drain_s
        while time.perf_counter() < deadline and (self.due or self.busy()):
            self.release_due(time.perf_counter())
            timeout = self.due[0][0] - time.perf_counter() if self.due else 0.05
            for key, _ in self.selector.select(max(0.0, min(timeout, 0.05))):
                self.receive(key.data)
        for slot in self.slots:
            unfinished = len(slot.pending) + (slot.in_flight is not None)
            if unfinished:
                self.result.errors["unfinished"] += unfinished
        self.result.wall_s = time.perf_counter() - start
        self.result.cpu_s = time.process_time() - cpu0
        self.result.reports = [slot.client.report() for slot in self.slots]
        return self.result

    def busy(self) -> bool:
        return any(slot.in_flight is not None or slot.pending for slot in self.slots)

    def release_due(self, now: float) -> None:
        """Move requests that fell due to their client's queue; send where the line is free."""
        interval = self.plan.interval_s
        while self.due and self.due[0][0] <= now:
            due, i = heapq.heappop(self.due)
            slot = self.slots[i]
            slot.pending.append(due)
            if interval is not None and due + interval < self.end:
                heapq.heappush(self.due, (due + interval, i))
            if slot.in_flight is None:
                self.send(slot)

    def send(self, slot: Slot) -> None:
        due = slot.pending.popleft()
        ready = max(due, slot.free_at)
        request = slot.client.next_request()
        if slot.sock is None:  # the server closed an idle keep-alive connection
            slot.sock = connect(self.plan.port)
            self.selector.register(slot.sock, selectors.EVENT_READ, slot)
            slot.reader = ResponseReader()
        slot.sock.sendall(request)
        self.result.lag_ms.append((time.perf_counter() - ready) * 1000)
        slot.in_flight = due

    def receive(self, slot: Slot) -> None:
        assert slot.sock is not None
        try:
            data = slot.sock.recv(RECV_BYTES)
        except ConnectionError:
            data = b""
        if not data:
            self.drop_connection(slot)
            return
        for status, body in slot.reader.feed(data):
            self.answered(slot, status, body)

    def answered(self, slot: Slot, status: int, body: bytes) -> None:
        done = time.perf_counter()
        assert slot.in_flight is not None
        self.result.latency_ms.append((done - slot.in_flight) * 1000)
        self.result.completed += 1
        error = slot.client.on_answer(status, body)
        if error is not None:
            self.result.errors[error] += 1
        slot.in_flight, slot.free_at = None, done
        if self.plan.interval_s is None and done < self.end:
            slot.pending.append(done)  # closed loop: the next request is due now
        if slot.pending:
            self.send(slot)

    def drop_connection(self, slot: Slot) -> None:
        assert slot.sock is not None
        self.selector.unregister(slot.sock)
        slot.sock.close()
        slot.sock = None
        if slot.in_flight is not None:
            self.result.errors["connection_closed"] += 1
            slot.in_flight = None
            if slot.pending:
                self.send(slot)


def generator_process(pipe: Pipe, clients: list[Client], plan: Plan, phases: list[float]) -> None:
    """Connect every client, say ready, wait for the common start (wall clock), run, report."""
    try:
        loop = Loop(clients, plan, phases)
        pipe.send("ready")
        start_wall: float = pipe.recv()
        start = time.perf_counter() + (start_wall - time.time())
        time.sleep(max(0.0, start - time.perf_counter()))
        pipe.send(loop.run(start))
    except Exception as exc:
        pipe.send(LoadError(f"generator process failed: {exc!r}"))
        raise


# ---- several processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    """Every generator process's figures, merged."""

    completed: int
    errors: Counter[str]
    latency_ms: list[float]
    lag_ms: list[float]
    wall_s: float
    generator_cpu: float
    """CPU ÷ wall of the busiest generator process (1.0 = saturated)."""
    reports: list[Any]


def run_load(groups: Sequence[list[Client]], plan: Plan) -> LoadResult:
    """One generator process per group; open-loop phases spread the clients' first requests
    evenly over one interval, so the arrival rate is flat from the first second."""
    context = multiprocessing.get_context("spawn")
    total = sum(len(group) for group in groups)
    workers = []
    index = 0
    for group in groups:
        phases = [phase_s(index + j, total, plan.interval_s) for j in range(len(group))]
        index += len(group)
        parent_end, child_end = context.Pipe()
        process = context.Process(
            target=generator_process, args=(child_end, group, plan, phases), daemon=True
        )
        process.start()
        workers.append((process, parent_end))
    try:
        for _, pipe in workers:
            check_message(pipe.recv())
        start = time.time() + START_DELAY_S
        for _, pipe in workers:
            pipe.send(start)
        results = [check_message(pipe.recv()) for _, pipe in workers]
    finally:
        for process, _ in workers:
            process.join(5.0)
            if process.is_alive():
                process.kill()
    return merge_results(results)


def phase_s(index: int, total: int, interval_s: float | None) -> float:
    return 0.0 if interval_s is None else interval_s * index / total


def check_message(message: Any) -> Any:
    if isinstance(message, Exception):
        raise message
    return message


def merge_results(results: Sequence[WorkerResult]) -> LoadResult:
    errors: Counter[str] = Counter()
    for result in results:
        errors.update(result.errors)
    return LoadResult(
        completed=sum(r.completed for r in results),
        errors=errors,
        latency_ms=[x for r in results for x in r.latency_ms],
        lag_ms=[x for r in results for x in r.lag_ms],
        wall_s=max(r.wall_s for r in results),
        generator_cpu=max(r.cpu_s / r.wall_s for r in results),
        reports=[report for r in results for report in r.reports],
    )


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Round-robin `items` into `parts` non-empty groups (fewer if there are fewer items)."""
    return [list(items[i::parts]) for i in range(min(parts, len(items)))]
