"""What-if scenarios and their batched replay.

A scenario says, for every (template op, DP rank), whether the op keeps its original replayed
duration (duration for compute, transfer for comm) or takes its ideal one, optionally scaled, and
whether launch delays are replayed. Scenarios are replayed in batches sized to a memory budget,
each batch in one pass over the compiled program.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from whatif.model import JobModel
from whatif.replay import Program, Workspace, compile_template, run

logger = logging.getLogger(__name__)

ProgressFn = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: called after each batch of replays."""

DEFAULT_MEMORY_BUDGET = 64 * 2**20
"""Least bytes of replay state one pass may use."""

BUDGET_PER_OP = 32
"""Bytes of replay state per op of the job one pass may use beyond the least. A scenario on
every DP rank needs about 43 bytes per op, so it takes two passes: each pass costs Python work
per level of the program (about 10 ms), so fewer passes are faster, and peak memory stays
proportional to the job (about 120 bytes per op in all at 20 M ops)."""


def default_budget(model: JobModel) -> int:
    """The replay memory budget of ``model``: :data:`DEFAULT_MEMORY_BUDGET` or
    :data:`BUDGET_PER_OP` bytes per op, whichever is larger."""
    return max(DEFAULT_MEMORY_BUDGET, BUDGET_PER_OP * model.n_ops_total)


@dataclass(frozen=True)
class Scenario:
    """One replay of the job.

    Attributes
    ----------
    name
        A label for progress and reports.
    keep
        Boolean, broadcastable to ``(ops, dp)``: ops that keep their original duration; the others
        take their ideal duration. ``None`` keeps every op original.
    scale
        Float, broadcastable to ``(ops, dp)``: multiplies the chosen durations (0 makes an op
        free). ``None`` leaves them.
    launch_delay
        Replay the recorded launch delays.
    ideal
        Per template op: the ideal durations to use instead of the model's (e.g. per-stage means).
    delay_keep
        Boolean, broadcastable to ``(ops, dp)``: with ``launch_delay``, only these ops replay
        their recorded launch delay, the others none (e.g. one rank as recorded, lateness
        included, and every other rank ideal). ``None``: every op.
    """

    name: str
    keep: np.ndarray | None = None
    scale: np.ndarray | None = None
    launch_delay: bool = False
    ideal: np.ndarray | None = None
    delay_keep: np.ndarray | None = None


