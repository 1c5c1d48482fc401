"""sealsync's reference chat store: threads, messages, personas and drafts on a replica
(specs/chat.md). It uses the engine's public API only (`import replica`), like any app."""

from chat.errors import NoSuchChatError, NothingToUndoError, TurnBusyError
from chat.models import (
    ChatDataError,
    Draft,
    ForkPoint,
    Message,
    Persona,
    Setting,
    Thread,
)
from chat.schema import COLLECTIONS, with_chat
from chat.search import Hit, SearchResult
from chat.store import ChatStore, ChatView, MessagePage, MessageView, Turn

__all__ = [
    "COLLECTIONS",
    "ChatDataError",
    "ChatStore",
    "ChatView",
    "Draft",
    "ForkPoint",
    "Hit",
    "Message",
    "MessagePage",
    "MessageView",
    "NoSuchChatError",
    "NothingToUndoError",
    "Persona",
    "SearchResult",
    "Setting",
    "Thread",
    "Turn",
    "TurnBusyError",
    "with_chat",
]
