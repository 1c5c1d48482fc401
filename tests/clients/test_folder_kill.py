"""A device SIGKILLed while it syncs through a folder (tests/clients/folder_child.py), again
and again at random moments: every file under a real name in its place opens, and once it
syncs again, another device holds every record it had committed. Nothing is lost, and
nothing half-written is ever read."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clients.folder import DEVICES, FolderSync, make_folder, parse_file_name
from replica import Replica
from tests.conftest import Account, ReplicaFactory

CHILD = Path(__file__).with_name("folder_child.py")
ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("SEALSYNC_FOLDER_KILLS", "8"))


def run_until_killed(replica: Path, folder: Path, key: bytes, first: int, after_s: float) -> int:
    """Start the child, let it run `after_s` seconds past its first round, SIGKILL it: the
    last record it said was committed."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(replica), str(folder), key.hex(), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(2)]
        assert lines[0].strip() == "ready", child.stderr
        while "synced" not in lines[-1]:
            lines.append(child.stdout.readline())
            assert lines[-1], child.stderr
        time.sleep(after_s)
        child.kill()
        output, errors = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    said = lines + output.splitlines()
    committed = [int(line.split()[1]) for line in said if line.startswith("committed")]
    assert committed or "Traceback" not in errors, errors
    return max(committed, default=first - 1)


@pytest.mark.slow
def test_a_device_killed_while_syncing_loses_nothing_and_leaves_nothing_misread(
    make_replica: ReplicaFactory, account: Account, tmp_path: Path
) -> None:
    folder = tmp_path / "shared"
    writer, reader = make_replica("writer"), make_replica("reader")
    make_folder(folder, writer.key_bundle(), writer.key_generation)
    device = writer.folder_session().device
    writer.close()
    rng = random.Random(7)
    last = 0
    for _ in range(KILLS):
        last = run_until_killed(writer.path, folder, account.key, last + 1, rng.uniform(0, 0.5))
        session = reader.folder_session()
        for path in (folder / DEVICES / device).iterdir():
            parsed = parse_file_name(path)
            if parsed is not None:  # the rest are hidden temporary files: never read
                session.open(path.read_bytes(), device, parsed.number, parsed.kind)
    assert last > 3 * KILLS  # the child did write, between the kills
    with Replica.open(writer.path) as again:
        again.unlock_with_key(account.key)
        FolderSync(again, folder).sync()  # a clean round: everything committed goes out
    FolderSync(reader, folder).sync()
    missing = [n for n in range(1, last + 1) if reader.get("notes", f"n{n}") is None]
    assert not missing
