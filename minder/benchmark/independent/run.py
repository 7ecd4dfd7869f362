"""Run detector variants over an independent suite at each sampling interval and score them with
the benchmark's matching.

Each case's table is generated at the interval (no resampling: the generator writes what a
scrape at that interval reads) and replayed by :func:`detectors.offline.detect_table`, the
offline path of the ``minder`` method (the same window and detector as the service; the
simulator's replay gives the same alerts on a table without late samples). Variants, the trained
model and the detector factories are those of :func:`minder.benchmark.runner.run_benchmark`
(trained on the simulator's training suite, so nothing is trained or tuned on these cases), and
scoring is :func:`minder.benchmark.evaluate.summarize` with the runner's slack per interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from detectors.offline import detect_table
from minder.benchmark.evaluate import CaseRun, Summary
from minder.benchmark.independent.cases import (
    INDEPENDENT_STREAM,
    SUITES,
    IndependentCase,
    build_independent_suite,
)
from minder.benchmark.runner import (
    BenchOptions,
    RunProgress,
    VariantResult,
    command_line,
    plan_variants,
    prepare_variants,
    variant_rows,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class IndependentResult:
    """Everything one run of an independent suite measured."""

    options: BenchOptions
    cases: dict[int, list[IndependentCase]]
    """The cases run at each interval."""
    rows: list[VariantResult]
    notes: list[str] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    generate_cpu_s: float = 0.0
    learnt_intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per interval (``"15"``) and case, the sampling interval the detector's window learnt."""

    @property
    def command(self) -> str:
        """The command line that reproduces this run."""
        return command_line(self.options)

    def per_cadence(self) -> list[dict[str, Any]]:
        """One entry per row: the figures the suite is reported by."""
        out = []
        for row in self.rows:
            summary = row.summary
            interval = row.variant.interval_s
            latency = summary.overall.latency.median
            out.append(
                {
                    "variant": row.variant.label,
                    "method": row.variant.method,
                    "interval_s": interval,
                    "cases_run": row.cases_run,
                    "precision": summary.overall.precision,
                    "recall": summary.overall.recall,
                    "f1": summary.overall.f1,
                    "false_alarms": summary.false_alarms.count,
                    "fault_free_machine_hours": summary.false_alarms.machine_hours,
                    "false_alarms_per_1000_machine_hours": (
                        summary.false_alarms.per_1000_machine_hours
                    ),
                    "stray_job_alerts": summary.stray_job_alerts.count,
                    "onset_to_alert_median_s": latency,
                    "onset_to_alert_median_samples": (
                        None if latency is None else latency / interval
                    ),
                    "recall_by_fault": recall_by_fault(summary),
                }
            )
        return out

    def to_dict(self, with_cases: bool = True) -> dict[str, Any]:
        """Plain data for ``--format json`` / ``--output``."""
        suites: dict[str, Any] = {}
        for interval, cases in self.cases.items():
            free = [c for c in cases if c.is_fault_free]
            faults: dict[str, int] = {}
            for case in cases:
                for fault in case.spec.faults:
                    faults[fault.kind] = faults.get(fault.kind, 0) + 1
            suites[str(interval)] = {
                "cases": len(cases),
                "faulty_cases": len(cases) - len(free),
                "fault_free_cases": len(free),
                "fault_free_machine_hours": sum(c.machine_hours for c in free),
                "machine_hours": sum(c.machine_hours for c in cases),
                "sizes": sorted({c.machines for c in cases}),
                "faults": dict(sorted(faults.items())),
            }
        return {
            "command": self.command,
            "suite": self.options.suite,
            "seed": self.options.seed,
            "seed_stream": INDEPENDENT_STREAM,
            "never_tuned": True,
            "train": self.options.train,
            "detection_path": "detectors.offline.detect_table",
            "per_cadence": self.per_cadence(),
            "suite_summary": suites,
            "cases": {
                str(interval): [c.to_dict() for c in cases]
                for interval, cases in self.cases.items()
            },
            "learnt_intervals": self.learnt_intervals,
            "training": self.training,
            "notes": self.notes,
            "rows": [r.to_dict(with_cases) for r in self.rows],
            "wall_s": round(self.wall_s, 2),
            "generate_cpu_s": round(self.generate_cpu_s, 2),
        }


