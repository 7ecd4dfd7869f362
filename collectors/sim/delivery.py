"""When each machine's batch arrives: on time, late (1-3 s) or twice.

Both outputs use the same delivery order, so the offline table lists rows in the order the
stream delivers them: by delivery second; within a second on-time batches by machine, then late
ones by their own second and machine; a duplicate right after its original. Late batches due
after the last second arrive with the last second.

A goodbye (the batch of a ``leave`` event an agent sends as it stops) never overtakes the
machine's earlier batches: the agent delivers its spool in order, so when one of them is late
the goodbye waits for it (it is then delivered in the same second, after it). Within a second,
goodbyes come with the late batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collectors.sim.contexts import PlannedEvent
from collectors.sim.engine import Chunk
from collectors.sim.plan import JobPlan
from minder.core.records import EventKind

STREAM_DELIVERY = 3
MAX_LATE_S = 3
_LEAVE = EventKind.LEAVE


@dataclass(frozen=True, slots=True)
class Delivery:
    """The batches one chunk's seconds deliver.

    Attributes
    ----------
    values, present
        ``(R, S)`` batch rows (late ones carried from the previous chunk first).
    second, machine
        ``(R,)`` the second each row was measured in, and its machine.
    events
        Row → events.
    order
        Rows in delivery order (a duplicate appears twice).
    deliver
        ``(len(order),)`` the second each is delivered in.
    """

    values: np.ndarray
    present: np.ndarray
    second: np.ndarray
    machine: np.ndarray
    events: dict[int, list[PlannedEvent]]
    order: np.ndarray
    deliver: np.ndarray


@dataclass(slots=True)
class Deliverer:
    """Turns one job's chunks, in order, into deliveries; holds the late batches in between."""

    plan: JobPlan
    _carry: Delivery | None = field(default=None)

    def deliver(self, chunk: Chunk, index: int) -> Delivery:
        """Deliveries of chunk ``index`` (the chunks must come in order)."""
        spec = self.plan.spec
        t, n, s = chunk.values.shape
        last_second = self.plan.duration_s - 1
        stop = chunk.first + t
        rows_t, rows_m = np.nonzero(chunk.sent)
        flat = rows_t * n + rows_m
        second = chunk.first + rows_t
        delay = np.zeros(len(flat), dtype=np.int64)
        copies = np.ones(len(flat), dtype=np.int64)
        if spec.late_rate > 0 or spec.duplicate_rate > 0:
            rng = self.plan.rng(STREAM_DELIVERY, index)
            late = rng.random((t, n))[rows_t, rows_m] < spec.late_rate
            lag = rng.integers(1, MAX_LATE_S + 1, (t, n))[rows_t, rows_m]
            delay = np.where(late, lag, 0)
            copies += rng.random((t, n))[rows_t, rows_m] < spec.duplicate_rate
        deliver = np.minimum(second + delay, last_second)
        self._goodbyes_last(chunk, flat, rows_m, second, deliver)
        values = chunk.values.reshape(t * n, s)
        present = chunk.present.reshape(t * n, s)
        events = {int(k[0] * n + k[1]): v for k, v in chunk.events.items()}
        row_second = chunk.first + np.arange(t * n) // n
        row_machine = np.arange(t * n) % n
        carried = self._carry
        if carried is not None and len(carried.order):
            offset = len(carried.second)
            values = np.concatenate([carried.values, values])
            present = np.concatenate([carried.present, present])
            row_second = np.concatenate([carried.second, row_second])
            row_machine = np.concatenate([carried.machine, row_machine])
            events = {**carried.events, **{k + offset: v for k, v in events.items()}}
            rows = np.concatenate([carried.order, flat + offset])
            deliver = np.concatenate([carried.deliver, deliver])
            copies = np.concatenate([np.ones(len(carried.order), np.int64), copies])
        else:
            rows = flat
        now = deliver < stop
        later = ~now
        self._carry = None
        if later.any():
            keep = rows[later]
            self._carry = Delivery(
                values=values[keep],
                present=present[keep],
                second=row_second[keep],
                machine=row_machine[keep],
                events={i: events[r] for i, r in enumerate(keep) if r in events},
                order=np.arange(len(keep)),
                deliver=deliver[later],
            )
            # A carried duplicate is carried twice (its copies count is 2).
            self._carry = _repeat(self._carry, copies[later])
        rows, deliver, copies = rows[now], deliver[now], copies[now]
        # Late batches after the on-time ones; goodbyes with them, so that one waiting for a
        # late batch of its machine comes after it (they sort by their own second).
        after = row_second[rows] < deliver
        goodbyes = [r for r, planned in events.items() if any(e.kind is _LEAVE for e in planned)]
        if goodbyes:
            after |= np.isin(rows, goodbyes)
        order = np.lexsort((row_machine[rows], row_second[rows], after, deliver))
        rows, deliver, copies = rows[order], deliver[order], copies[order]
        return Delivery(
            values=values,
            present=present,
            second=row_second,
            machine=row_machine,
            events=events,
            order=np.repeat(rows, copies),
            deliver=np.repeat(deliver, copies),
        )

    def _goodbyes_last(
        self,
        chunk: Chunk,
        flat: np.ndarray,
        machine: np.ndarray,
        second: np.ndarray,
        deliver: np.ndarray,
    ) -> None:
        """Delay each goodbye row of ``chunk`` (in place in ``deliver``) until the machine's
        earlier batches, of this chunk or carried from the previous one, are delivered."""
        n = chunk.values.shape[1]
        carried = self._carry
        for (t, m), planned in chunk.events.items():
            if not any(e.kind is _LEAVE for e in planned):
                continue
            i = int(np.searchsorted(flat, t * n + m))
            before = deliver[(machine == m) & (second < second[i])]
            bound = int(before.max()) if len(before) else 0
            if carried is not None and len(carried.order):
                own = carried.deliver[carried.machine[carried.order] == m]
                bound = max(bound, int(own.max()) if len(own) else 0)
            deliver[i] = max(int(deliver[i]), bound)


def _repeat(carry: Delivery, copies: np.ndarray) -> Delivery:
    if (copies == 1).all():
        return carry
    return Delivery(
        values=carry.values,
        present=carry.present,
        second=carry.second,
        machine=carry.machine,
        events=carry.events,
        order=np.repeat(carry.order, copies),
        deliver=np.repeat(carry.deliver, copies),
    )
