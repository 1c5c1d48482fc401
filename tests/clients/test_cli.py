"""The `sealsync` command line in-process (click's CliRunner) against a real relay process:
two devices converge through it, and every user mistake is one `error:` line, a `hint:`, a
non-zero exit, no traceback and an unchanged replica."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeAlias

import msgspec
import pytest
from click.testing import CliRunner, Result

from clients.cli import main
from clients.cli.console import ExitCode, user_errors
from clients.cli.records import written_at
from clients.cli.reports import report_sync
from clients.device import load_settings
from clients.schema import CHAT_SCHEMA
from clients.sync import SyncReport
from relay.errors import QuotaExceededError, RelayError, StoreFailedError
from replica import Replica, Status
from replica.wire import PROTOCOL_VERSION, ErrorCode
from tests.relay.server import RelayProcess, free_port

PASSPHRASE = "correct horse battery staple"

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
"""What `json.loads` can return; a test narrows it (`Cli.json_object`, `isinstance`) before
it indexes or passes it on."""
JsonObject: TypeAlias = dict[str, JsonValue]


@dataclass
class Cli:
    """Runs `sealsync --replica PATH …` in-process with the passphrase in the environment."""

    runner: CliRunner
    home: Path

    def __call__(self, replica: Path, *args: str, passphrase: str = PASSPHRASE) -> Result:
        env = {"SEALSYNC_PASSPHRASE": passphrase, "XDG_CONFIG_HOME": str(self.home / "config")}
        return self.runner.invoke(main, ["--replica", str(replica), *args], env=env)

    def ok(self, replica: Path, *args: str) -> Result:
        result = self(replica, *args)
        assert result.exit_code == 0, result.output
        return result

    def json(self, replica: Path, *args: str) -> JsonValue:
        """The command's `--json` output, parsed."""
        value: JsonValue = json.loads(self.ok(replica, *args, "--json").stdout)
        return value

    def json_object(self, replica: Path, *args: str) -> JsonObject:
        """The `--json` output of a command that prints one object (`get`, `status`)."""
        value = self.json(replica, *args)
        assert isinstance(value, dict), value
        return value

    def json_objects(self, replica: Path, *args: str) -> list[JsonObject]:
        """The `--json` output of a command that prints a list of objects (`ls`, `conflicts`,
        `devices`)."""
        value = self.json(replica, *args)
        assert isinstance(value, list), value
        objects = [item for item in value if isinstance(item, dict)]
        assert len(objects) == len(value), value
        return objects


def dump(path: Path) -> list[str]:
    """The replica's logical content: unchanged means these lines are unchanged. The push
    counter and the mark of what was offered (`offered_through`) are left out: both go up
    before a push is sent, refused or not."""
    with sqlite3.connect(path) as db:
        return [
            line
            for line in db.iterdump()
            if "'push_counter'" not in line and "'offered_through'" not in line
        ]


