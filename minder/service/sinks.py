"""The service's durable state: alerts (with their outbox events), jobs (with their lifecycle),
machines, scores."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from minder.core.alert import Alert
from minder.core.hang import HangAnalysis
from minder.service.persistence import JobSnapshot, MachineSnapshot
from minder.storage.alerts import count_active_alerts_by_machine
from minder.storage.engine import SessionFactory, read_only
from minder.storage.hangs import save_hang_analysis
from minder.storage.jobs import (
    report_job_states,
    save_job_findings,
    save_scores,
    set_top_scores,
    sweep_jobs,
    upsert_job_machines,
    upsert_scores,
)
from minder.storage.outbox import Destination, record_alert_with_events
from minder.storage.records import JobFinding, JobReport, MachineInfo, ScoreRow

logger = logging.getLogger(__name__)


class SqlStateStore:
    """The service's durable state in the SQL database (see ``minder.storage``).

    A new alert and its ``alert.opened`` outbox rows commit in one transaction, so a crash right
    after storing an alert still delivers it (the restarted service finds the rows).
    """

    def __init__(
        self,
        sessions: SessionFactory,
        destinations: Sequence[Destination] = (),
        *,
        on_enqueued: Callable[[], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.destinations = list(destinations)
        self.on_enqueued = on_enqueued

    def record_alert(self, alert: Alert) -> tuple[Alert, bool]:
        with self.sessions.begin() as session:
            stored, created = record_alert_with_events(session, alert, self.destinations)
        if created and self.on_enqueued is not None:
            self.on_enqueued()
        return stored, created

    def open_alert_counts(self, job: str | None = None) -> dict[tuple[str, str, str], int]:
        with self.sessions() as session:
            return count_active_alerts_by_machine(read_only(session), job)

    def save_job(self, job: JobSnapshot) -> None:
        """Replace the job's machines and current scores (machines not listed are kept)."""
        machines = _infos(job.machines)
        rows = [
            (m.machine, metric, score, device)
            for m in job.machines
            for metric, (score, device) in m.per_metric.items()
        ]  # the store takes the service's own tuples as they are: no row object per score
        with self.sessions.begin() as session:
            upsert_job_machines(session, job.job, machines, job.ts)
            save_scores(session, job.job, rows, job.ts)

    def save_changes(
        self,
        job: str,
        ts: float,
        machines: Sequence[MachineSnapshot],
        scores: Sequence[tuple[str, str, float, str]],
        removed: Sequence[tuple[str, str]],
    ) -> None:
        """Write what changed in ``job``: the machine rows (labels, last seen, top score) of
        ``machines``, the ``scores`` that moved and the ``removed`` ones; the rest is kept."""
        infos = _infos(machines)
        tops = {
            m.machine: ScoreRow(m.machine, m.metric, m.score, m.device) if m.metric else None
            for m in machines
        }
        with self.sessions.begin() as session:
            if infos:
                upsert_job_machines(session, job, infos, ts)
            if scores or removed:
                upsert_scores(session, job, scores, ts, removed=removed)
            if tops:
                set_top_scores(session, job, tops, ts)

    def save_job_findings(self, job: str, findings: Sequence[JobFinding], ts: float) -> None:
        """Replace the job's current job-level findings (none: clear them), as of ``ts``."""
        with self.sessions.begin() as session:
            save_job_findings(session, job, findings, ts)

    def save_hang_analysis(self, job: str, analysis: HangAnalysis, ts: float) -> None:
        """Keep ``analysis`` as the job's latest hang analysis, as of data time ``ts``."""
        with self.sessions.begin() as session:
            save_hang_analysis(session, job, analysis, ts)

    def report_job_states(self, reports: Sequence[JobReport], now: float) -> None:
        """Store the jobs' status as the detection worker reports it, at wall time ``now``."""
        with self.sessions.begin() as session:
            report_job_states(session, reports, now)

    def sweep_jobs(
        self, now: float, stale_after_s: float, retention_s: float
    ) -> tuple[list[str], list[str]]:
        """Age the stored jobs at wall time ``now``; the jobs that became idle, and those that
        ended."""
        with self.sessions.begin() as session:
            return sweep_jobs(session, now, stale_after_s=stale_after_s, retention_s=retention_s)


def _infos(machines: Iterable[MachineSnapshot]) -> list[MachineInfo]:
    return [
        MachineInfo(
            name=m.machine, group=m.group, domain=m.domain, last_seen_ts=m.last_seen_ts or None
        )
        for m in machines
    ]
