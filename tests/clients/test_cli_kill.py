"""SIGKILL `sealsync sync` inside each phase its `--progress json` markers name; rerun: converged.

Device A holds many dirty records (push batches to kill in, topped up as the runs push them);
device B has yet to pull the many records A pushed before (pages to kill in). Each run is
`sealsync sync --progress json` as its own process against a real relay process. The test
reads the run's JSON lines on stderr and SIGKILLs it right after a start marker: a moment
after `push_sending` (the batch in flight), at once on `push_answered` (the relay committed,
the receipts not yet saved), a moment after `merge_start` (mid-merge). A kill counts as inside
the phase only when the phase's end marker never came (all of a killed run's output is read
after its death). Once each phase has `SEALSYNC_CLI_KILLS` kills (default 10), every device
syncs to completion: both hold exactly the records written, each once, without siblings and
none dirty, and the relay holds each version exactly once, under one seq.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from click.testing import CliRunner

from clients.device import CLI_OPTIONS
from clients.http import RelayClient
from replica import Replica, passphrase_login_keys
from replica.wire import LoginRequest
from tests.clients.test_cli import PASSPHRASE, Cli
from tests.clients.test_sync import relay_entries
from tests.relay.server import RelayProcess

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("SEALSYNC_CLI_KILLS", "10"))
MAX_RUNS = 5 * KILLS + 20
ACCOUNT = "ann"
BATCH = 1000
"""The test relay's push batch and page size (smaller than the defaults, so that a few
thousand records make the many batches and pages the kills need)."""
ON_RELAY = 16 * BATCH
"""A's records the relay holds before the kills, which B has yet to pull and merge."""
MIN_DIRTY = 3 * BATCH
"""Before each run of A, it has at least this many records to push (written as needed)."""
RUN_TIMEOUT_S = 60.0
LATE_KILL_S = 0.02
"""Kill up to this long after `push_sending` or `merge_start`: a batch's round trip and a
page's merge each take some tens of ms here, so the kill strikes anywhere inside them."""
PHASES = {"push in flight": ("push_sending", "push_answered"),
          "receipts not saved": ("push_answered", "receipts_saved"),
          "mid-merge": ("merge_start", "merged")}  # fmt: skip
"""Each phase's start and end markers. The driver is pipelined (batch k+1 is sent before batch
k's receipts are saved), so a kill may strike inside two phases at once; it counts for the
phase it was aimed at."""


@dataclass(frozen=True)
class Target:
    """Where to kill: which device, on which marker, its how-manyth, and how long after it."""

    device: Literal["a", "b"]
    marker: str
    occurrence: int
    delay_s: float


def target_for(phase: str, rng: random.Random) -> Target:
    """An early batch or page of a run: a kill of a later one follows steps that completed in
    the same run (the third batch leaves only once the first one's receipts are saved)."""
    if phase == "push in flight":
        return Target("a", "push_sending", rng.randint(1, 3), rng.uniform(0, LATE_KILL_S))
    if phase == "receipts not saved":
        return Target("a", "push_answered", rng.randint(1, 2), 0.0)
    return Target("b", "merge_start", rng.randint(1, 2), rng.uniform(0, LATE_KILL_S))


def document(n: int) -> dict[str, Any]:
    return {"text": f"message {n}", "n": n}


@dataclass
class Writes:
    """A's records `m000000`, `m000001`, … written through the library in one transaction
    each time (a `sealsync put` per record would take minutes); `count` written so far."""

    path: Path
    count: int = 0
    key: bytes | None = None
    """The raw key, once the passphrase was hashed for it (Argon2id, a third of a second)."""

    def add(self, count: int) -> None:
        with closing(Replica.open(self.path, options=CLI_OPTIONS)) as replica:
            if self.key is None:
                replica.unlock(PASSPHRASE)
                self.key = replica.unlock_key()
            else:
                replica.unlock_with_key(self.key)
            with replica.batch():
                for n in range(self.count, self.count + count):
                    replica.put("messages", f"m{n:06}", document(n))
        self.count += count

    def keep_dirty(self, at_least: int) -> None:
        with closing(Replica.open(self.path, options=CLI_OPTIONS)) as replica:
            dirty = replica.status().dirty  # works while locked: no passphrase to hash
        if dirty < at_least:
            self.add(at_least)


