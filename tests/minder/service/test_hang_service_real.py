"""Every real hang, live: the dumps of real hung gloo jobs (:mod:`hang_jobs`), summarised as each
node's agent summarises them, reach the detection service in node batches beside the ranks' step
counters; the service names exactly the injected ranks, with their reasons, and raises a
``hang`` alert for exactly the machines that hold them, wherever the culprit wrote no dump.

Two ranks per node (rank ``r`` on ``n<r // 2>``): the step probe's ``rank<r>`` devices say
where a rank without a dump runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from collectors.flight_recorder import read_summary
from detectors.methods import default_factory
from minder.core.alert import AlertKind
from minder.core.hang import RankSummary
from minder.core.records import NodeBatch
from minder.service.engine import DetectionService

CASES = ("skip", "gil", "sigkill", "size", "two_groups", "subgroup")
T0 = 1_800_000_000
HANG_AT = 40
"""Seconds of stepping (one step a second) before the hang."""
DUMPS_AT = 48
END = 90


def node_of(rank: int) -> str:
    return f"n{rank // 2}"


def _summaries(case: Any) -> dict[str, list[RankSummary]]:
    """Each node's summaries of its own ranks' dumps, as its agent sends them."""
    out: dict[str, list[RankSummary]] = {}
    for rank in case.dumping_ranks:
        node = node_of(rank)
        path = case.pickle_dir / f"{case.prefix}{rank}"
        out.setdefault(node, []).append(read_summary(path, prefix=case.prefix, node=node))
    return out


def _run(case: Any) -> DetectionService:
    clock = [float(T0)]
    service = DetectionService(default_factory(), clock=lambda: clock[0], grace_s=0.0)
    summaries = _summaries(case)
    nodes = sorted({node_of(r) for r in range(case.world)})
    for sec in range(END):
        ts = float(T0 + sec)
        step = min(sec, HANG_AT)
        batches = []
        for node in nodes:
            ranks = [r for r in range(case.world) if node_of(r) == node]
            samples = [("train_step_number", f"rank{r}", float(step)) for r in ranks]
            if sec <= HANG_AT:
                samples += [("train_step_seconds", f"rank{r}", 1.0) for r in ranks]
            batch = NodeBatch("job", node, ts, samples=samples)
            if sec == DUMPS_AT:
                batch.flight_recorder = summaries.get(node, [])
            batches.append(batch)
        clock[0] = ts + 1.0
        service.ingest(batches)
        service.tick()
    return service


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_the_service_names_exactly_the_injected_ranks_and_their_machines(
    name: str, real_hang_dumps: Any
) -> None:
    case = real_hang_dumps[name]
    service = _run(case)
    hang = service.jobs["job"].hang
    assert hang is not None and hang.hung
    assert {c.rank: c.reason for c in hang.culprits} == dict(case.culprits)
    machine_alerts = [a for a in service.alerts if a.kind is AlertKind.HANG and a.machine]
    expected_machines = {node_of(r) for r in case.culprits}
    assert {a.machine for a in machine_alerts} == expected_machines
    named = {r for a in machine_alerts for r in a.evidence["culprit_ranks"]}
    assert named == set(case.culprits)
    job_alerts = [a for a in service.alerts if a.kind is AlertKind.HANG and not a.machine]
    assert job_alerts, "no job-level hang alert"
    assert {a.first_ts for a in job_alerts} == {job_alerts[0].first_ts}, "one hang, one episode"
    # nothing else is named: the waiting ranks' machines raise nothing
    others = [a for a in service.alerts if a.machine and a.machine not in expected_machines]
    assert others == []
