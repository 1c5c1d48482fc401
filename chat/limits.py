"""Reading an export file that nobody vouches for (specs/chat.md §9): hard ceilings first,
then the chat store's models, and every refusal names where in the file and which bound.

The bounds hold before anything is written: a file over any of them is refused whole. JSON
is decoded by msgspec (invalid UTF-8, lone surrogates and numbers out of range are refused
there; nesting past Python's limit too), then walked here with a path for each value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

from chat.ids import check_id
from chat.models import (
    MAX_CONTENT_CHARS,
    MAX_PERSONAS,
    MAX_THUMBNAILS,
    Message,
    Persona,
    Setting,
    Thread,
    build,
)
from chat.preferences import DEFAULT_PERSONA
from replica import InvalidArgumentError

EXPORT_FORMAT = 1
MAX_FILE_BYTES = 64 * 1024 * 1024
"""The largest file read before any other bound can be checked (the worst left below it,
one object of millions of distinct keys, decodes in seconds)."""
MAX_OPENINGS = 1_500_000
"""`{` and `[` outside strings, counted before decoding: each an object or a list to build
(64 MiB of `{},` would be 22 million: 7 s and 1.8 GB here), where an export at the byte
bound holds under a million (every message an object and a list, in 150 bytes at least)."""
MAX_SCANNED_QUOTES = 8_000_000
"""Quotes past which a file with more than `MAX_OPENINGS` `{` and `[` in all is not scanned
for which of them lie in strings (the scan costs about a second per 8 million): a file of
one chat, or a few, never comes near."""
MAX_THREADS = 5000
MAX_MESSAGES_PER_THREAD = 5000
MAX_SETTINGS_PER_THREAD = 100
MAX_DEPTH = 16
"""Nesting of any value below a record's fields (a setting's value, a newer app's field)."""
MAX_STRING_CHARS = MAX_CONTENT_CHARS
MAX_ITEMS = 1000
"""Items in any one list or object that is not one of the file's own lists."""
MAX_INTEGER = (1 << 63) - 1
TOP_FIELDS = {"sealsync_export", "scope", "profile", "exported_at", "active_persona", "personas",
              "threads"}  # fmt: skip
CHILDREN = ("messages", "settings")
"""A thread's fields in an export that are not its record's."""


@dataclass(frozen=True)
class ReadThread:
    """A chat as read from an export: its record's document, its settings by name, and its
    messages' documents by id (each as the chat store stores it)."""

    id: str
    document: dict[str, Any]
    settings: dict[str, Any]
    messages: list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class ReadExport:
    scope: str
    profile: str
    active_persona: str | None
    personas: list[tuple[str, dict[str, Any]]]
    threads: list[ReadThread]


class ImportLimitError(InvalidArgumentError):
    """An export file over a bound, or not of the export format: named by its path in the
    file (`threads[3].messages[12].content`), and nothing is written."""

    code = "import_limit"


def refuse(path: str, what: str) -> ImportLimitError:
    return ImportLimitError(f"{path}: {what}", hint="nothing was imported")


def decode(data: bytes) -> ReadExport:
    """What the export file holds, checked against every bound; `ImportLimitError`."""
    if len(data) > MAX_FILE_BYTES:
        raise refuse("the file", f"{len(data):,} bytes (bound {MAX_FILE_BYTES:,})")
    _check_openings(data)
    try:
        value = msgspec.json.decode(data)
    except RecursionError:
        raise refuse("the file", f"nested deeper than can be read (bound {MAX_DEPTH})") from None
    except msgspec.ValidationError as exc:
        raise refuse("the file", f"a number out of range ({exc})") from None
    except msgspec.DecodeError as exc:
        raise refuse("the file", f"not JSON in UTF-8 ({exc})") from None
    if not isinstance(value, dict) or value.get("sealsync_export") != EXPORT_FORMAT:
        raise refuse("the file", f"not a sealsync export of format {EXPORT_FORMAT}")
    unknown = sorted(set(value) - TOP_FIELDS)
    if unknown:
        raise refuse(unknown[0], "not a field of the export format")
    return _read_top(value)


def _check_openings(data: bytes) -> None:
    """`ImportLimitError` past `MAX_OPENINGS` objects and lists. Counted in all the bytes
    first (a tenth of a second); only past the bound are the strings taken out (escaped
    backslashes and quotes first, then every other piece between quotes), which costs with
    the number of strings, so past `MAX_SCANNED_QUOTES` the file is refused unscanned."""
    openings = data.count(b"{") + data.count(b"[")
    if openings <= MAX_OPENINGS:
        return
    hint = "nothing was imported; export fewer chats to a file (`sealsync export --chat`)"
    quotes = data.count(b'"')
    if quotes > MAX_SCANNED_QUOTES:
        what = f"{openings:,} `{{` and `[` and {quotes:,} quotes"
        bounds = f"{MAX_OPENINGS:,} and {MAX_SCANNED_QUOTES:,}"
        raise ImportLimitError(f"the file: {what} (bounds {bounds})", hint=hint)
    pieces = data.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')
    openings = sum(piece.count(b"{") + piece.count(b"[") for piece in pieces[::2])
    if openings > MAX_OPENINGS:
        what = f"{openings:,} `{{` and `[` outside strings"
        raise ImportLimitError(f"the file: {what} (bound {MAX_OPENINGS:,})", hint=hint)


