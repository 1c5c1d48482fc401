"""The README's first command runs the main job (`sealsync demo`); this keeps it true at every
commit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.relay.server import free_port

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block is not None, "the README opens with a sh block of the two commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_two_commands() -> None:
    setup_and_run, setup_and_test = readme_commands()
    assert setup_and_run.endswith("/sealsync demo")
    assert setup_and_test.endswith("-m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_and_test in ci, ".ci/run runs exactly the README's test command"


@pytest.mark.slow
def test_the_first_command_runs_as_written_in_a_clean_clone(tmp_path: Path) -> None:
    """Set-up and `sealsync demo` exactly as the README gives them, in a clone of this
    checkout's commit with no virtual environment yet (what a person gets from the repo)."""
    if not (ROOT / ".git").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs on a git checkout; this one has no .git")
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "sealsync"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    setup_and_run, _ = readme_commands()
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", setup_and_run],
        cwd=clone,
        env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "converged: yes"


def test_the_main_job_converges() -> None:
    """`sealsync demo`: a real relay on loopback, two devices, offline edits, a conflict."""
    result = subprocess.run(
        [sys.executable, "-m", "clients.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "converged: yes"


def test_the_python_example_converges() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "converge.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "converged" in result.stdout.splitlines()[-2]


def run_python_example(tmp_path: Path, number: int) -> subprocess.CompletedProcess[str]:
    """Run the README's `number`-th Python example in a folder of its own."""
    text = (ROOT / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", text, re.S)[number]
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    assert "write this down:" in run_python_example(tmp_path, 0).stdout


def test_the_readme_chat_example_runs(tmp_path: Path) -> None:
    printed = run_python_example(tmp_path, 1).stdout
    assert "['Find a hotel in Lisbon', 'Hotel Lisboa has a room'] 2" in printed


def tour_script(port: int) -> str:
    """The tour's commands as written, with this machine's Python, a free port (the relay
    takes it from SEALSYNC_RELAY_PORT), and a wait for the relay to listen after the line
    that starts it (a reader waits by eye)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A five-minute tour\n.*?```sh\n(.*?)```", text, re.S)
    assert block is not None, "the README has a five-minute tour"
    lines = ["trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    for written in block.group(1).splitlines():
        line = written.replace(".venv/bin/sealsync", f"{sys.executable} -m clients.cli")
        lines.append(line.replace("8787", str(port)))
        if "relay serve" in line:
            lines.append(
                f"for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null "
                "&& break; sleep 0.1; done"
            )
    return "\n".join(lines)


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    port = free_port()
    env["SEALSYNC_RELAY_PORT"] = str(port)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", tour_script(port)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listed = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("[")))
    resolved = {"title": "Rome, then Lisbon", "message_count": 3}  # by the phone; on the laptop
    assert listed == [{"id": "t1", "doc": resolved}], result.stdout
    assert "Lisbon" in result.stdout and "Rome" in result.stdout  # `conflicts` showed a sibling
    assert len(list((tmp_path / "backups").glob("*.db"))) == 1  # and its manifest
