"""The relay's benchmarks over HTTP on loopback, and their baseline, a bare Starlette endpoint.

Every server runs in a child process under one uvicorn setup (`server.py`); requests come from
`load.py`'s raw-socket generator. The relay is the shipped one: SQLite in the scratch folder,
WAL, synchronous=FULL, every receipt after a durable commit; its rate limits are set out of
reach so they never throttle the benchmark. `--profile` profiles this process (the client
side) only, not the server.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import raw  # noqa: F401  (registers raw.sqlite_upsert, relay.push's baseline)
from device import (
    Device,
    DeviceReport,
    Dot,
    SigningAccount,
    account_sessions,
    decode_page,
    decode_push_result,
    make_envelope,
    pull_request,
    push_request,
    register,
)
from harness import (
    PAGE_ENTRIES,
    Bench,
    BenchmarkError,
    Line,
    benchmark,
    best_seconds,
    check_equal,
)
from load import Connection, LoadResult, Plan, percentile, request_bytes, run_load, split
from server import Served, cpu_seconds, serving

from replica.wire import PushBatch, Session, VersionVector, parse_header

GENERATOR_PROCESSES = 2
"""The machine has 2 cores: the server takes one, the generator processes share the other."""
ECHO_CONNECTIONS = 16
ECHO_BODY = b"0123456789abcdef"

# relay.load: the workload, stated in its output line
DEVICES_PER_ACCOUNT = 4
LOAD_RATE_PER_S = 200.0
"""Requests offered per second, in every mode: 200 devices sending one request a second
(full), 50 sending four (`--quick`); the same load on the server, so the lines compare."""
PUSH_SHARE = 0.5
ENVELOPES_PER_PUSH = 10


# ---- helpers --------------------------------------------------------------------------------


@contextmanager
def relay_server(bench: Bench, stem: str) -> Iterator[Served]:
    """A fresh relay (its own SQLite file) for one benchmark; its log beside the file."""
    db = bench.path(stem)
    with serving("relay", db.with_suffix(".log"), db) as served:
        yield served


@contextmanager
def connection(port: int) -> Iterator[Connection]:
    conn = Connection(port)
    try:
        yield conn
    finally:
        conn.close()


@dataclass(frozen=True)
class CpuWindow:
    """The server's CPU use over a stretch of wall time, as a fraction of one core."""

    pid: int
    cpu0: float | None
    wall0: float

    @classmethod
    def start(cls, pid: int) -> CpuWindow:
        return cls(pid, cpu_seconds(pid), time.perf_counter())

    def share(self) -> float | None:
        cpu1 = cpu_seconds(self.pid)
        if cpu1 is None or self.cpu0 is None:
            return None
        return round((cpu1 - self.cpu0) / (time.perf_counter() - self.wall0), 3)


def load_extra(result: LoadResult, server_cpu: float | None) -> dict[str, Any]:
    """Latency and the evidence that the generator kept up, for a load line."""
    return {
        "p50_ms": round(percentile(result.latency_ms, 0.50), 2),
        "p99_ms": round(percentile(result.latency_ms, 0.99), 2),
        "max_ms": round(max(result.latency_ms, default=0.0), 2),
        "errors": sum(result.errors.values()),
        "generator_lag_p99_ms": round(percentile(result.lag_ms, 0.99), 3),
        "generator_lag_max_ms": round(max(result.lag_ms, default=0.0), 3),
        "generator_cpu": round(result.generator_cpu, 3),
        "generator_processes": GENERATOR_PROCESSES,
        "server_cpu": server_cpu,
    }


# ---- raw.starlette_echo ---------------------------------------------------------------------


@dataclass
class EchoClient:
    """POST /echo with a 16-byte body; the answer must be that body."""

    request: bytes

    def next_request(self) -> bytes:
        return self.request

    def on_answer(self, status: int, body: bytes) -> str | None:
        return None if status == 200 and body == ECHO_BODY else f"http_{status}"

    def report(self) -> None:
        return None


@benchmark("raw.starlette_echo")
def bench_starlette_echo(bench: Bench) -> list[Line]:
    """Requests/s of a bare Starlette endpoint under the relay's uvicorn setup, closed loop
    over ECHO_CONNECTIONS keep-alive connections: the ceiling any relay endpoint lives under."""
    request = request_bytes("POST", "/echo", {}, ECHO_BODY)
    clients = [EchoClient(request) for _ in range(ECHO_CONNECTIONS)]
    with serving("echo", bench.folder / "echo.log") as served:
        window = CpuWindow.start(served.pid)
        result = run_load(
            split(clients, GENERATOR_PROCESSES), Plan(served.port, bench.sizes.echo_s, None)
        )
        server_cpu = window.share()
    if result.errors or not result.completed:
        raise BenchmarkError(
            f"raw.starlette_echo: {result.completed} answers, {dict(result.errors)}"
        )
    extra: dict[str, Any] = {"connections": ECHO_CONNECTIONS, "duration_s": bench.sizes.echo_s}
    extra |= load_extra(result, server_cpu)
    return [Line("raw.starlette_echo", result.completed / result.wall_s, "requests/s", extra=extra)]


