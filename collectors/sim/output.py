"""The simulator's outputs: the canonical metric table, and a real-time stream of node batches.

Both come from the same chunks and the same delivery order, so ``simulate_table(s)`` equals
``batches_to_table`` of everything ``iter_batches(s)`` yields (rows in the same order for a
one-job scenario; for several jobs the table is job after job, the stream interleaves them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from collectors.sim.delivery import Deliverer, Delivery
from collectors.sim.engine import chunk_count, generate_chunk
from collectors.sim.plan import JobPlan, compile_scenario
from collectors.sim.scenario import Scenario
from minder.core.records import Event, NodeBatch
from minder.core.table import normalize_table, write_table

log = logging.getLogger(__name__)


def _deliveries(plan: JobPlan) -> Iterator[tuple[int, int, Delivery]]:
    """``(first, stop, delivery)``: each chunk's deliveries, due in seconds first … stop-1."""
    deliverer = Deliverer(plan)
    for index in range(chunk_count(plan.duration_s)):
        chunk = generate_chunk(plan, index)
        yield chunk.first, chunk.first + chunk.seconds, deliverer.deliver(chunk, index)


def _code_dtype(size: int) -> type[np.signedinteger]:
    if size < 127:
        return np.int8
    if size < 32_767:
        return np.int16
    return np.int32


@dataclass(frozen=True, slots=True)
class _Codes:
    """Category codes of every job's names in the whole table, categories sorted (the canonical
    order, so that normalising the table needs no pass over its rows)."""

    jobs: list[str]
    machines: list[str]
    metrics: list[str]
    devices: list[str]
    groups: list[str]
    domains: list[str]

    @classmethod
    def of(cls, plans: list[JobPlan]) -> _Codes:
        return cls(
            jobs=sorted({plan.spec.name for plan in plans}),
            machines=sorted({name for plan in plans for name in plan.layout.machines}),
            metrics=sorted({name for plan in plans for name in plan.layout.metrics}),
            devices=sorted({d for plan in plans for d in plan.layout.series_device}),
            groups=sorted({g for plan in plans for g in plan.layout.groups}),
            domains=sorted({d for plan in plans for d in plan.layout.domains}),
        )

    def lookup(self, names: tuple[str, ...] | list[str], categories: list[str]) -> np.ndarray:
        index = {name: code for code, name in enumerate(categories)}
        return np.array([index[n] for n in names], dtype=_code_dtype(len(categories)))


def simulate_table(scenario: Scenario) -> pd.DataFrame:
    """Simulate the whole scenario into a canonical metric table (docs/architecture.md §3.3).

    Rows are job after job; within a job in delivery order (see ``delivery.py``), each batch's
    samples in series order. ``ts`` is the end of the sample's one-second interval.
    """
    plans = compile_scenario(scenario)
    codes = _Codes.of(plans)
    columns: dict[str, list[np.ndarray]] = {
        key: [] for key in ("ts", "value", "job", "machine", "metric", "device", "group", "domain")
    }
    for plan in plans:
        layout = plan.layout
        series_metric = codes.lookup(layout.series_metric, codes.metrics)
        series_device = codes.lookup(layout.series_device, codes.devices)
        machine_code = codes.lookup(layout.machines, codes.machines)
        machine_group = codes.lookup(layout.groups, codes.groups)
        machine_domain = codes.lookup(layout.domains, codes.domains)
        job_code = codes.lookup([plan.spec.name], codes.jobs)
        for _, _, delivery in _deliveries(plan):
            order = delivery.order
            present = delivery.present[order]
            counts = present.sum(axis=1)
            machine = delivery.machine[order]
            columns["ts"].append(
                np.repeat(scenario.start_ts + 1.0 + delivery.second[order], counts)
            )
            columns["value"].append(delivery.values[order][present])
            columns["machine"].append(np.repeat(machine_code[machine], counts))
            columns["group"].append(np.repeat(machine_group[machine], counts))
            columns["domain"].append(np.repeat(machine_domain[machine], counts))
            columns["metric"].append(np.broadcast_to(series_metric, present.shape)[present])
            columns["device"].append(np.broadcast_to(series_device, present.shape)[present])
            columns["job"].append(np.repeat(job_code, int(counts.sum())))
    categories = {
        "job": codes.jobs,
        "machine": codes.machines,
        "metric": codes.metrics,
        "device": codes.devices,
        "group": codes.groups,
        "domain": codes.domains,
    }
    joined: dict[str, object] = {}
    for key, pieces in columns.items():
        if key in categories:
            dtype = _code_dtype(len(categories[key]))
            codes_of = np.concatenate(pieces) if pieces else np.array([], dtype=dtype)
            names = pd.Index(categories[key], dtype="string")  # as read_table gives them
            joined[key] = pd.Categorical.from_codes(codes_of, categories=names)
        else:
            joined[key] = np.concatenate(pieces) if pieces else np.array([], dtype=np.float64)
        pieces.clear()  # free each column's pieces once joined
    # copy=False: setting columns one by one, or consolidating, would copy ~GB more.
    frame = pd.DataFrame(joined, copy=False)
    table = normalize_table(frame)
    log.info("simulated %d rows for %d job(s) over %d s", len(table), len(plans),
             scenario.duration_s)  # fmt: skip
    return table


