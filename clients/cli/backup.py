"""`backup` and `restore`: the replica file copied whole, as ciphertext, and put back
(`clients.backup`), with a progress bar on a terminal."""

from __future__ import annotations

import datetime
import functools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from clients.autobackup import BackupOutcome, Schedule, record_outcome, watch_backups
from clients.backup import (
    ALL,
    backup_replica,
    forget_backups,
    list_backups,
    merge_backup_into,
    profile_scope,
    restore_replica,
)
from clients.cli.chat import reconcile_chats
from clients.cli.console import (
    ExitCode,
    copy_progress,
    err,
    fail,
    out,
    stopped_by_signals,
    user_errors,
    when,
)
from clients.cli.duration import DURATION
from clients.cli.records import json_option, print_json
from clients.cli.settings import CliSettings
from clients.device import opened_replica
from clients.retention import KeepPolicy
from clients.verify import Verdict, verify_backup, verify_folder, verify_with_key
from replica import Replica
from replica.errors import SealsyncError, StoreError


def keep_options(command: Callable[..., None]) -> Callable[..., None]:
    """restic's --keep-* rules (clients/retention.py), as `keep_last` … `keep_monthly`."""
    for rule, help_text in reversed(KEEP_RULES):
        option = click.option(
            f"--keep-{rule}", f"keep_{rule}", type=click.IntRange(min=0), default=0, help=help_text
        )
        command = option(command)
    return command


def keep_policy(keep: dict[str, int]) -> KeepPolicy:
    return KeepPolicy(**{name.removeprefix("keep_"): count for name, count in keep.items()})


KEEP_RULES = (
    ("last", "The newest N."),
    ("daily", "One a day, N days."),
    ("weekly", "One a week, N weeks."),
    ("monthly", "One a month, N months."),
)


@click.group("backup", invoke_without_command=True)
@click.option(
    "--to",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write the snapshot and its manifest into.",
)
@click.option(
    "--profile", default=None, help="Back up this profile only (asks for the passphrase)."
)
@click.pass_context
def backup(context: click.Context, folder: Path | None, profile: str | None) -> None:
    """Snapshot the replica file (ciphertext; no passphrase needed); `ls` and `verify`."""
    if context.invoked_subcommand is not None:
        if folder is not None or profile is not None:
            raise click.UsageError("--to takes a backup: give it without a subcommand")
        return
    if folder is None:
        raise click.UsageError("give --to FOLDER, or a subcommand (ls, verify, forget)")
    settings: CliSettings = context.obj
    path = settings.replica_path
    scope = ALL
    if profile is not None:
        with user_errors(), opened_replica(path, settings.passphrase) as replica:
            scope = profile_scope(replica, profile)
    with user_errors(), copy_progress("backing up") as progress:
        now = datetime.datetime.now(datetime.UTC)
        at_ms = int(now.timestamp() * 1000)
        try:
            target = backup_replica(path, folder, now, progress, scope)
        except (SealsyncError, OSError) as exc:
            record_outcome(path, BackupOutcome(at_ms, False, None, str(exc)))
            raise
        record_outcome(path, BackupOutcome(at_ms, True, str(target), "written"))
    out.print(f"backup written: {target}")


@backup.command("watch")
@click.option(
    "--to",
    "folder",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write backups into (made if missing when the watch starts).",
)
@click.option(
    "--every", type=DURATION, default="1h", show_default=True, help="Attempt at least this often."
)
@click.option(
    "--quiet-for",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Back up once the replica has not changed for this long.",
)
@keep_options
@click.pass_obj
def backup_watch(
    settings: CliSettings, /, folder: Path, every: float, quiet_for: float, **keep: int
) -> None:
    """Back up whenever the replica has been quiet after a change, and at least --every;
    rotate with --keep-* after each good backup. Runs until Ctrl-C or SIGTERM."""
    path = settings.replica_path
    with user_errors():
        Replica.open(path).close()  # a replica, or a clear error before watching
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    stop = threading.Event()
    out.print(f"watching {path}; backups into {folder} (Ctrl-C stops)")
    with stopped_by_signals(stop):
        schedule = Schedule(every, quiet_for)
        watch_backups(path, folder, schedule, keep_policy(keep), stop, report_outcome)
    out.print("stopped watching")


def report_outcome(outcome: BackupOutcome) -> None:
    """A failed backup is an `error:` line (the watch goes on); one skipped says nothing."""
    if not outcome.ok:
        err.print(f"[red]error:[/red] backup failed: {escape(outcome.detail)}", markup=True)
    elif outcome.backup is not None:
        out.print(f"backup written: {outcome.backup}")


@backup.command("ls")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@json_option
def backup_ls(folder: Path, as_json: bool) -> None:
    """The backups in FOLDER, newest last: size, when taken, and whether their manifest is
    there (`verify` checks them)."""
    with user_errors():
        listed = list_backups(folder)
    if as_json:
        print_json([asdict(b) for b in listed])
        return
    table = Table("backup", "size", "taken", "manifest")
    now_ms = time.time_ns() // 1_000_000
    for b in listed:
        table.add_row(
            b.name, f"{b.bytes:,}", when(b.taken_ms, now_ms), "yes" if b.manifest else "NO"
        )
    out.print(table)


