"""`sealsync chat` in-process on a real replica file (the chat store: specs/chat.md)."""

from __future__ import annotations

from pathlib import Path

from clients.cli.console import age, when
from clients.schema import CHAT_SCHEMA
from replica import Collection, Replica, Schema
from tests.clients.test_cli import PASSPHRASE, Cli


def a_replica(tmp_path: Path, schema: Schema = CHAT_SCHEMA) -> Path:
    path = tmp_path / "device.db"
    Replica.create(path, schema, PASSPHRASE)[0].close()
    return path


def test_a_chat_from_new_to_undo(cli: Cli, tmp_path: Path) -> None:
    path = a_replica(tmp_path)
    thread = cli.ok(path, "chat", "new", "Trip").stdout.strip()
    first = cli.ok(path, "chat", "say", thread, "Book a hotel").stdout.strip()
    cli.ok(path, "chat", "say", thread, "Done: Hotel Lisboa", "--role", "assistant")
    shown = cli.json_objects(path, "chat", "show", thread)
    assert [(m["role"], m["content"]) for m in shown] == [
        ("user", "Book a hotel"),
        ("assistant", "Done: Hotel Lisboa"),
    ]
    cli.ok(path, "chat", "edit", thread, first, "Book a cheap hotel")
    cli.ok(path, "chat", "rename", thread, "Lisbon")
    (listed,) = cli.json_objects(path, "chat", "ls")
    assert (listed["id"], listed["title"], listed["messages"]) == (thread, "Lisbon", 2)
    found = cli.json_object(path, "chat", "search", "lisbo")
    assert found["total"] == 2  # the title and the answer
    assert cli.ok(path, "chat", "undo", thread).stdout.strip() == "undid rename"
    assert cli.json_objects(path, "chat", "ls")[0]["title"] == "Trip"
    table = cli.ok(path, "chat", "ls").stdout
    assert "Trip" in table and "just now" in table


def test_archive_fork_trim_clear_and_rm(cli: Cli, tmp_path: Path) -> None:
    path = a_replica(tmp_path)
    thread = cli.ok(path, "chat", "new", "long").stdout.strip()
    ids = [cli.ok(path, "chat", "say", thread, f"m{i}").stdout.strip() for i in range(4)]
    fork = cli.ok(path, "chat", "fork", thread, ids[1]).stdout.strip()
    assert [m["content"] for m in cli.json_objects(path, "chat", "show", fork)] == ["m0", "m1"]
    assert "deleted 2" in cli.ok(path, "chat", "trim", thread, "--first", "1", "--last", "1").stdout
    cli.ok(path, "chat", "archive", fork)
    assert [c["id"] for c in cli.json_objects(path, "chat", "ls", "--archived")] == [fork]
    assert "deleted 2" in cli.ok(path, "chat", "clear", thread).stdout
    cli.ok(path, "chat", "rm", thread)
    stats = cli.json_object(path, "chat", "stats")
    assert (stats["chats"], stats["archived"], stats["messages"]) == (1, 1, 2)
    assert isinstance(stats["bytes"], int) and stats["bytes"] > 2 * 100  # sealed and padded


def test_personas_and_drafts(cli: Cli, tmp_path: Path) -> None:
    path = a_replica(tmp_path)
    writer = cli.ok(path, "chat", "personas", "--add", "Writer", "--prompt", "Write.").stdout
    cli.ok(path, "chat", "personas", "--use", writer.strip())
    listed = cli.json_object(path, "chat", "personas")
    assert listed["active"] == writer.strip() and "default" in listed["personas"]  # type: ignore[operator]
    thread = cli.ok(path, "chat", "new").stdout.strip()
    cli.ok(path, "chat", "draft", thread, "half a thought")
    assert cli.ok(path, "chat", "draft", thread).stdout.strip() == "half a thought"
    cli.ok(path, "chat", "draft", thread, "--clear")
    assert cli.ok(path, "chat", "draft", thread).stdout.strip() == ""


def test_bad_input_is_an_error_line_not_a_traceback(cli: Cli, tmp_path: Path) -> None:
    path = a_replica(tmp_path)
    result = cli(path, "chat", "say", "no-such-id", "hi")
    assert result.exit_code != 0 and "error:" in result.output and "Traceback" not in result.output
    thread = cli.ok(path, "chat", "new").stdout.strip()
    assert cli.ok(path, "chat", "undo", thread).stdout.strip() == "undid new chat"
    result = cli(path, "chat", "undo", thread)
    assert result.exit_code != 0 and "error: nothing left to undo" in result.output


def test_an_account_without_the_chat_store_gets_it_declared(cli: Cli, tmp_path: Path) -> None:
    path = a_replica(tmp_path, Schema((Collection("notes"),)))
    result = cli.ok(path, "chat", "ls")
    assert "declared the chat store's collections" in result.output
    assert cli.json_objects(path, "chat", "ls") == []


def test_times_are_dates_and_ages() -> None:
    assert (
        age(500) == "just now" and age(90_000) == "1 min ago" and age(3 * 86_400_000) == "3 d ago"
    )
    assert when(0, now_ms=7_200_000) == "1970-01-01 00:00, 2 h ago"
    assert when(None) == ""


def test_status_shows_times_as_dates_and_ages(cli: Cli, tmp_path: Path) -> None:
    from clients.cli.status import shown

    assert shown("last_sync_ms", 0).startswith("1970-01-01 00:00, ")
    assert shown("skew_seen_ms", -1500) == "-1.5 s" and shown("records", 3) == "3"
    path = a_replica(tmp_path)
    assert "last_sync_ms" in cli.ok(path, "status").stdout
