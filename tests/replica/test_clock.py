"""Hybrid logical clock (specs/replica.md §clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import clock
from replica.errors import InvalidArgumentError

ms = st.integers(min_value=0, max_value=clock.MAX_MS >> 2)
hlcs = st.integers(min_value=0, max_value=clock.MAX_HLC >> 2)


@given(state=hlcs, now=ms)
def test_tick_is_greater_than_state_and_not_before_now(state: int, now: int) -> None:
    nxt = clock.tick(state, now)
    assert nxt > state
    assert clock.hlc_ms(nxt) >= now


@given(now=ms, ticks=st.integers(min_value=1, max_value=300))
def test_ticks_in_one_millisecond_are_strictly_increasing(now: int, ticks: int) -> None:
    state = 0
    seen = []
    for _ in range(ticks):
        state = clock.tick(state, now)
        seen.append(state)
    assert seen == sorted(set(seen))


def test_counter_overflow_carries_into_milliseconds() -> None:
    state = clock.pack_hlc(1000, clock.COUNTER_MASK)
    nxt = clock.tick(state, 1000)
    assert clock.hlc_ms(nxt) == 1001 and clock.hlc_counter(nxt) == 0


def test_tick_refuses_a_wall_clock_outside_48_bits() -> None:
    with pytest.raises(InvalidArgumentError, match="outside"):
        clock.tick(0, clock.MAX_MS + 1)


def test_tick_refuses_to_wrap_past_64_bits() -> None:
    with pytest.raises(InvalidArgumentError, match="exhausted"):
        clock.tick(clock.MAX_HLC, 0)


@given(state=hlcs, remote=st.integers(min_value=0, max_value=clock.MAX_HLC * 2), now=ms)
def test_observe_never_raises_and_never_goes_back(state: int, remote: int, now: int) -> None:
    after = clock.observe(state, remote, now, clock.DEFAULT_MAX_DRIFT_MS)
    assert after >= state


def test_observe_ignores_a_timestamp_beyond_the_drift_bound() -> None:
    now = 1_000_000
    ahead = clock.pack_hlc(now + 5001, 0)
    assert clock.observe(7, ahead, now, 5000) == 7
    within = clock.pack_hlc(now + 5000, 3)
    assert clock.observe(7, within, now, 5000) == within


@given(now=ms, counter=st.integers(min_value=0, max_value=clock.COUNTER_MASK))
def test_pack_round_trips(now: int, counter: int) -> None:
    hlc = clock.pack_hlc(now, counter)
    assert (clock.hlc_ms(hlc), clock.hlc_counter(hlc)) == (now, counter)


@given(
    hlc=st.integers(min_value=1, max_value=clock.MAX_HLC),
    now=ms,
    drift=st.one_of(st.integers(min_value=0, max_value=10**9), st.just(1 << 62)),
)
def test_latest_hlc_is_the_bound_that_is_ahead_checks(hlc: int, now: int, drift: int) -> None:
    """Merges compare with `latest_hlc` instead of calling `is_ahead` per version."""
    assert (hlc > clock.latest_hlc(now, drift)) == clock.is_ahead(hlc, now, drift)
    edge = clock.latest_hlc(now, drift)
    assert not clock.is_ahead(edge, now, drift) and clock.is_ahead(edge + 1, now, drift)
