"""`sealsync relay …`: the operator's commands, beside the relay they administer.

`serve` runs the relay; `invite`, `accounts`, `collect`, `compact` and `stats` open its
storage directly (SQLite by default, PostgreSQL with --database-url) and print what an
operator may see: counts and sizes, never what an account wrote. The command line
(`clients.cli`) mounts this group under the one `sealsync` console script and turns the
errors raised here into `error:`/`hint:` lines.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import platformdirs
from rich.console import Console
from rich.table import Table

from relay import tokens
from relay.collection import DAY_MS, MAX_HORIZON_MS
from relay.collector import collect_all, collect_every_account
from relay.config import RelayConfig, load_config
from relay.serve import configure_logging, open_storage, serve
from relay.sqlite import SQLiteStorage
from relay.storage import AccountSummary, Storage
from replica.errors import InvalidArgumentError
from replica.wire import system_clock_ms

DEFAULT_PORT = 8787
HORIZON_DAYS = click.IntRange(1, MAX_HORIZON_MS // DAY_MS)
"""`--horizon-days`: within the storage's bound on a horizon (`check_horizon`)."""
out = Console(highlight=False, soft_wrap=True)


def default_relay_db() -> Path:
    return Path(platformdirs.user_data_dir("sealsync")) / "relay.db"


@dataclass(frozen=True)
class RelayStorage:
    """Where a relay command finds its storage, from --db / --database-url / --schema."""

    db: Path | None
    database_url: str | None
    schema: str
    config_path: Path | None

    def config(self, flags: dict[str, object] | None = None) -> RelayConfig:
        return load_config(self.config_path, os.environ, flags or {})

    def open(self, config: RelayConfig) -> Storage:
        if self.db is not None and self.database_url is not None:
            raise InvalidArgumentError(
                "give --db or --database-url, not both",
                hint="either may come from SEALSYNC_RELAY_DB or SEALSYNC_RELAY_DATABASE_URL: "
                "unset the one you do not mean",
            )
        return open_storage(
            config,
            db=self.db or default_relay_db(),
            database_url=self.database_url,
            schema=self.schema,
        )

    @contextmanager
    def opened(self) -> Iterator[Storage]:
        storage = self.open(self.config())
        try:
            yield storage
        finally:
            storage.close()


STORAGE_OPTIONS = (
    click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SEALSYNC_RELAY_DB",
        help=f"SQLite file (default: {default_relay_db()}).",
    ),
    click.option(
        "--database-url",
        envvar="SEALSYNC_RELAY_DATABASE_URL",
        help="PostgreSQL URL, for several relay processes sharing one database.",
    ),
    click.option(
        "--schema",
        default="public",
        show_default=True,
        envvar="SEALSYNC_RELAY_SCHEMA",
        help="PostgreSQL schema of the relay's tables.",
    ),
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SEALSYNC_RELAY_CONFIG",
        help="TOML file of relay settings (a [relay] table).",
    ),
)


def storage_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the storage options; the command gets them as one `where: RelayStorage`."""

    @functools.wraps(command)
    def run(
        db: Path | None,
        database_url: str | None,
        schema: str,
        config_path: Path | None,
        **rest: Any,
    ) -> Any:
        return command(where=RelayStorage(db, database_url, schema, config_path), **rest)

    for option in reversed(STORAGE_OPTIONS):
        run = option(run)
    return run


def settings_from_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--set NAME=VALUE` flags as settings."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InvalidArgumentError(
                f"--set {pair!r} is not NAME=VALUE", hint="for example --set page_size=500"
            )
        settings[name.strip()] = value.strip()
    return settings


@click.group()
def relay() -> None:
    """Run and administer a relay."""


@relay.command("serve")
@storage_options
@click.option("--host", default="127.0.0.1", show_default=True, envvar="SEALSYNC_RELAY_HOST")
@click.option("--port", default=DEFAULT_PORT, show_default=True, envvar="SEALSYNC_RELAY_PORT")
@click.option("--open-signup", is_flag=True, default=None, help="Anyone may register.")
@click.option("--trusted-proxy", multiple=True, help="Believe X-Forwarded-For from this address.")
@click.option("--metrics", is_flag=True, default=None, help="Serve GET /metrics (Prometheus).")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE", help="Any relay setting.")
@click.option("--log-level", default="info", show_default=True)
def relay_serve(
    *,
    where: RelayStorage,
    host: str,
    port: int,
    open_signup: bool | None,
    metrics: bool | None,
    trusted_proxy: tuple[str, ...],
    pairs: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve the relay (SQLite by default, PostgreSQL with --database-url)."""
    flags: dict[str, object] = {
        **settings_from_pairs(pairs),
        "open_signup": open_signup,
        "metrics": metrics,
    }
    if trusted_proxy:
        flags["trusted_proxies"] = trusted_proxy
    config = where.config(flags)
    configure_logging(log_level)
    serve(where.open(config), config, host, port)


