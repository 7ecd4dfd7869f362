"""The true slowdown S of a simulated straggler, measured by the what-if replay on the simulator's
op trace (docs/whatif-method.md §3): the live estimate of the straggler detector and the offline
analysis check each other.

S is ``T_orig / T_ideal``, the mean step time replayed with the ops' recorded durations over the
one replayed with every op at its ideal duration (compute: the mean of its type over every rank
and step of the span; communication: its median transfer), the two replays behind
:func:`whatif.analysis.analyze`'s ``slowdown``. Only those two are run: the per-rank
attributions of the full analysis would replay a 2,048-rank job 2,048 more times.
"""

from __future__ import annotations

import numpy as np

from collectors.sim import Scenario
from collectors.sim.optrace import op_table
from minder.benchmark.evaluate import SlowdownReplay
from whatif.model import build_model
from whatif.scenarios import Replayer
from whatif.scenarios import Scenario as Replay
from whatif.trace import JobMeta, make_trace

REPLAY_MAX_STEPS = 120
"""Steps replayed at most per span, evenly spaced (a 256 x 8-rank job: about 3 s)."""


def replayed_slowdown(
    scenario: Scenario,
    start_s: float,
    end_s: float,
    *,
    job: int = 0,
    last_steps: int | None = None,
    max_steps: int = REPLAY_MAX_STEPS,
) -> float | None:
    """S of job ``job``'s steps in ``[start_s, end_s]`` (scenario seconds) by the what-if replay
    of its op trace (:func:`collectors.sim.optrace.op_table`); None for an asynchronous job (no
    shared step to replay) or a span in which no step completes."""
    spec = scenario.jobs[job]
    if not spec.sync or end_s <= start_s:
        return None
    frame = op_table(
        scenario, job=job, start_s=start_s, end_s=end_s, last_steps=last_steps, max_steps=max_steps
    )
    if frame.empty:
        return None
    meta = JobMeta(dp_size=spec.machines * spec.gpus_per_machine, pp_size=1, name=spec.name)
    model = build_model(make_trace(frame, meta, source=f"simulated:{spec.name}"))
    none = np.zeros((model.template.n_ops, 1), dtype=bool)
    original, ideal = Replayer(model).step_times([Replay("original"), Replay("ideal", keep=none)])
    t_ideal = float(ideal.mean())
    return float(original.mean()) / t_ideal if t_ideal > 0 else None


def slowdown_replay(scenario: Scenario, job: int = 0) -> SlowdownReplay:
    """The :data:`~minder.benchmark.evaluate.SlowdownReplay` of one simulated job (its
    ``CaseRun.replay``)."""

    def replay(start_ts: float, end_ts: float, last_steps: int | None) -> float | None:
        return replayed_slowdown(
            scenario,
            start_ts - scenario.start_ts,
            end_ts - scenario.start_ts,
            job=job,
            last_steps=last_steps,
        )

    return replay
