"""Score alerts against a suite's ground truth: precision, recall, F1, latency, false alarms, CPU.

Matching (per case, against :func:`collectors.sim.labels.scenario_labels`):

* A machine alert is a true positive when its ``machine`` is a faulty machine of the case and its
  ``detected_ts`` falls in ``[floor(start_ts), end_ts + slack_s]`` of that machine's label
  (``detected_ts`` is a whole second of the detector's window: an agent's event at the onset is
  taken in the second that holds it).
* A domain alert (``machine`` is the domain's name, ``evidence["domain_members"]`` its machines)
  is a true positive when it names the domain of a ``switch_reboot`` within the same span.
* A stage straggler alert (``evidence["verdict"] == "stage"``, ``machine`` the group's name) is
  a true positive when it names the group of a ``slow_stage`` label within the same span.
* Each fault instance (``fault_index``) is detected when at least one true positive matches it;
  its onset-to-alert latency is the first such alert's ``detected_ts`` minus the fault's
  ``start_ts`` (0 at least). Further alerts on the same instance (one alert per machine of a
  rebooted switch, a second alert on the same machine) are *duplicates*: reported, and left out
  of precision altogether, so a method that names each machine of a domain is neither rewarded
  nor punished against one that names the domain once.
* A job-level alert (``machine`` empty: a hang, the whole job stopped) names no machine, so it
  is neither a hit nor a false positive of the attribution figures. Within a fault's span (as a
  machine alert would be matched), or at any time after the onset of a fail-stop fault (one
  that halts the job stalls its steps until the end), it is the fault's. Anywhere else, and in
  every fault-free case, it is a *stray job alert* (a checkpoint the loop did not report,
  taken for a hang): listed per case and counted apart (:class:`JobAlerts`), never hidden. A
  hang's culprit machines have alerts of their own, and those are matched like any machine
  alert.
* Every other alert is a false positive; those of fault-free cases are the false alarms per
  1000 machine-hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from minder.benchmark.suite import FAIL_SLOW, FAIL_STOP
from minder.core.alert import Alert

SLACK_S = 60.0
"""Seconds after a fault's end in which an alert still counts as detecting it."""

SlowdownReplay = Callable[[float, float, int | None], float | None]
"""``replay(start_ts, end_ts, last_steps)``: the true slowdown S of a case's job over its steps in
``[start_ts, end_ts]`` (unix seconds; only the last ``last_steps`` of them when given), measured
by the what-if replay (:func:`minder.benchmark.truth.slowdown_replay`); None where it cannot be
(an asynchronous job, no step completed)."""


@dataclass(slots=True)
class CaseRun:
    """One detector's alerts on one case, with what the case covered.

    Attributes
    ----------
    name
        The case's name.
    fault
        The case's fault type, or None for a fault-free case.
    machines
        Machines of the case's job.
    labels
        Ground truth (columns of ``scenario_labels``); empty for a fault-free case.
    alerts
        What the detector raised.
    detect_cpu_s
        CPU seconds of detection.
    job_seconds, machine_seconds
        Seconds of the job, and machines times seconds.
    """

    name: str
    fault: str | None
    machines: int
    labels: pd.DataFrame
    alerts: list[Alert]
    detect_cpu_s: float
    job_seconds: float
    machine_seconds: float
    step_s: float = 0.0
    """The job's nominal step time (stragglers are counted in steps)."""
    replay: SlowdownReplay | None = None
    """The true S by the what-if replay of the simulated job (None: the labels' S only)."""

    @property
    def is_fault_free(self) -> bool:
        """No fault injected."""
        return self.fault is None


@dataclass(frozen=True, slots=True)
class Instance:
    """One injected fault and what the detector made of it.

    Attributes
    ----------
    case, fault_index, fault
        Where it was injected and what it was.
    start_ts, end_ts
        Its span (unix seconds).
    machines
        The faulty machines (all of a switch's for a ``switch_reboot``).
    first_alert_ts
        ``detected_ts`` of its first true positive; None when missed.
    alerts
        True positives that matched it.
    """

    case: str
    fault_index: int
    fault: str
    start_ts: float
    end_ts: float
    machines: tuple[str, ...]
    first_alert_ts: float | None
    alerts: int

    @property
    def detected(self) -> bool:
        """At least one true positive."""
        return self.first_alert_ts is not None

    @property
    def latency_s(self) -> float | None:
        """Onset to first alert, seconds."""
        if self.first_alert_ts is None:
            return None
        return max(0.0, self.first_alert_ts - self.start_ts)


