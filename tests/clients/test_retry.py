"""The retry policy, run on an injected clock: no test here sleeps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clients.errors import RelayRefusedError, UnknownOutcomeError
from clients.retry import Backoff, Retrier
from replica.wire import ErrorCode


class Recorder:
    """A clock that moves only when the retrier sleeps."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


def retrier(backoff: Backoff, recorder: Recorder, random: float = 0.5) -> Retrier:
    return Retrier(
        backoff, sleep=recorder.sleep, random=lambda: random, clock=lambda: recorder.now_s
    )


def failing(errors: list[Exception]) -> Callable[[], str]:
    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "answer"

    return call


def test_unknown_outcomes_are_retried_with_growing_jittered_delays() -> None:
    recorder = Recorder()
    r = retrier(Backoff(first_delay_s=0.1, max_delay_s=0.4), recorder, random=1.0)
    lost: list[Exception] = [UnknownOutcomeError("timed out") for _ in range(4)]
    assert r.call(failing(lost)) == "answer"
    assert recorder.slept == [0.1, 0.2, 0.4, 0.4] and r.retries == 4
    half = retrier(Backoff(first_delay_s=0.1, max_delay_s=0.4), Recorder(), random=0.0)
    assert half.backoff.delay_s(2, lambda: 0.0) == pytest.approx(0.2)  # half fixed, half random


def test_attempts_and_time_are_bounded_and_the_last_error_surfaces() -> None:
    recorder = Recorder()
    r = retrier(Backoff(max_attempts=3), recorder)
    last = UnknownOutcomeError("third")
    with pytest.raises(UnknownOutcomeError) as raised:
        r.call(failing([UnknownOutcomeError("1"), UnknownOutcomeError("2"), last]))
    assert raised.value is last and len(recorder.slept) == 2
    slow = retrier(Backoff(first_delay_s=10, max_delay_s=10, max_elapsed_s=12), Recorder())
    with pytest.raises(UnknownOutcomeError):
        slow.call(failing([UnknownOutcomeError("1"), UnknownOutcomeError("2")]))
    assert slow.retries == 1


def test_refusals_are_not_retried_but_rate_limits_wait_as_told() -> None:
    recorder = Recorder()
    r = retrier(Backoff(), recorder)
    with pytest.raises(RelayRefusedError):
        r.call(failing([RelayRefusedError(401, ErrorCode.UNAUTHORIZED, "no")]))
    assert recorder.slept == []
    limited = RelayRefusedError(429, ErrorCode.RATE_LIMITED, "slow down", retry_after_s=3)
    assert r.call(failing([limited])) == "answer"
    assert recorder.slept == [3]
