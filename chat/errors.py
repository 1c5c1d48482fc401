"""The chat store's errors, in sealsync's one tree (replica.SealsyncError)."""

from __future__ import annotations

from replica import InvalidArgumentError, LeaseBusyError


class TurnBusyError(LeaseBusyError):
    """Another turn of this chat is under way (on this replica file, in any process): HTTP
    apps answer 409. A crashed turn's lease runs out."""

    code = "turn_busy"


class NoSuchChatError(InvalidArgumentError):
    """The chat (or a message of it) does not exist here, or was deleted."""

    code = "no_such_chat"


class NothingToUndoError(InvalidArgumentError):
    """The chat's undo log on this device is empty."""

    code = "nothing_to_undo"
