"""Space comes back (issue 15 item 4, docs/tombstone-collection.md §5): a chat of 5,000
messages deleted on one device, both devices synced, then `relay collect`: the relay and
each replica give back at least 90 % of the pages the chat took, measured as used pages
(page count less free pages) of the real files, against the same files before the chat.
New files vacuum incrementally, so those pages leave the files at once; `compact` gives an
older file's free pages back (and converts it)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from chat import ChatStore
from clients.cli import main
from replica import Replica, ReplicaOptions
from tests.clients.test_cli import PASSPHRASE, Cli
from tests.clients.test_cli_admin import two_devices
from tests.relay.server import RelayProcess

MESSAGES = 5000


def used_bytes(path: Path, *, free_too: bool = False) -> int:
    """Pages in use, as a reader sees the file now (its WAL included); `free_too`: all its
    pages, what the file takes on disk once its WAL is checkpointed."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        pages, free, size = (
            db.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_count", "freelist_count", "page_size")
        )
    return int((pages - (0 if free_too else free)) * size)


def collect(cli: Cli, database: Path) -> dict[str, object]:
    """`sealsync relay collect --json` on the relay's file: the one account's totals."""
    result = cli.runner.invoke(main, ["relay", "collect", "--db", str(database), "--json"])
    assert result.exit_code == 0, result.output
    (account,) = json.loads(result.stdout)
    assert isinstance(account, dict)
    return account


def compact(cli: Cli, name: str, path: Path) -> int:
    """`sealsync compact` (`relay compact` for the relay's file): the file's bytes after."""
    if name == "relay":
        args = ["relay", "compact", "--db", str(path), "--json"]
        result = cli.runner.invoke(main, args)
        assert result.exit_code == 0, result.output
        after = json.loads(result.stdout)["after"]
    else:
        after = cli.json_object(path, "compact")["after"]
    assert isinstance(after, int)
    assert after == path.stat().st_size + Path(f"{path}-wal").stat().st_size
    return after


def opened(path: Path) -> ChatStore:
    """The device's replica with no freshness window: a delete leaves no lock rows behind
    for the next write to sweep (they would be the device's, not the chat's, bytes)."""
    replica = Replica.open(path, options=ReplicaOptions(freshness_window_s=0))
    replica.unlock(PASSPHRASE)
    return ChatStore(replica)


@pytest.mark.slow
def test_a_deleted_chat_of_5000_messages_gives_back_90_percent(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    assert relay.db is not None
    a, b = two_devices(cli, relay, tmp_path)
    files = {"relay": relay.db, "a": a, "b": b}
    before = {name: used_bytes(path) for name, path in files.items()}
    store = opened(a)
    thread = store.new_chat("a long one")
    with store.replica.batch():
        for i in range(MESSAGES):
            store.append(thread, "user", f"message {i}: " + "words " * 30)
    store.replica.close()
    for device in (a, b):
        cli.ok(device, "sync")
    full = {name: used_bytes(path) for name, path in files.items()}
    store = opened(a)
    assert store.delete(thread) == MESSAGES
    store.replica.close()
    for device in (a, b, a, b):  # pushed, pulled, and each device's cursor acknowledged
        cli.ok(device, "sync")
    assert collect(cli, relay.db)["versions"] == MESSAGES + 1  # the chat's record too
    for device in (a, b):
        cli.ok(device, "sync")  # the run's page: each drops its tombstones, and acks it
        assert cli.json_object(device, "status")["collected"] == MESSAGES + 1
    assert collect(cli, relay.db)["released"] == 1  # its markers and ghosts go too
    after = {name: used_bytes(path) for name, path in files.items()}
    given_back = {name: (full[name] - after[name]) / (full[name] - before[name]) for name in files}
    print(f"space given back (used pages): {given_back}, bytes before/full/after: "
          f"{before}, {full}, {after}")  # fmt: skip
    assert all(share >= 0.9 for share in given_back.values()), given_back
    # new files vacuum incrementally: the pages a run freed left the files, not just the data
    in_files = {name: used_bytes(path, free_too=True) for name, path in files.items()}
    assert all(in_files[name] - after[name] < 0.05 * (full[name] - before[name]) for name in files)
    compacted = {name: compact(cli, name, path) for name, path in files.items()}
    print(f"files after compact: {compacted}")
    for name in files:  # the files now hold hardly more than their used pages
        assert compacted[name] <= before[name] + 0.1 * (full[name] - before[name]), name
