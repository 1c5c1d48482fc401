"""`devices` and `passwd` for an account that syncs through a shared folder
(clients/folder_keys.py): a folder has no relay to revoke a token on or to take a new key
bundle, so both rotate the account's keys into the folder's next generation, and the other
devices take it at their next `sync` with the new passphrase."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from clients.cli.console import ExitCode, err, fail, out
from clients.cli.folder import report_folder_round
from clients.cli.remembered import replace_remembered
from clients.cli.rotation import created_to_text, rotation_passphrase, shown_recovery_key
from clients.cli.settings import CliSettings
from clients.device import opened_replica
from clients.folder import FolderSync
from clients.folder_keys import check_revocable_in_folder, folder_devices, rotate_in_folder

REMOVE_FROM_TOOL = (
    "remove the revoked device from the file-sync tool as well: it keeps whatever the tool "
    "gives it (it opens nothing written from now on)"
)


def devices_in_folder(
    settings: CliSettings,
    folder: Path,
    revoke_id: str | None,
    new_recovery_key: bool,
    keep_passphrase: bool,
    as_json: bool,
) -> None:
    """The devices with a place in the folder, after revoking `revoke_id`, if given."""
    if revoke_id is not None:
        flags = (new_recovery_key, keep_passphrase)
        done = revoke_in_folder(settings, folder, revoke_id, *flags, to=err if as_json else out)
        (err if as_json else out).print(done)  # stdout: JSON only
    show_folder_devices(settings, folder, as_json)


def revoke_in_folder(
    settings: CliSettings,
    folder: Path,
    revoke_id: str,
    new_recovery_key: bool,
    keep_passphrase: bool,
    *,
    to: Console,
) -> str:
    """Revoke a device of a folder's account by rotating its keys; what was done, in words."""
    with opened_replica(settings.replica_path) as replica:
        driver = FolderSync(replica, folder)
        check_revocable_in_folder(folder, driver.device, revoke_id)
        old = settings.passphrase()
        replica.unlock(old)  # a wrong passphrase stops here
        new = rotation_passphrase(settings, old, keep_passphrase)
        recovery_key = shown_recovery_key() if new_recovery_key else None
        report = rotate_in_folder(driver, new, revoked=revoke_id, new_recovery_key=recovery_key)
        replace_remembered(settings.replica_path, new)
        generation = replica.key_generation
    report_folder_round(report, to)
    err.print(f"[yellow]note:[/yellow] {REMOVE_FROM_TOOL}", markup=True)
    return (
        f"revoked device {revoke_id} and rotated the account's keys to generation "
        f"{generation}: other devices take them at their next sync, with the new passphrase"
    )


def show_folder_devices(settings: CliSettings, folder: Path, as_json: bool) -> None:
    """The devices with a place in the folder, by id, this one marked."""
    with opened_replica(settings.replica_path) as replica:
        listed = folder_devices(folder, FolderSync(replica, folder).device)
    if as_json:
        rows = [{"id": d.id, "files": d.files, "written_ms": d.written_ms, "current": d.current}
                for d in listed]  # fmt: skip
        click.echo(json.dumps(rows))
        return
    table = Table("", "id", "files", "last written")
    for d in listed:
        written = created_to_text(d.written_ms) if d.written_ms else "-"
        table.add_row("*" if d.current else "", d.id, str(d.files), written)
    out.print(table)
    out.print("* this device")


def passwd_in_folder(settings: CliSettings, folder: Path, *, end_other_sessions: bool) -> None:
    """A folder's passphrase change: the next key generation, under the new passphrase (the
    folder's bundles are one immutable file per generation, so one is not re-wrapped in
    place), which the other devices take with it; what the old one opened stays as it was."""
    if end_other_sessions:
        fail("--end-other-sessions is a relay's", "leave it out", code=ExitCode.USAGE)
    path = settings.replica_path
    with opened_replica(path) as replica:
        old = settings.passphrase()
        replica.unlock(old)  # a wrong passphrase stops here
        new = settings.new_passphrase()
        if new == old:
            fail("the new passphrase is the current one", "choose a different passphrase")
        report = rotate_in_folder(FolderSync(replica, folder), new, revoked=None)
        replace_remembered(path, new)
        generation = replica.key_generation
    report_folder_round(report)
    out.print(
        f"passphrase changed: the account's keys are generation {generation} now; other "
        "devices take them at their next sync, with the new passphrase"
    )