@backup.command("verify")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--read-data", is_flag=True, help="Also open every envelope with the passphrase.")
@json_option
@click.pass_obj
def backup_verify(settings: CliSettings, path: Path, read_data: bool, as_json: bool) -> None:
    """Check a backup, or every backup in a folder, without the passphrase (with it, given
    --read-data); exit 3 when one is damaged, 4 when the passphrase does not open one, 1
    when one cannot be read (specs/cli.md §2)."""
    passphrase = functools.cache(settings.passphrase)
    check = functools.partial(verify_with_key, passphrase=passphrase) if read_data else None
    with user_errors():
        if not path.exists():
            raise StoreError(f"no backup or folder at {path}", hint="give a path `backup` wrote")
        verdicts = verify_folder(path, check) if path.is_dir() else [(check or verify_backup)(path)]
        if not verdicts:
            raise StoreError(f"no backups in {path}", hint="give the folder given to `backup --to`")
    if as_json:
        print_json([verdict_json(v) for v in verdicts])
    else:
        for v in verdicts:
            out.print(f"{v.state}: {v.backup}")
            for problem in v.problems:
                out.print(f"  {escape(problem)}")
    states = {v.state for v in verdicts}
    if "damaged" in states:
        sys.exit(ExitCode.DAMAGED)
    if "wrong_key" in states:
        sys.exit(ExitCode.WRONG_KEY)
    if "unreadable" in states:
        sys.exit(ExitCode.ERROR)


@backup.command("forget")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@keep_options
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@json_option
def backup_forget(folder: Path, dry_run: bool, as_json: bool, **keep: int) -> None:
    """Remove the backups in FOLDER that no --keep-* rule keeps (restic's rules); backups
    that do not verify are left alone and never counted."""
    policy = keep_policy(keep)
    with user_errors():
        if not folder.is_dir():
            raise StoreError(f"no folder {folder}", hint="give the folder given to `backup --to`")
        done = forget_backups(folder, policy, dry_run=dry_run)
    if as_json:
        print_json(asdict(done))
        return
    verb = "would remove" if dry_run else "removed"
    for name in done.removed:
        out.print(f"{verb}: {name}")
    for name in done.left_alone:
        err.print(f"[yellow]warning:[/yellow] left alone (does not verify): {name}", markup=True)
    out.print(f"kept {len(done.kept)}, {verb} {len(done.removed)}")


@click.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing replica at --replica.")
@click.option("--unverified", is_flag=True, help="Restore a backup that does not verify, as it is.")
@click.option(
    "--merge", is_flag=True, help="Merge the backup into the replica (nothing newer is replaced)."
)
@click.option("--profile", default=None, help="With --merge: only this profile's records.")
@click.option("--collection", default=None, help="With --merge: only this collection's records.")
@click.pass_obj
def restore(
    settings: CliSettings,
    file: Path,
    force: bool,
    unverified: bool,
    merge: bool,
    profile: str | None,
    collection: str | None,
) -> None:
    """Put a backup in place as this device's replica, writing under a new node id; or,
    with --merge, merge its versions into this replica as if pulled."""
    if merge and force:
        raise click.UsageError("--merge never replaces the replica: give --force without it")
    if not merge and (profile is not None or collection is not None):
        raise click.UsageError("--profile and --collection choose what --merge merges")
    if merge:
        merge_into_replica(settings, file, unverified, profile, collection)
        return
    with user_errors(), copy_progress("restoring") as progress:
        node, verdict = restore_replica(
            file,
            settings.replica_path,
            force=force,
            unverified=unverified,
            progress=progress,
            passphrase=settings.passphrase,
        )
    warn_unverified(verdict)
    out.print(f"restored {file} to {settings.replica_path} (node {node:016x})")


def merge_into_replica(
    settings: CliSettings, file: Path, unverified: bool, profile: str | None, collection: str | None
) -> None:
    """`restore --merge`: exit 3 when versions of the backup were quarantined or refused."""
    with (
        user_errors(),
        opened_replica(settings.replica_path, settings.passphrase) as replica,
        copy_progress("merging") as progress,
    ):
        merged, verdict = merge_backup_into(
            replica,
            file,
            profile=profile,
            collection=collection,
            unverified=unverified,
            progress=progress,
        )
        reconcile_chats(replica)
    warn_unverified(verdict)
    held = sum(merged.held.values())
    out.print(
        f"merged {file}: {merged.read} versions read, {merged.merged} merged, "
        f"{merged.superseded} already here or older, {held} held, "
        f"{merged.quarantined} quarantined, {merged.untrusted} untrusted"
    )
    if merged.quarantined or merged.untrusted:
        fail(
            "versions of the backup could not be opened or were refused",
            "`sealsync diagnose` names them; they are kept in quarantine",
            code=ExitCode.DAMAGED,
        )


def warn_unverified(verdict: Verdict) -> None:
    for problem in verdict.problems:
        err.print(f"[yellow]warning:[/yellow] restored as it is: {escape(problem)}", markup=True)


def verdict_json(verdict: Verdict) -> dict[str, object]:
    return {
        "backup": str(verdict.backup),
        "state": verdict.state,
        "problems": list(verdict.problems),
    }
