"""`put`, `get`, `rm`, `ls` and `conflicts`: records of the replica, as JSON on the terminal.

Each command unlocks the replica with the passphrase (Argon2id on every run: the command line
keeps no key between runs). `--json` output is meant for scripts: one JSON value on stdout,
nothing else there.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from rich.table import Table

from clients.cli.console import fail, out, user_errors
from clients.cli.settings import CliSettings
from clients.device import opened_replica
from replica import DEFAULT_PROFILE, Record, Replica, Version
from replica.errors import InvalidArgumentError
from replica.wire import hlc_ms

profile_option = click.option(
    "--profile", default=DEFAULT_PROFILE, show_default=True, help="Profile (namespace) of records."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def parse_json(text: str) -> Any:
    """The document given on the command line (`-`: read from stdin)."""
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise InvalidArgumentError(
            f"document {shown!r} is not JSON ({exc.msg} at character {exc.pos})",
            hint="""quote it for the shell, for example '{"title": "hello"}', or give - to """
            "read it from stdin",
        ) from exc


def require_names(replica: Replica, collection: str, profile: str) -> None:
    """Refuse an undeclared collection or an unknown profile, with a hint in commands."""
    if replica.schema.get(collection) is None:
        declared = ", ".join(c.name for c in replica.schema.collections)
        raise InvalidArgumentError(
            f"collection {collection!r} is not declared in this account's schema",
            hint=f"the collections are: {declared}",
        )
    if profile not in replica.profiles():
        raise InvalidArgumentError(
            f"profile {profile!r} does not exist on this device",
            hint="`sealsync profiles` lists them and `sealsync profiles --create NAME` makes "
            "one; one made on another device arrives with `sealsync sync`",
        )


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, sort_keys=True))


def compact(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False, sort_keys=True)


def version_to_json(id: str, version: Version) -> dict[str, Any]:
    return {
        "id": id,
        "doc": version.document,
        "hlc": version.hlc,
        "node": version.node,
        "deleted": version.deleted,
    }


def live_record(replica: Replica, collection: str, id: str, profile: str) -> Record:
    """The record, or exit 1 with "not found" when it never existed or its visible version
    is a tombstone (with how many siblings it has: a deleted record may still be in conflict)."""
    require_names(replica, collection, profile)
    record = replica.get(collection, id, profile=profile)
    if record is None:
        fail(f"{collection}/{id} not found in profile {profile!r}")
    if record.deleted:
        fail(
            f"{collection}/{id} not found: deleted ({len(record.conflicts)} conflicts)",
            "see its other versions with `sealsync conflicts`" if record.conflicts else None,
        )
    return record


@click.command("put")
@click.argument("collection")
@click.argument("id")
@click.argument("document", metavar="JSON")
@profile_option
@click.pass_obj
def put(settings: CliSettings, collection: str, id: str, document: str, profile: str) -> None:
    """Write a record; it replaces every version there was, resolving any conflict."""
    with user_errors():
        value = parse_json(document)
        with opened_replica(settings.replica_path, settings.passphrase) as replica:
            require_names(replica, collection, profile)
            replica.put(collection, id, value, profile=profile)


@click.command("get")
@click.argument("collection")
@click.argument("id")
@profile_option
@json_option
@click.pass_obj
def get(settings: CliSettings, collection: str, id: str, profile: str, as_json: bool) -> None:
    """Print a record's document (exit 1 if it does not exist or was deleted)."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        record = live_record(replica, collection, id, profile)
    if as_json:
        visible = Version(record.node, record.hlc, record.deleted, record.document)
        print_json({**version_to_json(id, visible), "conflicts": len(record.conflicts)})
        return
    click.echo(json.dumps(record.document, ensure_ascii=False, indent=2, sort_keys=True))
    if record.conflicts:
        click.echo(
            f"{len(record.conflicts)} other version(s) in conflict: "
            f"sealsync conflicts {collection} {id}",
            err=True,
        )


@click.command("rm")
@click.argument("collection")
@click.argument("id")
@profile_option
@click.pass_obj
def rm(settings: CliSettings, collection: str, id: str, profile: str) -> None:
    """Delete a record (a tombstone that syncs; a later put brings it back)."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        record = live_record(replica, collection, id, profile)
        replica.delete(collection, id, profile=profile, context=record.context)


@click.command("ls")
@click.argument("collection")
@profile_option
@json_option
@click.pass_obj
def ls(settings: CliSettings, collection: str, profile: str, as_json: bool) -> None:
    """List a collection's live records, by id."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        require_names(replica, collection, profile)
        records = sorted(replica.scan(collection, profile=profile), key=lambda r: r.id)
    if as_json:
        print_json([{"id": r.id, "doc": r.document} for r in records])
        return
    table = Table("id", "document", "conflicts")
    for r in records:
        table.add_row(r.id, compact(r.document), str(len(r.conflicts)) if r.conflicts else "")
    out.print(table)


@click.command("conflicts")
@click.argument("collection")
@click.argument("id")
@profile_option
@json_option
@click.pass_obj
def conflicts(settings: CliSettings, collection: str, id: str, profile: str, as_json: bool) -> None:
    """List a record's other versions (siblings); `put` a document to resolve them."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        require_names(replica, collection, profile)
        record = replica.get(collection, id, profile=profile)
    if record is None:
        fail(f"{collection}/{id} not found in profile {profile!r}")
    siblings = [version_to_json(id, v) for v in record.conflicts]
    if as_json:
        print_json(siblings)
        return
    table = Table()
    for heading in ("written (UTC)", "by node", "deleted"):
        table.add_column(heading, no_wrap=True)
    table.add_column("document")
    for s in siblings:
        table.add_row(
            written_at(s["hlc"]), str(s["node"]), "yes" if s["deleted"] else "", compact(s["doc"])
        )
    out.print(table)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def written_at(hlc: int) -> str:
    """When a version was written, by its writer's clock: the wall part of its hybrid clock."""
    written = EPOCH + timedelta(milliseconds=hlc_ms(hlc))  # any hlc: up to year ~6400
    return written.isoformat(sep=" ", timespec="milliseconds").removesuffix("+00:00")
