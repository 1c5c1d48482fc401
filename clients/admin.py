"""`devices` and `profiles`: looking after an account from one of its devices."""

from __future__ import annotations

import datetime
import json

import click
from rich.table import Table

from clients.console import fail, out, user_errors
from clients.device import device_client, load_settings, opened_replica
from clients.http import RelayClient
from clients.settings import CliSettings
from replica.errors import InvalidArgumentError
from replica.wire import DeviceInfo


def created_to_text(created_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(created_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def revoke(client: RelayClient, listed: list[DeviceInfo], device_id: str) -> None:
    """Revoke another device of the account; this one and unknown ids are refused first."""
    found = next((d for d in listed if d.id == device_id), None)
    if found is None:
        raise InvalidArgumentError(
            f"no device {device_id!r} in this account", hint="`sealsync devices` lists their ids"
        )
    if found.current:
        raise InvalidArgumentError(
            f"{device_id!r} is this device", hint="revoke it from another device of the account"
        )
    client.revoke_device(device_id)


@click.command("devices")
@click.option("--revoke", "revoke_id", metavar="ID", help="Revoke another device's access.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def devices(settings: CliSettings, revoke_id: str | None, as_json: bool) -> None:
    """The account's devices (this one marked); `--revoke ID` takes one's access away."""
    path = settings.replica_path
    with user_errors(), device_client(path, load_settings(path)) as client:
        listed = client.devices().devices
        if revoke_id is not None:
            revoke(client, listed, revoke_id)
            out.print(f"revoked device {revoke_id}")
            listed = client.devices().devices
    if as_json:
        rows = [{"id": d.id, "name": d.name, "created_ms": d.created_ms, "current": d.current}
                for d in listed]  # fmt: skip
        click.echo(json.dumps(rows))
        return
    table = Table("", "id", "name", "added")
    for d in listed:
        table.add_row("*" if d.current else "", d.id, d.name, created_to_text(d.created_ms))
    out.print(table)
    out.print("* this device")


@click.command("profiles")
@click.option("--create", "name", metavar="NAME", help="Make a profile (it syncs to the others).")
@click.pass_obj
def profiles(settings: CliSettings, name: str | None) -> None:
    """The account's profiles: namespaces of records (`--profile` of put, get, ls…)."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        if name is not None:
            try:
                replica.create_profile(name)
            except InvalidArgumentError as exc:
                fail(str(exc), exc.hint or "choose another profile name")
        names = replica.profiles()
    for profile in names:
        out.print(profile)


ADMIN_COMMANDS = (devices, profiles)
