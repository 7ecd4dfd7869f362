"""Offline detection speed on the bundled scenarios: CPU seconds per second of job data.

Run: ``python bench/detect_speed.py [SCENARIO ...]`` (default: demo three-faults fault-free).
Prints, per scenario, machines, series per machine, rows, simulation time, detection CPU time,
CPU seconds per job-second, and the alerts against the injected faults.
"""

from __future__ import annotations

import sys
import time

from collectors.sim import bundled_scenario, load_scenario, scenario_labels, simulate_table
from detectors.offline import detect_table


def main(names: list[str]) -> None:
    print(f"{'scenario':14} {'machines':>8} {'series/m':>8} {'rows':>11} {'sim s':>6} "
          f"{'detect cpu s':>12} {'cpu s/job-s':>11}  alerts (injected)")  # fmt: skip
    for name in names:
        scenario = load_scenario(bundled_scenario(name))
        t0 = time.perf_counter()
        table = simulate_table(scenario)
        sim_s = time.perf_counter() - t0
        c0 = time.process_time()
        run = detect_table(table)
        cpu = time.process_time() - c0
        machines = sum(job.machines for job in scenario.jobs)
        series = table.groupby("machine", observed=True).size().mean() / scenario.duration_s
        injected = sorted(set(scenario_labels(scenario)["machine"]))
        named = sorted({a.machine for a in run.alerts})
        print(
            f"{name:14} {machines:8d} {series:8.0f} {len(table):11,d} {sim_s:6.1f} {cpu:12.1f} "
            f"{cpu / scenario.duration_s:11.4f}  {named} ({injected})"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or ["demo", "three-faults", "fault-free"])
