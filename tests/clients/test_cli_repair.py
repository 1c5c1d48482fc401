"""What the command line says of data that cannot be opened: `sync` counts it and exits 3,
`diagnose` names it, `repair` sets it aside so its records can be used again (issue 12: a
sync that quarantined printed "0 merged" and exited 0, and the hint named a `repair` the
command line did not have)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clients.test_cli import Cli, assert_user_error
from tests.relay.server import RelayProcess

DAMAGED = 3
"""specs/cli.md: done, but data that cannot be opened was found."""


def damage_newest_envelope(relay_db: Path) -> None:
    """Flip one bit of the AES-GCM tag of the relay's newest envelope; the header stays."""
    with sqlite3.connect(relay_db) as db:
        seq, envelope = db.execute(
            "SELECT seq, envelope FROM versions ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        damaged = envelope[:-1] + bytes([envelope[-1] ^ 1])
        db.execute("UPDATE versions SET envelope = ? WHERE seq = ?", (damaged, seq))


@pytest.mark.slow
def test_a_damaged_pulled_version_is_counted_named_and_repaired(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t1", '{"title": "kept"}')
    cli.ok(a, "sync")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t2", '{"title": "damaged on the relay"}')
    cli.ok(a, "sync")
    assert relay.db is not None
    damage_newest_envelope(relay.db)

    synced = cli(b, "sync")
    assert synced.exit_code == DAMAGED, synced.output
    assert "1 pulled, 0 merged, 1 quarantined" in synced.stdout
    assert "could not be opened" in synced.stderr and "sealsync diagnose" in synced.stderr

    diagnosed = cli(b, "diagnose", "--json")
    assert diagnosed.exit_code == DAMAGED
    found = json.loads(diagnosed.stdout)
    assert (found["healthy"], found["degraded_records"]) == (False, 1)
    assert cli.json_object(b, "get", "threads", "t1")["doc"] == {"title": "kept"}
    assert_user_error(cli(b, "get", "threads", "t2"), "cannot be opened")

    repaired = cli.ok(b, "repair")
    assert "1 record(s) readable again" in repaired.stdout
    healthy = cli.ok(b, "diagnose")
    assert "0 corrupt, 0 undecryptable; 0 degraded" in healthy.stdout


def test_aside_lists_nothing_until_a_resync_sets_something_aside(cli: Cli, tmp_path: Path) -> None:
    """`aside` (what a full resync set aside: specs/replica.md §2, the taking back is
    `tests/replica/test_collection.py`): empty at first, in both forms, and taking back
    what is not there is one error line that changes nothing."""
    a = tmp_path / "a.db"
    cli.ok(a, "init", "--folder", str(tmp_path / "Sync"))
    assert "nothing is set aside" in cli.ok(a, "aside").stdout
    assert cli.json(a, "aside") == []
    assert_user_error(cli(a, "aside", "--take", "threads", "t1"), "nothing of threads/t1")
