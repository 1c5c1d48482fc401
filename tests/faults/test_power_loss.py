"""Power cuts (issue 15, item 2): one recorded run of a child committing batches, replayed
offline into a crash image at every cut point (tests/faults/crashsim.py), each opened and
checked.

With synchronous=full, whatever the cut drops, keeps or tears of the writes not yet synced:
every image passes `integrity_check`, holds every batch acknowledged before the cut, holds no
part of a batch without the rest, and nothing of a batch not yet begun. The control run with
synchronous=normal loses acknowledged batches in a share of its images, which shows the
replay drops what a power cut drops.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from replica import DEFAULT_PROFILE, Replica
from replica.envelope import Identity
from tests.conftest import Account
from tests.faults import crashsim
from tests.faults.power_child import PER_BATCH, note_id
from tests.faults.test_disk_faults import ROOT, strace

CHILD = Path(__file__).with_name("power_child.py")
BATCHES = 24
SAMPLE_EVERY = 60
"""Every 60th image is also opened by a replica, each acknowledged note read through it."""


@dataclass(frozen=True)
class Recording:
    calls: list[crashsim.Call]
    traced: str
    keys: dict[int, set[bytes]]
    """Each batch's record keys, as the file names them."""


def record(account: Account, folder: Path, synchronous: str) -> Recording:
    """The child's run under strace, parsed; the batches' keys from the file it left."""
    path = folder / "replica.db"
    log = folder / "strace.log"
    command = [strace(), "-qq", "-y", "-xx", "-s", "1000000", "-e", f"trace={crashsim.CALLS}",
               "-o", str(log), sys.executable, str(CHILD), str(path), account.bundle.hex(),
               account.key.hex(), synchronous, str(BATCHES)]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0, done.stderr[-2000:]
    replica = Replica.open(path)
    with replica:
        replica.unlock_with_key(account.key)
        keys = {
            batch: {
                replica._core.record_key(Identity(DEFAULT_PROFILE, "notes", note_id(batch, i)))
                for i in range(PER_BATCH)
            }
            for batch in range(BATCHES)
        }
    return Recording(crashsim.parse(log.read_text(), str(path)), str(path), keys)


@pytest.fixture(scope="module")
def recordings(account: Account, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recording]:
    return {
        synchronous: record(account, tmp_path_factory.mktemp(synchronous), synchronous)
        for synchronous in ("full", "normal")
    }


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """Where images are written: memory when the machine has it (thousands are written)."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    made = Path(tempfile.mkdtemp(prefix="sealsync-power-", dir=parent))
    yield made
    shutil.rmtree(made)


def check(cut: crashsim.CutPoint, folder: Path, recording: Recording) -> Counter[str]:
    """What the image at `cut` shows: `lost` acknowledged batches (in `losing` images), `partial` batches,
    `ahead` (a batch present that had not begun), `corrupt` (integrity_check)."""
    crashsim.write_image(cut, folder, recording.traced)
    acked = {int(line.split()[1]) for line in cut.printed if line.startswith("ack ")}
    outcome: Counter[str] = Counter(images=1)
    try:
        with closing(sqlite3.connect(folder / "replica.db")) as db:
            intact = db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            stored = {key for (key,) in db.execute("SELECT key FROM versions")}
    except sqlite3.DatabaseError:
        intact = False
    if not intact:
        outcome["corrupt"] += 1
        return outcome
    present = {batch for batch, keys in recording.keys.items() if keys & stored}
    outcome["partial"] += sum(
        not keys <= stored for b, keys in recording.keys.items() if b in present
    )
    outcome["lost"] += len(acked - present)
    outcome["losing"] += bool(acked - present)
    outcome["ahead"] += len(present - acked - {max(acked, default=-1) + 1})
    return outcome


def replica_reads(folder: Path, account: Account, cut: crashsim.CutPoint) -> bool:
    """Whether a replica opens the image and reads every acknowledged note."""
    acked = [int(line.split()[1]) for line in cut.printed if line.startswith("ack ")]
    replica = Replica.open(folder / "replica.db")
    with replica:
        replica.unlock_with_key(account.key)
        return all(
            replica.get("notes", note_id(batch, i)) is not None
            for batch in acked
            for i in range(PER_BATCH)
        )


def trial(
    recording: Recording, mode: crashsim.Mode, seed: int, folder: Path, account: Account
) -> Counter[str]:
    totals: Counter[str] = Counter()
    for cut in crashsim.replay(recording.calls, mode, seed):
        if "ready" not in cut.printed:
            continue  # the file is still being made: nothing is acknowledged yet
        outcome = check(cut, folder, recording)
        if totals["images"] % SAMPLE_EVERY == 0 and not outcome["corrupt"]:
            outcome["sampled"] += 1
            outcome["unreadable"] += not replica_reads(folder, account, cut)
        totals += outcome
    return totals


def report(name: str, totals: Counter[str]) -> str:
    fields = ("images", "losing", "lost", "partial", "ahead", "corrupt", "sampled", "unreadable")
    return f"power loss {name}: " + ", ".join(f"{totals[f]} {f}" for f in fields)


@pytest.mark.parametrize(
    ("mode", "seeds"),
    [(crashsim.Mode.DROP, [0]), (crashsim.Mode.KEEP, [0]), (crashsim.Mode.TORN, [1, 2])],
)
def test_a_power_cut_anywhere_loses_no_acknowledged_batch_with_synchronous_full(
    mode: crashsim.Mode,
    seeds: list[int],
    recordings: dict[str, Recording],
    account: Account,
    folder: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    totals: Counter[str] = Counter()
    for seed in seeds:
        totals += trial(recordings["full"], mode, seed, folder, account)
    with capsys.disabled():
        print("\n" + report(f"full/{mode.value}", totals))
    assert totals["images"] >= 500
    assert totals["sampled"] >= 5
    for bad in ("lost", "partial", "ahead", "corrupt", "unreadable"):
        assert totals[bad] == 0, report(mode.value, totals)


def test_the_control_with_synchronous_normal_loses_acknowledged_batches(
    recordings: dict[str, Recording],
    account: Account,
    folder: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without an fsync per commit, a cut loses what the disk had not yet taken: if this
    found nothing lost, the replay would not be dropping what a power cut drops."""
    totals = trial(recordings["normal"], crashsim.Mode.DROP, 0, folder, account)
    with capsys.disabled():
        print("\n" + report("normal/drop (control)", totals))
    assert totals["images"] >= 500
    assert totals["losing"] > 0
    assert totals["corrupt"] == totals["partial"] == totals["ahead"] == 0
