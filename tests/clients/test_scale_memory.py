"""A device's memory does not grow with what it holds (issue 15, item 3): a device pushing
N records and another joining them (then taking a status, a backup, its check and a repair),
each in a process of its own over a real relay. Each peaks at the same RSS for 200,000
records as for 20,000, within 10%, and under 200 MiB; the joining device is allowed
SQLite's page cache on top (it fills up to its bound, 16 MiB, as the file grows past it:
20,000 records do not fill it). The pushing device once grew by a quarter: the pull after
its push loaded every automatic lock its writes held (now a page reads only its own
records' locks: `test_a_page_reads_its_own_records_locks_not_every_recent_writes`). The
million runs in the full bench (`bench/run.py --only scale`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replica.store import CACHE_KIB
from tests.conftest import Account
from tests.relay.server import RelayProcess

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "bench" / "scale_child.py"
SIZES = (20_000, 200_000)
BOUND_MIB = 200
PAGE_CACHE_MIB = CACHE_KIB / 1024


def run_child(mode: str, url: str, folder: Path, n: int) -> dict[str, Any]:
    command = [sys.executable, str(CHILD), mode, url, "scale", str(folder), str(n)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                          env=os.environ.copy())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def push_and_join(account: Account, folder: Path, n: int) -> tuple[float, float]:
    """The pushing and the joining device's peak RSS (MiB), once every record arrived."""
    folder.mkdir()
    (folder / "bundle").write_bytes(account.bundle)
    (folder / "key").write_bytes(account.key)
    with RelayProcess(folder / "relay.db", folder / "relay.log") as relay:
        pushed = run_child("push", relay.url, folder, n)
        joined = run_child("join", relay.url, folder, n)
    assert (pushed["pushed"], joined["records"], joined["backup"]) == (n, n, "ok")
    return pushed["peak_rss_mib"], joined["peak_rss_mib"]


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_records_a_device_holds(
    account: Account, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small, large = (push_and_join(account, tmp_path / str(n), n) for n in SIZES)
    with capsys.disabled():
        print(f"\npeak RSS MiB (push, join): {SIZES[0]}: {small}, {SIZES[1]}: {large}")
    assert max(*small, *large) < BOUND_MIB
    (pushed_few, joined_few), (pushed_many, joined_many) = small, large
    assert pushed_many <= pushed_few * 1.1
    assert joined_many <= joined_few * 1.1 + PAGE_CACHE_MIB