@dataclass(frozen=True, slots=True)
class AlertMatch:
    """One alert and the fault instance it matched (None: a false positive)."""

    alert: Alert
    fault_index: int | None
    duplicate: bool = False

    @property
    def true_positive(self) -> bool:
        """It named a faulty machine (or domain) in time."""
        return self.fault_index is not None


@dataclass(frozen=True, slots=True)
class CaseMatch:
    """Every alert and every fault instance of one case, matched."""

    run: CaseRun
    alerts: tuple[AlertMatch, ...]
    instances: tuple[Instance, ...]
    stray_job_alerts: tuple[Alert, ...] = ()
    """Job-level alerts no fault explains (see the module's rules)."""

    @property
    def true_positives(self) -> int:
        """Alerts that matched a fault."""
        return sum(a.true_positive for a in self.alerts)

    @property
    def false_positives(self) -> int:
        """Alerts that matched none."""
        return len(self.alerts) - self.true_positives

    @property
    def duplicates(self) -> int:
        """True positives after the first of their instance."""
        return sum(a.duplicate for a in self.alerts)

    def to_dict(self) -> dict[str, Any]:
        """Per-case figures for the JSON report."""
        latencies = [i.latency_s for i in self.instances if i.latency_s is not None]
        return {
            "case": self.run.name,
            "fault": self.run.fault,
            "machines": self.run.machines,
            "alerts": len(self.alerts),
            "tp_alerts": self.true_positives,
            "fp_alerts": self.false_positives,
            "duplicates": self.duplicates,
            "instances": len(self.instances),
            "detected": sum(i.detected for i in self.instances),
            "onset_to_alert_s": latencies,
            "false_positives": [
                {
                    "machine": m.alert.machine,
                    "kind": m.alert.kind.value,
                    "metric": m.alert.metric,
                    "devices": list(m.alert.devices),
                    "score": round(float(m.alert.score), 3),
                    "first_ts": m.alert.first_ts,
                    "detected_ts": m.alert.detected_ts,
                }
                for m in self.alerts
                if not m.true_positive
            ],
            "stray_job_alerts": [
                {
                    "kind": a.kind.value,
                    "metric": a.metric,
                    "first_ts": a.first_ts,
                    "detected_ts": a.detected_ts,
                }
                for a in self.stray_job_alerts
            ],
            "detect_cpu_s": round(self.run.detect_cpu_s, 4),
        }


def _is_domain_alert(alert: Alert) -> bool:
    return bool(alert.domain) and (
        alert.machine == alert.domain or "domain_members" in alert.evidence
    )


def match_case(run: CaseRun, slack_s: float = SLACK_S) -> CaseMatch:
    """Match ``run``'s alerts to its labels (see the module's rules)."""
    labels = run.labels
    by_machine: dict[str, list[tuple[float, float, int]]] = {}
    by_domain: dict[str, list[tuple[float, float, int]]] = {}
    by_stage: dict[str, list[tuple[float, float, int]]] = {}
    spans: dict[int, dict[str, Any]] = {}
    for row in labels.to_dict("records"):
        index = int(row["fault_index"])
        span = (float(row["start_ts"]), float(row["end_ts"]), index)
        machine, fault = str(row["machine"]), str(row["fault"])
        by_machine.setdefault(machine, []).append(span)
        if fault == "switch_reboot":
            by_domain.setdefault(str(row["domain"]), []).append(span)
        if fault == "slow_stage" and row.get("group"):
            by_stage.setdefault(str(row["group"]), []).append(span)
        info = spans.setdefault(
            index, {"fault": fault, "start": span[0], "end": span[1], "machines": []}
        )
        info["machines"].append(machine)
    matches: list[AlertMatch] = []
    stray: list[Alert] = []
    first: dict[int, float] = {}
    count: dict[int, int] = {}
    for alert in sorted(run.alerts, key=lambda a: (a.detected_ts, a.machine, a.metric)):
        if not alert.machine:
            # A job-level alert (a hang: the whole job stopped) names no machine: a verdict on
            # the job, not an attribution (its culprits come as alerts of their own); within a
            # fault's span, or after a fail-stop fault's onset, the fault's; else a stray.
            during = any(
                math.floor(info["start"]) <= alert.detected_ts
                and (info["fault"] in FAIL_STOP or alert.detected_ts <= info["end"] + slack_s)
                for info in spans.values()
            )
            if not during:
                stray.append(alert)
            continue
        if alert.evidence.get("verdict") == "stage":
            table = by_stage  # a stage straggler names its group
        else:
            table = by_domain if _is_domain_alert(alert) else by_machine
        candidates = [
            (start, index)
            for start, end, index in table.get(alert.machine, [])
            if math.floor(start) <= alert.detected_ts <= end + slack_s
        ]
        if not candidates:
            matches.append(AlertMatch(alert, None))
            continue
        index = min(candidates)[1]
        duplicate = index in first
        first.setdefault(index, alert.detected_ts)
        count[index] = count.get(index, 0) + 1
        matches.append(AlertMatch(alert, index, duplicate))
    instances = tuple(
        Instance(
            case=run.name,
            fault_index=index,
            fault=info["fault"],
            start_ts=info["start"],
            end_ts=info["end"],
            machines=tuple(info["machines"]),
            first_alert_ts=first.get(index),
            alerts=count.get(index, 0),
        )
        for index, info in sorted(spans.items())
    )
    return CaseMatch(run, tuple(matches), instances, tuple(stray))


