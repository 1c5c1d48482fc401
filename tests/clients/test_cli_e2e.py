"""Three devices through the `sealsync` command line and a real relay process (uvicorn on
127.0.0.1, SQLite): each edits offline, they sync in a random order, all converge with the
siblings of a record edited on all three; `conflicts` lists them, one `put` resolves them
everywhere; and the relay's files and logs hold none of the markers written into ids,
documents and a profile name — while a device name, which the relay keeps in the clear, is
found (the scan's positive control)."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clients.test_cli import Cli
from tests.relay.server import RelayProcess
from tests.relay.test_ciphertext import found_in

DEVICES = ("a", "b", "c")


def everything(cli: Cli, replica: Path, profile: str) -> list[object]:
    """What a device shows: its threads and messages (both profiles) and the shared thread's
    siblings."""
    shown: list[object] = []
    for where in ("default", profile):
        for collection in ("threads", "messages"):
            shown.append(cli.json(replica, "ls", collection, "--profile", where))
    conflicts = cli.json_objects(replica, "conflicts", "threads", "shared")
    shown.append(sorted(json.dumps(c, sort_keys=True) for c in conflicts))
    return shown


@pytest.mark.slow
def test_three_devices_converge_resolve_a_conflict_and_leave_no_plaintext_on_the_relay(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    marker = f"zq{secrets.token_hex(6)}"
    control = f"clear{secrets.token_hex(6)}"
    profile = f"home{marker}p"
    paths = {name: tmp_path / f"{name}.db" for name in DEVICES}
    cli.ok(paths["a"], "init", "--relay", relay.url, "--account", "ann")
    for name in ("b", "c"):
        device_name = f"{name} {control}" if name == "b" else name
        cli.ok(paths[name], "join", "--relay", relay.url, "--account", "ann",
               "--device-name", device_name)  # fmt: skip
    cli.ok(paths["a"], "profiles", "--create", profile)
    unknown = cli(paths["c"], "ls", "messages", "--profile", profile)
    assert unknown.exit_code == 1 and "profiles --create" in unknown.stderr  # not synced yet
    for name in DEVICES:  # the profile reaches every device
        cli.ok(paths[name], "sync")

    for n, name in enumerate(DEVICES):  # offline: nobody syncs until everyone has written
        path = paths[name]
        cli.ok(path, "put", "messages", f"m{n}{marker}i", json.dumps({"text": f"{marker}d {n}"}))
        cli.ok(path, "put", "threads", "shared", json.dumps({"title": f"by {name}"}))
    cli.ok(paths["c"], "put", "messages", "private", json.dumps({"text": marker}),
           "--profile", profile)  # fmt: skip
    cli.ok(paths["b"], "rm", "messages", "m1" + marker + "i")

    order = random.Random(11)
    for _ in range(2):  # two rounds in random orders: every write reaches every device
        for name in order.sample(DEVICES, len(DEVICES)):
            cli.ok(paths[name], "sync")
    shown = [everything(cli, paths[name], profile) for name in DEVICES]
    assert shown[0] == shown[1] == shown[2]
    siblings = shown[0][-1]
    assert isinstance(siblings, list) and len(siblings) == 2  # three concurrent edits: two others

    cli.ok(paths["c"], "put", "threads", "shared", '{"title": "agreed"}')
    for name in ("c", "a", "b"):
        cli.ok(paths[name], "sync")
    for name in DEVICES:
        assert cli.json(paths[name], "conflicts", "threads", "shared") == []
        shared = cli.json_object(paths[name], "get", "threads", "shared")
        assert shared["doc"] == {"title": "agreed"}
        messages = cli.json_objects(paths[name], "ls", "messages")
        assert [m["id"] for m in messages] == [f"m0{marker}i", f"m2{marker}i"]

    relay.stop()  # graceful: the WAL is checkpointed into the main file
    relay_files = sorted(tmp_path.glob("relay0.*"))
    assert [p.name for p in relay_files] == ["relay0.db", "relay0.log"]
    assert found_in(marker, relay_files) == []
    assert found_in(control, relay_files)  # the scan finds what the relay keeps in the clear
