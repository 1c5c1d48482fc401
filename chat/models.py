"""The chat store's documents, typed with sqlmodel (non-table models: validation only).

Everything read from the replica — written here, synced from another device, or imported —
is validated against these before the store uses it; a document that fails is refused with
`ChatDataError` naming the record and the field, never shown half-read. Fields this version
does not know (a newer app's) are kept in `model_extra` and written back unchanged.
"""

from __future__ import annotations

import base64
import unicodedata
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, ConfigDict, PlainSerializer, ValidationError
from sqlmodel import Field, SQLModel

from replica import InvalidArgumentError, SealsyncError

MAX_TITLE_CHARS = 200
MAX_CONTENT_CHARS = 256 * 1024
MAX_THUMBNAILS = 10
MAX_THUMBNAIL_BYTES = 64 * 1024
MAX_PERSONAS = 50
MAX_PERSONA_NAME_CHARS = 80
MAX_PROMPT_CHARS = 16 * 1024
MAX_SETTING_NAME_CHARS = 64
Role = Literal["user", "assistant", "system", "tool"]


def _from_base64(value: object) -> object:
    return base64.b64decode(value, validate=True) if isinstance(value, str) else value


def _to_base64(value: bytes) -> str:
    return base64.b64encode(value).decode()


Thumbnail = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(_to_base64, return_type=str),
    Field(max_length=MAX_THUMBNAIL_BYTES),
]
"""Bytes to the app; base64 in the stored document, which must be JSON (it is the form an
export carries too)."""
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")


def _part_of_an_id(value: str) -> str:
    """A setting's name is part of its record's id, which the engine takes only in NFC and
    without NUL (specs/replica.md §2): refused here, by the setting's own name."""
    if "\x00" in value or not unicodedata.is_normalized("NFC", value):
        raise ValueError("must be text in Unicode NFC, without NUL")
    return value


SettingName = Annotated[
    str, AfterValidator(_part_of_an_id), Field(min_length=1, max_length=MAX_SETTING_NAME_CHARS)
]


class ChatDataError(SealsyncError):
    """A stored chat document does not have the shape the chat store writes (another app's
    data, or a newer incompatible one): the chat is read-only until it is repaired."""

    code = "chat_data"


class Document(SQLModel):
    """Strict types; unknown fields kept (`model_extra`)."""

    model_config = ConfigDict(extra="allow", strict=True)  # type: ignore[assignment]


class ForkPoint(Document):
    thread: str
    message: str


class Thread(Document):
    title: str = Field(max_length=MAX_TITLE_CHARS)
    persona: str | None = None
    archived: bool = False
    forked_from: ForkPoint | None = None
    created_ms: int = Field(ge=0)
    updated_ms: int = Field(ge=0)
    message_count: int = Field(default=0, ge=0)
    """The chat's messages when the record was last written (appends do not write it: the
    blind index counts them); the tiebreak of equal hybrid-clock times (DESIGN §4)."""


class Message(Document):
    thread: str
    at: int = Field(ge=0)
    """The message's place in its chat (the blind index orders by it): its creation time in
    microseconds, made unique per chat on the device that wrote it."""
    role: Role
    content: str = Field(max_length=MAX_CONTENT_CHARS)
    turn: str
    thumbnails: list[Thumbnail] = Field(default_factory=list, max_length=MAX_THUMBNAILS)
    created_ms: int = Field(ge=0)
    edited_ms: int | None = None


class Persona(Document):
    name: str = Field(min_length=1, max_length=MAX_PERSONA_NAME_CHARS)
    prompt: str = Field(max_length=MAX_PROMPT_CHARS)


class Setting(Document):
    thread: str
    name: SettingName
    value: Any = None


class Draft(Document):
    stamp: int = Field(ge=0)
    """When the text was typed (ns): a save with an older stamp than the stored one is a
    late save, and is dropped (the chain of DESIGN §11)."""
    text: str = Field(max_length=MAX_CONTENT_CHARS)


Model = TypeVar("Model", bound=Document)


def parse(model: type[Model], document: Any, where: str) -> Model:
    """A stored document as `model`, or `ChatDataError` naming `where` and the field."""
    try:
        return _validate(model, document)
    except ValidationError as exc:
        raise ChatDataError(f"{where}: {_first(exc)}", hint="repair or clear the chat") from None


def build(model: type[Model], **fields: Any) -> Model:
    """A new document from the caller's values, or `InvalidArgumentError` naming the field,
    the value and the bound (nothing is written)."""
    try:
        return _validate(model, fields)
    except ValidationError as exc:
        raise InvalidArgumentError(f"{model.__name__.lower()} {_first(exc)}") from None


def _validate(model: type[Model], document: Any) -> Model:
    """`model.model_validate(document)` as sqlmodel does it for a model that is not a table,
    without the wrapper only tables need: an append validates a message every time."""
    validated: Model = model.__new__(model)
    model.__pydantic_validator__.validate_python(document, self_instance=validated)
    return validated


def _first(exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or "document"
    value = error.get("input")
    shown = f"{value!r:.60}" if not isinstance(value, (bytes, list, dict)) else type(value).__name__
    message = error["msg"].removeprefix("Value error, ")  # pydantic's, for a ValueError
    return f"{field}: {message} (got {shown})"


def to_document(model: Document) -> dict[str, Any]:
    """What is stored: the model's fields and the unknown ones it kept (`model_dump`, by
    pydantic's core serializer directly)."""
    document: dict[str, Any] = model.__pydantic_serializer__.to_python(model)
    return document