# -- summaries -------------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else num / den


def f1_score(precision: float | None, recall: float | None) -> float | None:
    """Harmonic mean; 0 when either is 0 or undefined (no alert) while faults exist."""
    if recall is None:
        return None
    if precision is None or precision + recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Onset-to-alert latencies of detected instances (seconds)."""

    n: int
    median: float | None
    p95: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencyStats:
        """Statistics of ``values`` (all None when empty)."""
        if not values:
            return cls(0, None, None, None)
        array = np.asarray(values, dtype=np.float64)
        return cls(
            len(values),
            float(np.median(array)),
            float(np.percentile(array, 95)),
            float(array.max()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median": self.median, "p95": self.p95, "max": self.max}


@dataclass(frozen=True, slots=True)
class Scores:
    """Precision, recall and F1 over some alerts and fault instances.

    ``precision`` is None when there was no alert, ``recall`` None when there was no fault.
    """

    alerts: int
    tp_alerts: int
    fp_alerts: int
    duplicates: int
    instances: int
    detected: int
    precision: float | None
    recall: float | None
    f1: float | None
    latency: LatencyStats

    @classmethod
    def of(cls, matches: Iterable[AlertMatch], instances: Iterable[Instance]) -> Scores:
        """Scores of these alerts and these instances."""
        matches = list(matches)
        instances = list(instances)
        tp = sum(m.true_positive for m in matches)
        duplicates = sum(m.duplicate for m in matches)
        detected = sum(i.detected for i in instances)
        precision = _ratio(tp - duplicates, len(matches) - duplicates)
        recall = _ratio(detected, len(instances))
        return cls(
            alerts=len(matches),
            tp_alerts=tp,
            fp_alerts=len(matches) - tp,
            duplicates=duplicates,
            instances=len(instances),
            detected=detected,
            precision=precision,
            recall=recall,
            f1=f1_score(precision, recall),
            latency=LatencyStats.of([i.latency_s for i in instances if i.latency_s is not None]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "recall": self.recall,
            "f1": self.f1,
            "alerts": self.alerts,
            "tp_alerts": self.tp_alerts,
            "fp_alerts": self.fp_alerts,
            "duplicates": self.duplicates,
            "instances": self.instances,
            "detected": self.detected,
            "onset_to_alert_s": self.latency.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class FalseAlarms:
    """Alerts on fault-free cases, per 1000 machine-hours of them."""

    count: int
    machine_hours: float
    per_1000_machine_hours: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "machine_hours": self.machine_hours,
            "per_1000_machine_hours": self.per_1000_machine_hours,
        }


@dataclass(frozen=True, slots=True)
class JobAlerts:
    """Stray job-level alerts (hangs no fault explains: mostly checkpoints the loop did not
    report), over every case, per 100 job-hours."""

    count: int
    cases: int
    job_hours: float
    per_100_job_hours: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "cases": self.cases,
            "job_hours": self.job_hours,
            "per_100_job_hours": self.per_100_job_hours,
        }


@dataclass(frozen=True, slots=True)
class CpuCost:
    """CPU seconds of detection per second of job, overall and by job size."""

    seconds: float
    job_seconds: float
    per_job_second: float | None
    per_machine_second_us: float | None
    by_size: dict[int, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "job_seconds": self.job_seconds,
            "per_job_second": self.per_job_second,
            "per_machine_second_us": self.per_machine_second_us,
            "by_size": {str(k): v for k, v in sorted(self.by_size.items())},
        }


@dataclass(frozen=True, slots=True)
class Summary:
    """Everything ``minder bench detect`` reports for one detector variant."""

    overall: Scores
    fail_stop: Scores
    fail_slow: Scores
    by_fault: dict[str, Scores]
    false_alarms: FalseAlarms
    cpu: CpuCost
    cases: tuple[CaseMatch, ...] = field(default=())
    stragglers: dict[str, Any] = field(default_factory=dict)
    """Straggler faults: steps from onset to alert, and the error of the alert's live S."""
    stray_job_alerts: JobAlerts = field(default_factory=lambda: JobAlerts(0, 0, 0.0, None))

    def to_dict(self, with_cases: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stragglers": self.stragglers,
            "overall": self.overall.to_dict(),
            "fail_stop": self.fail_stop.to_dict(),
            "fail_slow": self.fail_slow.to_dict(),
            "by_fault": {k: v.to_dict() for k, v in self.by_fault.items()},
            "false_alarms": self.false_alarms.to_dict(),
            "stray_job_alerts": self.stray_job_alerts.to_dict(),
            "cpu": self.cpu.to_dict(),
        }
        if with_cases:
            out["cases"] = [c.to_dict() for c in self.cases]
        return out


