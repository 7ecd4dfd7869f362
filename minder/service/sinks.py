"""The service's durable state: alerts (with their outbox events), jobs, machines, scores."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from minder.core.alert import Alert
from minder.service.engine import JobSnapshot
from minder.storage.alerts import count_active_alerts_by_machine
from minder.storage.engine import SessionFactory, read_only
from minder.storage.jobs import save_scores, upsert_job_machines
from minder.storage.outbox import Destination, record_alert_with_events
from minder.storage.records import MachineInfo, ScoreRow

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
        machines = [
            MachineInfo(
                name=m.machine,
                group=m.group,
                domain=m.domain,
                last_seen_ts=m.last_seen_ts or None,
            )
            for m in job.machines
        ]
        rows = [
            ScoreRow(machine=m.machine, metric=metric, score=score, device=device)
            for m in job.machines
            for metric, (score, device) in m.per_metric.items()
        ]
        with self.sessions.begin() as session:
            upsert_job_machines(session, job.job, machines, job.ts)
            save_scores(session, job.job, rows, job.ts)
