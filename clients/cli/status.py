"""`sealsync status`: the replica's health, where it syncs, and its last backup; works while
locked."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from clients.autobackup import read_last_backup
from clients.cli.console import out, user_errors, when
from clients.cli.settings import CliSettings
from clients.device import load_settings, opened_replica, sidecar_path
from replica.errors import StoreError


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_obj
def status(settings: CliSettings, as_json: bool) -> None:
    """The replica's health (works while locked) and where it syncs."""
    path = settings.replica_path
    with user_errors():
        with opened_replica(path) as replica:
            fields: dict[str, Any] = dataclasses.asdict(replica.status())
        fields.update(relay_fields(path))
        last = read_last_backup(path)
        fields["last_backup"] = None if last is None else dataclasses.asdict(last)
    if as_json:
        click.echo(json.dumps(fields, sort_keys=True))
        return
    table = Table("", "", show_header=False, box=None)
    for name, value in fields.items():
        table.add_row(name, escape(shown(name, value)))
    out.print(table)


def relay_fields(path: Any) -> dict[str, Any]:
    """Relay URL, account and device id from the sidecar; None each when there is none."""
    try:
        relay = load_settings(path)
    except StoreError:
        if sidecar_path(path).exists():
            raise
        return {"relay": None, "account": None, "device_id": None}
    device = relay.session.device_id if relay.session else None
    return {"relay": relay.url, "account": relay.account, "device_id": device}


def shown(name: str, value: Any) -> str:
    """A status field for people: times as dates and ages, skews in seconds."""
    if value is None:
        return "-"
    if name == "last_sync_ms":
        return when(int(value))
    if name == "skew_seen_ms":
        return f"{int(value) / 1000:+.1f} s"
    if name == "last_backup":
        state = "ok" if value["ok"] else "FAILED"
        return f"{when(value['at_ms'])}: {state}, {value['detail']} {value['backup'] or ''}".strip()
    return str(value)
