"""`sync --watch` as its own process against a real relay process: it shows another device's
write, a `put` by a second process on its replica file is synced too (nothing lost), and
SIGINT or SIGTERM ends it cleanly with exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.clients.test_cli import PASSPHRASE, Cli
from tests.relay.server import RelayProcess

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """Start `sealsync --replica PATH sync --watch --every 0.5`; killed after the test if
    it is still running."""
    started: list[subprocess.Popen[str]] = []

    def start(replica: Path) -> subprocess.Popen[str]:
        env = {**os.environ, "SEALSYNC_PASSPHRASE": PASSPHRASE,
               "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip
        command = [sys.executable, "-m", "clients.cli", "--replica", str(replica),
                   "sync", "--watch", "--every", "0.5"]  # fmt: skip
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {TIMEOUT_S} s: {what}")


def wait_for_line(process: subprocess.Popen[str], text: str) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        assert line or process.poll() is None, process.stderr.read() if process.stderr else ""
    raise AssertionError(f"no line with {text!r} within {TIMEOUT_S} s")


def has_record(cli: Cli, replica: Path, collection: str, id: str) -> bool:
    return cli(replica, "get", collection, id).exit_code == 0


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_a_watching_device_shows_another_devices_write_and_a_concurrent_put(
    cli: Cli,
    start_relay: Callable[..., RelayProcess],
    watch: Callable[[Path], subprocess.Popen[str]],
    tmp_path: Path,
    stop_signal: signal.Signals,
) -> None:
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    watching = watch(b)
    wait_for_line(watching, "watching for changes")

    cli.ok(a, "put", "threads", "from-a", '{"title": "written on a"}')
    cli.ok(a, "sync")
    eventually(lambda: has_record(cli, b, "threads", "from-a"), "b shows a's write")

    cli.ok(b, "put", "threads", "from-b", '{"title": "put while b watches"}')  # a 2nd process
    eventually(
        lambda: cli(a, "sync").exit_code == 0 and has_record(cli, a, "threads", "from-b"),
        "a gets the put made on b's replica while b watched",
    )

    watching.send_signal(stop_signal)
    stdout, stderr = watching.communicate(timeout=TIMEOUT_S)
    assert watching.returncode == 0, stderr
    assert "Traceback" not in stderr and "stopped watching" in stdout
    assert cli.json_object(b, "status")["dirty"] == 0
    for device in (a, b):
        ids = [r["id"] for r in cli.json_objects(device, "ls", "threads")]
        assert ids == ["from-a", "from-b"]


@pytest.mark.slow
def test_a_watch_round_brings_back_a_chat_deleted_elsewhere_that_got_a_message_here(
    cli: Cli,
    start_relay: Callable[..., RelayProcess],
    watch: Callable[[Path], subprocess.Popen[str]],
    tmp_path: Path,
) -> None:
    """specs/chat.md §7: while b's watch is paused, a deletes a chat and b (another process)
    adds a message to it; b's next watch round merges the delete and brings the chat back
    with the message (the one-off sync that starts a watch did not see either)."""
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann")
    thread = cli.ok(a, "chat", "new", "Trip").stdout.strip()
    cli.ok(a, "chat", "say", thread, "Book a hotel")
    cli.ok(a, "sync")
    watching = watch(b)
    wait_for_line(watching, "watching for changes")
    eventually(lambda: len(cli.json_objects(b, "chat", "ls")) == 1, "b's watch gets the chat")

    watching.send_signal(signal.SIGSTOP)
    cli.ok(a, "chat", "rm", thread)
    cli.ok(a, "sync")
    cli.ok(b, "chat", "say", thread, "and a table for two")  # b has not seen the delete
    watching.send_signal(signal.SIGCONT)
    eventually(
        lambda: cli(a, "sync").exit_code == 0 and len(cli.json_objects(a, "chat", "ls")) == 1,
        "a gets the chat back from b's watch",
    )
    watching.send_signal(signal.SIGTERM)
    _, stderr = watching.communicate(timeout=TIMEOUT_S)
    assert "brought back 1 chat(s) deleted elsewhere with new messages" in stderr
    for device in (a, b):
        (chat,) = cli.json_objects(device, "chat", "ls")
        assert chat["id"] == thread
        shown = cli.json_objects(device, "chat", "show", thread)
        assert [m["content"] for m in shown] == ["and a table for two"]
