"""`init --folder`, `join --folder`, `sync` and `move` through a folder (clients/folder.py): the
command line's side of syncing through a folder a file-sync tool keeps in step."""

from __future__ import annotations

import threading
import time
from contextlib import closing
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from watchfiles import watch

from clients.cli.chat import reconcile_chats
from clients.cli.console import ExitCode, err, fail, out, stopped_by_signals, user_errors
from clients.cli.remembered import forget_remembered, replace_remembered
from clients.cli.settings import CliSettings
from clients.device import (
    CLI_OPTIONS,
    opened_replica,
    refuse_existing,
    removed_on_failure,
    sidecar_path,
)
from clients.folder import (
    DEVICES,
    MARKER,
    FolderReport,
    FolderState,
    FolderSync,
    load_state,
    make_folder,
    read_bundle,
    save_state,
)
from clients.keys import describe_rotation
from clients.schema import CHAT_SCHEMA
from replica import Replica, passphrase_login_keys
from replica.bundles import parse_bundle
from replica.errors import StoreError

TICK_MS = 500
"""How often a waiting watch looks at its stop event and its deadline."""


def folder_of(replica_path: Path) -> Path | None:
    """The folder this device syncs through, if it syncs through one: a device with relay
    settings syncs through its relay (`login` moved it back there)."""
    if sidecar_path(replica_path).exists():
        return None
    state = load_state(replica_path)
    return None if state is None else Path(state.folder)


def require_relay(relay_url: str | None, account: str | None) -> tuple[str, str]:
    if relay_url is None or account is None:
        raise click.UsageError("give --relay URL and --account NAME, or --folder DIR")
    return relay_url, account


def refuse_relay_options(relay_url: str | None, account: str | None, invite: str | None) -> None:
    if relay_url is not None or account is not None:
        raise click.UsageError("--folder takes the place of --relay and --account")
    if click.get_current_context().params.get("cacert") is not None:
        raise click.UsageError("--cacert is a relay's: a folder takes none")
    given = click.get_current_context().get_parameter_source("invite")
    if invite is not None and given is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--invite is a relay's: a folder takes no invite")


def init_in_folder(settings: CliSettings, folder: Path) -> None:
    """A new account whose devices sync through `folder` (made a sealsync folder here)."""
    path = settings.replica_path
    with user_errors():
        refuse_existing(path)
        passphrase = settings.passphrase(confirm=True)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with removed_on_failure(path):
            replica, new = Replica.create(path, CHAT_SCHEMA, passphrase, options=CLI_OPTIONS)
            with closing(replica):
                make_folder(folder.resolve(), replica.key_bundle(), replica.key_generation)
                save_state(path, FolderState(str(folder.resolve())))
    out.print(f"account created in folder {folder}; this device's replica: {path}")
    out.print("recovery key (shown once; keep it somewhere safe, it unlocks the account):")
    click.echo(new.recovery_key)
    forget_remembered(path)


def join_from_folder(settings: CliSettings, folder: Path) -> None:
    """Add this device to the account whose folder `folder` is, then sync it."""
    path = settings.replica_path
    folder = folder.resolve()
    with user_errors():
        refuse_existing(path)
        bundle = read_bundle(folder)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with removed_on_failure(path):
            replica = Replica.join(path, bundle, options=CLI_OPTIONS)
            with closing(replica):
                replica.unlock(settings.passphrase())
                replica.declare(CHAT_SCHEMA)
                save_state(path, FolderState(str(folder)))
                out.print(f"joined the account in folder {folder}; replica: {path}")
                report_folder_round(FolderSync(replica, folder).sync())
    forget_remembered(path)


def sync_through_folder(settings: CliSettings, folder: Path, *, watch_s: float | None) -> None:
    """A round through `folder` (and, with `watch_s`, a round at every change there or
    here, and at least every `watch_s`, until a signal)."""
    path = settings.replica_path
    with user_errors():
        if sidecar_path(path).exists():
            raise StoreError(
                f"{path} syncs through a relay ({sidecar_path(path)})",
                hint="an account syncs through one transport at a time",
            )
    with user_errors(), opened_replica(path, settings.passphrase) as replica:
        driver = FolderSync(replica, folder.resolve())
        report = with_newer_keys(settings, driver, driver.sync())
        reconcile_chats(replica)
        report_folder_round(report)
        if watch_s is not None:
            watch_folder(driver, watch_s)
    if report.merged.quarantined or report.merged.untrusted:
        fail(
            "versions in the folder could not be opened or were refused",
            "`sealsync diagnose` names them; they are kept in quarantine",
            code=ExitCode.DAMAGED,
        )


