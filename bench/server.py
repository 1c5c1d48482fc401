"""An ASGI app served by uvicorn in a child process, for the HTTP benchmarks.

The server gets a process (and so a core) of its own, apart from the load generator, and
both apps — the bare Starlette echo baseline and the relay — run under one uvicorn setup
(uvloop, httptools, no access log), so their ratio measures the relay, not the server.

The parent binds the listening socket on 127.0.0.1 and hands it to the child (`pass_fds`):
no race for a free port. `serving()` waits until the app answers, yields the port and the
child's pid, and stops the child afterwards (SIGTERM, then SIGKILL).

    python bench/server.py echo FD
    python bench/server.py relay FD DB_PATH
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the child imports Starlette when it builds an app, the parent never
    from starlette.applications import Starlette

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the child runs this file as a script
    sys.path.insert(0, str(ROOT))

BENCH_RATE = 1e9
"""Per-token rate limit and burst of the benchmark relay: high enough never to throttle."""
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ServerError(Exception):
    """The benchmark server did not start, or died (its stderr is in the message)."""


# ---- the child: one app under uvicorn -------------------------------------------------------


def echo_app() -> Starlette:
    """A bare Starlette endpoint: POST /echo answers with the request's body."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def echo(request: Request) -> Response:
        return Response(await request.body(), media_type="application/octet-stream")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"])])


def relay_app(db: str, schema: str | None = None) -> Starlette:
    """The relay as shipped (SQLite, WAL, synchronous=FULL; or PostgreSQL when `db` is a
    `postgresql://` URL, in `schema`), with rate limits out of reach; it takes the unsigned
    pushes of the version-1 accounts that `relay.load` and the `relay.push.unsigned`
    baseline register (`relay.push` and `sync.e2e` sign theirs)."""
    from relay.app import create_app
    from relay.config import RelayConfig
    from relay.sqlite import SQLiteStorage
    from relay.storage import Storage
    from replica.wire import system_clock_ms

    config = RelayConfig(
        open_signup=True,
        requests_per_second=BENCH_RATE,
        burst=int(BENCH_RATE),
        accept_unsigned_pushes=True,
    )
    rules = config.version_rules(system_clock_ms)
    storage: Storage
    if db.startswith("postgresql://"):
        from relay.postgres import PostgresStorage  # needs psycopg: only for this relay

        storage = PostgresStorage(db, rules, schema=schema or "public")
    else:
        storage = SQLiteStorage(db, rules)
    return create_app(storage, config)


def serve(app: Starlette, fd: int) -> None:
    """uvicorn as the relay runs in production: uvloop, httptools, no access log."""
    import uvicorn

    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


def main(argv: Sequence[str]) -> None:
    kind, fd = argv[0], int(argv[1])
    serve(echo_app() if kind == "echo" else relay_app(*argv[2:4]), fd)


# ---- the parent: start, wait, stop ----------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A running benchmark server."""

    port: int
    pid: int


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc), None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(port: int, child: subprocess.Popen[bytes], log_path: Path) -> None:
    """Poll until the app answers any HTTP request (its status does not matter)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    probe = b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    while time.monotonic() < deadline:
        if child.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                sock.sendall(probe)
                if sock.recv(16).startswith(b"HTTP/1.1"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise ServerError(f"benchmark server did not answer on port {port}: {tail(log_path)}")


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM (uvicorn shuts down gracefully, the relay closes its storage), then SIGKILL."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def serving(
    kind: str, log_path: Path, db: Path | str | None = None, schema: str | None = None
) -> Iterator[Served]:
    """Serve `kind` ("echo" or "relay": its SQLite file, or a PostgreSQL URL and schema) on
    a fresh loopback port for the `with` block."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port = listener.getsockname()[1]
    args = [sys.executable, __file__, kind, str(listener.fileno())]
    args += [str(db)] if db is not None else []
    args += [schema] if schema is not None else []
    with log_path.open("wb") as log:
        child = subprocess.Popen(args, pass_fds=[listener.fileno()], stderr=log, stdout=log)
    listener.close()  # the child holds its own copy
    try:
        wait_ready(port, child, log_path)
        yield Served(port, child.pid)
        if child.poll() is not None:
            raise ServerError(f"benchmark server died during the run: {tail(log_path)}")
    finally:
        stop(child)


if __name__ == "__main__":
    main(sys.argv[1:])