class Replayer:
    """Replays scenarios of one job model.

    Parameters
    ----------
    model
        The job laid out on its dependency model.
    memory_budget
        Bytes of replay state one pass may use (default: :func:`default_budget`). Scenarios
        are batched up to it; one scenario larger than it replays a few steps per pass.
    """

    def __init__(self, model: JobModel, *, memory_budget: int | None = None) -> None:
        self.model = model
        self.program: Program = compile_template(model.template)
        self.memory_budget = default_budget(model) if memory_budget is None else memory_budget
        self.replays = 0
        # The program takes weights in its end order and delays in its start order; they are
        # gathered from the model's arrays per pass (no reordered copy of the whole trace).
        self._end_order = self.program.end_order
        self._ideal = model.ideal[self._end_order]
        self._workspace = Workspace()  # buffers reused by every pass

    def _step_bytes(self, columns: int | None = None) -> int:
        """Replay state of one step of one scenario on ``columns`` DP columns."""
        m = self.model
        width = m.dp_size if columns is None else columns
        return max((self.program.n_nodes + 3 * m.template.n_ops) * width * 8, 1)

    def batch_size(self, columns: int | None = None) -> int:
        """Scenarios replayed per pass (at least 1) when each uses ``columns`` DP columns."""
        per_run = self._step_bytes(columns) * self.model.n_steps
        return max(1, int(self.memory_budget // per_run))

    def steps_per_pass(self, columns: int | None = None) -> int:
        """Steps of one scenario replayed per pass: all of them unless one scenario exceeds the
        memory budget, then as many as fit (at least 1). Steps replay independently."""
        fit = int(self.memory_budget // self._step_bytes(columns))
        return max(1, min(self.model.n_steps, fit))

    def _gather(
        self, source: np.ndarray, order: np.ndarray, cols: np.ndarray, steps: slice, out: np.ndarray
    ) -> np.ndarray:
        """``source[order][:, steps][:, :, cols]`` into ``out``, copying only the columns."""
        part = source[:, steps]
        if len(cols) != self.model.dp_size:
            part = part[:, :, cols]
        return part.take(order, axis=0, out=out, mode="clip")  # clip: unbuffered, all valid

    def columns(self, scenario: Scenario) -> np.ndarray:
        """The DP ranks whose replay ``scenario`` needs.

        DP ranks that keep no op original replay the same ideal durations, so one of them
        stands for all: a DP-synced collective waits for the latest member, and copies of one
        member do not change the latest. "DP rank d original, rest ideal" thus replays 2 ranks
        instead of all.
        """
        m = self.model
        every = np.arange(m.dp_size)
        if scenario.keep is None or scenario.scale is not None:
            return every
        masks = [np.asarray(scenario.keep, dtype=bool)]
        if scenario.launch_delay:
            if scenario.delay_keep is None:
                return every
            masks.append(np.asarray(scenario.delay_keep, dtype=bool))
        used = np.zeros(m.dp_size, dtype=bool)
        for mask in masks:
            if mask.shape == (m.template.n_ops, 1):  # a set of ops on every DP rank
                if mask.any():
                    return every
            elif mask.shape == (1, m.dp_size):  # every op of a set of DP ranks
                used |= mask[0]
            else:
                used |= np.broadcast_to(mask, (m.template.n_ops, m.dp_size)).any(axis=0)
        original = np.flatnonzero(used)
        if len(original) == m.dp_size:
            return every
        if not len(original):
            return every[:1]
        stand_in = int(np.setdiff1d(every, original)[0])
        return np.sort(np.append(original, stand_in))

    def weights(
        self,
        scenario: Scenario,
        out: np.ndarray | None = None,
        columns: np.ndarray | None = None,
        steps: slice | None = None,
    ) -> np.ndarray:
        """Replayed durations ``(ops, steps, len(columns))`` of ``scenario`` on DP ranks
        ``columns`` (default: all) and the steps ``steps`` (default: all), in the program's end
        order."""
        m = self.model
        order = self._end_order
        cols = np.arange(m.dp_size) if columns is None else columns
        span = slice(None) if steps is None else steps
        n_steps = len(range(*span.indices(m.n_steps)))
        shape = (m.template.n_ops, n_steps, len(cols))
        if out is None:
            out = np.empty(shape)
        if scenario.keep is None:
            self._gather(m.transfer, order, cols, span, out)
        else:
            ideal = self._ideal if scenario.ideal is None else scenario.ideal[order]
            keep = np.asarray(scenario.keep, dtype=bool)
            if keep.shape == (m.template.n_ops, 1):  # a set of ops, every DP rank
                out[...] = ideal[:, None, None]
                rows = np.flatnonzero(keep[order, 0])
                picked = np.empty((len(rows), n_steps, len(cols)))
                out[rows] = self._gather(m.transfer, order[rows], cols, span, picked)
            elif keep.shape == (1, m.dp_size):  # every op of a set of DP ranks
                out[...] = ideal[:, None, None]
                for j in np.flatnonzero(keep[0, cols]):
                    m.transfer[:, span, cols[j]].take(order, axis=0, out=out[:, :, j], mode="clip")
            else:
                full = np.broadcast_to(keep, (m.template.n_ops, m.dp_size))[order][:, cols]
                self._gather(m.transfer, order, cols, span, out)
                np.copyto(out, ideal[:, None, None], where=~full[:, None, :])
        if scenario.scale is not None:
            scale = np.broadcast_to(scenario.scale, (m.template.n_ops, m.dp_size))[order]
            out *= scale[:, None, cols]
        return out

    def delays(
        self,
        scenario: Scenario,
        out: np.ndarray,
        columns: np.ndarray | None = None,
        steps: slice | None = None,
    ) -> np.ndarray:
        """Replayed launch delays ``(ops, steps, len(columns))`` of ``scenario`` in the
        program's start order (zero where ``delay_keep`` says so)."""
        m = self.model
        cols = np.arange(m.dp_size) if columns is None else columns
        span = slice(None) if steps is None else steps
        self._gather(m.launch_delay, self.program.start_order, cols, span, out)
        if scenario.delay_keep is not None:
            keep = np.broadcast_to(scenario.delay_keep, (m.template.n_ops, m.dp_size))
            out *= keep[self.program.start_order][:, None, cols]
        return out

    def step_times(
        self,
        scenarios: Sequence[Scenario],
        *,
        progress: ProgressFn | None = None,
        phase: str = "replay",
    ) -> np.ndarray:
        """Step times ``(scenarios, steps)`` of every scenario."""
        m = self.model
        n_ops, n_steps, _ = m.transfer.shape
        out = np.empty((len(scenarios), n_steps))
        columns = [self.columns(s) for s in scenarios]
        # Batches share a width and a launch-delay setting (the others skip the addition).
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, s in enumerate(scenarios):
            groups.setdefault((len(columns[i]), s.launch_delay), []).append(i)
        done = 0
        for (width, with_delay), members in groups.items():
            size = self.batch_size(width)
            chunk = self.steps_per_pass(width)
            spans = [slice(a, min(a + chunk, n_steps)) for a in range(0, n_steps, chunk)]
            for first in range(0, len(members), size):
                batch = members[first : first + size]
                for span in spans:
                    k = span.stop - span.start
                    shape = (n_ops, len(batch), k, width)
                    runs = self._workspace.get("weights", shape)
                    delays = self._workspace.get("delays", shape) if with_delay else None
                    for j, i in enumerate(batch):
                        self.weights(scenarios[i], out=runs[:, j], columns=columns[i], steps=span)
                        if delays is not None:
                            self.delays(
                                scenarios[i], out=delays[:, j], columns=columns[i], steps=span
                            )
                    times, _ = run(
                        self.program,
                        runs.reshape(n_ops, -1, width),
                        None if delays is None else delays.reshape(n_ops, -1, width),
                        workspace=self._workspace,
                    )
                    out[batch, span] = times.reshape(len(batch), k)
                    del runs, delays
                self.replays += len(batch)
                done += len(batch)
                if progress is not None:
                    progress(phase, done, len(scenarios))
        return out

    def timeline(self, scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
        """Start and end ``(ops, steps, dp)`` of every op in ``scenario`` (step-relative)."""
        delays = None
        if scenario.launch_delay:
            delays = np.empty(self.model.launch_delay.shape)
            self.delays(Scenario("all delays"), out=delays)
        _, values = run(self.program, self.weights(scenario), delays, keep_values=True)
        assert values is not None
        return values[self.program.start_node], values[self.program.end_node]
