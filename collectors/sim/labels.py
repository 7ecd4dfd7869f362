"""Ground truth of a scenario: which machine was faulty, when, with what."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from collectors.sim.faults import straggler_slowdown
from collectors.sim.kinds import STRAGGLER_FAULTS
from collectors.sim.plan import injections_of
from collectors.sim.scenario import FaultType, Scenario
from minder.core.errors import ScenarioError

LABEL_COLUMNS = (
    "job",
    "machine",
    "start_ts",
    "end_ts",
    "fault",
    "device",
    "domain",
    "fault_index",
    "group",
    "slowdown",
)


def scenario_labels(scenario: Scenario, start_ts: float | None = None) -> pd.DataFrame:
    """One row per faulty machine of every injected fault (confounders are not faults).

    Columns ``job, machine, start_ts, end_ts, fault`` (unix seconds; ``end_ts`` is the
    scenario's end for a fault without duration), then ``device`` (the devices hit, joined by
    ``,``; empty for machine-wide faults), ``domain`` (the machine's failure domain) and
    ``fault_index`` (position in the scenario's ``faults``), ``group`` (the machine's peer group,
    its PP stage) and ``slowdown``. A ``switch_reboot`` gives one row per machine of the
    rebooted domain, all with that ``domain`` and the same ``fault_index``: a detector may
    blame the domain or each machine. Stragglers likewise give one row per slow machine
    (a ``slow_stage`` every machine of its ``group``, a ``slow_group`` each of its machines);
    ``device`` lists the slow ranks when not all of a machine's are; and ``slowdown`` is the
    slowdown S the straggler causes while slow (step time observed over step time with the
    slow ranks at the mean busy time, from the job's nominal rhythm, to 3 decimals; see
    :func:`collectors.sim.faults.straggler_slowdown`), NaN for the other faults.
    ``job_wide_slowdown`` is a confounder: no row.

    ``start_ts`` moves the times as ``iter_batches(scenario, start_ts)`` does.
    """
    origin = scenario.start_ts if start_ts is None else float(start_ts)
    rows = []
    for injection in injections_of(scenario):
        if not isinstance(injection.kind, FaultType):
            continue
        target = injection.target
        job = scenario.jobs[target.job]
        names = job.machine_names()
        devices = [job.gpu_names()[g] for g in target.gpus] + [
            job.nic_names()[k] for k in target.nics
        ]
        slowdown = math.nan
        if injection.kind in STRAGGLER_FAULTS:
            slowdown = round(straggler_slowdown(injection, job), 3)
            if len(target.ranks) < job.gpus_per_machine:
                devices = [job.rank_names()[r] for r in target.ranks]
        for machine in target.machines:
            rows.append(
                {
                    "job": job.name,
                    "machine": names[machine],
                    "start_ts": origin + target.start_s,
                    "end_ts": origin + target.end_s,
                    "fault": injection.kind.value,
                    "device": ",".join(devices),
                    "domain": job.domain_of(machine),
                    "fault_index": injection.index,
                    "group": job.group_of(machine),
                    "slowdown": slowdown,
                }
            )
    frame = pd.DataFrame(rows, columns=list(LABEL_COLUMNS))
    return frame.astype(
        {"start_ts": "float64", "end_ts": "float64", "fault_index": "int64", "slowdown": "float64"}
    )


def write_scenario_labels(
    scenario: Scenario, path: str | Path, start_ts: float | None = None
) -> Path:
    """Write :func:`scenario_labels` as CSV (``.csv`` or ``.csv.gz``)."""
    path = Path(path)
    if not str(path).lower().endswith((".csv", ".csv.gz")):
        raise ScenarioError(f"labels file {str(path)!r}: expected a .csv or .csv.gz name")
    path.parent.mkdir(parents=True, exist_ok=True)
    scenario_labels(scenario, start_ts).to_csv(path, index=False, float_format="%.3f")
    return path
