"""The `sealsync` command line: the composition root (the one module that imports `relay`).

A user mistake prints `error:` and `hint:` lines and exits non-zero, never a traceback.
Settings: flags > environment > TOML config > defaults.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
import platformdirs
from rich.console import Console
from rich.table import Table

from relay import tokens
from relay.config import RelayConfig, load_config
from relay.errors import RelayError
from relay.serve import configure_logging, open_storage, serve
from relay.storage import Storage
from replica.errors import SealsyncError

DEFAULT_PORT = 8787
err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def fail(message: str, hint: str | None = None, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True)
    if hint:
        err.print(f"[yellow]hint:[/yellow] {hint}", markup=True)
    sys.exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can cause into `error:`/`hint:` lines."""
    try:
        yield
    except SealsyncError as exc:
        fail(str(exc), exc.hint)
    except RelayError as exc:
        fail(exc.message)
    except OSError as exc:
        fail(str(exc), "check the path and its permissions")


def default_relay_db() -> Path:
    return Path(platformdirs.user_data_dir("sealsync")) / "relay.db"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sealsync")
def main() -> None:
    """sealsync: encrypted offline-first sync: replicas, a ciphertext-only relay."""


# -- relay ------------------------------------------------------------------------------------


def storage_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SEALSYNC_RELAY_CONFIG",
        help="TOML file of relay settings (a [relay] table).",
    )(command)
    command = click.option(
        "--database-url",
        envvar="SEALSYNC_RELAY_DATABASE_URL",
        help="PostgreSQL URL, for several relay processes sharing one database.",
    )(command)
    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="SEALSYNC_RELAY_DB",
        help=f"SQLite file (default: {default_relay_db()}).",
    )(command)


def _settings(pairs: tuple[str, ...]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            fail(f"--set {pair!r} is not NAME=VALUE", "for example --set page_size=500")
        settings[name.strip()] = value.strip()
    return settings


def _config(config_path: Path | None, flags: dict[str, object]) -> RelayConfig:
    return load_config(config_path, os.environ, flags)


def _open(config: RelayConfig, db: Path | None, database_url: str | None) -> Storage:
    if db is not None and database_url is not None:
        fail("give --db or --database-url, not both")
    return open_storage(config, db=db or default_relay_db(), database_url=database_url)


@contextmanager
def _storage(config: RelayConfig, db: Path | None, database_url: str | None) -> Iterator[Storage]:
    storage = _open(config, db, database_url)
    try:
        yield storage
    finally:
        storage.close()


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
    db: Path | None,
    database_url: str | None,
    config_path: Path | None,
    host: str,
    port: int,
    open_signup: bool | None,
    trusted_proxy: tuple[str, ...],
    pairs: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve the relay (SQLite by default, PostgreSQL with --database-url)."""
    with user_errors():
        flags: dict[str, object] = {**_settings(pairs), "open_signup": open_signup}
        if trusted_proxy:
            flags["trusted_proxies"] = trusted_proxy
        config = _config(config_path, flags)
        configure_logging(log_level)
        serve(_open(config, db, database_url), config, host, port)


@relay.command("invite")
@storage_options
@click.option("--days", default=7, show_default=True, help="Days the invite stays valid.")
def relay_invite(
    db: Path | None, database_url: str | None, config_path: Path | None, days: int
) -> None:
    """Print a single-use invite token for a new account."""
    with user_errors():
        if days < 1:
            fail(f"--days {days} must be at least 1")
        config = _config(config_path, {})
        with _storage(config, db, database_url) as storage:
            invite = tokens.new_token()
            digest = tokens.token_hash(invite)
            assert digest is not None
            storage.add_invite(digest, time.time_ns() // 1_000_000 + days * 86_400_000)
        out.print(invite)


@relay.command("accounts")
@storage_options
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def relay_accounts(
    db: Path | None, database_url: str | None, config_path: Path | None, as_json: bool
) -> None:
    """List accounts: devices, stored versions and bytes (never what they hold)."""
    with user_errors():
        with _storage(_config(config_path, {}), db, database_url) as storage:
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
def relay_stats(
    db: Path | None, database_url: str | None, config_path: Path | None, as_json: bool
) -> None:
    """Totals of the relay's database."""
    with user_errors():
        with _storage(_config(config_path, {}), db, database_url) as storage:
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


if __name__ == "__main__":
    main()
