"""Automatic backups (clients/autobackup.py, `sealsync backup watch`): the schedule's
promises as properties; a backup skipped only when nothing changed; and the watch as its own
process, backing up after a quiet moment, rotating, reporting a failure without touching the
good backups, and ending cleanly on SIGTERM."""

from __future__ import annotations

import datetime
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.autobackup import BackupOutcome, Schedule, read_last_backup
from clients.backup import backup_if_changed
from clients.cli.duration import DURATION
from clients.manifest import read_manifest
from replica import Replica
from tests.clients.test_backup_verify import flip_a_byte
from tests.clients.test_cli import Cli
from tests.clients.test_cli_watch import ROOT, TIMEOUT_S, eventually
from tests.conftest import Account, ReplicaFactory

TICK_S = 0.5
Tick = tuple[float, bool]
"""Seconds since the last tick, and whether the files changed meanwhile."""


@given(
    every_s=st.floats(1, 100),
    quiet_s=st.floats(0.1, 50),
    ticks=st.lists(st.tuples(st.floats(0.01, TICK_S), st.booleans()), min_size=1, max_size=400),
)
def test_a_schedule_backs_up_after_quiet_and_never_waits_past_every(
    every_s: float, quiet_s: float, ticks: list[Tick]
) -> None:
    schedule = Schedule(every_s, quiet_s)
    now, attempts, changes = 0.0, [], []
    for step, changed in ticks:
        now += step
        if changed:
            schedule.changed(now)
            changes.append(now)
        if schedule.due(now):
            schedule.attempted(now)
            attempts.append(now)
    assert attempts and attempts[0] == ticks[0][0]  # the first attempt is at once
    for before, after in zip([*attempts, now], [*attempts[1:], now], strict=False):
        assert after - before <= every_s + TICK_S  # never longer than --every between
    for at in attempts[1:]:
        since_change = [at - c for c in changes if c <= at]
        early = since_change and min(since_change) < quiet_s
        previous = max(a for a in attempts if a < at)
        assert not early or at - previous >= every_s  # not while changing, unless scheduled
    if changes and changes[-1] + quiet_s + TICK_S <= now:  # quiet since: backed up, by an
        assert any(a >= changes[-1] for a in attempts)  # attempt that began after the change


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("0.5s", 0.5)]
)
def test_durations_read_with_their_units(text: str, seconds: float) -> None:
    assert DURATION.convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["", "0", "-1s", "1w", "1e400", "nan", "5 minutes"])
def test_a_bad_duration_is_refused_by_name(text: str) -> None:
    with pytest.raises(click.BadParameter, match="not a duration"):
        DURATION.convert(text, None, None)


def test_a_backup_is_skipped_only_when_its_rows_and_bundle_are_the_newest_good_ones(
    make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica, folder = make_replica(), tmp_path / "set"
    replica.put("notes", "n", {"text": "one"})
    now = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC)
    times = (now + datetime.timedelta(minutes=m) for m in range(10))
    first = backup_if_changed(replica.path, folder, next(times))
    assert first is not None and backup_if_changed(replica.path, folder, next(times)) is None
    replica.change_passphrase("another passphrase, as long as it must be")
    second = backup_if_changed(replica.path, folder, next(times))  # a new bundle
    assert second is not None
    flip_a_byte(second, random.Random(5))  # the newest is damaged: back up
    third = backup_if_changed(replica.path, folder, next(times))
    assert third is not None
    replica.put("notes", "n", {"text": "two"})
    fourth = backup_if_changed(replica.path, folder, next(times))
    assert fourth is not None
    counts = [read_manifest(p.with_suffix(".json")).rows["versions"] for p in (third, fourth)]
    assert counts == [1, 1] and third.read_bytes() != fourth.read_bytes()


def backups(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.db"))


@pytest.mark.slow
def test_a_watch_backs_up_when_quiet_reports_a_failure_and_keeps_good_backups(
    cli: Cli, make_replica: ReplicaFactory, tmp_path: Path
) -> None:
    replica = make_replica()
    replica.put("notes", "n0", {"text": "before the watch"})
    path, folder = replica.path, tmp_path / "set"
    process = start_watch(path, folder, tmp_path, "--keep-last", "1")
    try:
        eventually(lambda: len(backups(folder)) == 1, "the first backup, at once")
        first = backups(folder)[0]
        replica.put("notes", "n1", {"text": "while watching"})
        eventually(lambda: _settled_on_one_after(first, folder, path), "a backup of the change")
        (second,) = backups(folder)  # --keep-last 1 let the first go once this one was good
        assert read_manifest(second.with_suffix(".json")).rows["versions"] == 2
        last = read_last_backup(path)
        assert last is not None and last.ok and last == _last_in_status(cli, path)

        replica.close()
        path.rename(path.with_name("aside.db"))
        path.write_bytes(b"not a replica: the backup fails")
        eventually(lambda: _failed(path), "the failure, recorded beside the replica")
        assert backups(folder) == [second]  # the good backup stays
        path.with_name("aside.db").replace(path)
        eventually(lambda: not _failed(path), "a good backup once the replica is back")
        assert read_last_backup(path) == _last_in_status(cli, path)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()  # closes its pipes too
    assert process.returncode == 0, stderr
    assert "error: backup failed:" in stderr and "stopped watching" in stdout


def start_watch(path: Path, folder: Path, home: Path, *options: str) -> subprocess.Popen[str]:
    env = {**os.environ, "XDG_CONFIG_HOME": str(home / "config")}
    command = [sys.executable, "-m", "clients.cli", "--replica", str(path), "backup", "watch",
               "--to", str(folder), "--quiet-for", "0.2s", "--every", "1h", *options]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_a_watch_of_a_replica_nobody_writes_attempts_nothing(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    """Its own backup opens and closes the file (SQLite makes and removes the WAL): that
    must not wake it for another backup, and another, every quiet period."""
    replica = make_replica()
    replica.put("notes", "n0", {"text": "before the watch"})
    replica.close()  # nobody holds it open: the watch's own open makes the WAL anew
    folder = tmp_path / "set"
    process = start_watch(replica.path, folder, tmp_path)
    try:
        eventually(lambda: len(backups(folder)) == 1, "the first backup, at once")
        first = read_last_backup(replica.path)
        time.sleep(3)  # fifteen quiet periods
        assert read_last_backup(replica.path) == first
        with Replica.open(replica.path) as writer:
            writer.unlock_with_key(account.key)
            writer.put("notes", "n1", {"text": "a change"})
        eventually(lambda: len(backups(folder)) == 2, "a backup of the change")
    finally:
        process.kill()
        process.communicate()


def _last_in_status(cli: Cli, path: Path) -> BackupOutcome:
    last = cli.json_object(path, "status")["last_backup"]
    assert isinstance(last, dict), last
    return BackupOutcome(**last)  # type: ignore[arg-type]


def _settled_on_one_after(first: Path, folder: Path, path: Path) -> bool:
    """One backup left, a newer one than `first`, and its outcome recorded (the watch
    writes the backup, rotates, then records: a look between those steps sees less)."""
    left = backups(folder)
    last = read_last_backup(path)
    return (
        left not in ([], [first])
        and len(left) == 1
        and last is not None
        and (last.backup == str(left[0]))
    )


def _failed(path: Path) -> bool:
    last = read_last_backup(path)
    return last is not None and not last.ok
