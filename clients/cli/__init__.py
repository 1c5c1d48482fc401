"""The `sealsync` command line: the composition root, the one package that imports both the
client library (`clients`) and `relay` (whose operator commands it mounts as `sealsync relay`,
and which `sealsync demo` runs on loopback).

A user mistake prints `error:` and `hint:` lines and exits non-zero, never a traceback: each
command turns its errors into them, and the root group does so for any that get past one (the
relay's commands raise theirs). Settings: flags > environment > TOML config > defaults.

Each command's module is imported when that command runs (`COMMANDS`): a relay or a
`status` starts without the chat store's sqlmodel models and the sync client, which were
two thirds of every start-up (1.5 s measured; 0.8 s for `relay serve` and 0.5 s for
`status` without them).
"""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path
from typing import Any

import click

from clients.cli import console
from clients.cli.settings import (
    ENV_CONFIG,
    ENV_REPLICA,
    CliSettings,
    config_to_default_map,
    default_config_path,
    default_replica_path,
    read_config,
)

COMMANDS: dict[str, str] = {
    "init": "clients.cli.commands:init",
    "join": "clients.cli.commands:join",
    "login": "clients.cli.commands:login",
    "sync": "clients.cli.commands:sync",
    "move": "clients.cli.move:move",
    "status": "clients.cli.status:status",
    "put": "clients.cli.records:put",
    "get": "clients.cli.records:get",
    "rm": "clients.cli.records:rm",
    "ls": "clients.cli.records:ls",
    "conflicts": "clients.cli.records:conflicts",
    "devices": "clients.cli.admin:devices",
    "profiles": "clients.cli.admin:profiles",
    "passwd": "clients.cli.admin:passwd",
    "upgrade": "clients.cli.admin:upgrade",
    "backup": "clients.cli.backup:backup",
    "restore": "clients.cli.backup:restore",
    "diagnose": "clients.cli.repair:diagnose",
    "repair": "clients.cli.repair:repair",
    "compact": "clients.cli.repair:compact",
    "aside": "clients.cli.repair:aside",
    "keyring": "clients.cli.remembered:keyring_group",
    "export": "clients.cli.exchange:export",
    "import": "clients.cli.exchange:import_",
    "chat": "clients.cli.chat:chat",
    "demo": "clients.cli.demo:demo",
    "relay": "relay.commands:relay",
}
"""Each command's name and where it is defined, as `module:attribute`."""


def load_config_file(ctx: click.Context, _: click.Parameter, value: Path | None) -> Path | None:
    """Eager: the TOML file becomes click's default_map before the other options are read."""
    path = value or default_config_path()
    if value is None and not path.is_file():
        return None
    with console.user_errors():
        ctx.default_map = {**config_to_default_map(read_config(path)), **(ctx.default_map or {})}
    return path


class Sealsync(click.Group):
    """The root group: imports a command's module only when the command is asked for, and
    prints a sealsync error no command caught as an `error:` line."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, naming the nearest command after a typo: click draws its suggestions from
        the commands a group holds, and this one holds them only in `COMMANDS`."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as error:
            close = difflib.get_close_matches(args[0], COMMANDS) if args else []
            if not close or "Did you mean" in error.format_message():
                raise
            raise click.UsageError(f"{error.message} Did you mean {close[0]!r}?", ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        with console.user_errors():
            return super().invoke(ctx)


@click.group(cls=Sealsync, context_settings={"help_option_names": ["-h", "--help"]})
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
