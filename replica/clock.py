"""Hybrid logical clock: milliseconds and a 16-bit counter in one 64-bit integer.

The top bit stays zero (47 bits of milliseconds last until the year 6429), so every hlc fits
SQLite's signed integers and a hostile header cannot overflow a column (wire.MAX_HLC).

Pure: the wall time is always an argument. A local tick never goes backwards; when the
counter overflows it carries into the millisecond part (the sum just keeps counting). An
inbound timestamp never makes the clock raise: one too far ahead (more than `max_drift_ms`)
is not observed at all, so a device with a wrong clock cannot drag everyone forward; the
caller holds such a version for drift instead (specs/replica.md §clock).
"""

from __future__ import annotations

from replica.errors import InvalidArgumentError
from replica.wire import MAX_HLC as WIRE_MAX_HLC
from replica.wire import hlc_ms as hlc_ms  # noqa: PLC0414  (re-exported: the clock's own view)

COUNTER_BITS = 16
COUNTER_MASK = (1 << COUNTER_BITS) - 1
MAX_HLC = WIRE_MAX_HLC
MAX_MS = MAX_HLC >> COUNTER_BITS
DEFAULT_MAX_DRIFT_MS = 5 * 60 * 1000


def pack_hlc(ms: int, counter: int) -> int:
    """Join milliseconds and counter into one hlc."""
    if not 0 <= ms <= MAX_MS or not 0 <= counter <= COUNTER_MASK:
        raise InvalidArgumentError(
            f"hlc parts out of range: ms={ms} (0..{MAX_MS}), counter={counter} (0..{COUNTER_MASK})"
        )
    return (ms << COUNTER_BITS) | counter


def hlc_counter(hlc: int) -> int:
    """The counter part of an hlc."""
    return hlc & COUNTER_MASK


def tick(state: int, now_ms: int) -> int:
    """The hlc for a local event: greater than every hlc seen so far and at least `now_ms`."""
    if now_ms < 0 or now_ms > MAX_MS:
        raise InvalidArgumentError(f"wall clock {now_ms} ms outside 0..{MAX_MS}")
    nxt = max(state + 1, now_ms << COUNTER_BITS)
    if nxt > MAX_HLC:
        raise InvalidArgumentError(
            f"hlc exhausted at {state}: the clock cannot count past {MAX_HLC}",
            hint="a peer's clock is absurdly far ahead; restore from a backup",
        )
    return nxt


def is_ahead(hlc: int, now_ms: int, max_drift_ms: int) -> bool:
    """True when `hlc` is further ahead of the wall clock than the drift bound allows."""
    return hlc_ms(hlc) > now_ms + max_drift_ms


def latest_hlc(now_ms: int, max_drift_ms: int) -> int:
    """The greatest hlc within the drift bound: `is_ahead(hlc, ...)` exactly when `hlc` is
    greater. Merges compute it once per batch and compare each inbound hlc with it."""
    return ((now_ms + max_drift_ms + 1) << COUNTER_BITS) - 1


def observe(state: int, remote: int, now_ms: int, max_drift_ms: int) -> int:
    """The clock after seeing an inbound hlc; never raises, ignores one ahead of the drift bound."""
    if is_ahead(remote, now_ms, max_drift_ms) or remote > MAX_HLC:
        return state
    return max(state, remote)