def iter_batches(
    scenario: Scenario, start_ts: float | None = None
) -> Iterator[tuple[float, list[NodeBatch]]]:
    """Yield, for every second of the scenario, the batches the machines send in it.

    Parameters
    ----------
    scenario
        What to simulate.
    start_ts
        Unix time of the scenario start (default ``scenario.start_ts``); only timestamps move,
        values are the same. The demo passes ``time.time()`` and publishes each second's list
        when the clock reaches its ``ts``.

    Yields
    ------
    tuple[float, list[NodeBatch]]
        ``ts`` (end of the second, unix time) and the batches delivered in it: silent machines
        send none, machines out of the job none but their goodbye (no samples, one ``leave``
        event), a lost GPU's samples are absent, late batches carry their own earlier ``ts``.
        Chunks of seconds are generated as they are needed.
    """
    origin = scenario.start_ts if start_ts is None else float(start_ts)
    plans = compile_scenario(scenario)
    streams = [_job_stream(plan, origin) for plan in plans]
    for second in range(scenario.duration_s):
        batches: list[NodeBatch] = []
        for stream in streams:
            got_second, job_batches = next(stream)
            assert got_second == second
            batches.extend(job_batches)
        yield origin + second + 1.0, batches


def _job_stream(plan: JobPlan, origin: float) -> Iterator[tuple[int, list[NodeBatch]]]:
    layout = plan.layout
    metric_names = np.array(layout.series_metric, dtype=object)
    device_names = np.array(layout.series_device, dtype=object)
    for first, stop, delivery in _deliveries(plan):
        for second in range(first, stop):
            lo, hi = np.searchsorted(delivery.deliver, [second, second + 1])
            rows = delivery.order[lo:hi]
            yield (
                second,
                [_batch(delivery, int(r), plan, metric_names, device_names, origin) for r in rows],
            )


def _batch(
    delivery: Delivery,
    row: int,
    plan: JobPlan,
    metric_names: np.ndarray,
    device_names: np.ndarray,
    origin: float,
) -> NodeBatch:
    mask = delivery.present[row]
    machine = int(delivery.machine[row])
    samples = list(
        zip(
            metric_names[mask].tolist(),
            device_names[mask].tolist(),
            delivery.values[row][mask].tolist(),
            strict=True,
        )
    )
    events = [
        Event(e.kind, e.device, origin + e.offset_s, e.code, e.message)
        for e in delivery.events.get(row, [])
    ]
    return NodeBatch(
        job=plan.spec.name,
        node=plan.layout.machines[machine],
        ts=origin + 1.0 + float(delivery.second[row]),
        interval_s=1.0,
        labels=plan.layout.labels(machine),
        samples=samples,
        events=events,
    )


def write_scenario_table(scenario: Scenario, path: str | Path) -> Path:
    """Simulate ``scenario`` and write its table (Parquet or CSV, by extension)."""
    return write_table(simulate_table(scenario), path)