# ---- relay.push and relay.pull --------------------------------------------------------------


def push_bodies(
    session: Session, count: int, batch: int, signing: SigningAccount | None
) -> list[bytes]:
    """Requests pushing `count` envelopes of new keys, `batch` per request, from one device;
    signed by `signing` (in the setup, outside the timing), or unsigned."""
    token = session.access_token
    device = Device("bench", token, seed=0, push_share=1.0, envelopes_per_push=batch)
    requests = []
    for counter, start in enumerate(range(0, count, batch), start=1):
        size = min(batch, count - start)
        dots = [(device.rng.randbytes(16), device.node, device.clock.next()) for _ in range(size)]
        push = PushBatch([make_envelope(*dot) for dot in dots])
        if signing is not None:
            push = signing.sign(push, counter, session)
        requests.append(push_request(token, push))
    return requests


@dataclass
class Transfer:
    """One timed repeat of relay.push or relay.pull: what it sends and what it got back."""

    token: str
    requests: list[bytes]
    envelopes: int = 0
    latency_ms: list[float] = field(default_factory=list)


def push_all(conn: Connection, transfer: Transfer) -> None:
    """Send each push; count the envelopes whose receipt says stored."""
    for request in transfer.requests:
        start = time.perf_counter()
        status, body = conn.call(request)
        transfer.latency_ms.append((time.perf_counter() - start) * 1000)
        if status != 200:
            raise BenchmarkError(f"relay push: {status} {body[:200]!r}")
        receipts = decode_push_result(body).receipts
        transfer.envelopes += sum(r.status == "stored" for r in receipts)


def new_push(conn: Connection, account: str, n: int, batch: int, signed: bool) -> Transfer:
    signing = SigningAccount.new() if signed else None
    session = register(conn, account, signing.bundle() if signing else b"bundle")
    return Transfer(session.access_token, push_bodies(session, n, batch, signing))


@benchmark("relay.push.unsigned", needs=("raw.sqlite_upsert",))
def bench_relay_push_unsigned(bench: Bench) -> list[Line]:
    """`relay.push` into accounts that sign nothing (a version-1 account's pushes): the
    relay.push baseline, so the ratio is what verifying a signature costs. Against SQLite
    alone upserting rows of the same size: what HTTP, parsing, the sibling lookup of each
    key and a commit per 1000 cost."""
    return [push_line(bench, "relay.push.unsigned", "raw.sqlite_upsert", signed=False)]


@benchmark("relay.push", needs=("relay.push.unsigned",))
def bench_relay_push(bench: Bench) -> list[Line]:
    """Envelopes/s pushed at PAGE_ENTRIES (1000) per request, one connection, each request
    signed (specs/protocol.md §4.7) and one durable commit; new keys, so every envelope is
    stored. Against the same pushes unsigned. Best of `repeats`, each into a new account."""
    return [push_line(bench, "relay.push", "relay.push.unsigned", signed=True)]


def push_line(bench: Bench, name: str, baseline: str, *, signed: bool) -> Line:
    n, batch = bench.sizes.relay_envelopes, min(PAGE_ENTRIES, bench.sizes.relay_envelopes)
    done: list[Transfer] = []

    def verify(transfer: Transfer) -> None:
        check_equal(f"{name} envelopes stored", transfer.envelopes, n)
        done.append(transfer)

    with relay_server(bench, name.replace(".", "-")) as served, connection(served.port) as conn:
        seconds = best_seconds(
            bench,
            bench.sizes.repeats,
            lambda: new_push(conn, f"{name}-{len(done)}", n, batch, signed),
            lambda transfer: push_all(conn, transfer),
            verify,
        )
    latency_ms = [x for transfer in done for x in transfer.latency_ms]
    extra = {"n": n, "batch": batch, "request_p50_ms": round(percentile(latency_ms, 0.5), 1)}
    return Line(name, n / seconds, "envelopes/s", baseline, extra)


def pull_everything(conn: Connection, token: str, cursor: int = 0) -> list[bytes]:
    """Every envelope after `cursor`, page after page, as a device catching up does."""
    envelopes: list[bytes] = []
    while True:
        status, body = conn.call(pull_request(token, cursor, PAGE_ENTRIES))
        if status != 200:
            raise BenchmarkError(f"relay pull: {status} {body[:200]!r}")
        page = decode_page(body)
        envelopes += [entry.envelope for entry in page.entries]
        cursor = page.next_cursor
        if not page.has_more:
            return envelopes


def pull_all(conn: Connection, transfer: Transfer) -> None:
    transfer.envelopes = len(pull_everything(conn, transfer.token))


