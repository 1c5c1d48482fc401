"""`backup forget`'s keep rules (clients/retention.py) against a model written from restic's
documented rules: for each rule, the newest backup of each of the newest n buckets, and the
oldest backup when the set has fewer buckets than n."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.retention import KeepPolicy, kept

START = datetime.datetime(2025, 12, 20, tzinfo=datetime.UTC)


def model(times: list[datetime.datetime], policy: KeepPolicy) -> set[int]:
    """Written apart from the code: bucket first, then pick."""
    if policy.empty:
        return set(range(len(times)))
    utc = [t.astimezone(datetime.UTC) for t in times]
    keys: dict[str, Callable[[int], object]] = {
        "last": lambda i: i,
        "daily": lambda i: (utc[i].year, utc[i].month, utc[i].day),
        "weekly": lambda i: (utc[i].isocalendar().year, utc[i].isocalendar().week),
        "monthly": lambda i: (utc[i].year, utc[i].month),
    }
    oldest = min(range(len(times)), key=lambda i: (times[i], -i))
    chosen: set[int] = set()
    for name, count in policy.counts():
        if count == 0:
            continue
        newest_of: dict[object, int] = {}
        for i in sorted(range(len(times)), key=lambda i: (times[i], -i)):
            newest_of[keys[name](i)] = i  # ascending: the last one seen is the newest
        buckets = sorted(newest_of.values(), key=lambda i: (times[i], -i), reverse=True)
        chosen |= set(buckets[:count])
        if len(buckets) < count:
            chosen.add(oldest)
    return chosen


ZONES = [datetime.timezone(datetime.timedelta(hours=h)) for h in (-7, 0, 5, 13)]
calendars = st.lists(  # ties, several zones, and the ISO week that straddles a new year
    st.builds(
        lambda hours, zone: (START + datetime.timedelta(hours=hours)).astimezone(zone),
        st.integers(0, 24 * 70),
        st.sampled_from(ZONES),
    ),
    min_size=1,
    max_size=40,
)
policies = st.builds(
    KeepPolicy,
    last=st.integers(0, 6),
    daily=st.integers(0, 8),
    weekly=st.integers(0, 5),
    monthly=st.integers(0, 4),
)


@settings(max_examples=400, deadline=None)
@given(times=calendars, policy=policies)
def test_forget_keeps_what_restics_rules_keep(
    times: list[datetime.datetime], policy: KeepPolicy
) -> None:
    keep = kept(times, policy)
    assert {i for i, k in enumerate(keep) if k} == model(times, policy)
    assert any(keep)  # never the whole set


def test_a_week_of_backups_every_six_hours() -> None:
    """The two newest, and the newest of each of the three newest days; not the oldest: the
    week has more days than the daily rule asks."""
    times = [START + datetime.timedelta(hours=6 * n) for n in range(28)]
    keep = kept(times, KeepPolicy(last=2, daily=3))
    day = datetime.timedelta(days=1)
    evening = START + datetime.timedelta(hours=18)
    assert sorted(t for t, k in zip(times, keep, strict=True) if k) == [
        evening + 4 * day,
        evening + 5 * day,
        evening + 6 * day - datetime.timedelta(hours=6),
        evening + 6 * day,
    ]


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="keep-daily"):
        KeepPolicy(daily=-1)
