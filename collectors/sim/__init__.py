"""Cluster simulator: machines of GPU training jobs at 1 Hz, with injected faults.

Public API (the CLI's ``minder simulate`` calls these)::

    scenario = load_scenario(path)              # or Scenario.model_validate(dict)
    scenario = resolve_scenario("demo")         # a file, or the name of a bundled one
    table = simulate_table(scenario)            # canonical metric table (docs/architecture.md §3.3)
    write_scenario_table(scenario, "out.parquet")
    for ts, batches in iter_batches(scenario, start_ts=time.time()): ...
    labels = scenario_labels(scenario)          # ground truth per faulty machine
    bundled_scenario("demo")                    # path of a shipped example
"""

from collectors.sim.labels import scenario_labels, write_scenario_labels
from collectors.sim.output import iter_batches, simulate_table, write_scenario_table
from collectors.sim.scenario import (
    DEFAULT_METRICS,
    ConfounderSpec,
    ConfounderType,
    FaultSpec,
    FaultType,
    FleetSpec,
    JobSpec,
    Scenario,
    bundled_scenario,
    bundled_scenarios,
    load_scenario,
    resolve_scenario,
)

__all__ = [
    "DEFAULT_METRICS",
    "ConfounderSpec",
    "ConfounderType",
    "FaultSpec",
    "FaultType",
    "FleetSpec",
    "JobSpec",
    "Scenario",
    "bundled_scenario",
    "bundled_scenarios",
    "iter_batches",
    "load_scenario",
    "resolve_scenario",
    "scenario_labels",
    "simulate_table",
    "write_scenario_labels",
    "write_scenario_table",
]
