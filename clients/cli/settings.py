"""The command line's settings: flags > environment > TOML config > defaults.

Only the command line reads the environment: this module, click's envvars, and
`relay.commands` (the relay's own settings). The TOML file
(`platformdirs.user_config_dir("sealsync")/config.toml`, or `--config`/`SEALSYNC_CONFIG`) may
set `replica`, `passphrase_file` and `profile` at its top level; its tables (such as a relay's
`[relay]`) are left to whoever reads them. Config values reach click as its
`default_map`, which click already ranks below flags and environment variables.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import platformdirs

from clients.cli.remembered import remembered
from replica.errors import InvalidArgumentError

ENV_REPLICA = "SEALSYNC_REPLICA"
ENV_CONFIG = "SEALSYNC_CONFIG"
ENV_PASSPHRASE = "SEALSYNC_PASSPHRASE"
ENV_RECOVERY_KEY = "SEALSYNC_RECOVERY_KEY"
ENV_NEW_PASSPHRASE = "SEALSYNC_NEW_PASSPHRASE"
CONFIG_KEYS = ("replica", "passphrase_file", "profile")
PROFILE_COMMANDS = ("put", "get", "rm", "ls", "conflicts")
"""The commands whose `--profile` default the config's `profile` sets."""


def default_replica_path() -> Path:
    return Path(platformdirs.user_data_dir("sealsync")) / "replica.db"


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir("sealsync")) / "config.toml"


def read_config(path: Path) -> dict[str, str]:
    """The top-level settings of a TOML file; unknown keys are refused, tables skipped."""
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(
            f"config {path} is not TOML: {exc}",
            hint="fix the file, or name another with --config (or SEALSYNC_CONFIG)",
        ) from exc
    settings = {k: v for k, v in document.items() if not isinstance(v, dict)}
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise InvalidArgumentError(
            f"config {path}: unknown setting {', '.join(unknown)}",
            hint=f"the settings are {', '.join(CONFIG_KEYS)}",
        )
    for name, value in settings.items():
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"config {path}: {name} must be a string, got {value!r}",
                hint=f'quote it: {name} = "..."',
            )
    return settings


def config_to_default_map(settings: dict[str, str]) -> dict[str, Any]:
    """click's default_map, keyed by parameter name: the group's own options at the top
    (`replica` is `--replica`'s `replica_path`), commands' options nested."""
    parameter_by_setting = {"replica": "replica_path", "passphrase_file": "passphrase_file"}
    default_map: dict[str, Any] = {
        parameter: settings[name]
        for name, parameter in parameter_by_setting.items()
        if name in settings
    }
    if "profile" in settings:
        default_map.update({name: {"profile": settings["profile"]} for name in PROFILE_COMMANDS})
    return default_map


@dataclass(frozen=True)
class CliSettings:
    """The global options, resolved: the replica and where its passphrase comes from.

    `passphrase_file_is_flag`: a file named on the command line beats SEALSYNC_PASSPHRASE;
    one named in the config file does not.
    """

    replica_path: Path
    passphrase_file: Path | None = None
    passphrase_file_is_flag: bool = False

    def passphrase(self, *, confirm: bool = False) -> str:
        """The passphrase: --passphrase-file, SEALSYNC_PASSPHRASE, config file, the OS
        keyring (clients/cli/remembered.py), else a prompt."""
        if self.passphrase_file is not None and self.passphrase_file_is_flag:
            return read_secret_file(self.passphrase_file)
        if os.environ.get(ENV_PASSPHRASE):
            return os.environ[ENV_PASSPHRASE]
        if self.passphrase_file is not None:
            return read_secret_file(self.passphrase_file)
        return remembered(self.replica_path) or hidden_prompt("passphrase", confirm=confirm)

    def new_passphrase(self) -> str:
        """`passwd`'s new passphrase: SEALSYNC_NEW_PASSPHRASE, else a prompt typed twice."""
        return os.environ.get(ENV_NEW_PASSPHRASE) or hidden_prompt("new passphrase", confirm=True)

    def changed_passphrase(self) -> str:
        """The account's passphrase as another device changed it: SEALSYNC_NEW_PASSPHRASE,
        else a prompt (this device's replica still opens with the old one)."""
        label = "the account's passphrase, changed on another device"
        return os.environ.get(ENV_NEW_PASSPHRASE) or hidden_prompt(label)

    def recovery_key(self) -> str:
        """The recovery key: SEALSYNC_RECOVERY_KEY, else a hidden prompt."""
        return os.environ.get(ENV_RECOVERY_KEY) or hidden_prompt("recovery key")


def hidden_prompt(label: str, *, confirm: bool = False) -> str:
    """A secret typed at the terminal (on stderr, so stdout stays the command's output)."""
    text: str = click.prompt(label, hide_input=True, confirmation_prompt=confirm, err=True)
    return text


def read_secret_file(path: Path) -> str:
    """The first line of `path` without its line ending (editors add one)."""
    lines = path.read_text().splitlines()
    if not lines or not lines[0]:
        raise InvalidArgumentError(
            f"passphrase file {path} is empty", hint="put the passphrase on its first line"
        )
    return lines[0]