def move_to_folder(settings: CliSettings, folder: Path) -> None:
    """Move this device from its relay to a shared folder: every version it holds is
    written there (a reseed into the folder), and it syncs through the folder from then
    on; run again after a crash, it finishes."""
    path = settings.replica_path
    folder = folder.resolve()
    with user_errors():
        state = load_state(path)
        if not sidecar_path(path).exists() and (state is None or state.folder != str(folder)):
            raise StoreError(
                f"{path} syncs through no relay", hint="`sealsync sync` syncs it as it is set"
            )
    with user_errors(), opened_replica(path, settings.passphrase) as replica:
        if (folder / MARKER).exists():
            if read_bundle(folder) != replica.key_bundle():
                raise StoreError(
                    f"{folder} holds another key bundle: another account's folder, or one "
                    "whose keys changed",
                    hint="move into an empty folder, or one this account's devices made",
                )
        else:
            make_folder(folder, replica.key_bundle(), replica.key_generation)
        replica.sync_session().reseed()  # every version to write out; the relay forgotten
        save_state(path, FolderState(str(folder)))
        report = FolderSync(replica, folder).sync()
        sidecar_path(path).unlink(missing_ok=True)  # only once the folder holds everything
        reconcile_chats(replica)
    report_folder_round(report)
    out.print(f"moved to folder {folder}: `sealsync sync` syncs through it from now on")


def with_newer_keys(
    settings: CliSettings, driver: FolderSync, report: FolderReport
) -> FolderReport:
    """The round's report, or, when the folder holds newer keys (changed on another device),
    the next round's once this device took them with the passphrase as changed there: only
    keys that passphrase opens, only newer ones, only this account's, vouched for by this
    generation when they are the next."""
    if report.newer_keys is None:
        return report
    report_folder_round(report)
    replica, bundle = driver.replica, report.newer_keys
    kdf = parse_bundle(bundle).kdf
    changed = kdf != replica.kdf_params()  # every rotation draws a new salt (keys.py)
    passphrase = settings.changed_passphrase() if changed else settings.passphrase()
    replica.adopt_bundle(bundle, passphrase_login_keys(passphrase, kdf))
    replace_remembered(settings.replica_path, passphrase)
    out.print("took the account's newer keys from the folder (changed on another device)")
    rotation = describe_rotation(None, replica)
    if rotation is not None:
        out.print(escape(rotation))
    return driver.sync()


def watch_folder(driver: FolderSync, every_s: float) -> None:
    """A round whenever a file in the folder changes (not a temporary one), and at least
    every `every_s` (writes by other processes on this replica are noticed then), until
    SIGINT or SIGTERM."""
    stop = threading.Event()
    out.print("watching the folder for changes (Ctrl-C stops)")
    with stopped_by_signals(stop):
        while not wait_for_files(driver.folder / DEVICES, stop, every_s):
            report = driver.sync()
            reconcile_chats(driver.replica)
            report_folder_round(report)
    out.print("stopped watching")


def wait_for_files(place: Path, stop: threading.Event, every_s: float) -> bool:
    """Wait until a file under `place` changes (not a temporary one) or `every_s` passed;
    whether `stop` was set meanwhile. Where there are no file events (inotify's limits,
    some platforms), it waits `every_s`."""
    deadline = time.monotonic() + every_s
    try:
        for changes in watch(
            place,
            watch_filter=lambda _, changed: not Path(changed).name.startswith("."),
            stop_event=stop,
            yield_on_timeout=True,
            rust_timeout=TICK_MS,
        ):
            if changes or time.monotonic() >= deadline:
                break
    except (OSError, RuntimeError):
        stop.wait(max(0.0, deadline - time.monotonic()))
    return stop.is_set()


def report_folder_round(report: FolderReport, to: Console = out) -> None:
    """The round's line (on `to`: stderr where stdout is JSON only), and a `warning:` for
    each file not read and for newer keys to take."""
    merged = report.merged
    held = sum(merged.held.values())
    retired = f", {report.retired} under retired keys not read" if report.retired else ""
    to.print(
        f"synced: {report.pushed} written in {report.segments} segment(s), {report.files} "
        f"file(s) read, {merged.merged} merged, {held} held, {merged.quarantined} "
        f"quarantined, {merged.untrusted} untrusted{retired}"
        + (f"; snapshot {report.snapshot}" if report.snapshot else "")
    )
    for refused in report.refused:
        err.print(f"[yellow]warning:[/yellow] not read (yet): {escape(refused)}", markup=True)
    if report.newer_keys is not None:
        err.print(f"[yellow]warning:[/yellow] {NEWER_KEYS_WARNING}", markup=True)
    elif report.waiting:
        waiting = f"{report.waiting} file(s) {WAITING_WARNING}"
        err.print(f"[yellow]warning:[/yellow] {waiting}", markup=True)


NEWER_KEYS_WARNING = (
    "the folder holds newer keys (changed on another device): this device neither writes "
    "nor reads there until `sealsync sync` takes them, with the new passphrase"
)
WAITING_WARNING = (
    "signed under newer keys wait until their key bundle reaches this copy of the folder"
)
