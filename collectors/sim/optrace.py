"""The op trace of a simulated job, in the canonical op table of job traces (docs/architecture.md
§3.5), so that the what-if analysis can replay what the simulator ran.

The simulator runs a synchronous job as one data-parallel step shared by every rank: each rank
computes (its busy time: the step's compute, times a straggler's factor while it is slow), then
all meet in one blocking collective that ends the step, so every rank waits there for the
slowest. The trace says exactly that, step by step: per rank a forward and a backward compute
op (a third and two thirds of its busy time, a host-bound phase of the step included) and a
``grads-reduce-scatter`` from the end of its compute to the end of the job's step (its wait
included, as a profiler records it). Every rank is a DP worker of stage 0: the job's
``pp_stages`` are the detector's peer groups, not a pipeline schedule the simulator runs. Noise
of the reported samples is not in the trace: it is what the job ran, not what its probes
measured.

An asynchronous job has no shared step to replay (each rank keeps its own pace): refused.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collectors.sim.plan import compile_scenario
from collectors.sim.scenario import Scenario
from minder.core.errors import ScenarioError

FORWARD = "forward-compute"
BACKWARD = "backward-compute"
COLLECTIVE = "grads-reduce-scatter"
"""Op types of the trace (``whatif.optypes``: the op table's names)."""
OP_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")


def op_table(
    scenario: Scenario,
    *,
    job: int = 0,
    start_s: float = 0.0,
    end_s: float | None = None,
    last_steps: int | None = None,
    max_steps: int | None = None,
) -> pd.DataFrame:
    """The op table of job ``job``'s steps that start at or after ``start_s`` and end by
    ``end_s`` (scenario seconds; default: the scenario's end).

    Parameters
    ----------
    last_steps
        Only the last this many of those steps (the steps a detector had seen when it alerted).
    max_steps
        At most this many steps, evenly spaced over the span (the cost of a replay grows with
        the steps; each step of a synchronous job is replayed on its own, so thinning keeps the
        mean step time).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`OP_COLUMNS`, times in scenario seconds; ``step`` is the job's step index.
        Empty when no step completes in the span.

    Raises
    ------
    ScenarioError
        ``job`` is not a job of the scenario, the job is asynchronous, the span is empty, or a
        step count is below 1.
    """
    if not 0 <= job < len(scenario.jobs):
        raise ScenarioError(f"job {job!r}: expected an index in 0..{len(scenario.jobs) - 1}")
    spec = scenario.jobs[job]
    if not spec.sync:
        raise ScenarioError(
            f"job {spec.name!r} is asynchronous: expected a synchronous job (the what-if replay "
            "models steps every rank shares)"
        )
    end = float(scenario.duration_s if end_s is None else end_s)
    if not end > start_s:
        raise ScenarioError(f"span [{start_s!r}, {end_s!r}): expected start_s < end_s")
    for name, value in (("last_steps", last_steps), ("max_steps", max_steps)):
        if value is not None and value < 1:
            raise ScenarioError(f"{name} is {value!r}: expected at least 1")
    plan = compile_scenario(scenario)[job]
    timeline = plan.timeline
    starts, ends = timeline.it_start, timeline.it_end
    steps = np.flatnonzero((starts >= start_s) & np.isfinite(ends) & (ends <= end))
    if last_steps is not None:
        steps = steps[-last_steps:]
    if max_steps is not None and len(steps) > max_steps:
        steps = steps[np.unique(np.linspace(0, len(steps) - 1, max_steps).round().astype(int))]
    n, g = spec.machines, spec.gpus_per_machine
    busy = np.broadcast_to(timeline.it_compute[steps][:, None, None], (len(steps), n, g)).copy()
    for pace in plan.paces:
        busy[:, pace.cells] = pace.busy[steps][:, None]
    # A step's host-bound phase (host_fraction) is busy time outside the collective too.
    busy += timeline.it_host[steps][:, None, None]
    ranks = n * g
    busy = busy.reshape(len(steps), ranks)
    begin = np.broadcast_to(starts[steps][:, None], busy.shape)
    finish = np.broadcast_to(ends[steps][:, None], busy.shape)
    rank = np.broadcast_to(np.arange(ranks)[None, :], busy.shape).ravel()
    step = np.broadcast_to(steps[:, None], busy.shape).ravel()
    parts = [
        (FORWARD, begin, busy / 3.0),
        (BACKWARD, begin + busy / 3.0, 2.0 * busy / 3.0),
        (COLLECTIVE, begin + busy, np.maximum(finish - begin - busy, 0.0)),
    ]
    frames = [
        pd.DataFrame(
            {
                "dp_rank": rank,
                "stage": 0,
                "rank": rank,
                "step": step,
                "optype": optype,
                "start_ts": start.ravel(),
                "duration": duration.ravel(),
            }
        )
        for optype, start, duration in parts
    ]
    return pd.concat(frames, ignore_index=True)
