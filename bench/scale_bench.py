"""A device pushing N records and another joining them, each in a process of its own so each
peak RSS is its own (issue 15, item 3): `sync.push_<N>` and `sync.join_<N>` over a relay on
SQLite, and `sync.push_<N>_pg` and `sync.join_<N>_pg` over one on PostgreSQL (a schema of
its own, dropped after), with the field `peak_rss_mib` (the joiner's takes a status, a
backup, its check and a repair too). Without a PostgreSQL server the `_pg` lines are left
out, and a `note` on the last line says why.

A million in the full bench; `--quick` and `--n` run fewer. The bound is per process, not a
ratio: a device must stay under 200 MiB however much it holds.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

from harness import Bench, BenchmarkError, Line, benchmark, check_equal
from relay_http import relay_server
from server import Served, serving

CHILD = Path(__file__).with_name("scale_child.py")
ROOT = CHILD.parent.parent
PEAK_RSS_BOUND_MIB = 200
POSTGRES_URL = os.environ.get(
    "SEALSYNC_BENCH_POSTGRES_URL",
    os.environ.get("SEALSYNC_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
)
"""The tests' server unless told otherwise (psycopg comes with the `dev` or `postgres`
extra; without it, the `_pg` lines are left out)."""


def run_child(mode: str, url: str, folder: Path, n: int) -> dict[str, object]:
    """The child's JSON line; its traceback as the error when it fails."""
    command = [sys.executable, str(CHILD), mode, url, "scale", str(folder), str(n)]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise BenchmarkError(f"{mode} of {n}: {done.stderr[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def scale_lines(
    label: str, n: int, push: dict[str, object], join: dict[str, object], suffix: str = ""
) -> list[Line]:
    lines = []
    for mode, done in (("push", push), ("join", join)):
        seconds = float(done["seconds"])  # type: ignore[arg-type]
        extra = {"n": n, "peak_rss_mib": done["peak_rss_mib"], "bound_mib": PEAK_RSS_BOUND_MIB}
        lines.append(Line(f"sync.{mode}_{label}{suffix}", n / seconds, "records/s", extra=extra))
    return lines


@contextmanager
def postgres_relay(bench: Bench) -> Iterator[Served]:
    """A relay on PostgreSQL, in a schema of its own that is dropped after."""
    import psycopg
    from psycopg import sql

    schema = f"bench_scale_{secrets.token_hex(6)}"
    try:
        log = bench.path("relay-scale-pg").with_suffix(".log")
        with serving("relay", log, POSTGRES_URL, schema) as served:
            yield served
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
            db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def postgres_missing() -> str | None:
    """Why the PostgreSQL lines cannot run here, or None."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (the dev or postgres extra): _pg lines not run"
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL at {POSTGRES_URL} ({type(exc).__name__}): _pg lines not run"
    return None


def push_and_join(
    bench: Bench, relay: AbstractContextManager[Served], n: int, label: str, suffix: str
) -> list[Line]:
    """A new account of `n` records pushed by one device and joined by another."""
    folder = bench.account_folder(f"scale{suffix}")
    with relay as served:
        url = f"http://127.0.0.1:{served.port}"
        push = run_child("push", url, folder, n)
        join = run_child("join", url, folder, n)
    check_equal(f"scale{suffix} pushed", push["pushed"], n)
    check_equal(f"scale{suffix} joined records", join["records"], n)
    return scale_lines(label, n, push, join, suffix)


@benchmark("scale")
def bench_sync_scale(bench: Bench) -> list[Line]:
    n = bench.sizes.scale_records
    label = f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k" if n >= 1000 else str(n)
    lines = push_and_join(bench, relay_server(bench, "relay-scale"), n, label, "")
    missing = postgres_missing()
    if missing is not None:
        return [*lines[:-1], replace(lines[-1], extra=lines[-1].extra | {"note": missing})]
    return lines + push_and_join(bench, postgres_relay(bench), n, label, "_pg")