def summarize(runs: Iterable[CaseRun], slack_s: float = SLACK_S) -> Summary:
    """Match every run and aggregate: overall, fail-stop/fail-slow, per fault type, false
    alarms of the fault-free runs, and CPU cost."""
    cases = tuple(match_case(run, slack_s) for run in runs)
    alerts = [m for c in cases for m in c.alerts]
    instances = [i for c in cases for i in c.instances]

    def of_mode(kinds: frozenset[str]) -> Scores:
        # Precision over the alerts of the cases of those kinds; recall over their instances.
        return Scores.of(
            (m for c in cases if c.run.fault in kinds for m in c.alerts),
            (i for i in instances if i.fault in kinds),
        )

    by_fault: dict[str, Scores] = {}
    kinds = sorted({i.fault for i in instances} | {c.run.fault for c in cases if c.run.fault})
    for kind in kinds:
        by_fault[kind] = Scores.of(
            (m for c in cases if c.run.fault == kind for m in c.alerts),
            (i for i in instances if i.fault == kind),
        )
    free = [c for c in cases if c.run.is_fault_free]
    hours = sum(c.run.machine_seconds for c in free) / 3600.0
    false_alarms = sum(len(c.alerts) for c in free)
    per_1000 = None if hours == 0 else false_alarms / hours * 1000.0
    job_hours = sum(c.run.job_seconds for c in cases) / 3600.0
    stray = [len(c.stray_job_alerts) for c in cases]
    per_100 = None if job_hours == 0 else sum(stray) / job_hours * 100.0
    return Summary(
        overall=Scores.of(alerts, instances),
        fail_stop=of_mode(FAIL_STOP),
        fail_slow=of_mode(FAIL_SLOW),
        by_fault=by_fault,
        false_alarms=FalseAlarms(false_alarms, hours, per_1000),
        cpu=_cpu([c.run for c in cases]),
        cases=cases,
        stragglers=straggler_stats(cases),
        stray_job_alerts=JobAlerts(sum(stray), sum(1 for n in stray if n), job_hours, per_100),
    )


STRAGGLER_FAULTS = frozenset(
    {"slow_worker", "transient_straggler", "slow_stage", "flapping_worker", "slow_group"}
)


