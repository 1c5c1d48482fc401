"""The root group imports a command's module only when that command runs
(`clients.cli.COMMANDS`): every name there is a command of that name, and a relay or a
`status` starts without the chat store's sqlmodel models and the sync client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from clients.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("sqlmodel", "chat", "clients.sync")
"""What a relay or `status` need not load: most of a second of start-up, measured."""


def test_every_command_is_found_by_its_name_and_listed_in_the_help() -> None:
    context = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(context, name)
        assert command is not None and command.name == name
    assert main.get_command(context, "no-such-command") is None
    shown = CliRunner().invoke(main, ["--help"])
    assert shown.exit_code == 0 and all(f"  {name} " in shown.stdout for name in COMMANDS)


def test_a_mistyped_command_is_refused_naming_the_nearest() -> None:
    typo = CliRunner().invoke(main, ["stauts"])
    assert typo.exit_code == 2 and "No such command 'stauts'. Did you mean 'status'?" in typo.output
    unlike = CliRunner().invoke(main, ["zzzzzz"])
    assert unlike.exit_code == 2 and "Did you mean" not in unlike.output


def loaded_after(*args: str) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter loaded to run `sealsync ARGS`."""
    code = (
        "import json, sys\n"
        "from clients.cli import main\n"
        f"main({list(args)!r}, standalone_mode=False)\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded: dict[str, bool] = json.loads(done.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    ("args", "heavy"),
    [
        (("relay", "serve", "--help"), False),
        (("status", "--help"), False),
        (("sync", "--help"), True),  # sync reconciles chats: it loads them (the check can fail)
    ],
)
def test_a_relay_or_status_starts_without_the_chat_store_or_the_sync_client(
    args: tuple[str, ...], heavy: bool
) -> None:
    assert loaded_after(*args) == dict.fromkeys(HEAVY, heavy)
