"""bench/run.py keeps working and keeps its output contract (the JSON lines CI and people read).

Runs the script as a subprocess, as a person would, with tiny sizes so the suite stays fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    "raw.sqlite_upsert",
    "raw.aesgcm_open",
    "raw.upsert_aead",
    "replica.put",
    "replica.put_single",
    "replica.merge",
    "raw.starlette_echo",
    "relay.push",
    "relay.pull",
    "relay.load",
    "sync.e2e_10k",
    "sync.join_10k",
    "sync.incremental",
    "sync.live",
    "folder.e2e_10k",
}
LOAD_FIELDS = {"p50_ms", "p99_ms", "errors", "lost", "rate_per_s", "generator_lag_p99_ms"}


def run_script(*args: str) -> str:
    """bench/run.py's standard output; it must exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_bench(*args: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run_script("--json", *args).splitlines() if line.strip()]


def check_lines(lines: list[dict[str, Any]]) -> None:
    """Every line has name, a positive value and a unit; a ratio is value ÷ its baseline's."""
    value_by_name = {line["name"]: line["value"] for line in lines}
    assert len(value_by_name) == len(lines), "duplicate names"
    for line in lines:
        assert isinstance(line["name"], str) and line["name"]
        assert isinstance(line["value"], int | float) and line["value"] > 0, line
        assert isinstance(line["unit"], str) and line["unit"], line
        if "ratio" in line:
            base = value_by_name[line["baseline"]]
            assert line["ratio"] == pytest.approx(line["value"] / base, rel=1e-9), line


def test_bench_quick_aesgcm_prints_json_lines() -> None:
    lines = run_bench("--quick", "--only", "raw.aesgcm")
    check_lines(lines)
    assert [line["name"] for line in lines] == ["raw.aesgcm_open"]
    assert lines[0]["unit"] == "ops/s" and lines[0]["n"] > 0


@pytest.mark.slow
def test_bench_tiny_run_has_every_required_line_with_its_baseline() -> None:
    lines = run_bench("--n", "100")
    check_lines(lines)
    by_name = {line["name"]: line for line in lines}
    assert set(by_name) >= REQUIRED
    assert by_name["replica.merge"]["baseline"] == "raw.upsert_aead"
    assert by_name["replica.put"]["baseline"] == "raw.sqlite_upsert"
    assert by_name["replica.put_single"]["baseline"] == "raw.sqlite_upsert"
    assert by_name["folder.e2e_10k"]["baseline"] == "sync.e2e_10k"
    assert all("ratio" in by_name[name] for name in ("replica.merge", "replica.put"))
    assert by_name["replica.merge"]["n"] == by_name["raw.upsert_aead"]["n"] == 100
    units = {name: by_name[name]["unit"] for name in ("raw.sqlite_upsert", "raw.aesgcm_open",
             "raw.upsert_aead", "replica.put", "replica.merge")}  # fmt: skip
    assert units == {"raw.sqlite_upsert": "rows/s", "raw.aesgcm_open": "ops/s",
                     "raw.upsert_aead": "rows/s", "replica.put": "ops/s",
                     "replica.merge": "rows/s"}  # fmt: skip
    merge_envelopes = by_name["replica.merge"]["envelope_bytes"]
    assert merge_envelopes == by_name["raw.upsert_aead"]["envelope_bytes"]  # one size, fair
    assert by_name["relay.push"]["baseline"] == "relay.push.unsigned"
    assert by_name["relay.push.unsigned"]["baseline"] == "raw.sqlite_upsert"
    assert by_name["relay.push"]["n"] == by_name["relay.pull"]["n"] == 100


@pytest.mark.slow
def test_bench_relay_load_reports_latency_loss_and_its_baseline() -> None:
    lines = run_bench("--n", "20", "--only", "relay.load")
    check_lines(lines)
    by_name = {line["name"]: line for line in lines}
    assert list(by_name) == ["raw.starlette_echo", "relay.load"]
    load = by_name["relay.load"]
    assert load["unit"] == "requests/s" and load["baseline"] == "raw.starlette_echo"
    assert "ratio" in load and set(load) >= LOAD_FIELDS
    assert load["devices"] == 20 and load["acknowledged"] > 0
    assert load["errors"] == 0 and load["lost"] == 0, load


def test_bench_only_pulls_in_the_baseline_it_needs() -> None:
    lines = run_bench("--n", "50", "--only", "replica.put_single")
    assert [line["name"] for line in lines] == ["raw.sqlite_upsert", "replica.put_single"]
    check_lines(lines)


@pytest.mark.slow
def test_bench_sync_reports_e2e_incremental_and_live_with_the_merge_baseline() -> None:
    lines = run_bench("--n", "20", "--only", "sync")
    check_lines(lines)
    by_name = {line["name"]: line for line in lines}
    assert list(by_name) == [
        "raw.upsert_aead", "replica.merge", "sync.e2e_10k", "sync.join_10k",
        "sync.incremental", "sync.live",
    ]  # fmt: skip
    e2e, join = by_name["sync.e2e_10k"], by_name["sync.join_10k"]
    assert e2e["unit"] == "records/s" and e2e["baseline"] == "replica.merge" and "ratio" in e2e
    assert e2e["n"] == 20 and "100k not run" in e2e["note"]
    assert join["baseline"] == "replica.merge" and join["n"] == 20
    assert join["value"] == pytest.approx(20 / join["join_s"], rel=0.05)
    incremental = by_name["sync.incremental"]
    assert (
        incremental["value"] == pytest.approx(incremental["ms_10k"], abs=0.01)
        and incremental["bytes_10k"] > 0
    )
    assert incremental["ms_100k"] is None and incremental["bytes_100k"] is None
    live = by_name["sync.live"]
    assert live["writes"] == 20 and 0 < live["p50_ms"] <= live["p95_ms"] == live["value"]


def test_without_json_a_table_shows_each_line_with_its_unit_ratio_and_baseline() -> None:
    table = run_script("--n", "50", "--only", "replica.merge")
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
    assert rows["benchmark"][:5] == ["benchmark", "value", "unit", "ratio", "vs"]
    assert rows["raw.upsert_aead"][2] == "rows/s" and "n=50" in rows["raw.upsert_aead"]
    merge = rows["replica.merge"]
    assert merge[2] == "rows/s" and merge[4] == "raw.upsert_aead" and float(merge[3]) > 0


def test_bench_scale_reports_each_device_s_peak_memory_on_sqlite_and_postgresql() -> None:
    lines = run_bench("--n", "50", "--only", "scale")
    check_lines(lines)
    for line in lines:
        assert line["n"] == 50 and line["unit"] == "records/s"
        assert 10 < line["peak_rss_mib"] < line["bound_mib"] == 200
    names = [line["name"] for line in lines]
    if names == ["sync.push_50", "sync.join_50"]:  # the bench found no PostgreSQL
        unavailable(lines[-1]["note"])
    assert names == ["sync.push_50", "sync.join_50", "sync.push_50_pg", "sync.join_50_pg"]
