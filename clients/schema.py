"""The built-in chat-shaped schema: what `sealsync init` declares and `sealsync demo` uses.

Chat apps are the first users (docs/architecture.md §11), so a new account gets their collections unless an
app declares its own: threads and messages last-writer-wins (a thread's equal-hlc tie goes to
the side that saw more messages), personas a bounded set, the active persona one value per
profile, drafts never leaving the device — and the reference chat store's collections
(`chat.with_chat`, specs/chat.md), which `sealsync chat` uses.
"""

from __future__ import annotations

from chat import with_chat
from replica import Collection, Schema

MAX_PERSONAS = 50

CHAT_SCHEMA = with_chat(
    Schema(
        (
            Collection("threads", "lww", tiebreak="message_count"),
            Collection("messages", "lww"),
            Collection("personas", "per_item", max_items=MAX_PERSONAS),
            Collection("active_persona", "register"),
            Collection("drafts", "local"),
        )
    )
)
