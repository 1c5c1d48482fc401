"""The `sealsync` command line: the composition root (the one module that imports `relay`).

A user mistake prints `error:` and `hint:` lines and exits non-zero, never a traceback.
Settings: flags > environment > TOML config > defaults.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import platformdirs
import uvicorn
from rich.table import Table

from clients import console
from clients.admin import ADMIN_COMMANDS
from clients.backup import BACKUP_COMMANDS
from clients.commands import DEVICE_COMMANDS
from clients.console import fail, out
from clients.demo import run_demo
from clients.records import RECORD_COMMANDS
from clients.settings import (
    ENV_CONFIG,
    ENV_REPLICA,
    CliSettings,
    config_to_default_map,
    default_config_path,
    default_replica_path,
    read_config,
)
from relay import tokens
from relay.app import create_app
from relay.config import RelayConfig, load_config
from relay.serve import configure_logging, open_storage, serve
from relay.storage import Storage

DEFAULT_PORT = 8787


def default_relay_db() -> Path:
    return Path(platformdirs.user_data_dir("sealsync")) / "relay.db"


def load_config_file(ctx: click.Context, _: click.Parameter, value: Path | None) -> Path | None:
    """Eager: the TOML file becomes click's default_map before the other options are read."""
    path = value or default_config_path()
    if value is None and not path.is_file():
        return None
    with console.user_errors():
        ctx.default_map = {**config_to_default_map(read_config(path)), **(ctx.default_map or {})}
    return path


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sealsync")
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=ENV_CONFIG,
    is_eager=True,
    expose_value=False,
    callback=load_config_file,
    help=f"TOML settings (default: {default_config_path()}).",
)
@click.option(
    "--replica",
    "replica_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=ENV_REPLICA,
    help=f"This device's replica file (default: {default_replica_path()}).",
)
@click.option(
    "--passphrase-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the passphrase from this file's first line (else SEALSYNC_PASSPHRASE, a prompt).",
)
@click.pass_context
def main(ctx: click.Context, replica_path: Path | None, passphrase_file: Path | None) -> None:
    """sealsync: encrypted offline-first sync: replicas, a ciphertext-only relay."""
    source = ctx.get_parameter_source("passphrase_file")
    ctx.obj = CliSettings(
        replica_path=replica_path or default_replica_path(),
        passphrase_file=passphrase_file,
        passphrase_file_is_flag=source is click.core.ParameterSource.COMMANDLINE,
    )


for _command in (*DEVICE_COMMANDS, *RECORD_COMMANDS, *ADMIN_COMMANDS, *BACKUP_COMMANDS):
    main.add_command(_command)


# -- relay ------------------------------------------------------------------------------------


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
            fail("give --db or --database-url, not both")
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

    options = [
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
    ]
    for option in reversed(options):
        run = option(run)
    return run


def _settings(pairs: tuple[str, ...]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            fail(f"--set {pair!r} is not NAME=VALUE", "for example --set page_size=500")
        settings[name.strip()] = value.strip()
    return settings


@main.group()
def relay() -> None:
    """Run and administer a relay."""


@relay.command("serve")
@storage_options
@click.option("--host", default="127.0.0.1", show_default=True, envvar="SEALSYNC_RELAY_HOST")
@click.option("--port", default=DEFAULT_PORT, show_default=True, envvar="SEALSYNC_RELAY_PORT")
@click.option("--open-signup", is_flag=True, default=None, help="Anyone may register.")
@click.option("--trusted-proxy", multiple=True, help="Believe X-Forwarded-For from this address.")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE", help="Any relay setting.")
@click.option("--log-level", default="info", show_default=True)
def relay_serve(
    where: RelayStorage,
    host: str,
    port: int,
    open_signup: bool | None,
    trusted_proxy: tuple[str, ...],
    pairs: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve the relay (SQLite by default, PostgreSQL with --database-url)."""
    with console.user_errors():
        flags: dict[str, object] = {**_settings(pairs), "open_signup": open_signup}
        if trusted_proxy:
            flags["trusted_proxies"] = trusted_proxy
        config = where.config(flags)
        configure_logging(log_level)
        serve(where.open(config), config, host, port)


@relay.command("invite")
@storage_options
@click.option("--days", type=int, help="Days the invite stays valid (default: invite_s).")
def relay_invite(where: RelayStorage, days: int | None) -> None:
    """Print a single-use invite token for a new account."""
    with console.user_errors():
        if days is not None and days < 1:
            fail(f"--days {days} must be at least 1")
        valid_ms = days * 86_400_000 if days is not None else where.config().invite_s * 1000
        with where.opened() as storage:
            invite, digest = tokens.new_invite()
            storage.add_invite(digest, time.time_ns() // 1_000_000 + valid_ms)
        out.print(invite)


@relay.command("accounts")
@storage_options
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def relay_accounts(where: RelayStorage, as_json: bool) -> None:
    """List accounts: devices, stored versions and bytes (never what they hold)."""
    with console.user_errors():
        with where.opened() as storage:
            accounts = storage.accounts()
        if as_json:
            out.print_json(json.dumps([vars(a) for a in accounts]))
            return
        table = Table("account", "devices", "versions", "bytes", "head")
        for a in accounts:
            table.add_row(a.name, str(a.devices), str(a.versions), str(a.stored_bytes), str(a.head))
        out.print(table)


@relay.command("stats")
@storage_options
@click.option("--json", "as_json", is_flag=True)
def relay_stats(where: RelayStorage, as_json: bool) -> None:
    """Totals of the relay's database."""
    with console.user_errors():
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


# -- demo -------------------------------------------------------------------------------------


@contextmanager
def loopback_relay(folder: Path) -> Iterator[str]:
    """A relay over a SQLite file in `folder`, served by uvicorn in a background thread on a
    free loopback port (the socket is bound first, so no other process can take the port)."""
    config = RelayConfig(open_signup=True)
    storage = open_storage(config, db=folder / "relay.db")
    app = create_app(storage, config, on_shutdown=storage.close)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                fail("the demo relay did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@main.command("demo")
def demo() -> None:
    """Two devices edit offline and converge through a relay on loopback (no setup needed)."""
    with (
        console.user_errors(),
        tempfile.TemporaryDirectory(prefix="sealsync-demo-") as folder,
        loopback_relay(Path(folder)) as url,
    ):
        out.print(f"relay on {url} (a temporary SQLite file)")
        converged = run_demo(url, Path(folder), out)
    if not converged:
        fail("the two devices did not converge", "please report this as a bug")


if __name__ == "__main__":
    main()