@relay.command("invite")
@storage_options
@click.option("--days", type=int, help="Days the invite stays valid (default: invite_s).")
def relay_invite(*, where: RelayStorage, days: int | None) -> None:
    """Print a single-use invite token for a new account."""
    if days is not None and days < 1:
        raise InvalidArgumentError(f"--days {days} must be at least 1")
    valid_ms = days * DAY_MS if days is not None else where.config().invite_s * 1000
    with where.opened() as storage:
        invite, digest = tokens.new_invite()
        storage.add_invite(digest, system_clock_ms() + valid_ms)
    out.print(invite)


@relay.command("accounts")
@storage_options
@click.option("--json", "as_json", is_flag=True, help="One JSON array (one object with --delete).")
@click.option(
    "--delete",
    "to_delete",
    metavar="NAME",
    help="Delete account NAME: its devices, tokens and stored versions. Asks first.",
)
@click.option("--yes", is_flag=True, help="With --delete: do not ask.")
@click.option(
    "--horizon-days",
    type=HORIZON_DAYS,
    help="Show the floor and the device runs wait for leaving out devices silent for longer, "
    "as `relay collect --horizon-days N` does (default: the relay's tombstone_horizon_days "
    "when its setting collect is on, else none).",
)
def relay_accounts(
    *,
    where: RelayStorage,
    as_json: bool,
    to_delete: str | None,
    yes: bool,
    horizon_days: int | None,
) -> None:
    """List accounts: devices, stored versions and bytes, tombstones and how far every device
    acknowledged pulling (never what they hold); or delete one."""
    check_listing_or_delete(to_delete, yes=yes, horizon_days=horizon_days)
    if to_delete is not None:
        delete_account(where, to_delete, as_json=as_json, yes=yes)
        return
    with where.opened() as storage:
        accounts = storage.accounts(horizon_ms=horizon_shown(where, horizon_days))
    if as_json:
        out.print_json(json.dumps([vars(a) for a in accounts]))
    else:
        print_accounts(accounts)


def check_listing_or_delete(to_delete: str | None, *, yes: bool, horizon_days: int | None) -> None:
    """`relay accounts`' flags: `--yes` with `--delete` only, `--horizon-days` without it."""
    if to_delete is not None and horizon_days is not None:
        raise InvalidArgumentError(
            "--horizon-days goes with the listing, not --delete",
            hint="sealsync relay accounts --horizon-days N",
        )
    if to_delete is None and yes:
        raise InvalidArgumentError(
            "--yes only goes with --delete NAME", hint="sealsync relay accounts --delete NAME --yes"
        )


def horizon_shown(where: RelayStorage, horizon_days: int | None) -> int | None:
    """`relay accounts --horizon-days` in ms; by default the horizon of the relay's own runs
    (setting `collect`), or none."""
    config = where.config()
    if horizon_days is None and config.collect:
        horizon_days = config.tombstone_horizon_days
    return None if horizon_days is None else horizon_days * DAY_MS


def print_accounts(accounts: list[AccountSummary]) -> None:
    """`relay accounts`' table."""
    table = Table("account", "devices", "versions", "bytes", "head", "tombstones", "acked")
    table.add_column("held by")  # the device collection waits for: its id's first 8 digits
    table.add_column("collected")
    for a in accounts:
        devices = f"{a.devices} ({a.resyncing} to resync)" if a.resyncing else str(a.devices)
        numbers = (devices, a.versions, a.stored_bytes, a.head)
        tombstones = f"{a.tombstones} ({a.tombstone_bytes} B)"
        acked = "-" if a.ack_floor is None else str(a.ack_floor)
        held = (a.held_back_by or "-")[:8]
        collected = f"{a.collected} ({a.collected_bytes} B)"
        table.add_row(a.name, *map(str, numbers), tombstones, acked, held, collected)
    out.print(table)


def horizon_within_the_advertised(where: RelayStorage, horizon_days: int | None) -> int | None:
    """`--horizon-days` in ms, refused below the relay's `tombstone_horizon_days`: devices
    are told that one, and one silent between the two would count itself in and could
    reseed a wiped relay with what the run collects (specs/protocol.md §5.1)."""
    if horizon_days is None:
        return None
    advertised = where.config().tombstone_horizon_days
    if horizon_days < advertised:
        raise InvalidArgumentError(
            f"--horizon-days {horizon_days} is below the relay's tombstone_horizon_days "
            f"({advertised}), which devices are told",
            hint=f"give at least {advertised}, or lower the setting tombstone_horizon_days",
        )
    return horizon_days * DAY_MS


