"""Alert, job, score and what-if report storage: SQLAlchemy 2 ORM with Alembic migrations.

The only package of Minder that imports SQLAlchemy and Alembic (docs/architecture.md §2). Callers
open a session from :func:`session_factory` and pass it to the repository functions, which return
plain records (:class:`~minder.core.alert.Alert` and the dataclasses of
:mod:`minder.storage.records`) and leave the commit to the caller::

    engine = create_engine_for(settings.database.url)
    upgrade_database(engine)
    sessions = session_factory(engine)
    with sessions.begin() as session:
        stored, inserted = record_alert(session, alert, seen_ts=now)
"""

from sqlalchemy.orm import Session

from minder.storage.alerts import (
    ACTIVE_STATUSES,
    CLOSED_STATUSES,
    MAX_PAGE,
    StatusTransitionError,
    allowed_transitions,
    count_active_alerts,
    count_active_alerts_by_machine,
    get_alert,
    get_alert_record,
    list_alert_records,
    list_alerts,
    open_alerts,
    record_alert,
    set_alert_status,
)
from minder.storage.engine import SessionFactory, create_engine_for, normalise_url, session_factory
from minder.storage.hangs import (
    HangRecord,
    OpenHangAlerts,
    get_hang_analysis,
    open_hang_alerts,
    save_hang_analysis,
)
from minder.storage.health import database_status
from minder.storage.jobs import (
    count_job_findings,
    current_scores,
    get_job,
    list_job_findings,
    list_jobs,
    list_machines,
    report_job_states,
    save_job_findings,
    save_scores,
    set_job_status,
    sweep_jobs,
    upsert_job_machines,
)
from minder.storage.layouts import SqlLayoutStore, load_layout, save_layout
from minder.storage.migrate import (
    alembic_config,
    current_revisions,
    head_revisions,
    schema_is_current,
    upgrade_database,
)
from minder.storage.records import (
    AlertRecord,
    JobFinding,
    JobInfo,
    JobReport,
    JobStatus,
    MachineInfo,
    MachineScore,
    MachineState,
    ScoreRow,
    WhatIfRecord,
    WhatIfStatus,
    WhatIfSummary,
    parse_status,
)
from minder.storage.selfchecks import (
    accept_report,
    cancel_selfcheck,
    create_selfcheck,
    get_selfcheck,
    latest_selfcheck_for_alert,
    list_selfchecks,
    request_selfcheck,
)
from minder.storage.whatif import (
    create_report,
    fail_report,
    finish_report,
    get_report,
    list_reports,
    mark_running,
    parse_whatif_status,
)

__all__ = [
    "ACTIVE_STATUSES",
    "CLOSED_STATUSES",
    "MAX_PAGE",
    "AlertRecord",
    "HangRecord",
    "JobFinding",
    "JobInfo",
    "JobReport",
    "JobStatus",
    "MachineInfo",
    "MachineScore",
    "MachineState",
    "OpenHangAlerts",
    "ScoreRow",
    "Session",
    "SessionFactory",
    "SqlLayoutStore",
    "StatusTransitionError",
    "WhatIfRecord",
    "WhatIfStatus",
    "WhatIfSummary",
    "accept_report",
    "alembic_config",
    "allowed_transitions",
    "cancel_selfcheck",
    "count_active_alerts",
    "count_active_alerts_by_machine",
    "count_job_findings",
    "create_engine_for",
    "create_report",
    "create_selfcheck",
    "current_revisions",
    "current_scores",
    "database_status",
    "fail_report",
    "finish_report",
    "get_alert",
    "get_alert_record",
    "get_hang_analysis",
    "get_job",
    "get_report",
    "get_selfcheck",
    "head_revisions",
    "latest_selfcheck_for_alert",
    "list_alert_records",
    "list_alerts",
    "list_job_findings",
    "list_jobs",
    "list_machines",
    "list_reports",
    "list_selfchecks",
    "load_layout",
    "mark_running",
    "normalise_url",
    "open_alerts",
    "open_hang_alerts",
    "parse_status",
    "parse_whatif_status",
    "record_alert",
    "report_job_states",
    "request_selfcheck",
    "save_hang_analysis",
    "save_job_findings",
    "save_layout",
    "save_scores",
    "schema_is_current",
    "session_factory",
    "set_alert_status",
    "set_job_status",
    "sweep_jobs",
    "upgrade_database",
    "upsert_job_machines",
]
