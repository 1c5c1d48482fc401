"""Automatic backups (`sealsync backup watch`): a backup once the replica has been quiet for
a while, and an attempt at least every so often besides, the old ones rotated.

The replica's files are watched with watchfiles (polled where the platform gives no file
events). A backup holding the same rows and key bundle as its node's newest good backup is
not kept (`backup_if_changed`), so a watch woken by nothing new — another process reading
the file, its own backup's read, a scheduled attempt — adds nothing to the folder. Each
attempt's outcome is written beside the replica, where `sealsync status` reads it. A backup
that fails is reported and never followed by `forget`: a failure can never push an older
good backup out (and `forget` counts only backups that verify).
"""

from __future__ import annotations

import datetime
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from watchfiles import watch

from clients.backup import backup_if_changed, forget_backups
from clients.device import read_sidecar, write_atomically
from clients.retention import KeepPolicy
from replica.errors import SealsyncError, StoreError

LAST_BACKUP_SUFFIX = ".backup.json"
TICK_S = 0.5
"""How often the watch looks at its clocks when no file event comes."""
WATCHED_SUFFIXES = ("", "-wal", "-journal")
"""The replica file and the journals SQLite commits through (not -shm: readers write it)."""


@dataclass(frozen=True)
class BackupOutcome:
    """One attempt: when (ms since the epoch), whether it worked, the backup it wrote (None
    when nothing had changed or it failed), and what happened, in words."""

    at_ms: int
    ok: bool
    backup: str | None
    detail: str


@dataclass
class Schedule:
    """When to back up: once the replica has been quiet for `quiet_s` after a change, and
    at least every `every_s` whatever happens (a scheduled attempt finds out whether
    anything changed). The first attempt is due at once."""

    every_s: float
    quiet_s: float
    pending: bool = True
    last_change: float = -math.inf
    last_attempt: float = -math.inf

    def changed(self, now: float) -> None:
        self.pending, self.last_change = True, now

    def due(self, now: float) -> bool:
        quiet = self.pending and now - self.last_change >= self.quiet_s
        return quiet or now - self.last_attempt >= self.every_s

    def attempted(self, now: float) -> None:
        self.pending, self.last_attempt = False, now


def last_backup_path(replica_path: Path) -> Path:
    return replica_path.with_name(replica_path.name + LAST_BACKUP_SUFFIX)


def read_last_backup(replica_path: Path) -> BackupOutcome | None:
    """The outcome of the last backup of this replica, if one was recorded."""
    return read_sidecar(
        last_backup_path(replica_path),
        BackupOutcome,
        "a backup's outcome",
        hint="remove it: the next backup writes it again",
    )


def back_up_once(
    replica_path: Path, folder: Path, policy: KeepPolicy | None, now: datetime.datetime
) -> BackupOutcome:
    """One attempt: a backup if the replica changed, then `forget` by `policy` if one was
    written (an unchanged set needs no second look); its outcome recorded beside the
    replica and returned."""
    at_ms = int(now.timestamp() * 1000)
    try:
        if not folder.is_dir():  # never made anew: an unmounted disk's mount point is not it
            raise StoreError(
                f"no folder {folder}", hint="is its disk there? the watch writes into it again"
            )
        written = backup_if_changed(replica_path, folder, now)
        if written is not None and policy is not None and not policy.empty:
            forget_backups(folder, policy, dry_run=False)
        detail = "written" if written else "unchanged since the last backup"
        outcome = BackupOutcome(at_ms, True, None if written is None else str(written), detail)
    except (SealsyncError, OSError) as exc:
        outcome = BackupOutcome(at_ms, False, None, str(exc))
    try:
        record_outcome(replica_path, outcome)
    except OSError as exc:
        return replace(outcome, detail=f"{outcome.detail} (status not recorded: {exc})")
    return outcome


def record_outcome(replica_path: Path, outcome: BackupOutcome) -> None:
    """Write `outcome` beside the replica, if the replica is there (a mistyped path leaves
    no file; the outcome is reported to the person all the same)."""
    if replica_path.is_file():
        write_atomically(last_backup_path(replica_path), json.dumps(asdict(outcome)).encode())


def watch_backups(
    replica_path: Path,
    folder: Path,
    schedule: Schedule,
    policy: KeepPolicy | None,
    stop: threading.Event,
    on_outcome: Callable[[BackupOutcome], None],
) -> None:
    """Back up as `schedule` says until `stop` is set, telling `on_outcome` each attempt.

    A file event counts as a change only when the replica's files differ from what they
    were as the last attempt began: an attempt opens and closes the file, and SQLite makes
    and removes the WAL then, which would otherwise wake the watch for another attempt, and
    another. (Taken as the attempt begins, a write during it is not missed.)"""
    names = _watched(replica_path)
    before_last = _files(replica_path, names)
    for changed in _file_events(replica_path, stop):
        now = time.monotonic()
        if changed and _files(replica_path, names) != before_last:
            schedule.changed(now)
        if schedule.due(now):
            schedule.attempted(now)
            before_last = _files(replica_path, names)
            at = datetime.datetime.now(datetime.UTC)
            on_outcome(back_up_once(replica_path, folder, policy, at))


def _watched(replica_path: Path) -> set[str]:
    return {replica_path.name + suffix for suffix in WATCHED_SUFFIXES}


def _files(replica_path: Path, names: set[str]) -> list[tuple[str, int, int]]:
    """The watched files that exist, with their sizes and times."""
    found = []
    for name in sorted(names):
        try:
            stat = (replica_path.parent / name).stat()
            found.append((name, stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:
            continue
    return found


def _file_events(replica_path: Path, stop: threading.Event) -> Iterator[bool]:
    """Whether the replica's files changed, about every `TICK_S`, until `stop` is set."""
    names = _watched(replica_path)
    try:
        for changes in watch(
            replica_path.parent,
            watch_filter=lambda _, changed: Path(changed).name in names,
            stop_event=stop,
            yield_on_timeout=True,
            rust_timeout=int(TICK_S * 1000),
            debounce=int(TICK_S * 1000),
            recursive=False,
        ):
            yield bool(changes)
    except (OSError, RuntimeError):  # no file events here (inotify limits, platforms)
        yield from _polled(replica_path, names, stop)


def _polled(replica_path: Path, names: set[str], stop: threading.Event) -> Iterator[bool]:
    seen = _files(replica_path, names)
    while not stop.wait(TICK_S):
        now = _files(replica_path, names)
        yield now != seen
        seen = now
