"""`backup` and `restore`: the replica file copied whole, as ciphertext, and put back
(`clients.backup`), with a progress bar on a terminal."""

from __future__ import annotations

import datetime
from pathlib import Path

import click

from clients.backup import backup_replica, restore_replica
from clients.cli.console import copy_progress, out, user_errors
from clients.cli.settings import CliSettings


@click.command("backup")
@click.option(
    "--to",
    "folder",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write the snapshot into.",
)
@click.pass_obj
def backup(settings: CliSettings, folder: Path) -> None:
    """Snapshot the replica file (ciphertext; no passphrase needed)."""
    with user_errors(), copy_progress("backing up") as progress:
        now = datetime.datetime.now(datetime.UTC)
        target = backup_replica(settings.replica_path, folder, now, progress)
    out.print(f"backup written: {target}")


@click.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an existing replica at --replica.")
@click.pass_obj
def restore(settings: CliSettings, file: Path, force: bool) -> None:
    """Put a backup in place as this device's replica, writing under a new node id."""
    with user_errors(), copy_progress("restoring") as progress:
        node = restore_replica(file, settings.replica_path, force=force, progress=progress)
    out.print(f"restored {file} to {settings.replica_path} (node {node:016x})")


BACKUP_COMMANDS = (backup, restore)
