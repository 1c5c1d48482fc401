"""The passphrase kept in the OS keyring (clients/cli/remembered.py): read when none is
given, checked before it is kept, following a passphrase change made here, and forgotten."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import keyring
import pytest
from click.testing import Result

from clients.cli import main
from tests.clients.test_cli import PASSPHRASE, Cli, assert_user_error
from tests.clients.test_cli_admin import NEW_PASSPHRASE, passwd, two_devices
from tests.relay.server import RelayProcess


def without_passphrase(cli: Cli, replica: Path, *args: str) -> Result:
    """The command with no passphrase in the environment, and no terminal to ask at."""
    env = {"SEALSYNC_PASSPHRASE": "", "XDG_CONFIG_HOME": str(cli.home / "config")}
    return cli.runner.invoke(main, ["--replica", str(replica), *args], env=env)


def asked(result: Result) -> bool:
    """The command fell through to the passphrase prompt (and, with no terminal, stopped)."""
    return result.exit_code != 0 and "passphrase:" in result.stderr


def kept(replica: Path) -> str | None:
    found: str | None = keyring.get_password("sealsync", str(replica.resolve()))
    return found


@pytest.mark.slow
def test_the_keyring_keeps_the_passphrase_and_follows_a_change_made_here(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    a, _ = two_devices(cli, relay, tmp_path)
    cli.ok(a, "put", "threads", "t", '{"title": "kept"}')
    assert asked(without_passphrase(cli, a, "ls", "threads"))  # nothing kept to read yet

    assert_user_error(cli(a, "keyring", "store", passphrase="not the passphrase"), "unlock")
    assert kept(a) is None  # a wrong one is never kept
    assert "keeps the passphrase" in cli.ok(a, "keyring", "store").stdout
    assert kept(a) == PASSPHRASE
    listed = without_passphrase(cli, a, "ls", "threads")
    assert listed.exit_code == 0 and "kept" in listed.stdout, listed.output

    changed = passwd(cli, a)
    assert changed.exit_code == 0, changed.output
    assert kept(a) == NEW_PASSPHRASE  # the file and its entry never part
    assert without_passphrase(cli, a, "sync").exit_code == 0

    forgot = without_passphrase(cli, a, "keyring", "forget")
    assert "no longer keeps" in forgot.stdout, forgot.output
    assert kept(a) is None and asked(without_passphrase(cli, a, "ls", "threads"))
    again = without_passphrase(cli, a, "keyring", "forget")
    assert "keeps no passphrase" in again.stdout


@pytest.mark.slow
def test_an_entry_left_by_a_deleted_file_makes_no_account_and_is_dropped(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """The default replica path is shared: a file deleted and made again there must not
    take the old file's passphrase from the keyring unasked."""
    relay = start_relay()
    path = tmp_path / "again.db"
    keyring.set_password("sealsync", str(path.resolve()), "the old file's passphrase")
    made = ["init", "--relay", relay.url, "--account", "ann", "--device-name", "desk"]
    assert asked(without_passphrase(cli, path, *made)) and not path.exists()
    cli.ok(path, *made)  # the passphrase given: the stale entry goes
    assert kept(path) is None
