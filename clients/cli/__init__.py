"""The `sealsync` command line: the composition root, the one package that imports both the
client library (`clients`) and `relay` (whose operator commands it mounts as `sealsync relay`,
and which `sealsync demo` runs on loopback).

A user mistake prints `error:` and `hint:` lines and exits non-zero, never a traceback: each
command turns its errors into them, and the root group does so for any that get past one (the
relay's commands raise theirs). Settings: flags > environment > TOML config > defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from clients.cli import console
from clients.cli.admin import ADMIN_COMMANDS
from clients.cli.backup import BACKUP_COMMANDS
from clients.cli.chat import chat
from clients.cli.commands import DEVICE_COMMANDS
from clients.cli.demo import demo
from clients.cli.exchange import EXCHANGE_COMMANDS
from clients.cli.move import move
from clients.cli.records import RECORD_COMMANDS
from clients.cli.remembered import KEYRING_COMMANDS
from clients.cli.repair import REPAIR_COMMANDS
from clients.cli.settings import (
    ENV_CONFIG,
    ENV_REPLICA,
    CliSettings,
    config_to_default_map,
    default_config_path,
    default_replica_path,
    read_config,
)
from clients.cli.status import status
from relay import commands as relay_commands


def load_config_file(ctx: click.Context, _: click.Parameter, value: Path | None) -> Path | None:
    """Eager: the TOML file becomes click's default_map before the other options are read."""
    path = value or default_config_path()
    if value is None and not path.is_file():
        return None
    with console.user_errors():
        ctx.default_map = {**config_to_default_map(read_config(path)), **(ctx.default_map or {})}
    return path


class Sealsync(click.Group):
    """The root group: a sealsync error no command caught still prints as an `error:` line."""

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


for _command in (
    *DEVICE_COMMANDS,
    move,
    status,
    *RECORD_COMMANDS,
    *ADMIN_COMMANDS,
    *BACKUP_COMMANDS,
    *REPAIR_COMMANDS,
    *KEYRING_COMMANDS,
    *EXCHANGE_COMMANDS,
    chat,
    demo,
    relay_commands.relay,
):
    main.add_command(_command)
