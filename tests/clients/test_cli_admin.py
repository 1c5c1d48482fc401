"""`devices` and `profiles` against a real relay process: each does its job, and
each user mistake is an `error:` with a `hint:` that changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.clients.test_cli import Cli, assert_user_error, dump
from tests.relay.server import RelayProcess


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(CliRunner(), tmp_path)


def two_devices(cli: Cli, relay: RelayProcess, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann", "--device-name", "desk")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann", "--device-name", "laptop")
    return a, b


@pytest.mark.slow
def test_devices_lists_the_account_marks_this_one_and_revokes_another(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, b = two_devices(cli, start_relay(), tmp_path)
    listed = cli.json(a, "devices")
    assert isinstance(listed, list)
    by_name = {d["name"]: d for d in listed}
    assert set(by_name) == {"desk", "laptop"}
    assert by_name["desk"]["current"] and not by_name["laptop"]["current"]
    table = cli.ok(a, "devices").stdout
    assert "laptop" in table and "* this device" in table

    assert_user_error(cli(a, "devices", "--revoke", by_name["desk"]["id"]), "this device")
    assert_user_error(cli(a, "devices", "--revoke", "no-such-device"), "no device")
    assert len(cli.json(a, "devices")) == 2  # type: ignore[arg-type]

    revoked = cli.ok(a, "devices", "--revoke", by_name["laptop"]["id"], "--json")
    assert "revoked" in revoked.stdout
    assert [d["name"] for d in cli.json(a, "devices")] == ["desk"]  # type: ignore[union-attr,index]
    before = dump(b)
    assert_user_error(cli(b, "sync", "--retry-for", "1"), "unauthorized")
    assert dump(b) == before


@pytest.mark.slow
def test_a_profile_made_on_one_device_reaches_the_other(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, b = two_devices(cli, start_relay(), tmp_path)
    assert cli.ok(a, "profiles").stdout.split() == ["default"]
    assert cli.ok(a, "profiles", "--create", "work").stdout.split() == ["default", "work"]
    cli.ok(a, "put", "threads", "t", '{"title": "at work"}', "--profile", "work")
    cli.ok(a, "sync")
    cli.ok(b, "sync")
    assert cli.ok(b, "profiles").stdout.split() == ["default", "work"]
    assert cli.json(b, "get", "threads", "t", "--profile", "work")["doc"] == {"title": "at work"}  # type: ignore[index]

    before = dump(a)
    assert_user_error(cli(a, "profiles", "--create", "x" * 1000), "profile")
    assert_user_error(cli(a, "profiles", "--create", "y", passphrase="wrong"), "does not unlock")
    assert dump(a) == before