@relay.command("collect")
@storage_options
@click.option("--account", "name", help="Only this account (default: every account).")
@click.option(
    "--horizon-days",
    type=HORIZON_DAYS,
    help="Leave out devices silent for longer (a lost phone); they pull everything again "
    "when they return (default: every device counts). At least the relay's "
    "tombstone_horizon_days, which devices judge a wiped relay by.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON array, an object per account.")
def relay_collect(
    *, where: RelayStorage, name: str | None, horizon_days: int | None, as_json: bool
) -> None:
    """Delete the tombstones every device of an account has acknowledged pulling, each the
    last version of its record, and give their space back to the account (runs of at most
    10,000; a device that never acknowledged holds its account's back). Each device drops
    its own copies as it next syncs."""
    horizon_ms = horizon_within_the_advertised(where, horizon_days)
    with where.opened() as storage:
        if name is not None and not storage.accounts(name):
            raise InvalidArgumentError(
                f"no account {name!r} on this relay", hint="`sealsync relay accounts` lists them"
            )
        if name is None:
            totals = collect_every_account(storage, horizon_ms)
        else:
            totals = [collect_all(storage, name, horizon_ms)]
    if as_json:
        out.print_json(json.dumps(totals))
        return
    table = Table("account", "acked", "runs", "collected", "bytes", "runs released", "to resync")
    for t in totals:
        acked = "-" if t["ack_floor"] is None else str(t["ack_floor"])
        numbers = (t["runs"], t["versions"], t["bytes"], t["released"], t["flagged"])
        table.add_row(str(t["account"]), acked, *map(str, numbers))
    out.print(table)


@relay.command("compact")
@storage_options
@click.option("--json", "as_json", is_flag=True)
def relay_compact(*, where: RelayStorage, as_json: bool) -> None:
    """Rewrite the relay's SQLite file without its free pages (after `relay collect`, say);
    pushes wait meanwhile. PostgreSQL keeps freed space for its own reuse."""
    with where.opened() as storage:
        if not isinstance(storage, SQLiteStorage):
            raise InvalidArgumentError(
                "compact rewrites a relay's SQLite file; PostgreSQL reuses freed space itself",
                hint="VACUUM FULL, run by the database's owner, gives it back to the disk",
            )
        before, after = storage.compact()
    if as_json:
        out.print_json(json.dumps({"before": before, "after": after}))
        return
    out.print(f"compacted: {before} bytes before, {after} after ({before - after} given back)")


def delete_account(where: RelayStorage, name: str, *, as_json: bool, yes: bool) -> None:
    """Delete an account an operator names: the way out for a person whose account here is
    not theirs any more (registered again by a revoked device after a wipe, for one), who then
    registers it again with `sealsync sync --reseed`. Devices keep their replicas."""
    with where.opened() as storage:
        found = storage.accounts(name)
        if not found:
            raise InvalidArgumentError(
                f"no account {name!r} on this relay", hint="`sealsync relay accounts` lists them"
            )
        gone = found[0]
        if not yes:
            click.confirm(
                f"Delete account {name!r} with {gone.devices} device(s) and {gone.versions} "
                f"stored version(s), {gone.stored_bytes} bytes? It cannot be undone",
                abort=True,
                err=True,
            )
        if not storage.delete_account(name):
            raise InvalidArgumentError(f"account {name!r} was deleted meanwhile")
    if as_json:
        out.print_json(json.dumps({"deleted": vars(gone)}))
        return
    out.print(
        f"deleted account {name!r}: {gone.devices} device(s), {gone.versions} version(s), "
        f"{gone.stored_bytes} bytes; its devices can register it again with "
        "`sealsync sync --reseed`"
    )


@relay.command("stats")
@storage_options
@click.option("--json", "as_json", is_flag=True)
def relay_stats(*, where: RelayStorage, as_json: bool) -> None:
    """Totals of the relay's database."""
    with where.opened() as storage:
        accounts = storage.accounts()
        stats = {
            "storage_id": storage.storage_id,
            "accounts": len(accounts),
            "devices": sum(a.devices for a in accounts),
            "versions": sum(a.versions for a in accounts),
            "stored_bytes": sum(a.stored_bytes for a in accounts),
        }
    if as_json:
        out.print_json(json.dumps(stats))
        return
    for name, value in stats.items():
        out.print(f"{name:>14}  {value}")
