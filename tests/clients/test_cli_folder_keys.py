"""Key changes of a folder's account on the command line: `devices` lists the folder's
devices, `devices --revoke` and `passwd` rotate into the folder, and `sync` on another
device takes the new keys with the new passphrase."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from clients.cli import main
from clients.folder import KEYS
from replica.folder import bundle_name
from tests.clients.test_cli import PASSPHRASE, Cli, assert_user_error
from tests.clients.test_cli_admin import NEW_PASSPHRASE
from tests.clients.test_cli_rotate import cli_bundle, run
from tests.relay.server import RelayProcess


def run_failing(cli: Cli, replica: Path, *args: str, passphrase: str, new: str) -> Result:
    env = {"SEALSYNC_PASSPHRASE": passphrase, "SEALSYNC_NEW_PASSPHRASE": new,
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    result = cli.runner.invoke(main, ["--replica", str(replica), *args], env=env)
    assert result.exit_code != 0, result.output
    return result


def two_devices(cli: Cli, tmp_path: Path) -> tuple[Path, Path, Path]:
    folder, a, b = tmp_path / "Sync", tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--folder", str(folder))
    cli.ok(a, "put", "threads", "t1", '{"title": "from a", "message_count": 1}')
    cli.ok(a, "sync")
    cli.ok(b, "join", "--folder", str(folder))
    return folder, a, b


def test_a_revoke_in_a_folder_rotates_and_the_other_device_takes_the_keys(
    cli: Cli, tmp_path: Path
) -> None:
    folder, a, b = two_devices(cli, tmp_path)
    c = tmp_path / "c.db"
    cli.ok(c, "join", "--folder", str(folder))
    listed = cli.json_objects(a, "devices")
    assert [d["current"] for d in listed].count(True) == 1 and len(listed) == 3
    c_id = next(str(d["id"]) for d in cli.json_objects(c, "devices") if d["current"])
    done = run(cli, a, "devices", "--revoke", c_id, "--json", passphrase=PASSPHRASE,
               new=NEW_PASSPHRASE)  # fmt: skip
    assert "rotated the account's keys to generation 2" in done.stderr
    assert "remove the revoked device from the file-sync tool" in done.stderr
    assert len(json.loads(done.stdout)) == 3  # stdout: JSON only
    assert (folder / KEYS / bundle_name(2)).is_file()

    cli.ok(b, "put", "threads", "t2", '{"title": "from b", "message_count": 2}')
    took = run(cli, b, "sync", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)
    assert "took the account's newer keys from the folder" in took.stdout
    assert f"revoking device {c_id}" in took.stdout
    run(cli, a, "sync", passphrase=NEW_PASSPHRASE)
    t2 = cli(a, "get", "threads", "t2", "--json", passphrase=NEW_PASSPHRASE)
    assert t2.exit_code == 0 and '"from b"' in t2.stdout
    behind = cli(c, "sync")  # the revoked device: asked for a passphrase it does not know
    assert behind.exit_code != 0 and "the folder holds newer keys" in behind.stderr
    wrong = run_failing(cli, c, "sync", passphrase=PASSPHRASE, new="a guess at the new one")
    assert_user_error(wrong)
    for this in (c, a):
        assert cli(this, "devices", "--revoke", "0123456789abcdef").exit_code == 1


def test_passwd_in_a_folder_is_a_new_generation_the_others_take(cli: Cli, tmp_path: Path) -> None:
    folder, a, b = two_devices(cli, tmp_path)
    before = cli_bundle(a)
    assert cli(a, "passwd", "--end-other-sessions").exit_code == 2
    changed = run(cli, a, "passwd", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)
    assert "generation 2" in changed.stdout and cli_bundle(a) != before
    assert cli(a, "sync").exit_code != 0  # the old passphrase opens this device no more
    assert (folder / KEYS / bundle_name(2)).read_bytes() == cli_bundle(a)
    took = run(cli, b, "sync", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)
    assert "took the account's newer keys" in took.stdout
    assert run(cli, b, "get", "threads", "t1", passphrase=NEW_PASSPHRASE).exit_code == 0


def test_an_account_moves_from_its_folder_to_a_relay_with_one_command(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    _, a, b = two_devices(cli, tmp_path)
    run(cli, a, "passwd", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)  # generation 2 moves too
    behind = run_failing(cli, b, "move", "--relay", relay.url, "--account", "ann",
                         passphrase=PASSPHRASE, new="")  # fmt: skip
    assert "the folder holds key generation 2, newer than this device's 1" in behind.stderr
    run(cli, b, "sync", passphrase=PASSPHRASE, new=NEW_PASSPHRASE)
    run(cli, b, "put", "threads", "t2", '{"title": "never in the folder", "message_count": 2}',
        passphrase=NEW_PASSPHRASE)  # fmt: skip
    for wrong in (
        ("move",),
        ("move", "--relay", relay.url),
        ("move", "--folder", "x", "--insecure"),
    ):
        assert cli(b, *wrong).exit_code == 2
    moved = run(cli, a, "move", "--relay", relay.url, "--account", "ann", passphrase=NEW_PASSPHRASE)
    assert "moved to relay" in moved.stdout and not (tmp_path / "a.db.folder.json").exists()
    run(cli, b, "move", "--relay", relay.url, "--account", "ann", passphrase=NEW_PASSPHRASE)
    run(cli, a, "sync", passphrase=NEW_PASSPHRASE)
    t2 = run(cli, a, "get", "threads", "t2", "--json", passphrase=NEW_PASSPHRASE)
    assert '"never in the folder"' in t2.stdout
    again = run_failing(cli, a, "move", "--relay", relay.url, "--account", "bob",
                        passphrase=NEW_PASSPHRASE, new="")  # fmt: skip
    assert "syncs through no folder" in again.stderr
    c = tmp_path / "c.db"  # the relay holds everything: a device joining there gets it all
    run(cli, c, "join", "--relay", relay.url, "--account", "ann", passphrase=NEW_PASSPHRASE)
    for thread in ("t1", "t2"):
        assert run(cli, c, "get", "threads", thread, passphrase=NEW_PASSPHRASE).exit_code == 0
