"""`sealsync move`: a device goes from its relay to a shared folder, or from its folder to a
relay, in one command (a reseed into the other transport: everything it holds is written
there); an account syncs through one transport at a time, so each device is moved."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from clients.cli.commands import (
    CA_FILE,
    DEFAULT_RETRY_FOR_S,
    Rejoin,
    default_device_name,
    sync_through_relay,
    with_options,
)
from clients.cli.console import out, user_errors
from clients.cli.folder import move_to_folder, refuse_relay_options, report_folder_round
from clients.cli.settings import CliSettings
from clients.device import (
    RelaySettings,
    load_settings,
    opened_replica,
    save_settings,
    sidecar_path,
)
from clients.folder import FolderState, FolderSync, load_state, state_path
from clients.folder_keys import refuse_newer_keys
from clients.http import check_relay_url
from replica.errors import StoreError

MOVE_OPTIONS = (
    click.option(
        "--folder",
        type=click.Path(file_okay=False, path_type=Path),
        help="The shared folder to sync through from now on (made a sealsync folder if empty).",
    ),
    click.option("--relay", "relay_url", help="The relay to sync through from now on."),
    click.option("--account", help="With --relay: the account's name there."),
    click.option(
        "--insecure", is_flag=True, help="With --relay: allow plain http to a host not loopback."
    ),
    click.option(
        "--cacert", type=CA_FILE, help="With --relay: verify its TLS with this CA certificate."
    ),
    click.option(
        "--invite",
        envvar="SEALSYNC_INVITE",
        help="With --relay: an invite, if the relay has no such account and takes new ones by "
        "invite only.",
    ),
)


@click.command("move")
@with_options(MOVE_OPTIONS)
@click.pass_obj
def move(
    settings: CliSettings,
    folder: Path | None,
    relay_url: str | None,
    account: str | None,
    insecure: bool,
    cacert: str | None,
    invite: str | None,
) -> None:
    """Move this device between its relay and a shared folder: everything it holds is
    written to the other (a reseed into it), and it syncs through that from then on. Move
    each device; what it leaves keeps its copy until it is removed there."""
    if folder is not None:
        refuse_relay_options(relay_url, account, invite)
        if insecure:
            raise click.UsageError("--insecure is a relay's: a folder takes none")
        return move_to_folder(settings, folder)
    if relay_url is None:
        raise click.UsageError("give --folder DIR, or --relay URL and --account NAME")
    if account is None:
        raise click.UsageError("--relay needs --account NAME")
    with user_errors():
        url = check_relay_url(relay_url, insecure=insecure)
    move_to_relay(settings, RelaySettings(url, account, insecure, cacert=cacert), invite)


def move_to_relay(settings: CliSettings, relay: RelaySettings, invite: str | None) -> None:
    """Move this device from its folder to a relay: a last round through the folder (a
    device whose keys are behind the folder's takes them first: it must not carry retired
    keys to the relay), then a reseed there, which registers the account with this device's
    keys if the relay has none (as `init` would) or logs this device in, and gives the relay
    every version it holds (the relay's other devices reseed too). The folder state ends
    only once that is done. A move the relay refuses before it took this device in changes
    nothing; once it did (the session is kept, so the device stays one device there), or
    when cut short, running it again finishes it."""
    path, account = settings.replica_path, relay.account
    with user_errors():
        state, saved = folder_and_relay_settings(path, relay)
    if saved is None:  # else a move cut short: finished
        last_folder_round(settings, Path(state.folder))
        with user_errors():
            save_settings(path, dataclasses.replace(relay, device_name=default_device_name()))
    try:
        # a reseed onto the new relay; nothing collects through a folder, so nothing comes back
        rejoin = Rejoin(adopt=False, allow_resurrection=True)
        sync_through_relay(settings, rejoin, False, invite, DEFAULT_RETRY_FOR_S, None, None)
    except BaseException:  # a refusal's exit too
        if saved is None and load_settings(path).session is None:  # the relay took nothing
            sidecar_path(path).unlink(missing_ok=True)  # so the folder still serves
        raise
    state_path(path).unlink(missing_ok=True)  # only once the relay holds everything
    out.print(f"moved to relay {relay.url} as account {account!r}: `sealsync sync` syncs there")


def folder_and_relay_settings(
    path: Path, relay: RelaySettings
) -> tuple[FolderState, RelaySettings | None]:
    """The folder state a move to `relay` leaves, and the relay settings of a move to it
    cut short (None: none); `StoreError` for no folder, or settings of another relay."""
    state = load_state(path)
    if state is None:
        raise StoreError(
            f"{path} syncs through no folder",
            hint="`sealsync login --relay URL --account NAME` moves it to another relay",
        )
    saved = load_settings(path) if sidecar_path(path).exists() else None
    if saved is not None and (saved.url, saved.account) != (relay.url, relay.account):
        raise StoreError(
            f"{path} has settings for relay {saved.url}, account {saved.account!r} (a "
            "move cut short?)",
            hint=f"finish that one: `sealsync move --relay {saved.url} --account "
            f"{saved.account}`; or `sealsync move --folder {state.folder}` to stay",
        )
    return state, saved


def last_folder_round(settings: CliSettings, folder: Path) -> None:
    """A round through the folder before leaving it; `StoreError` when the folder holds
    newer keys than this device's."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        report = FolderSync(replica, folder).sync()
        refuse_newer_keys(replica, report)
    report_folder_round(report)
