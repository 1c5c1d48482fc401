"""A real relay process on 127.0.0.1: `sealsync relay serve` over SQLite or PostgreSQL, for
tests that need uvicorn, a real socket, SIGKILL and restarts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTakenError(RuntimeError):
    """The relay could not bind its port: another process took it after `free_port`."""


class RelayProcess:
    """Start, SIGKILL and restart one relay; its JSON log lines (debug level: one per request)
    go to `log_path`."""

    def __init__(
        self,
        db: Path | None,
        log_path: Path,
        *options: str,
        open_signup: bool = True,
        accept_unsigned: bool = False,
        prefix: tuple[str, ...] = (),
    ) -> None:
        """SQLite at `db`, or whatever storage `options` name (`--database-url …`); anyone
        may register unless `open_signup` is False (then by invite only); unsigned pushes
        (of accounts registered with a placeholder bundle) only with `accept_unsigned`;
        `prefix` runs the relay under another program (strace injecting faults)."""
        self.db = db
        self.prefix = prefix
        self.log_path = log_path
        self.options = (
            *(("--db", str(db)) if db else ()),
            *options,
            *(("--open-signup",) if open_signup else ()),
            *(("--set", "accept_unsigned_pushes=true") if accept_unsigned else ()),
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.started_once = False
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        """Start the relay and wait for it to answer. `free_port` cannot reserve its port: on
        a busy machine another process may take it first, so a first start that finds it
        taken tries a new one (a restart keeps its port: clients know the URL)."""
        for _ in range(3):
            try:
                return self._start_once()
            except PortTakenError:
                if self.started_once:
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        return self._start_once()

    def _start_once(self) -> RelayProcess:
        command = [
            *self.prefix, sys.executable, "-m", "clients.cli", "relay", "serve", *self.options,
            "--port", str(self.port), "--set", "requests_per_second=100000",
            "--set", "burst=100000", "--log-level", "debug",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self._process = subprocess.Popen(  # under a prefix, its own group: killed whole
            command,
            stdout=log,
            stderr=log,
            env=os.environ.copy(),
            start_new_session=bool(self.prefix),
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = self.log_path.read_text()[-2000:]
                if f"{self.port}): address already in use" in tail:
                    raise PortTakenError(tail)
                raise RuntimeError(f"relay exited: {tail}")
            try:
                if httpx2.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    self.started_once = True
                    return self
            except httpx2.TransportError:
                time.sleep(0.05)
        raise RuntimeError("relay did not answer within 20 s")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush — what a power cut or OOM kill does to the process."""
        if self._process is not None:
            if self.prefix:  # strace's tracee would outlive strace
                os.killpg(self._process.pid, signal.SIGKILL)
            else:
                self._process.send_signal(signal.SIGKILL)
            self._process.wait()
            self._process = None

    def stop(self) -> None:
        """SIGTERM: uvicorn's graceful shutdown."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=20)
            self._process = None

    def __enter__(self) -> RelayProcess:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()