@benchmark("relay.pull")
def bench_relay_pull(bench: Bench) -> list[Line]:
    """Envelopes/s pulled in full pages of PAGE_ENTRIES, one connection, from an account
    holding `relay_envelopes` (pushed first, untimed). Best of `repeats`."""
    n, batch = bench.sizes.relay_envelopes, min(PAGE_ENTRIES, bench.sizes.relay_envelopes)
    with relay_server(bench, "relay-pull") as served, connection(served.port) as conn:
        pushed = new_push(conn, "pull", n, batch, signed=True)
        push_all(conn, pushed)
        check_equal("relay.pull envelopes stored", pushed.envelopes, n)
        seconds = best_seconds(
            bench,
            bench.sizes.repeats,
            lambda: Transfer(pushed.token, []),
            lambda transfer: pull_all(conn, transfer),
            lambda transfer: check_equal("relay.pull envelopes", transfer.envelopes, n),
        )
    return [Line("relay.pull", n / seconds, "envelopes/s", extra={"n": n, "page": PAGE_ENTRIES})]


# ---- relay.load -----------------------------------------------------------------------------


def make_devices(conn: Connection, count: int) -> list[Device]:
    """`count` devices, DEVICES_PER_ACCOUNT to an account, each logged in with its own token."""
    devices = []
    for a in range(0, count, DEVICES_PER_ACCOUNT):
        sessions = account_sessions(
            conn, f"load-{a // DEVICES_PER_ACCOUNT}", min(DEVICES_PER_ACCOUNT, count - a)
        )
        devices += [
            Device(
                s.account,
                s.access_token,
                seed=a + i,
                push_share=PUSH_SHARE,
                envelopes_per_push=ENVELOPES_PER_PUSH,
            )
            for i, s in enumerate(sessions)
        ]
    return devices


def count_lost(conn: Connection, devices: Sequence[Device], reports: Sequence[DeviceReport]) -> int:
    """Acknowledged versions that a final pull does not serve, nor any version dominating them."""
    token_by_account = {device.account: device.token for device in devices}
    vectors: dict[tuple[str, bytes], list[VersionVector]] = defaultdict(list)
    for account, token in token_by_account.items():
        for envelope in pull_everything(conn, token):
            header = parse_header(envelope)
            vectors[account, header.key].append(header.vector)
    return sum(
        not is_kept(vectors[report.account, key], node, hlc)
        for report in reports
        for key, node, hlc in report.acknowledged
    )


def is_kept(served: Sequence[VersionVector], node: int, hlc: int) -> bool:
    return any(vector.get(node, 0) >= hlc for vector in served)


def acknowledged(reports: Sequence[DeviceReport]) -> list[Dot]:
    return [dot for report in reports for dot in report.acknowledged]


@benchmark("relay.load", needs=("raw.starlette_echo",))
def bench_relay_load(bench: Bench) -> list[Line]:
    """`load_devices` devices for `load_s` seconds, open loop at LOAD_RATE_PER_S: each
    device sends a request every devices ÷ rate seconds (first requests spread evenly), a
    push of ENVELOPES_PER_PUSH with probability PUSH_SHARE, else a pull of the next page.
    Latency counts from each request's due time. Then every acknowledged version must be
    served by a final pull, or a version dominating it (`lost` counts those that are not)."""
    count, duration = bench.sizes.load_devices, bench.sizes.load_s
    interval = count / LOAD_RATE_PER_S
    with relay_server(bench, "relay-load") as served:
        with connection(served.port) as conn:
            devices = make_devices(conn, count)
        window = CpuWindow.start(served.pid)
        result = run_load(
            split(devices, GENERATOR_PROCESSES), Plan(served.port, duration, interval)
        )
        server_cpu = window.share()
        reports: list[DeviceReport] = result.reports
        with connection(served.port) as conn:  # a new one: uvicorn closes idle ones after 5 s
            lost = count_lost(conn, devices, reports)
    if not result.completed or not acknowledged(reports):
        raise BenchmarkError(f"relay.load: {result.completed} answers, {dict(result.errors)}")
    extra: dict[str, Any] = {
        "devices": count,
        "accounts": -(-count // DEVICES_PER_ACCOUNT),
        "rate_per_s": LOAD_RATE_PER_S,
        "device_interval_s": interval,
        "duration_s": duration,
        "push_share": PUSH_SHARE,
        "envelopes_per_push": ENVELOPES_PER_PUSH,
    }
    extra |= load_extra(result, server_cpu)
    extra |= {
        "error_kinds": dict(result.errors),
        "lost": lost,
        "acknowledged": len(acknowledged(reports)),
        "pushes": sum(r.pushes for r in reports),
        "pulls": sum(r.pulls for r in reports),
    }
    if extra["errors"] or lost:
        print(f"relay.load: {extra['errors']} errors, {lost} lost", file=sys.stderr)
    rate = result.completed / result.wall_s
    return [Line("relay.load", rate, "requests/s", "raw.starlette_echo", extra)]