def straggler_stats(cases: Sequence[CaseMatch]) -> dict[str, Any]:
    """For the straggler faults detected: the job's steps from onset to the first alert (by
    type), and the relative error of the job's live slowdown S at the first straggler alert.

    The live S is scored against the true S replayed by the what-if analysis on the simulated
    job's op trace (``CaseRun.replay``) over the steps the alert was judged on: the alert's
    ``steps`` (its persistent window, its transient or stage run) ending at the alert, from the
    fault's onset at the earliest. Asynchronous jobs, which the replay does not model (no
    shared step), are scored against the simulator's closed-form S apart. The closed-form S and
    the S replayed over the whole fault are kept beside it per case as cross-checks.
    """
    steps: dict[str, list[float]] = {}
    rows: list[dict[str, Any]] = []
    for case in cases:
        run = case.run
        first: dict[int, AlertMatch] = {}  # the first straggler alert on each instance
        for match in case.alerts:
            if match.fault_index is not None and match.alert.kind.value == "straggler":
                first.setdefault(match.fault_index, match)
        truth: dict[int, float] = {}
        if "slowdown" in run.labels.columns:
            for row in run.labels.to_dict("records"):
                value = row.get("slowdown")
                if value is not None and math.isfinite(float(value)):
                    truth[int(row["fault_index"])] = float(value)
        for instance in case.instances:
            if instance.fault not in STRAGGLER_FAULTS or instance.latency_s is None:
                continue
            true_s = truth.get(instance.fault_index)
            hit = first.get(instance.fault_index)
            if run.step_s > 0:
                # Steps as the straggler takes them: in a synchronous job every step takes S
                # times the nominal one; in an asynchronous one the slow worker's own steps take
                # its ratio to the reference times it.
                stretch = true_s or 1.0
                if hit is not None and hit.alert.evidence.get("sync") is False:
                    stretch = float(hit.alert.evidence.get("ratio", stretch))
                # To the first straggler alert when there is one, else to the first alert.
                latency = (
                    max(0.0, hit.alert.detected_ts - instance.start_ts)
                    if hit is not None
                    else instance.latency_s
                )
                steps.setdefault(instance.fault, []).append(latency / (run.step_s * stretch))
            live = hit.alert.evidence.get("job_slowdown") if hit is not None else None
            if hit is None or live is None:
                continue
            rows.append(_slowdown_row(run, instance, hit.alert, float(live), true_s))
    if not steps and not rows:
        return {}

    def errors(key: str, of: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[str, Any]:
        values = np.asarray([r[key] for r in rows if r[key] is not None and of(r)], dtype=float)
        return {
            "median": float(np.median(values)) if values.size else None,
            "p95": float(np.percentile(values, 95)) if values.size else None,
            "within_5pct": float(np.mean(values <= 0.05)) if values.size else None,
            "n": int(values.size),
        }

    agreement = [
        abs(r["replayed"] - r["closed_form"]) / r["closed_form"]
        for r in rows
        if r["replayed"] is not None and r["closed_form"]
    ]
    return {
        "steps_to_alert": {
            kind: {"median": float(np.median(v)), "max": float(np.max(v)), "n": len(v)}
            for kind, v in sorted(steps.items())
        },
        # The target: the live S against the replayed S (synchronous jobs).
        "slowdown_error": errors("error"),
        # Asynchronous jobs: against the closed-form (throughput) S.
        "slowdown_error_async": errors("error_closed_form", lambda r: not r["sync"]),
        # Cross-check: every case against the closed-form S, as before the replay.
        "slowdown_error_closed_form": errors("error_closed_form"),
        "replay_vs_closed_form": {
            "median": float(np.median(agreement)) if agreement else None,
            "max": float(np.max(agreement)) if agreement else None,
            "n": len(agreement),
        },
        "cases": rows,
    }


def _slowdown_row(
    run: CaseRun, instance: Instance, alert: Alert, live: float, closed_form: float | None
) -> dict[str, Any]:
    """The live S at the first straggler alert on ``instance`` against the true ones."""
    replayed = replayed_fault = None
    if run.replay is not None:
        judged = alert.evidence.get("steps")
        last = int(judged) if isinstance(judged, int | float) and judged >= 1 else None
        replayed = run.replay(instance.start_ts, alert.detected_ts, last)
        replayed_fault = run.replay(instance.start_ts, instance.end_ts, None)
    sync = replayed is not None or alert.evidence.get("sync") is not False
    return {
        "case": run.name,
        "fault": instance.fault,
        "sync": bool(sync),
        "live": live,
        "replayed": replayed,
        "replayed_fault": replayed_fault,
        "closed_form": closed_form,
        "error": abs(live - replayed) / replayed if replayed else None,
        "error_closed_form": abs(live - closed_form) / closed_form if closed_form else None,
        "alert_steps": alert.evidence.get("steps"),
    }


def _cpu(runs: Sequence[CaseRun]) -> CpuCost:
    seconds = sum(r.detect_cpu_s for r in runs)
    job_seconds = sum(r.job_seconds for r in runs)
    machine_seconds = sum(r.machine_seconds for r in runs)
    by_size: dict[int, list[float]] = {}
    for run in runs:
        pair = by_size.setdefault(run.machines, [0.0, 0.0])
        pair[0] += run.detect_cpu_s
        pair[1] += run.job_seconds
    per_us = _ratio(seconds * 1e6, machine_seconds)
    return CpuCost(
        seconds=seconds,
        job_seconds=job_seconds,
        per_job_second=_ratio(seconds, job_seconds),
        per_machine_second_us=per_us,
        by_size={size: cpu / js for size, (cpu, js) in by_size.items() if js > 0},
    )
