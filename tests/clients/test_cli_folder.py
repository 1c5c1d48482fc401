"""Syncing through a folder on the command line (`init`/`join --folder`, `sync`): two
devices converge through one folder, `sync` needs no flag once set, a forged file is named
and refused, a device with a relay is not moved silently, and bad combinations are usage
errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from clients.folder import DEVICES, file_name
from replica import Replica
from tests.clients.test_cli import PASSPHRASE, Cli
from tests.clients.test_cli_watch import ROOT, TIMEOUT_S, wait_for_line
from tests.conftest import SCHEMA
from tests.relay.server import RelayProcess


def test_two_devices_converge_through_a_folder(cli: Cli, tmp_path: Path) -> None:
    folder, a, b = tmp_path / "Sync" / "notes", tmp_path / "a.db", tmp_path / "b.db"
    made = cli.ok(a, "init", "--folder", str(folder))
    assert "recovery key" in made.stdout and (folder / "sealsync-folder.json").is_file()
    cli.ok(a, "put", "threads", "t1", '{"title": "from a", "message_count": 1}')
    assert "1 written in 1 segment(s)" in cli.ok(a, "sync").stdout  # no flag: the folder is set
    joined = cli.ok(b, "join", "--folder", str(folder))
    assert "1 merged" in joined.stdout
    assert cli.json_object(b, "get", "threads", "t1")["doc"] == {
        "title": "from a",
        "message_count": 1,
    }
    cli.ok(b, "put", "threads", "t2", '{"title": "from b", "message_count": 2}')
    cli.ok(b, "sync")
    cli.ok(a, "sync")
    assert cli.json_object(a, "get", "threads", "t2")["doc"] == {
        "title": "from b",
        "message_count": 2,
    }
    assert len(list((folder / DEVICES).iterdir())) == 2  # each device writes its own place


def test_a_forged_file_is_named_and_nothing_of_it_merged(cli: Cli, tmp_path: Path) -> None:
    folder, a = tmp_path / "shared", tmp_path / "a.db"
    cli.ok(a, "init", "--folder", str(folder))
    other, _ = Replica.create(tmp_path / "other.db", SCHEMA, "another account's passphrase")
    with other:
        other.put("threads", "t", {"title": "planted"})
        forged = other.folder_session().next_segment(1)
        assert forged is not None
        place = folder / DEVICES / other.folder_session().device
    place.mkdir(parents=True)
    (place / file_name("segment", 1)).write_bytes(forged.data)
    result = cli.ok(a, "sync")
    assert (
        "warning: not read (yet)" in result.stderr and "signature does not verify" in result.stderr
    )
    assert cli(a, "get", "threads", "t").exit_code == 1


def test_folder_and_relay_options_do_not_mix(cli: Cli, tmp_path: Path) -> None:
    folder, a = tmp_path / "shared", tmp_path / "a.db"
    for args in (
        ("init", "--folder", str(folder), "--relay", "http://127.0.0.1:1", "--account", "x"),
        ("init",),
        ("join", "--account", "x"),
    ):
        result = cli(a, *args)
        assert result.exit_code == 2, result.output
    assert not a.exists() and not folder.exists()
    cli.ok(a, "init", "--folder", str(folder))
    assert cli(tmp_path / "b.db", "init", "--folder", str(folder)).exit_code == 1  # one account
    assert cli(a, "sync", "--reseed").exit_code == 2
    wrong = cli(tmp_path / "d.db", "join", "--folder", str(folder), passphrase="not it at all")
    assert wrong.exit_code == 1 and "error:" in wrong.stderr and not (tmp_path / "d.db").exists()
    no_folder = cli(tmp_path / "c.db", "join", "--folder", str(tmp_path / "empty"))
    assert no_folder.exit_code == 1 and "not a sealsync folder" in no_folder.stderr
    assert not (tmp_path / "c.db").exists()


def test_a_damaged_envelope_in_a_signed_file_is_quarantined_and_exits_3(
    cli: Cli, tmp_path: Path
) -> None:
    """A device of the account whose own copy of a version is damaged signs it all the
    same: the readers' merge quarantines it, as a pulled one would be."""
    folder, a, b = tmp_path / "shared", tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--folder", str(folder))
    cli.ok(b, "join", "--folder", str(folder))
    cli.ok(a, "put", "threads", "t", '{"title": "fine", "message_count": 1}')
    with sqlite3.connect(a) as db:
        (envelope,) = db.execute("SELECT envelope FROM versions WHERE dirty = 1").fetchone()
        damaged = envelope[:-1] + bytes([envelope[-1] ^ 1])
        db.execute("UPDATE versions SET envelope = ? WHERE dirty = 1", (damaged,))
    cli.ok(a, "sync")
    result = cli(b, "sync")
    assert result.exit_code == 3, result.output
    assert "1 quarantined" in result.stdout and "sealsync diagnose" in result.stderr


@pytest.mark.slow
def test_a_watch_through_a_folder_merges_what_another_device_writes(
    cli: Cli, tmp_path: Path
) -> None:
    folder, a, b = tmp_path / "shared", tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--folder", str(folder))
    cli.ok(b, "join", "--folder", str(folder))
    env = {**os.environ, "SEALSYNC_PASSPHRASE": PASSPHRASE,
           "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip
    command = [sys.executable, "-m", "clients.cli", "--replica", str(b), "sync", "--watch",
               "--every", "60"]  # fmt: skip
    watch = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(watch, "watching the folder")
        cli.ok(a, "put", "threads", "t", '{"title": "seen live", "message_count": 1}')
        cli.ok(a, "sync")
        wait_for_line(watch, "1 merged")  # woken by the file, not by --every
        watch.send_signal(signal.SIGTERM)
        stdout, stderr = watch.communicate(timeout=TIMEOUT_S)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0 and "stopped watching" in stdout, stderr


@pytest.mark.slow
def test_an_account_moves_from_its_relay_to_a_folder_with_one_command(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay, folder = start_relay(), tmp_path / "Sync"
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t1", '{"title": "via the relay", "message_count": 1}')
    cli.ok(a, "sync")
    cli.ok(b, "sync")
    cli.ok(b, "put", "threads", "t2", '{"title": "never pushed", "message_count": 1}')
    moved = cli.ok(a, "move", "--folder", str(folder))
    assert "moved to folder" in moved.stdout and not (tmp_path / "a.db.relay.json").exists()
    cli.ok(b, "move", "--folder", str(folder))  # the folder a made: same account, same keys
    cli.ok(a, "sync")
    assert cli.json_object(a, "get", "threads", "t2")["doc"] == {
        "title": "never pushed",
        "message_count": 1,
    }
    again = cli(a, "move", "--folder", str(tmp_path / "elsewhere"))
    assert again.exit_code == 1 and "syncs through no relay" in again.stderr
    cli.ok(a, "login", "--relay", relay.url, "--account", "ann")  # and back to the relay
    assert not (tmp_path / "a.db.folder.json").exists()
    cli.ok(a, "sync", "--reseed")
    other = tmp_path / "other"
    cli.ok(tmp_path / "c.db", "init", "--folder", str(other))
    cli.ok(tmp_path / "d.db", "init", "--relay", relay.url, "--account", "bob")
    refused = cli(tmp_path / "d.db", "move", "--folder", str(other))
    assert refused.exit_code == 1 and "another key bundle" in refused.stderr
