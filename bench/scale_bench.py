"""A device pushing N records and another joining them, each in a process of its own so each
peak RSS is its own (issue 15, item 3): `sync.push_<N>` and `sync.join_<N>`, with the field
`peak_rss_mib` (the joiner's takes a status, a backup, its check and a repair too).

A million in the full bench; `--quick` and `--n` run fewer. The bound is per process, not a
ratio: a device must stay under 200 MiB however much it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import Bench, BenchmarkError, Line, benchmark, check_equal
from relay_http import relay_server

CHILD = Path(__file__).with_name("scale_child.py")
ROOT = CHILD.parent.parent
PEAK_RSS_BOUND_MIB = 200


def run_child(mode: str, url: str, folder: Path, n: int) -> dict[str, object]:
    """The child's JSON line; its traceback as the error when it fails."""
    command = [sys.executable, str(CHILD), mode, url, "scale", str(folder), str(n)]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"{mode} of {n}: {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def scale_lines(label: str, n: int, push: dict[str, object], join: dict[str, object]) -> list[Line]:
    lines = []
    for mode, done in (("push", push), ("join", join)):
        seconds = float(done["seconds"])  # type: ignore[arg-type]
        extra = {"n": n, "peak_rss_mib": done["peak_rss_mib"], "bound_mib": PEAK_RSS_BOUND_MIB}
        lines.append(Line(f"sync.{mode}_{label}", n / seconds, "records/s", extra=extra))
    return lines


@benchmark("scale")
def bench_sync_scale(bench: Bench) -> list[Line]:
    n = bench.sizes.scale_records
    label = f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k" if n >= 1000 else str(n)
    account = bench.account()
    folder = bench.folder / "scale"
    folder.mkdir()
    (folder / "bundle").write_bytes(account.bundle)
    (folder / "key").write_bytes(account.key)
    with relay_server(bench, "relay-scale") as served:
        url = f"http://127.0.0.1:{served.port}"
        push = run_child("push", url, folder, n)
        join = run_child("join", url, folder, n)
    check_equal("scale pushed", push["pushed"], n)
    check_equal("scale joined records", join["records"], n)
    return scale_lines(label, n, push, join)
