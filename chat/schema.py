"""The chat store's collections, declared next to an app's own (`with_chat`)."""

from __future__ import annotations

from msgspec import structs

from chat.models import MAX_PERSONAS
from replica import Collection, InvalidArgumentError, Schema

THREADS = "chat.threads"
MESSAGES = "chat.messages"
SETTINGS = "chat.settings"
PERSONAS = "chat.personas"
ACTIVE_PERSONA = "chat.active_persona"
DRAFTS = "chat.drafts"
STATE = "chat.state"
UNDO = "chat.undo"
THREAD_HISTORY = 3
"""Replaced versions of a chat's record kept on the device: a deleted chat that must come
back (specs/chat.md §7) takes its title from them."""

COLLECTIONS = (
    Collection(THREADS, "lww", tiebreak="message_count", history=THREAD_HISTORY, unique_ids=True),
    Collection(MESSAGES, "lww", index="thread", created_field="at", unique_ids=True),
    Collection(SETTINGS, "lww", index="thread"),
    Collection(PERSONAS, "per_item", max_items=MAX_PERSONAS),
    Collection(ACTIVE_PERSONA, "register"),
    Collection(DRAFTS, "local"),
    Collection(STATE, "local"),
    Collection(UNDO, "local"),
)


def with_chat(schema: Schema) -> Schema:
    """`schema` with the chat store's collections added (those it declares already must be
    declared as the chat store's, or as its first release did: they are brought up to date)."""
    mine = {c.name: c for c in COLLECTIONS}
    for collection in schema.collections:
        if collection.name in mine and not _same_but_unique_ids(collection, mine[collection.name]):
            raise InvalidArgumentError(
                f"collection {collection.name!r} is the chat store's, declared otherwise here"
            )
    return Schema(
        (
            *(mine.get(c.name, c) for c in schema.collections),
            *(c for c in COLLECTIONS if schema.get(c.name) is None),
        )
    )


def check_declared(schema: Schema) -> None:
    """A clear error when the replica's schema lacks the chat store's collections. A
    declaration of the first release (without `unique_ids`) serves as well: only the
    freshness locks of new chats and messages differ, never what merges."""
    missing = [
        c.name
        for c in COLLECTIONS
        if (declared := schema.get(c.name)) is None or not _same_but_unique_ids(declared, c)
    ]
    if missing:
        raise InvalidArgumentError(
            f"the replica does not declare the chat store's collections {missing}",
            hint="declare chat.with_chat(schema) first",
        )


def _same_but_unique_ids(declared: Collection, mine: Collection) -> bool:
    return structs.replace(declared, unique_ids=mine.unique_ids) == mine