def run_sync(tmp_path: Path, replica: Path, target: Target | None) -> tuple[list[str], int]:
    """Run `sealsync sync --progress json` and SIGKILL it at `target` (None: let it finish);
    every phase marker it printed, and its exit code."""
    env = {**os.environ, "SEALSYNC_PASSPHRASE": PASSPHRASE,
           "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip
    command = [sys.executable, "-m", "clients.cli", "--replica", str(replica),
               "sync", "--progress", "json", "--retry-for", "10"]  # fmt: skip
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as process:  # fmt: skip
        watchdog = threading.Timer(RUN_TIMEOUT_S, process.kill)
        watchdog.start()
        try:
            lines = read_until(process, target)
        finally:
            watchdog.cancel()
            process.kill()  # nothing if it has exited
        return [m for line in lines if (m := marker_of(line))], process.wait()


def read_until(process: subprocess.Popen[str], target: Target | None) -> list[str]:
    """Its stderr lines to the end, with a SIGKILL at `target` on the way."""
    assert process.stderr is not None
    lines: list[str] = []
    seen = 0
    for line in process.stderr:
        lines.append(line)
        if target is not None and marker_of(line) == target.marker:
            seen += 1
            if seen == target.occurrence:
                time.sleep(target.delay_s)
                process.send_signal(signal.SIGKILL)
    return lines


def open_phases(markers: list[str]) -> list[str]:
    """The phases a run was inside when it died: each started more often than it ended
    (batches are answered, and pages merged, in the order they were sent and fetched)."""
    return [
        phase for phase, (start, end) in PHASES.items() if markers.count(start) > markers.count(end)
    ]


def marker_of(line: str) -> str | None:
    """The phase a `--progress json` line names; None for any other line (an error, say)."""
    if not line.startswith("{"):
        return None
    phase = json.loads(line)["phase"]
    assert isinstance(phase, str)
    return phase


def kill_in_every_phase(
    tmp_path: Path, writes: Writes, b: Path
) -> tuple[Counter[str], Counter[str]]:
    """Kill runs of A and B, aiming at the phase with the fewest kills so far, until every
    phase has `KILLS` aimed kills that struck inside it; how many did, and how many runs aimed
    at each."""
    rng = random.Random(4)
    landed: Counter[str] = Counter()
    aimed: Counter[str] = Counter()
    for run in range(MAX_RUNS):
        if min(landed[phase] for phase in PHASES) >= KILLS:
            return landed, aimed
        aim = min(PHASES, key=lambda phase: landed[phase])
        aimed[aim] += 1
        target = target_for(aim, rng)
        if target.device == "a":
            writes.keep_dirty(MIN_DIRTY)
        markers, code = run_sync(tmp_path, writes.path if target.device == "a" else b, target)
        assert markers.count(target.marker) >= target.occurrence, f"run {run}: {markers}"
        if code == -signal.SIGKILL and aim in open_phases(markers):
            landed[aim] += 1
    raise AssertionError(f"not {KILLS} kills in every phase after {MAX_RUNS} runs: {landed}")


def audit_client(url: str) -> RelayClient:
    """The account seen by a device of its own (the devices' sessions stay theirs)."""
    client = RelayClient(url)
    auth_key = passphrase_login_keys(PASSPHRASE, client.prelogin(ACCOUNT).kdf).auth_key
    client.login(LoginRequest(ACCOUNT, auth_key, "auditor"))
    return client


def contents(path: Path) -> tuple[dict[str, Any], int, int]:
    """A replica's messages by id, how many have siblings, and how many versions are dirty."""
    with closing(Replica.open(path, options=CLI_OPTIONS)) as replica:
        replica.unlock(PASSPHRASE)
        records = replica.scan("messages", include_deleted=True)
        with_siblings = sum(bool(r.conflicts) for r in records)
        return {r.id: r.document for r in records}, with_siblings, replica.status().dirty


@pytest.mark.slow
def test_sync_killed_in_every_phase_converges_when_run_again(
    start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay(f"page_size={BATCH}", f"max_push_envelopes={BATCH}")
    cli = Cli(CliRunner(), tmp_path)
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", ACCOUNT)
    cli.ok(b, "join", "--relay", relay.url, "--account", ACCOUNT)
    writes = Writes(a)
    writes.add(ON_RELAY)
    cli.ok(a, "sync")

    landed, aimed = kill_in_every_phase(tmp_path, writes, b)
    for device in (a, b):
        markers, code = run_sync(tmp_path, device, None)
        assert code == 0 and markers[-1] == "merged", markers
    expected = {f"m{n:06}": document(n) for n in range(writes.count)}
    for device in (a, b):
        assert contents(device) == (expected, 0, 0)  # every record, once; none left to push
    with closing(audit_client(relay.url)) as auditor:
        identities, seqs, head = relay_entries(auditor)
    assert len(identities) == len(expected)  # nothing lost on the relay
    assert len(set(identities)) == len(identities) and len(set(seqs)) == len(seqs)  # nor doubled
    assert head == len(expected)  # no version ever took a second seq (none was overwritten)
    print(f"kills landed {dict(landed)} in runs aimed {dict(aimed)}")
