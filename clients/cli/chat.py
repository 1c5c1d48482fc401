"""`sealsync chat`: the chat store (specs/chat.md) from the command line.

Each command unlocks the replica (Argon2id on every run, as the record commands do),
declares the chat store's collections the first time an account needs them, and runs one
operation. People get tables with dates and ages; scripts get `--json` (one JSON value on
stdout, nothing else there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.table import Table

from chat import ChatStore, ChatView, MessageView, with_chat
from chat.schema import check_declared
from clients.cli.console import out, user_errors, when
from clients.cli.records import json_option, print_json, profile_option
from clients.cli.settings import CliSettings
from clients.device import opened_replica
from replica import InvalidArgumentError, Replica

ROLES = click.Choice(["user", "assistant", "system", "tool"])


@contextmanager
def chat_store(settings: CliSettings, profile: str) -> Iterator[ChatStore]:
    """The unlocked replica's chat store, its collections declared if they were not."""
    with user_errors(), opened_replica(settings.replica_path, settings.passphrase) as replica:
        try:
            check_declared(replica.schema)
        except InvalidArgumentError:
            replica.declare(with_chat(replica.schema))
            click.echo("declared the chat store's collections in this account", err=True)
        yield ChatStore(replica, profile=profile)


def reconcile_chats(replica: Replica) -> None:
    """After a sync: bring back chats a delete elsewhere left with new messages (specs/chat.md
    §7), when this account has the chat store and the replica is unlocked."""
    if replica.is_locked:
        return
    try:
        check_declared(replica.schema)
    except InvalidArgumentError:
        return
    revived = ChatStore(replica).reconcile()
    if revived:
        click.echo(f"brought back {revived} chat(s) deleted elsewhere with new messages", err=True)


def chat_json(view: ChatView) -> dict[str, Any]:
    return {
        "id": view.id,
        "title": view.thread.title,
        "archived": view.thread.archived,
        "persona": view.thread.persona,
        "messages": view.messages,
        "first_message_ms": view.first_message_ms,
        "last_message_ms": view.last_message_ms,
        "updated_ms": view.thread.updated_ms,
    }


def message_json(view: MessageView) -> dict[str, Any]:
    message = view.message
    return {
        "id": view.id,
        "role": message.role,
        "content": message.content,
        "turn": message.turn,
        "created_ms": message.created_ms,
        "edited_ms": message.edited_ms,
    }


@click.group("chat")
def chat() -> None:
    """Chats: threads of messages that sync, with undo, search and one turn at a time."""


def chat_command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """A `chat` subcommand taking --profile."""

    def register(function: Callable[..., None]) -> click.Command:
        return chat.command(name)(profile_option(click.pass_obj(function)))

    return register


@chat_command("new")
@click.argument("title", default="New chat")
@click.option("--persona", help="The chat's persona (an id from `chat personas`).")
def new(settings: CliSettings, title: str, persona: str | None, profile: str) -> None:
    """Start a chat; print its id."""
    with chat_store(settings, profile) as store:
        click.echo(store.new_chat(title, persona=persona))


@chat_command("ls")
@click.option("--archived", is_flag=True, help="List the archived chats instead.")
@json_option
def ls(settings: CliSettings, archived: bool, as_json: bool, profile: str) -> None:
    """List the chats, most recently active first."""
    with chat_store(settings, profile) as store:
        views = store.chats(archived=archived)
    if as_json:
        print_json([chat_json(v) for v in views])
        return
    table = Table("id", "title", "messages", "last message")
    for v in views:
        table.add_row(v.id, v.thread.title, str(v.messages), when(v.last_message_ms))
    out.print(table)


@chat_command("show")
@click.argument("thread", metavar="ID")
@click.option("--last", default=120, show_default=True, help="How many messages, the newest.")
@json_option
def show(settings: CliSettings, thread: str, last: int, as_json: bool, profile: str) -> None:
    """Print a chat's last messages, oldest first."""
    with chat_store(settings, profile) as store:
        page = store.messages(thread, limit=last)
    if as_json:
        print_json([message_json(v) for v in page.messages])
        return
    for view in page.messages:
        out.print(f"[bold]{view.message.role}[/bold] ({when(view.message.created_ms)})")
        out.print(view.message.content, markup=False)
    if page.damaged:
        click.echo(f"{page.damaged} message(s) cannot be read: the chat is read-only", err=True)


@chat_command("say")
@click.argument("thread", metavar="ID")
@click.argument("text")
@click.option("--role", type=ROLES, default="user", show_default=True)
def say(settings: CliSettings, thread: str, text: str, role: str, profile: str) -> None:
    """Add a message to a chat; print its id."""
    with chat_store(settings, profile) as store:
        click.echo(store.append(thread, role, text))


@chat_command("edit")
@click.argument("thread", metavar="ID")
@click.argument("message")
@click.argument("text")
def edit(settings: CliSettings, thread: str, message: str, text: str, profile: str) -> None:
    """Replace a message's text (it keeps its place)."""
    with chat_store(settings, profile) as store:
        store.edit(thread, message, text)


