"""Chat ids: 26 characters that sort by creation time and that two devices working offline
never both draw — a ULID: a 48-bit millisecond timestamp, then 80 random bits, in Crockford's
base32. Within one process, ids drawn in one millisecond follow each other (the random part
of the last one, plus one), so the messages of one turn keep their order."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from replica import InvalidArgumentError

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


class IdClock:
    """The last id's (ms, random) in this process: the next one in a millisecond counts up."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last = (0, 0)

    def next(self, now_ms: int, random: int) -> int:
        with self.lock:
            last_ms, last_random = self.last
            if now_ms <= last_ms:
                now_ms, random = last_ms, last_random + 1
                if random >= 1 << 80:
                    now_ms, random = last_ms + 1, 0
            self.last = (now_ms, random)
        return (now_ms << 80) | random


PROCESS_CLOCK = IdClock()


def new_id(
    now_ms: int, random_bytes: Callable[[int], bytes], clock: IdClock = PROCESS_CLOCK
) -> str:
    """A new id, later than every id `clock` (this process's) gave before."""
    value = clock.next(now_ms, int.from_bytes(random_bytes(10), "big"))
    return "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))


def check_id(kind: str, value: object) -> str:
    """`value` if it is an id of this form; a clear error naming it otherwise."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise InvalidArgumentError(
            f"{kind} id must be 26 characters of Crockford base32 (a ULID), got {value!r:.60}"
        )
    return value


def id_time_ms(value: str) -> int:
    """When an id was drawn: its first 10 characters are the 48-bit time (2 leading zero
    bits pad the 128 bits to 26 characters)."""
    number = 0
    for char in value[:10]:
        number = number * 32 + _ALPHABET.index(char)
    return number
