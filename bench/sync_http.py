"""Two real devices syncing through the relay over HTTP: throughput, an incremental round, live.

The devices are real replicas of one account (keys from the run's shared account, so no
Argon2id per replica), each with its own `RelayClient` and `SyncDriver`, as an app runs
them; the relay is the shipped one under uvicorn in a child process on loopback
(`server.py`, SQLite in the scratch folder). Device A and device C run in this process;
`sync.e2e`'s device B runs in a process of its own (`follower.py`).

- `sync.e2e_<size>`: A writes N ~500-byte records (untimed, `put_batch` per transaction),
  then the clock runs from A's first push to B's last merge. B follows the relay live from
  the start (`SyncDriver.watch`), merging pages while A still pushes. Baseline:
  `replica.merge` of the same run (merging alone, no HTTP, no encryption of new writes).
- `sync.join_<size>`: then C, a new device, pulls and merges all N into its empty replica.
- `sync.incremental`: then one record changed on A; one sync round of A, then one of C.
  Time, and bytes on the wire both ways, counted at the HTTP layer (request line, headers
  and body of every request and answer; TCP/IP framing not counted). Flat in N is the aim.
- `sync.live`: B in `SyncDriver.watch` in a thread; A writes one record and syncs, 50 times
  one after another; latency from A's `put` to B's subscriber hearing the remote change.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx2
from engine import count_versions, document, put_in_batches, record_id
from follower import following
from harness import COLLECTION, Bench, BenchmarkError, Line, benchmark, check_equal
from load import percentile
from relay_http import relay_server

from clients.http import RelayClient
from clients.sync import SyncDriver
from replica import ChangeEvent, Replica, ReplicaOptions
from replica.wire import KdfParams, LoginRequest, RegisterRequest

DEVICE_OPTIONS = ReplicaOptions(freshness_window_s=0)
"""As the client tests run devices: no freshness window, so no merge waits for one."""
LABEL_BY_POSITION = ("10k", "100k")
"""`Sizes.sync_records` holds the sizes in this order; lines are named by position, so a
`--n` run keeps the names (its `n` field says the real size)."""
LIVE_TIMEOUT_S = 15.0
"""A write B has not seen by then is a failure, not a slow sample: the relay's feed
heartbeat is 15 s and B polls every 5 s without the feed."""


# ---- bytes on the wire ----------------------------------------------------------------------


@dataclass
class WireCounter:
    """HTTP bytes sent and received by one client since the last `reset`."""

    sent: int = 0
    received: int = 0

    def reset(self) -> None:
        self.sent = self.received = 0

    @property
    def total(self) -> int:
        return self.sent + self.received


def header_bytes(headers: httpx2.Headers) -> int:
    """`name: value\\r\\n` per header and the blank line that ends them."""
    return sum(len(name) + len(value) + 4 for name, value in headers.raw) + 2


class CountingStream(httpx2.SyncByteStream):
    """An answer's body, counted as the client reads it (a streamed page included)."""

    def __init__(self, inner: httpx2.SyncByteStream, counter: WireCounter) -> None:
        self._inner = inner
        self._counter = counter

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._counter.received += len(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class CountingTransport(httpx2.BaseTransport):
    """A real HTTP transport that counts what crosses it; the seam `RelayClient` offers."""

    def __init__(self, counter: WireCounter) -> None:
        self._inner = httpx2.HTTPTransport()
        self._counter = counter

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        target = request.url.raw_path
        self._counter.sent += len(request.method) + len(target) + len(b"  HTTP/1.1\r\n")
        self._counter.sent += header_bytes(request.headers) + len(body)
        response = self._inner.handle_request(request)
        self._counter.received += len(b"HTTP/1.1 200 OK\r\n") + header_bytes(response.headers)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        response.stream = CountingStream(response.stream, self._counter)
        return response

    def close(self) -> None:
        self._inner.close()


# ---- devices --------------------------------------------------------------------------------


@dataclass
class SyncDevice:
    """One device as an app runs it: replica, relay client and sync driver."""

    replica: Replica
    path: Path
    client: RelayClient
    driver: SyncDriver
    wire: WireCounter = field(default_factory=WireCounter)
    access: tuple[str, str, bytes] = ("", "", b"")
    """(relay URL, account, auth key): what another device of the account logs in with."""

    def close(self) -> None:
        self.client.close()
        self.replica.close()


def new_device(bench: Bench, url: str, name: str, account: str, auth_key: bytes) -> SyncDevice:
    """A replica of the run's account, logged in to the relay account (registered by the
    first device, "a", with the account's real bundle, so the relay verifies every push as
    it does in use). The relay's auth key protects nothing here, so it is random."""
    replica, path = bench.replica(f"sync-{name}", DEVICE_OPTIONS)
    wire = WireCounter()
    client = RelayClient(url, transport=CountingTransport(wire))
    if name == "a":
        kdf = KdfParams(os.urandom(16))
        bundle = replica.key_bundle()
        client.register(RegisterRequest(account, auth_key, os.urandom(32), kdf, bundle, name))
    else:
        client.login(LoginRequest(account, auth_key, name))
    driver = SyncDriver(replica, client)
    return SyncDevice(replica, path, client, driver, wire, (url, account, auth_key))


@contextmanager
def device_pair(bench: Bench, port: int) -> Iterator[tuple[SyncDevice, SyncDevice]]:
    """Devices A and B of a new relay account."""
    url, account, auth_key = (
        f"http://127.0.0.1:{port}",
        f"sync-{uuid.uuid4().hex[:8]}",
        os.urandom(32),
    )
    a = new_device(bench, url, "a", account, auth_key)
    b = new_device(bench, url, "b", account, auth_key)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


# ---- sync.e2e -------------------------------------------------------------------------------


@dataclass
class Timeline:
    """perf_counter stamps of one end-to-end run (B's from its own process: one clock)."""

    start: float = 0.0
    a_done: float = 0.0
    b_done: float = 0.0


def run_e2e(bench: Bench, a: SyncDevice, n: int) -> Timeline:
    """A syncs while B, in its own process, follows the relay until it merged all `n`.

    `--profile` sees A only."""
    times = Timeline()
    with following(*a.access, bench.account_folder("follower"), n) as b:
        times.start = time.perf_counter()
        b.start()
        try:
            bench.seconds(a.driver.sync)
        finally:
            times.a_done = time.perf_counter()
        times.b_done = b.done()
    return times


def verify_shared(b: SyncDevice, n: int, version: int = 1) -> None:
    check_equal("sync.e2e versions on B", count_versions(b.path), n)
    for i in (0, n // 2, n - 1):
        record = b.replica.get(COLLECTION, record_id(i))
        check_equal(f"sync.e2e record {i} on B", record and record.document, document(i, version))


def e2e_line(label: str, n: int, times: Timeline, wire_bytes: int, batch: int) -> Line:
    wall_s = times.b_done - times.start
    extra = {
        "n": n,
        "put_batch": batch,
        "a_round_s": round(times.a_done - times.start, 3),
        "b_after_a_s": round(times.b_done - times.a_done, 3),
        "wall_s": round(wall_s, 3),
        "wire_bytes": wire_bytes,
    }
    return Line(f"sync.e2e_{label}", n / wall_s, "records/s", "replica.merge", extra)


def join_line(label: str, n: int, join_s: float) -> Line:
    """C's pull and merge of every record into its empty replica."""
    extra = {"n": n, "join_s": round(join_s, 6)}
    return Line(f"sync.join_{label}", n / join_s, "records/s", "replica.merge", extra)


# ---- sync.incremental -----------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One changed record: one round of A then one of B."""

    ms: float
    wire_bytes: int


def run_incremental(a: SyncDevice, b: SyncDevice, repeat: int) -> Round:
    """Change record `repeat` on A (a new version each repeat), sync A then B, and check B."""
    version = 2 + repeat
    a.replica.put(COLLECTION, record_id(repeat), document(repeat, version))
    a.wire.reset()
    b.wire.reset()
    start = time.perf_counter()
    a.driver.sync()
    report = b.driver.sync()
    ms = (time.perf_counter() - start) * 1000
    check_equal("sync.incremental versions B merged", report.merged, 1)
    record = b.replica.get(COLLECTION, record_id(repeat))
    check_equal(
        "sync.incremental record on B", record and record.document, document(repeat, version)
    )
    return Round(ms, a.wire.total + b.wire.total)


def best_round(a: SyncDevice, b: SyncDevice, repeats: int) -> Round:
    """The fastest of `repeats` rounds; bytes are the most any round sent (they should not vary)."""
    rounds = [run_incremental(a, b, r) for r in range(repeats)]
    return Round(min(r.ms for r in rounds), max(r.wire_bytes for r in rounds))


def incremental_line(round_by_label: dict[str, Round], n_by_label: dict[str, int]) -> Line:
    """`value` is `ms_100k`; when 100k did not run (`--quick`), `ms_10k`, and the line says so."""
    extra: dict[str, Any] = {}
    for label in LABEL_BY_POSITION:
        measured = round_by_label.get(label)
        extra[f"ms_{label}"] = round(measured.ms, 2) if measured else None
        extra[f"bytes_{label}"] = measured.wire_bytes if measured else None
        extra[f"n_{label}"] = n_by_label.get(label)
    value_of = "100k" if "100k" in round_by_label else "10k"
    extra["value_is"] = f"ms_{value_of}"
    if value_of != "100k":
        extra["note"] = "100k not run (--quick or --n): value is ms_10k, *_100k fields null"
    return Line("sync.incremental", round_by_label[value_of].ms, "ms", extra=extra)


# ---- sync.live ------------------------------------------------------------------------------


class Arrivals:
    """perf_counter when B's replica first heard each record from the relay."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._changed = threading.Condition()

    def on_change(self, event: ChangeEvent) -> None:
        if event.origin == "remote" and event.id is not None:
            with self._changed:
                self._seen.setdefault(event.id, time.perf_counter())
                self._changed.notify_all()

    def wait_for(self, record: str, timeout_s: float) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: record in self._seen, timeout_s):
                raise BenchmarkError(f"sync.live: B did not see {record} within {timeout_s} s")
            return self._seen[record]


@contextmanager
def watching(b: SyncDevice, arrivals: Arrivals) -> Iterator[None]:
    """B in `SyncDriver.watch` (default polling and idle intervals) in a thread."""
    stop = threading.Event()
    failures: list[BaseException] = []
    unsubscribe = b.replica.subscribe(arrivals.on_change)

    def watch() -> None:
        try:
            b.driver.watch(stop)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=watch, name="device-b-watch")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        unsubscribe()
    if thread.is_alive() or failures:
        raise BenchmarkError(f"sync.live: B's watch did not end cleanly: {failures!r}")


def live_latencies_ms(a: SyncDevice, arrivals: Arrivals, writes: Iterable[int]) -> list[float]:
    latencies = []
    for k in writes:
        record = f"live-{k}"
        start = time.perf_counter()
        a.replica.put(COLLECTION, record, document(k))
        a.driver.sync()
        latencies.append((arrivals.wait_for(record, LIVE_TIMEOUT_S) - start) * 1000)
    return latencies


def run_live(a: SyncDevice, b: SyncDevice, writes: int) -> list[float]:
    """One untimed write first: it waits until B's watch is up and has synced once."""
    arrivals = Arrivals()
    with watching(b, arrivals):
        live_latencies_ms(a, arrivals, [-1])
        return live_latencies_ms(a, arrivals, range(writes))


def live_line(latencies: list[float]) -> Line:
    ordered = sorted(latencies)
    extra = {
        "writes": len(latencies),
        "p50_ms": round(percentile(ordered, 0.50), 2),
        "p95_ms": round(percentile(ordered, 0.95), 2),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
    }
    return Line("sync.live", extra["p95_ms"], "ms", extra=extra)


# ---- the benchmark --------------------------------------------------------------------------


@benchmark("sync.e2e", needs=("replica.merge",))
def bench_sync_e2e(bench: Bench) -> list[Line]:
    """`sync.e2e_<size>` and `sync.join_<size>` for each size, each on a new account; then
    `sync.incremental` on A and C, which now share N records. One relay for all sizes."""
    lines: list[Line] = []
    rounds: dict[str, Round] = {}
    n_by_label: dict[str, int] = {}
    batch = bench.sizes.put_batch
    skipped = len(bench.sizes.sync_records) < len(LABEL_BY_POSITION)
    note = {"note": "sync.e2e_100k not run (--quick or --n)"} if skipped else {}
    with relay_server(bench, "relay-sync") as served:
        for label, n in zip(LABEL_BY_POSITION, bench.sizes.sync_records, strict=False):
            with device_pair(bench, served.port) as (a, c):
                put_in_batches(a.replica, range(n), batch)
                times = run_e2e(bench, a, n)
                join_s = bench.seconds(c.driver.sync)
                verify_shared(c, n)
                line = e2e_line(label, n, times, a.wire.total + c.wire.total, batch)
                lines.append(replace(line, extra=line.extra | note))
                lines.append(join_line(label, n, join_s))
                rounds[label] = best_round(a, c, bench.sizes.repeats)
                n_by_label[label] = n
    return [*lines, incremental_line(rounds, n_by_label)]


@benchmark("sync.live")
def bench_sync_live(bench: Bench) -> list[Line]:
    """`live_writes` writes from A seen by B in watch mode, on a new, empty account."""
    with relay_server(bench, "relay-live") as served, device_pair(bench, served.port) as (a, b):
        return [live_line(run_live(a, b, bench.sizes.live_writes))]