def _read_top(value: dict[str, Any]) -> ReadExport:
    for name in ("scope", "profile", "exported_at"):
        _string(value.get(name), name)
    if value["scope"] not in ("profile", "chat"):
        raise refuse("scope", f"{value['scope']!r:.40} is neither 'profile' nor 'chat'")
    active = value.get("active_persona")
    if active is not None and active != DEFAULT_PERSONA:
        try:
            check_id("persona", active)
        except InvalidArgumentError as exc:
            raise refuse("active_persona", str(exc)) from None
    personas = _list(value.get("personas"), "personas", MAX_PERSONAS)
    threads = _list(value.get("threads"), "threads", MAX_THREADS)
    for index, thread in enumerate(threads):  # every count first: the cheap checks lead
        if isinstance(thread, dict):
            where = f"threads[{index}].messages"
            _list(thread.get("messages"), where, MAX_MESSAGES_PER_THREAD)
    read_personas = [persona_record(p, f"personas[{i}]") for i, p in enumerate(personas)]
    records = [thread_record(t, f"threads[{i}]") for i, t in enumerate(threads)]
    read_threads = [
        _read_thread(t, f"threads[{i}]", *record)
        for i, (t, record) in enumerate(zip(threads, records, strict=True))
    ]
    _unique([p for p, _ in read_personas], "personas")
    _unique([t.id for t in read_threads], "threads")
    _unique([m for t in read_threads for m, _ in t.messages], "messages")
    return ReadExport(value["scope"], value["profile"], active, read_personas, read_threads)


def _read_thread(
    thread: dict[str, Any], path: str, thread_id: str, document: dict[str, Any]
) -> ReadThread:
    """A chat whose record `thread_record` read: its messages and settings, checked."""
    messages = _list(thread.get("messages"), f"{path}.messages", MAX_MESSAGES_PER_THREAD)
    read_messages = [
        message_record(m, f"{path}.messages[{n}]", thread_id) for n, m in enumerate(messages)
    ]
    settings = thread.get("settings")
    if not isinstance(settings, dict) or len(settings) > MAX_SETTINGS_PER_THREAD:
        raise refuse(f"{path}.settings", f"not an object of {MAX_SETTINGS_PER_THREAD} at most")
    for name, setting in settings.items():
        where = f"{path}.settings.{name:.40}"
        if "\x00" in name or "/" in name:
            raise refuse(where, "a setting's name holds neither NUL nor '/'")
        build_at(Setting, where, thread=thread_id, name=name, value=setting)
        _value(setting, where, 0)
    return ReadThread(thread_id, document, dict(settings), read_messages)


def persona_record(value: object, path: str) -> tuple[str, dict[str, Any]]:
    """A persona's id and document, checked."""
    persona_id, fields = _record(value, path, "persona")
    build_at(Persona, path, **fields)
    return persona_id, fields


def thread_record(value: object, path: str) -> tuple[str, dict[str, Any]]:
    """A chat's id and record document, checked (its messages and settings apart)."""
    thread_id, fields = _record(value, path, "chat")
    document = {k: v for k, v in fields.items() if k not in CHILDREN}
    build_at(Thread, path, **document)
    return thread_id, document


def message_record(value: object, path: str, thread: str) -> tuple[str, dict[str, Any]]:
    """A message's id and document: its thread filled in (thumbnails stay base64, as
    stored)."""
    message_id, fields = _record(value, path, "message")
    _list(fields.get("thumbnails", []), f"{path}.thumbnails", MAX_THUMBNAILS)
    if "thread" in fields:
        raise refuse(f"{path}.thread", "a message's chat is the one it is listed under")
    build_at(Message, path, thread=thread, **fields)
    return message_id, {"thread": thread, **fields}


def build_at(model: type[Any], path: str, **fields: Any) -> None:
    try:
        build(model, **fields)
    except InvalidArgumentError as exc:
        raise refuse(path, str(exc)) from None


def _record(value: object, path: str, kind: str) -> tuple[str, dict[str, Any]]:
    """A record's id and its other fields, each value bounded (a chat's children apart)."""
    if not isinstance(value, dict):
        raise refuse(path, f"not an object (got {type(value).__name__})")
    try:
        record_id = check_id(kind, value.get("id"))
    except InvalidArgumentError as exc:
        raise refuse(f"{path}.id", str(exc)) from None
    for name, field in value.items():
        if name not in CHILDREN:
            _value(field, f"{path}.{name:.40}", 0)
    return record_id, {k: v for k, v in value.items() if k != "id"}


def _value(value: object, path: str, depth: int) -> None:
    """Any value below a record's fields: its depth, strings, numbers and sizes bounded."""
    if depth > MAX_DEPTH:
        raise refuse(path, f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        _string(value, path)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_INTEGER:
            raise refuse(path, f"an integer beyond ±{MAX_INTEGER}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise refuse(path, "not a finite number")
    elif isinstance(value, list | dict):
        if len(value) > MAX_ITEMS:
            raise refuse(path, f"{len(value):,} items (bound {MAX_ITEMS})")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _value(item, f"{path}[{key!r:.40}]", depth + 1)


def _string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise refuse(path, f"not a string (got {type(value).__name__})")
    if len(value) > MAX_STRING_CHARS:
        raise refuse(path, f"{len(value):,} characters (bound {MAX_STRING_CHARS:,})")
    return value


def _list(value: object, path: str, bound: int) -> list[Any]:
    if not isinstance(value, list):
        raise refuse(path, f"not a list (got {type(value).__name__})")
    if len(value) > bound:
        raise refuse(path, f"{len(value):,} items (bound {bound:,})")
    return value


def _unique(ids: list[str], what: str) -> None:
    seen: set[str] = set()
    for value in ids:
        if value in seen:
            raise refuse(what, f"the id {value!r:.40} twice")
        seen.add(value)