def recall_by_fault(summary: Summary) -> dict[str, dict[str, Any]]:
    """Per fault class: instances, detected, recall (two-fault jobs count under each fault's
    own class)."""
    return {
        kind: {"instances": s.instances, "detected": s.detected, "recall": s.recall}
        for kind, s in summary.by_fault.items()
        if s.instances
    }


def run_independent(
    options: BenchOptions,
    *,
    cases: Sequence[IndependentCase] | None = None,
    progress: RunProgress | None = None,
) -> IndependentResult:
    """Run every variant of ``options`` over the independent suite ``options.suite`` (or over
    ``cases``: at each interval, those generated at it) and score them per interval."""
    if options.suite not in SUITES and cases is None:
        raise ValueError(
            f"suite {options.suite!r} is not an independent suite: expected one of "
            f"{', '.join(SUITES)}"
        )
    began = time.perf_counter()
    variants = plan_variants(options)
    intervals = list(dict.fromkeys(v.interval_s for v in variants))
    by_interval: dict[int, list[IndependentCase]] = {}
    for interval in intervals:
        if cases is None:
            by_interval[interval] = build_independent_suite(options.suite, options.seed, interval)
        else:
            by_interval[interval] = [c for c in cases if c.interval_s == interval]
    total = sum(len(by_interval[v.interval_s]) for v in variants)
    notes: list[str] = []
    prepared, failed, training = prepare_variants(options, variants, notes, progress, total)

    runs: dict[str, list[CaseRun]] = {p.variant.label: [] for p in prepared}
    skipped: dict[str, list[dict[str, Any]]] = {p.variant.label: [] for p in prepared}
    errors: dict[str, list[dict[str, Any]]] = {p.variant.label: [] for p in prepared}
    learnt: dict[str, dict[str, float]] = {}
    generate_cpu = 0.0
    done = 0.0
    for interval in intervals:
        at_interval = [p for p in prepared if p.variant.interval_s == interval]
        for case in by_interval[interval]:
            todo = []
            for p in at_interval:
                limit = options.max_machines.get(p.variant.method, 0)
                if limit and case.machines > limit:
                    reason = f"{case.machines} machines > {limit} for {p.variant.method}"
                    skipped[p.variant.label].append(
                        {"case": case.name, "machines": case.machines, "reason": reason}
                    )
                    done += 1
                else:
                    todo.append(p)
            if not todo:
                continue
            tic = time.process_time()
            table = case.table()
            labels = case.labels()
            generate_cpu += time.process_time() - tic
            for p in todo:
                label = f"{p.variant.label} · {case.name}"
                if progress is not None:
                    progress(label, done, total)
                tic = time.process_time()
                try:
                    detected = detect_table(table, p.factory)
                except Exception as exc:  # one failing case must not lose a long run
                    logger.exception("%s failed on %s", p.variant.label, case.name)
                    errors[p.variant.label].append(
                        {"case": case.name, "error": f"{type(exc).__name__}: {exc}"}
                    )
                else:
                    cpu = time.process_time() - tic
                    job = detected.jobs.get(case.name, {})
                    seen = job.get("interval_s")
                    if seen is not None:
                        learnt.setdefault(str(interval), {})[case.name] = seen
                        if seen != interval:
                            notes.append(
                                f"{p.variant.label}: the window of {case.name} learnt an "
                                f"interval of {seen:g} s, not {interval} s"
                            )
                    runs[p.variant.label].append(
                        CaseRun(
                            name=case.name,
                            fault=case.fault,
                            machines=case.machines,
                            labels=labels,
                            alerts=detected.alerts,
                            detect_cpu_s=cpu,
                            job_seconds=float(case.duration_s),
                            machine_seconds=float(case.machines * case.duration_s),
                            step_s=case.spec.step_s,
                        )
                    )
                done += 1
                if progress is not None:
                    progress(label, done, total)
            del table

    rows = variant_rows(prepared, variants, runs, skipped, errors, failed)
    return IndependentResult(
        options=options,
        cases=by_interval,
        rows=rows,
        notes=notes,
        training=training,
        wall_s=time.perf_counter() - began,
        generate_cpu_s=generate_cpu,
        learnt_intervals=learnt,
    )
