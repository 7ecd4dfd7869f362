"""CounterRates: readings are timestamped when they are taken, resets give no value."""

from __future__ import annotations

import time

import pytest
from manual_clock import ManualClock

from collectors.base import CounterRates, ProblemLog


def test_first_reading_primes_then_rate_and_count_divide_by_the_clock() -> None:
    clock = ManualClock(100.0)
    rates = CounterRates(clock=clock)
    assert rates.rate(("nic", "tx"), 1000) is None
    assert rates.count(("nic", "err"), 5) is None
    clock.advance(2.0)
    assert rates.rate(("nic", "tx"), 1500) == 250.0
    assert rates.count(("nic", "err"), 8) == 3.0  # counts do not divide by the time
    assert rates.delta(("nic", "tx"), 1500) is None  # no time passed on the clock


def test_explicit_reading_time_overrides_the_clock() -> None:
    rates = CounterRates(clock=lambda: pytest.fail("the clock must not be read"))
    rates.rate(("k",), 0, at=10.0)
    assert rates.rate(("k",), 30, at=10.5) == 60.0


def test_default_clock_is_the_monotonic_time_of_each_reading() -> None:
    rates = CounterRates()
    rates.rate(("k",), 0)
    time.sleep(0.2)
    rate = rates.rate(("k",), 1000)
    assert rate is not None
    # 1000 over the ~0.2 s that really passed, whatever batch time a caller would have had.
    assert 1000 / 0.4 < rate <= 1000 / 0.2


def test_reset_yields_nothing_is_reported_and_forget_drops_state() -> None:
    problems = ProblemLog("test")
    clock = ManualClock()
    rates = CounterRates(problems, clock=clock)
    rates.rate(("a",), 100)
    rates.rate(("b",), 100)
    clock.advance(1.0)
    assert rates.rate(("a",), 10) is None
    assert problems.counts == {"counter_reset": 1}
    clock.advance(1.0)
    assert rates.rate(("a",), 30) == 20.0
    rates.forget({("a",)})
    clock.advance(1.0)
    assert rates.rate(("b",), 200) is None  # forgotten: primes again
