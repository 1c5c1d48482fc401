"""Talking to the person at the terminal: the two consoles, errors as `error:`/`hint:`, times.

A user mistake is never a traceback: each error sealsync raises on purpose, and each refusal
of the operating system or of SQLite, becomes one `error:` line, a `hint:` line where the user
can act, and a non-zero exit. The hints here are the command line's: the library's hints speak
of API calls, these speak of commands and options.
"""

from __future__ import annotations

import enum
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import NoReturn

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

from clients.errors import UnknownOutcomeError
from replica.errors import (
    ReplicaLockedError,
    SealsyncError,
    StoreError,
    WrongKeyError,
    is_disk_error,
)

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

HINT_BY_ERROR: dict[type[SealsyncError], str] = {
    WrongKeyError: "check the passphrase (prompt, --passphrase-file or SEALSYNC_PASSPHRASE) "
    "or the recovery key",
    StoreError: "check the --replica path (or SEALSYNC_REPLICA); `sealsync init` or "
    "`sealsync join` makes a replica",
    ReplicaLockedError: "give the passphrase (prompt, --passphrase-file or SEALSYNC_PASSPHRASE)",
}
PAGE_BYTES = 4096
"""SQLite's default page size: copy progress counts pages, the bar shows bytes."""
UNREACHABLE_HINT = (
    "check that the relay is running and the URL is right; running the command again is safe"
)


class ExitCode(enum.IntEnum):
    """How a command ended, for scripts (specs/cli.md)."""

    ERROR = 1
    """Nothing, or not all, was done: a refusal, a bad input, an unreachable relay."""
    USAGE = 2
    """The command line itself is wrong (click's own code for usage errors)."""
    DAMAGED = 3
    """Done, but data that cannot be opened was found (and kept, in quarantine)."""
    WRONG_KEY = 4
    """`backup verify --read-data`: the passphrase does not open a backup."""


def fail(message: str, hint: str | None = None, code: int = ExitCode.ERROR) -> NoReturn:
    """Print `error:` (and `hint:`) on stderr and exit with `code`."""
    print_error(message, hint)
    sys.exit(code)


def print_error(message: str, hint: str | None = None) -> None:
    """`error:` (and `hint:`) on stderr, for an error that does not end the command yet."""
    err.print(f"[red]error:[/red] {message}", markup=True)
    if hint:
        err.print(f"[yellow]hint:[/yellow] {hint}", markup=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can cause into `error:`/`hint:` lines."""
    try:
        yield
    except UnknownOutcomeError as exc:
        fail(str(exc), UNREACHABLE_HINT)
    except SealsyncError as exc:
        fail(str(exc), exc.hint or HINT_BY_ERROR.get(type(exc)))
    except sqlite3.Error as exc:
        fail(f"SQLite: {exc}", sqlite_hint(exc))
    except OSError as exc:
        fail(str(exc), "check the path and its permissions")


def sqlite_hint(exc: sqlite3.Error) -> str:
    """What to do about an error SQLite raised: a disk's, a lock's, or the file's."""
    if is_disk_error(exc):
        return "the disk failed or is full: check its free space and the system log"
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return "another process holds the file; try again once it is done"
    return "check the path; `sealsync diagnose` checks a replica file"


@contextmanager
def copy_progress(what: str) -> Iterator[Callable[[int, int], None]]:
    """A bar on a terminal's stderr for a file copy reported as (pages done, pages in all);
    nothing where stderr is not a terminal, so scripts' output stays clean."""
    with Progress(
        TextColumn(what),
        BarColumn(),
        DownloadColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done * PAGE_BYTES, total=total * PAGE_BYTES)

        yield update


@contextmanager
def stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (a watch then ends cleanly, after the work in hand,
    so a service manager's stop never cuts it short); the handlers before are put back."""

    def on_signal(signum: int, _: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def when(ms: int | None, now_ms: int | None = None) -> str:
    """A time for people: the date and how long ago ("2026-12-02 01:50, 3 min ago")."""
    if ms is None:
        return ""
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    date = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")
    return f"{date}, {age(now_ms - ms)}"


def age(ms: int) -> str:
    seconds = max(0, ms // 1000)
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"
