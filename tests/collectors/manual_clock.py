"""A clock the test moves by hand, for the sources' ``clock`` parameter (deterministic rates)."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds that change only when the test says so.

    ``source.collect(clock.at(t))`` moves the clock to ``t`` and collects with the batch time
    ``t``, so counters read in that collect are timestamped ``t`` and rates divide by the
    differences of the ``t`` values the test chose.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def at(self, t: float) -> float:
        """Move to ``t`` and return it."""
        self.t = float(t)
        return self.t

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time."""
        self.t += seconds
        return self.t
