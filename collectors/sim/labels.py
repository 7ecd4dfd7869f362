"""Ground truth of a scenario: which machine was faulty, when, with what."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from collectors.sim.plan import injections_of
from collectors.sim.scenario import FaultType, Scenario
from minder.core.errors import ScenarioError

LABEL_COLUMNS = ("job", "machine", "start_ts", "end_ts", "fault", "device", "domain", "fault_index")


def scenario_labels(scenario: Scenario, start_ts: float | None = None) -> pd.DataFrame:
    """One row per faulty machine of every injected fault (confounders are not faults).

    Columns ``job, machine, start_ts, end_ts, fault`` (unix seconds; ``end_ts`` is the
    scenario's end for a fault without duration), then ``device`` (the devices hit, joined by
    ``,``; empty for machine-wide faults), ``domain`` (the machine's failure domain) and
    ``fault_index`` (position in the scenario's ``faults``). A ``switch_reboot`` gives one row
    per machine of the rebooted domain, all with that ``domain`` and the same ``fault_index``:
    a detector may blame the domain or each machine.

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
                }
            )
    frame = pd.DataFrame(rows, columns=list(LABEL_COLUMNS))
    return frame.astype({"start_ts": "float64", "end_ts": "float64", "fault_index": "int64"})


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