def assert_user_error(result: Result, *words: str) -> None:
    assert result.exit_code != 0, result.output
    assert "error:" in result.stderr and "hint:" in result.stderr, result.output
    assert result.stderr.count("error:") == 1, result.stderr  # one error, however it wraps
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.slow
def test_two_devices_sync_and_a_put_resolves_a_concurrent_edit(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    created = cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    assert "recovery key" in created.stdout
    assert (tmp_path / "a.db.relay.json").stat().st_mode & 0o777 == 0o600
    session = load_settings(a).session
    assert session is not None  # no token is ever printed
    assert session.access_token not in created.output
    assert session.refresh_token not in created.output
    with Replica.open(a) as made:  # init declares the chat schema the demo runs on
        made.unlock(PASSPHRASE)
        assert made.schema == CHAT_SCHEMA
    cli.ok(b, "join", "--relay", relay.url, "--account", "ann", "--device-name", "laptop")

    cli.ok(a, "put", "threads", "t1", '{"title": "from a", "message_count": 1}')
    cli.ok(a, "put", "messages", "m1", '{"text": "hello"}')
    cli.ok(b, "put", "threads", "t1", '{"title": "from b", "message_count": 2}')
    for device in (a, b, a):
        cli.ok(device, "sync")
    (sibling,) = cli.json_objects(a, "conflicts", "threads", "t1")
    shown = cli.ok(a, "conflicts", "threads", "t1").stdout
    assert isinstance(sibling["hlc"], int), sibling
    written = written_at(sibling["hlc"])
    assert written in shown  # when, by the writer's clock: a minute ago at most
    now = datetime.now(UTC).replace(tzinfo=None)
    assert abs(datetime.fromisoformat(written) - now) < timedelta(minutes=1)
    assert "from " in shown and str(sibling["node"]) in shown
    assert set(sibling) == {"id", "doc", "hlc", "node", "deleted"}
    visible = cli.json_object(b, "get", "threads", "t1")
    assert set(visible) == {"id", "doc", "hlc", "node", "deleted", "conflicts"}
    assert visible["conflicts"] == 1 and visible == cli.json(a, "get", "threads", "t1")

    cli.ok(b, "put", "threads", "t1", '{"title": "merged", "message_count": 3}')
    cli.ok(b, "rm", "messages", "m1")
    cli.ok(b, "sync")
    cli.ok(a, "sync")
    resolved = cli.json_object(a, "get", "threads", "t1")
    assert resolved["doc"] == {"title": "merged", "message_count": 3}
    assert resolved["conflicts"] == 0 and cli.json(a, "conflicts", "threads", "t1") == []
    assert cli.json(a, "ls", "threads") == [{"id": "t1", "doc": resolved["doc"]}]
    gone = cli(a, "get", "messages", "m1")
    assert gone.exit_code == 1 and "not found" in gone.stderr and "0 conflicts" in gone.stderr
    for id in ("m5", "m2", "m4", "m3", "m6"):  # stored in opaque-key order, listed by id
        cli.ok(a, "put", "messages", id, f'{{"text": "{id}"}}')
    listed = cli.json_objects(a, "ls", "messages")
    assert [r["id"] for r in listed] == ["m2", "m3", "m4", "m5", "m6"]
    status = cli.json_object(a, "status")
    assert status["dirty"] == 5 and status["account"] == "ann" and status["relay"] == relay.url
    assert set(status) >= {f.name for f in fields(Status)}

    settings_b = load_settings(b)
    assert settings_b.session is not None
    env = {"SEALSYNC_PASSPHRASE": PASSPHRASE, "SEALSYNC_NEW_PASSPHRASE": "a new one, long enough",
           "XDG_CONFIG_HOME": str(cli.home / "config")}  # fmt: skip
    args = ["--replica", str(a), "devices", "--revoke", settings_b.session.device_id]
    revoked = cli.runner.invoke(main, args, env=env)
    assert revoked.exit_code == 0, revoked.output
    before = dump(b)
    assert_user_error(cli(b, "sync", "--retry-for", "1"), "this device was revoked")
    assert dump(b) == before


class OtherVersion(BaseHTTPRequestHandler):
    """A server whose /v1/info says the protocol after this one."""

    def do_GET(self) -> None:
        body = msgspec.msgpack.encode({"protocol_version": PROTOCOL_VERSION + 1})
        self.send_response(200)
        self.send_header("content-type", "application/msgpack")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_version_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OtherVersion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_user_mistakes_are_one_error_line_and_change_nothing(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path, other_version_url: str
) -> None:
    relay = start_relay("max_account_bytes=4000")
    a, new = tmp_path / "a.db", tmp_path / "new.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "t1", '{"title": "kept"}')
    before = dump(a)

    mistakes = [
        (cli(a, "get", "threads", "t1", passphrase="wrong passphrase"), "does not unlock"),
        (cli(a, "put", "threads", "t2", "{not json"), "is not JSON"),
        (cli(a, "put", "nope", "x", "{}"), "not declared"),
        (cli(a, "init", "--relay", relay.url, "--account", "ann"), "already exists"),
        (cli(a, "sync", "--invite", "inv-123"), "--invite is used only by a reseed"),
        (cli(a, "sync", "--allow-resurrection"), "used only with --reseed"),
        (cli(a, "sync", "--reseed", "--adopt"), "two ways back: pick one"),
    ]
    for result, words in mistakes:
        assert_user_error(result, words)
        assert dump(a) == before

    joins = [
        (["--relay", "http://relay.example.org", "--account", "ann"], "plain http"),
        (["--relay", f"http://127.0.0.1:{free_port()}", "--account", "ann"], "ConnectError"),
        (["--relay", other_version_url, "--account", "ann"], f"protocol {PROTOCOL_VERSION + 1}"),
        (["--relay", relay.url, "--account", "ann"], "bad_credentials"),
    ]
    for args, words in joins:
        env_passphrase = "not the passphrase" if words == "bad_credentials" else PASSPHRASE
        assert_user_error(cli(new, "join", *args, passphrase=env_passphrase), words)
        assert list(tmp_path.glob("new.db*")) == []

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a replica" * 100)
    assert_user_error(cli(corrupt, "ls", "threads"), "not a")
    assert corrupt.read_bytes() == b"this is not a replica" * 100

    cli.ok(a, "put", "threads", "big", json.dumps({"title": "x" * 5000}))
    before = dump(a)
    assert_user_error(cli(a, "sync", "--retry-for", "1"), "quota")
    assert dump(a) == before
    relay.kill()
    assert_user_error(cli(a, "sync", "--retry-for", "0.5"), "ConnectError")
    assert dump(a) == before


def listed_accounts(
    relay: RelayProcess, *options: str, env: dict[str, str] | None = None
) -> dict[str, JsonObject]:
    """`sealsync relay accounts --json` on the relay's SQLite file, by account name."""
    assert relay.db is not None
    command = ["relay", "accounts", "--db", str(relay.db), "--json", *options]
    listed = CliRunner().invoke(main, command, env=env)
    assert listed.exit_code == 0, listed.output
    accounts: list[JsonObject] = json.loads(listed.stdout)
    return {str(a["name"]): a for a in accounts}


def test_init_refuses_a_passphrase_too_easy_to_guess_and_makes_nothing(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """`SEALSYNC_PASSPHRASE=a sealsync init` made an account (issue 12)."""
    relay = start_relay()
    a = tmp_path / "a.db"
    made = cli(a, "init", "--relay", relay.url, "--account", "ann", passphrase="a")
    assert_user_error(made, "too easy to guess", "unrelated words")
    assert list(tmp_path.glob("a.db*")) == []
    assert listed_accounts(relay) == {}  # nothing registered


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (StoreFailedError("the commit this push joined failed"), "check the relay's storage"),
        (QuotaExceededError("over 4000 bytes", hint="raise max_account_bytes"), "max_account"),
        (RelayError("no hint here"), None),
    ],
    ids=["storage failed", "refused with a hint", "refused"],
)
def test_a_relay_error_is_an_error_line_and_its_hint(
    capsys: pytest.CaptureFixture[str], error: Exception, hint: str | None
) -> None:
    """The relay's errors are `SealsyncError`s: the `relay` commands print them as every other
    error, through the same `user_errors`, with a `hint:` line where the operator can act."""
    with pytest.raises(SystemExit) as exited, user_errors():
        raise error
    stderr = capsys.readouterr().err
    assert exited.value.code == 1 and "Traceback" not in stderr
    assert stderr.startswith(f"error: {error}\n")
    assert ("hint:" in stderr) == (hint is not None) and (hint or "") in stderr


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["invite", "--days", "0"], "--days 0 must be at least 1", None),
        (["serve", "--set", "page_size"], "--set 'page_size' is not NAME=VALUE", "page_size=500"),
        (
            ["accounts", "--database-url", "postgresql://x@127.0.0.1:1/db"],
            "--db or --data",
            "SEALSYNC_RELAY_DATABASE_URL",
        ),
    ],
    ids=["bad --days", "bad --set", "--db and --database-url"],
)
def test_the_relay_commands_errors_are_error_lines_through_the_root_group(
    tmp_path: Path, args: list[str], message: str, hint: str | None
) -> None:
    """`relay/commands.py` raises its errors and leaves printing them to the command line's
    root group (it cannot import the console): each is an `error:` line, never a traceback."""
    result = CliRunner().invoke(main, ["relay", *args, "--db", str(tmp_path / "relay.db")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert ("hint:" in result.stderr) == (hint is not None) and (hint or "") in result.stderr


def test_a_sync_that_both_was_refused_and_quarantined_keeps_the_refusals_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both errors are printed, each with its hint, and the exit code is the quarantine's."""
    refused = {ErrorCode.CLOCK_AHEAD: 2}
    report = SyncReport(3, 1, 0, refused, 1, 1, 1, 0, quarantined=1)
    with pytest.raises(SystemExit) as exited:
        report_sync(report)
    stderr = capsys.readouterr().err
    assert exited.value.code == ExitCode.DAMAGED
    assert "refused 2 version(s) (2 clock_ahead)" in stderr and "(NTP)" in stderr
    assert "1 pulled version(s) could not be opened" in stderr
    assert stderr.count("error:") == 2 and stderr.count("hint:") == 2


def test_a_sync_tells_of_writes_the_relay_called_superseded_without_proof(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Versions left unconfirmed after the pull are named on stderr; the line is silent when
    every `superseded` was proven by what the pull brought."""
    report = SyncReport(1, 0, 1, {}, 0, 0, 1, 0, unconfirmed=1)
    report_sync(report)
    captured = capsys.readouterr()
    assert "called 1 version(s) superseded" in captured.err and "stay to be pushed" in captured.err
    report_sync(dataclasses.replace(report, unconfirmed=0))
    assert "superseded" not in capsys.readouterr().err


def test_versions_the_relay_refuses_are_named_by_code_and_stay_to_be_pushed(
    cli: Cli, start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    relay = start_relay("max_envelope_bytes=2000")
    a = tmp_path / "a.db"
    cli.ok(a, "init", "--relay", relay.url, "--account", "ann")
    cli.ok(a, "put", "threads", "small", '{"title": "fits"}')
    cli.ok(a, "put", "threads", "big", json.dumps({"title": "x" * 5000}))
    result = cli(a, "sync", "--retry-for", "1")
    assert_user_error(result, "refused 1 version(s) (1 too_large)", "max_envelope_bytes")
    assert "1 stored" in result.stdout  # the rest of the batch went through
    assert cli.json_object(a, "status")["dirty"] == 1


def test_demo_runs_on_its_own_relay_and_converges(cli: Cli, tmp_path: Path) -> None:
    result = cli.ok(tmp_path / "unused.db", "demo")
    assert "converged: yes" in result.stdout
    assert "conflict on a chat's title" in result.stdout and "why:" in result.stdout
    assert "timings" in result.stdout
    phone, rest = result.stdout.split("\nlaptop\n")
    laptop = rest.split("conflict on a chat's title")[0]
    for device in (phone, laptop):
        assert "trams." in device and "Porto?" in device  # both offline appends (words:
        assert "Groceries" in device and "bread" in device  # a narrow table wraps lines)
        assert "milk" not in device  # the delete saw it: gone everywhere
        assert "searches 'lisbon': 1 hit(s)" in device
    assert "half-typed" in phone and "half-typed" not in laptop  # drafts never sync
