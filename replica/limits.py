"""Bounds on what an app may store, checked before anything is written (specs/limits.md).

Ids and profile names: non-empty str of at most 256 characters, no NUL, already in Unicode NFC
(two spellings of one name must not become two records). Documents: JSON-compatible values,
at most 1 MiB as MessagePack, nested at most 64 deep, integers within 64 bits, finite floats.
"""

from __future__ import annotations

import math
import reprlib
import unicodedata
from typing import Any

from replica.errors import InvalidArgumentError

MAX_ID_CHARS = 256
MAX_DOCUMENT_BYTES = 1024 * 1024
MAX_NESTING = 64
MIN_INT = -(1 << 63)
MAX_INT = (1 << 64) - 1


def check_name(kind: str, value: object) -> str:
    """Return `value` if it is a valid id, profile or collection name; raise otherwise."""
    if not isinstance(value, str):
        shown = reprlib.repr(value)
        raise InvalidArgumentError(f"{kind} must be a str, got {type(value).__name__} {shown}")
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise InvalidArgumentError(
            f"{kind} {value[:40]!r} has {len(value)} characters, bounds 1..{MAX_ID_CHARS}"
        )
    if "\x00" in value:
        raise InvalidArgumentError(f"{kind} {value[:40]!r} contains NUL")
    check_text(kind, value)
    if not unicodedata.is_normalized("NFC", value):
        raise InvalidArgumentError(
            f"{kind} {value[:40]!r} is not in Unicode NFC",
            hint="normalize it with unicodedata.normalize('NFC', value)",
        )
    return value


def check_text(kind: str, value: str) -> None:
    """Refuse text that has no UTF-8 form (a lone surrogate)."""
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidArgumentError(
                f"{kind} {value[:40]!r} holds a lone surrogate, which is not valid Unicode text"
            ) from None


def check_document(document: Any) -> None:
    """Raise unless `document` is a JSON-compatible value within the nesting and int bounds."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise InvalidArgumentError(f"document nests deeper than {MAX_NESTING} levels")
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            check_text("document text", value)
            continue
        if isinstance(value, int):
            if not MIN_INT <= value <= MAX_INT:
                raise InvalidArgumentError(f"document integer {value} outside 64 bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidArgumentError(f"document holds a non-finite number {value}")
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidArgumentError(f"document object key {key!r} is not a str")
                check_text("document object key", key)
                stack.append((item, depth + 1))
        else:
            raise InvalidArgumentError(
                f"document holds a {type(value).__name__}, which is not JSON-compatible"
            )


def check_document_size(encoded_bytes: int) -> None:
    if encoded_bytes > MAX_DOCUMENT_BYTES:
        raise InvalidArgumentError(
            f"document is {encoded_bytes} bytes as MessagePack, bound {MAX_DOCUMENT_BYTES}"
        )