@chat_command("rename")
@click.argument("thread", metavar="ID")
@click.argument("title")
def rename(settings: CliSettings, thread: str, title: str, profile: str) -> None:
    """Give a chat another title."""
    with chat_store(settings, profile) as store:
        store.rename(thread, title)


@chat_command("archive")
@click.argument("thread", metavar="ID")
@click.option("--restore", is_flag=True, help="Bring an archived chat back.")
def archive(settings: CliSettings, thread: str, restore: bool, profile: str) -> None:
    """Archive a chat (--restore brings it back)."""
    with chat_store(settings, profile) as store:
        store.archive(thread, archived=not restore)


@chat_command("trim")
@click.argument("thread", metavar="ID")
@click.option("--first", default=1, show_default=True, help="Turns kept from the start.")
@click.option("--last", default=10, show_default=True, help="Turns kept from the end.")
def trim(settings: CliSettings, thread: str, first: int, last: int, profile: str) -> None:
    """Keep the first and last turns of a chat; delete the rest."""
    with chat_store(settings, profile) as store:
        click.echo(f"deleted {store.trim(thread, keep_first=first, keep_last=last)} message(s)")


@chat_command("clear")
@click.argument("thread", metavar="ID")
def clear(settings: CliSettings, thread: str, profile: str) -> None:
    """Delete every message of a chat; keep the chat."""
    with chat_store(settings, profile) as store:
        click.echo(f"deleted {store.clear(thread)} message(s)")


@chat_command("rm")
@click.argument("thread", metavar="ID")
def rm(settings: CliSettings, thread: str, profile: str) -> None:
    """Delete a chat and its messages (`chat undo ID` brings it back, on this device)."""
    with chat_store(settings, profile) as store:
        click.echo(f"deleted the chat and {store.delete(thread)} message(s)")


@chat_command("fork")
@click.argument("thread", metavar="ID")
@click.argument("message")
def fork(settings: CliSettings, thread: str, message: str, profile: str) -> None:
    """Copy a chat up to a message into a new chat; print its id."""
    with chat_store(settings, profile) as store:
        click.echo(store.fork(thread, message))


@chat_command("undo")
@click.argument("thread", metavar="ID")
def undo(settings: CliSettings, thread: str, profile: str) -> None:
    """Undo the chat's last operation done on this device; print its name."""
    with chat_store(settings, profile) as store:
        click.echo(f"undid {store.undo(thread)}")


@chat_command("search")
@click.argument("query")
@json_option
def search(settings: CliSettings, query: str, as_json: bool, profile: str) -> None:
    """Find chats by title and messages by text (at most 30 hits)."""
    with chat_store(settings, profile) as store:
        result = store.search(query)
    hits = [{"chat": h.thread, "message": h.message, "text": h.text} for h in result.hits]
    if as_json:
        print_json({"hits": hits, "total": result.total})
        return
    table = Table("chat", "message", "text")
    for hit in hits:
        table.add_row(hit["chat"], hit["message"] or "(title)", hit["text"])
    out.print(table)
    click.echo(f"{result.total} match(es)", err=True)


@chat_command("stats")
@json_option
def stats(settings: CliSettings, as_json: bool, profile: str) -> None:
    """Chats and messages in this profile."""
    with chat_store(settings, profile) as store:
        views = store.chats(with_bytes=True) + store.chats(archived=True, with_bytes=True)
    totals = {
        "chats": len(views),
        "archived": sum(v.thread.archived for v in views),
        "messages": sum(v.messages for v in views),
        "bytes": sum(v.bytes for v in views),
    }
    if as_json:
        print_json(totals)
        return
    for name, value in totals.items():
        click.echo(f"{name}: {value}")


@chat_command("personas")
@click.option("--add", "name", help="Add a persona with this name; print its id.")
@click.option("--prompt", default="", help="The new persona's prompt.")
@click.option("--use", "use", help="Make this persona (an id, or `default`) the active one.")
@click.option("--rm", "remove", help="Delete this persona (an id).")
@json_option
def personas(
    settings: CliSettings,
    name: str | None,
    prompt: str,
    use: str | None,
    remove: str | None,
    as_json: bool,
    profile: str,
) -> None:
    """List personas, or add, use or delete one."""
    with chat_store(settings, profile) as store:
        if name is not None:
            click.echo(store.create_persona(name, prompt))
        if remove is not None:
            store.delete_persona(remove)
        if use is not None:
            store.set_active_persona(use)
        active, _ = store.active_persona()
        listed = {pid: p.name for pid, p in store.personas().items()}
    if name is not None or remove is not None or use is not None:
        return
    if as_json:
        print_json({"active": active, "personas": listed})
        return
    for pid, shown in listed.items():
        click.echo(f"{'*' if pid == active else ' '} {pid}  {shown}")


@chat_command("draft")
@click.argument("thread", metavar="ID")
@click.argument("text", required=False)
@click.option("--clear", is_flag=True, help="Clear the draft.")
def draft(settings: CliSettings, thread: str, text: str | None, clear: bool, profile: str) -> None:
    """Print a chat's draft (kept on this device only), or save or clear it."""
    with chat_store(settings, profile) as store:
        if text is not None or clear:
            store.save_draft(thread, "" if clear else text or "", store.draft_stamp())
        else:
            click.echo(store.draft(thread))
