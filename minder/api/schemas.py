"""Response and request bodies of the HTTP API (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from minder.core.alert import AlertKind, AlertStatus
from minder.core.hang import CulpritReason
from minder.core.selfcheck import (
    CheckStatus,
    SelfCheckRecord,
    SelfCheckState,
    Verdict,
)
from minder.storage import (
    AlertRecord,
    HangRecord,
    JobFinding,
    JobInfo,
    JobStatus,
    MachineScore,
    MachineState,
    OpenHangAlerts,
    WhatIfRecord,
    WhatIfStatus,
    WhatIfSummary,
)


class Health(BaseModel):
    """Liveness: the process answers."""

    status: str = Field("ok", description="always 'ok'")
    version: str


class Readiness(BaseModel):
    """Readiness: the database and every check of the service."""

    ready: bool
    checks: dict[str, bool] = Field(description="each check by name; false ones fail readiness")
    failing: list[str] = Field(description="names of the failing checks")


class Problem(BaseModel):
    """An error: what was wrong, naming the value received and what is allowed."""

    detail: str


class FieldProblem(BaseModel):
    """One bad field of a request, as FastAPI reports it."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int] = Field(description="where: 'query', 'path' or 'body', then the field")
    msg: str
    type: str


class InvalidInput(BaseModel):
    """422: a value the API cannot take, named with what is allowed; ``detail`` is one message,
    or a list of the bad fields when the request does not match its declared parameters."""

    detail: str | list[FieldProblem]


class TransitionProblem(Problem):
    """A status change the alert life cycle forbids."""

    current: AlertStatus
    requested: AlertStatus
    allowed: list[AlertStatus] = Field(description="statuses the alert may move to")


class JobOut(BaseModel):
    """A training job and where it is in its life (docs/operations.md, "Job lifecycle")."""

    id: str
    status: JobStatus = Field(
        description="'active' while a detection worker holds the job's window (its machines "
        "report, or stopped less than 15 minutes ago); 'idle' once its window was dropped (no "
        "data for 15 minutes, or the worker that held it stopped); 'ended' when its last "
        "machine said goodbye, or it stayed idle past the retention (MINDER_DETECTION__"
        "JOB_RETENTION_S). Data makes an idle or ended job active again"
    )
    status_since: float = Field(description="unix seconds, wall time: when it entered its status")
    status_reason: str = Field(description="why it is idle or ended; empty while active")
    first_seen_ts: float = Field(description="unix seconds, data time")
    last_seen_ts: float = Field(description="unix seconds, data time")
    machine_count: int = Field(description="machines the job has had (GET .../machines)")
    active_machines: int = Field(
        description="machines in the job now: reported and not departed (minder_job_machines); "
        "0 unless active"
    )
    open_alerts: int = Field(description="open or acknowledged alerts")
    finding_count: int = Field(
        0, description="current job-level findings (listed by GET /api/v1/jobs/{job})"
    )
    updated_at: float = Field(description="unix seconds, wall time")

    @classmethod
    def of(cls, job: JobInfo) -> JobOut:
        return cls(
            id=job.id,
            status=job.status,
            status_since=job.status_since,
            status_reason=job.status_reason,
            first_seen_ts=job.first_seen_ts,
            last_seen_ts=job.last_seen_ts,
            machine_count=job.machine_count,
            active_machines=job.active_machines,
            open_alerts=job.open_alerts,
            finding_count=job.finding_count,
            updated_at=job.updated_at,
        )


class JobFindingOut(BaseModel):
    """What detection found about the job as a whole, not about one machine, while it holds."""

    finding: str = Field(
        description="'not_peer_comparable': the job's machines are not alike on `metric` (a "
        "serving fleet of mixed load, undeclared mixed roles): no similarity alerts on it while "
        "this holds; 'too_few_machines': fewer than 4 machines, no peers (only the hard-fault "
        "rules run)"
    )
    metric: str | None = Field(description="the metric it is about; null when about none")
    coherence: float | None = Field(
        description="share of the job's machines that stayed with their peers on `metric` over "
        "the detector's horizon (0-1); null when not measured"
    )
    outliers: int | None = Field(
        description="distinct outlier events over the horizon (machines that became outliers "
        "together count once; machines apart from their first evaluations one by one)"
    )
    allowance: int | None = Field(description="outlier events a job of peers may have")
    machines: int = Field(description="machines in the job when measured")
    since_ts: float = Field(description="unix seconds, data time: when the finding began")
    updated_ts: float | None = Field(
        description="unix seconds, data time: when the service last stored it (its numbers are "
        "refreshed at most every minute while they move)"
    )
    detail: str = Field(description="one line for an operator")

    @classmethod
    def of(cls, finding: JobFinding) -> JobFindingOut:
        return cls(
            finding=finding.finding,
            metric=finding.metric,
            coherence=finding.coherence,
            outliers=finding.outliers,
            allowance=finding.allowance,
            machines=finding.machines,
            since_ts=finding.since_ts,
            updated_ts=finding.updated_ts,
            detail=finding.detail,
        )


class JobDetailOut(JobOut):
    """A training job with its current job-level findings."""

    findings: list[JobFindingOut] = Field(
        description="current findings about the job as a whole, by finding and metric; a "
        "finding that ended is not listed"
    )


class CulpritOut(BaseModel):
    """A rank a hang waits on."""

    rank: int = Field(description="the global rank")
    reason: CulpritReason = Field(
        description="not_joined: it never enqueued the collective the rest of its group waits "
        "in; no_dump: the group waits for it and it wrote no flight-recorder dump (killed, or "
        "stuck holding the GIL); mismatch: it entered that collective with another op, size or "
        "dtype; stopped_first: (no flight recorder) its step counter stopped before the rest "
        "of the job's"
    )
    machine: str = Field(description="the machine it runs on; empty when unknown")
    group: str = Field(description="the process group's id, as its entries name it")
    group_desc: str = Field(description="the group's description (default_pg, ep_group_3)")
    op: str = Field(description="the collective the group waits in (nccl:all_reduce)")
    seq: int | None = Field(description="the collective's sequence id within the group")
    detail: str = Field(description="one line for an operator")


class MismatchOut(BaseModel):
    """Ranks of one group that entered the same collective differently."""

    group: str
    seq: int
    field: str = Field(description="op, input_sizes, output_sizes, input_dtypes or output_dtypes")
    values: dict[str, list[int]] = Field(
        description="each value seen (as text) and the ranks that had it, the majority first"
    )


class GroupVerdictOut(BaseModel):
    """Where one process group stands across its ranks."""

    group: str
    desc: str
    size: int = Field(description="ranks in the group")
    stuck: bool = Field(
        description="some rank waits in a collective not every rank of the group joined"
    )
    seq: int | None = Field(description="the sequence id the group waits in")
    op: str
    waiting: int = Field(description="ranks that entered `seq` and wait in it")
    missing: list[int] = Field(description="ranks that never entered `seq` or wrote no dump")


class HangAnalysisOut(BaseModel):
    """The cross-rank verdict on a job's flight-recorder dumps (docs/hangs.md)."""

    hung: bool = Field(description="some process group waits on a rank")
    culprit_ranks: list[int] = Field(description="every rank named, ascending")
    culprit_machines: list[str] = Field(description="their machines, by name")
    culprits: list[CulpritOut] = Field(description="by rank; a rank may be named per group")
    mismatches: list[MismatchOut]
    groups: list[GroupVerdictOut] = Field(description="the stuck groups (all, when few)")
    ranks_seen: int = Field(description="ranks whose dump was analysed")
    ranks_expected: int = Field(description="ranks of the job per the groups' configurations")
    versions: list[str] = Field(description="flight-recorder dump versions seen")
    analysed_ts: float = Field(description="unix seconds: when the analysis was made")
    culprits_dropped: int = Field(description="culprits beyond the 256 kept")
    mismatches_dropped: int
    groups_dropped: int
    notes: list[str] = Field(description="one-line remarks for people")


class HangOut(BaseModel):
    """A job's latest hang analysis and its open hang alerts."""

    job: str
    hung: bool = Field(description="the analysis says the job is hung")
    analysis: HangAnalysisOut
    analysed_ts: float = Field(description="unix seconds: when the analysis was made")
    updated_ts: float = Field(description="unix seconds, data time: when the service stored it")
    job_alert_id: str | None = Field(
        description="the open (or acknowledged) job-level hang alert, which holds the analysis "
        "in its evidence and is never acted on; null when none is open"
    )
    machine_alert_ids: dict[str, str] = Field(
        description="machine -> its open (or acknowledged) hang alert: the culprits' machines, "
        "which the scheduler actions act on"
    )

    @classmethod
    def of(cls, record: HangRecord, alerts: OpenHangAlerts) -> HangOut:
        analysis = record.analysis
        return cls(
            job=record.job,
            hung=analysis.hung,
            analysis=HangAnalysisOut(**analysis.to_dict()),
            analysed_ts=record.analysed_ts,
            updated_ts=record.updated_ts,
            job_alert_id=alerts.job_alert,
            machine_alert_ids=dict(alerts.machine_alerts),
        )


class MachineOut(BaseModel):
    """A machine of a job with its current top score (null when it has none)."""

    name: str
    group: str = Field(description="peer group (PP stage, role); empty when unknown")
    domain: str = Field(description="shared failure domain (leaf switch, rack)")
    last_seen_ts: float | None
    top_score: float | None
    top_metric: str | None
    top_device: str | None
    score_ts: float | None

    @classmethod
    def of(cls, machine: MachineState) -> MachineOut:
        return cls(
            name=machine.name,
            group=machine.group,
            domain=machine.domain,
            last_seen_ts=machine.last_seen_ts,
            top_score=machine.top_score,
            top_metric=machine.top_metric,
            top_device=machine.top_device,
            score_ts=machine.score_ts,
        )


class MetricScoreOut(BaseModel):
    """A machine's current score on one metric."""

    metric: str
    score: float
    device: str = Field(description="the device that scored highest; empty for host metrics")
    ts: float

    @classmethod
    def of(cls, score: MachineScore) -> MetricScoreOut:
        return cls(metric=score.metric, score=score.score, device=score.device, ts=score.ts)


class MachineScoresOut(BaseModel):
    """A machine's top score and every per-metric score."""

    machine: str
    group: str
    domain: str
    top_score: float
    top_metric: str
    top_device: str
    score_ts: float
    metrics: list[MetricScoreOut] = Field(description="highest score first")


class JobScoresOut(BaseModel):
    """Current scores of a job, most anomalous machine first."""

    job: str
    machines: list[MachineScoresOut]


class AlertOut(BaseModel):
    """A stored alert."""

    id: str
    key: str = Field(description="job/machine/kind/metric: one open alert per key")
    job: str
    machine: str
    devices: list[str]
    kind: AlertKind
    metric: str
    score: float
    first_ts: float = Field(description="estimated onset, unix seconds")
    detected_ts: float = Field(description="when the detector fired, data time")
    last_seen_ts: float = Field(description="latest report of the fault, data time")
    occurrences: int = Field(description="reports folded into this alert")
    domain: str
    status: AlertStatus
    evidence: dict[str, Any]
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, record: AlertRecord) -> AlertOut:
        alert = record.alert
        return cls(
            id=alert.id,
            key=alert.key,
            job=alert.job,
            machine=alert.machine,
            devices=list(alert.devices),
            kind=alert.kind,
            metric=alert.metric,
            score=alert.score,
            first_ts=alert.first_ts,
            detected_ts=alert.detected_ts,
            last_seen_ts=record.last_seen_ts,
            occurrences=record.occurrences,
            domain=alert.domain,
            status=alert.status,
            evidence=alert.evidence,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


class AlertPage(BaseModel):
    """One page of alerts, newest detected first."""

    items: list[AlertOut]
    total: int = Field(description="alerts matching the filters, over all pages")
    limit: int
    offset: int


class AlertStatusChange(BaseModel):
    """The new status of an alert."""

    status: AlertStatus
    by: str | None = Field(
        None, max_length=255, description="who decided (kept with the event, e.g. a user name)"
    )
    model_config = ConfigDict(extra="forbid")


class DeliveryOut(BaseModel):
    """One outbox row: an event on its way to one destination."""

    id: int
    delivery_id: str = Field(description="stable across attempts: receivers de-duplicate on it")
    destination: str
    event: str
    alert_id: str | None
    job: str | None
    status: str = Field(description="pending, delivered or expired")
    attempts: int
    created_at: float
    next_attempt_at: float
    expires_at: float
    delivered_at: float | None
    last_error: str | None


class DeliveryPage(BaseModel):
    """A page of deliveries, newest first."""

    items: list[DeliveryOut]
    total: int
    limit: int
    offset: int


class AuditOut(BaseModel):
    """One scheduler action decision (applied, unchanged, dry_run, failed, skipped_*)."""

    id: int
    created_at: float
    alert_id: str | None
    job: str | None
    machine: str | None
    node: str | None
    target: str
    operation: str
    mode: str = Field(description="enforce or dry_run")
    outcome: str
    detail: str
    delivery_id: str | None


class AuditPage(BaseModel):
    """A page of the action audit trail, newest first."""

    items: list[AuditOut]
    total: int
    limit: int
    offset: int


class BreakerOut(BaseModel):
    """The actions circuit breaker."""

    name: str
    tripped: bool
    tripped_at: float | None
    reason: str | None
    reset_at: float | None
    reset_by: str | None


class BreakerReset(BaseModel):
    """Who resets the breaker (kept in its state and the audit of the reset)."""

    by: str = Field(min_length=1, max_length=255)
    model_config = ConfigDict(extra="forbid")


class JobSettingsOut(BaseModel):
    """Operator settings of one job."""

    job: str
    actions_enabled: bool


class JobSettingsChange(BaseModel):
    """Opt a job in or out of scheduler actions."""

    actions_enabled: bool
    by: str | None = Field(None, max_length=255)
    model_config = ConfigDict(extra="forbid")


class WhatIfLinks(BaseModel):
    """Where to follow a what-if report."""

    self_: str = Field(alias="self", description="GET it here")

    model_config = ConfigDict(populate_by_name=True)


def _whatif_links(report_id: str) -> WhatIfLinks:
    return WhatIfLinks(self_=f"/api/v1/whatif/{report_id}")


class WhatIfAccepted(BaseModel):
    """A what-if analysis was accepted and waits to run; poll ``links.self``."""

    id: str
    status: WhatIfStatus
    links: WhatIfLinks

    @classmethod
    def of(cls, summary: WhatIfSummary) -> WhatIfAccepted:
        return cls(id=summary.id, status=summary.status, links=_whatif_links(summary.id))


class WhatIfPathRequest(BaseModel):
    """Analyse a trace the server can read (under its allowed what-if roots)."""

    path: str = Field(
        min_length=1,
        description="a canonical .parquet trace, Kineto .json/.json.gz traces of the ranks, a "
        "directory of them or a glob; relative paths are looked up under the allowed roots",
    )
    meta: str | None = Field(None, description="the job meta YAML (dp_size, pp_size, …)")
    what_ifs: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="custom what-ifs, e.g. 'pp-comm:free' or 'stage=3:faster=20%'",
    )
    job: str | None = Field(
        None, min_length=1, max_length=255, description="the job's name; the trace's otherwise"
    )

    model_config = ConfigDict(extra="forbid")


class WhatIfSummaryOut(BaseModel):
    """A what-if report without its body."""

    id: str
    job: str | None = Field(description="given at submission, else the trace's name once done")
    status: WhatIfStatus
    source: str = Field(description="what was analysed")
    created_at: float = Field(description="submitted, unix seconds")
    started_at: float | None = Field(description="analysis started, unix seconds")
    finished_at: float | None = Field(description="analysis ended, unix seconds")
    slowdown: float | None = Field(description="S = T_orig / T_ideal, when done")
    verdict: str | None = Field(description="the root cause (stage, worker, …), when done")
    error: str | None = Field(description="why the analysis failed, when it did")
    links: WhatIfLinks

    @classmethod
    def of(cls, summary: WhatIfSummary) -> WhatIfSummaryOut:
        return cls(**_summary_fields(summary))


def _summary_fields(summary: WhatIfSummary) -> dict[str, Any]:
    return {
        "id": summary.id,
        "job": summary.job,
        "status": summary.status,
        "source": summary.source,
        "created_at": summary.created_at,
        "started_at": summary.started_at,
        "finished_at": summary.finished_at,
        "slowdown": summary.slowdown,
        "verdict": summary.verdict,
        "error": summary.error,
        "links": _whatif_links(summary.id),
    }


class WhatIfReportOut(WhatIfSummaryOut):
    """A what-if report with its body (docs/architecture.md §3.5) once done."""

    report: dict[str, Any] | None = Field(
        description="slowdown, waste, model_error, by_optype, by_dp_rank, by_stage, by_worker, "
        "mw, ms, verdict, per_step, then details; null until done"
    )

    @classmethod
    def of_record(cls, record: WhatIfRecord) -> WhatIfReportOut:
        return cls(**_summary_fields(record), report=record.report)


class WhatIfPage(BaseModel):
    """One page of what-if reports, newest submitted first."""

    items: list[WhatIfSummaryOut]
    total: int = Field(description="reports matching the filters, over all pages")
    limit: int
    offset: int


class CheckResultOut(BaseModel):
    """One check's outcome on the node (docs/selfcheck.md, "Report")."""

    name: str = Field(
        description="dotted check name: gpu.matmul, gpu.nvml, gpu.dcgm, network.rdma, "
        "network.ib_write_bw, collective.allreduce, host.clock, host.disk, host.memory_ecc"
    )
    status: CheckStatus = Field(
        description="pass, fail, skipped (its hardware or tool is absent: the summary says "
        "which) or error (it gave no answer)"
    )
    summary: str = Field(description="one line: what was measured against what, or why not")
    measurements: dict[str, float | int | str | bool | None] = Field(
        description="the figures behind the status (throughputs, baselines, counters, times)"
    )
    duration_s: float = Field(description="wall time the check took")


class SelfCheckReportBody(BaseModel):
    """What ``minder selfcheck run`` reports for one node: ``SelfCheckReport.to_dict()``.

    ``verdict`` and ``reason`` follow from ``checks``: fail when a check failed, else
    inconclusive when one gave no answer or none could run, else pass; a report whose stated
    verdict disagrees with its checks is refused (422).
    """

    schema_version: int = Field(description="1")
    check_id: str | None = Field(description="the service's id of the check it answers")
    node: str = Field(description="the node's scheduler name")
    started_ts: float = Field(description="unix seconds")
    finished_ts: float = Field(description="unix seconds, not before started_ts")
    verdict: Verdict
    reason: str = Field(description="one line: the failing checks, or why inconclusive")
    checks: list[CheckResultOut] = Field(description="at most 64, each name once")


class SelfCheckOut(BaseModel):
    """A self-check the service scheduled on a node it drained (docs/selfcheck-service.md)."""

    id: str
    alert_id: str = Field(description="the alert whose drain the check answers")
    job: str
    machine: str
    node: str = Field(description="the scheduler's name of the machine")
    target: str = Field(description="slurm or kubernetes")
    state: SelfCheckState = Field(
        description="pending (waiting for a slot, the node or partners), running (launched, no "
        "verdict yet), then passed (the node was returned), failed (kept out, alert confirmed), "
        "inconclusive or timed_out (kept out, notified), cancelled (by a person)"
    )
    attempt: int = Field(description="1 for the alert's first check, 2 for a retry, …")
    partners: list[str] = Field(description="healthy nodes the collective check ran with")
    created_ts: float = Field(description="when the check was decided, unix seconds")
    started_ts: float | None = Field(description="when it was launched")
    finished_ts: float | None = Field(description="when it reached its final state")
    drained_ts: float | None = Field(description="when Minder took the node out")
    returned_ts: float | None = Field(
        description="when the node went back to scheduling after a pass; null otherwise"
    )
    scheduler_ref: str | None = Field(
        description="the scheduler's handle: Slurm job id and reservation, Kubernetes Job name"
    )
    detail: str = Field(description="one line: why pending, the verdict, why inconclusive")
    verdict: Verdict | None = Field(description="the node's verdict once its report came")
    report: SelfCheckReportBody | None = Field(description="the node's report once received")

    @classmethod
    def of(cls, record: SelfCheckRecord) -> SelfCheckOut:
        return cls.model_validate(record.to_dict())


class SelfCheckPage(BaseModel):
    """One page of self-checks, newest first."""

    items: list[SelfCheckOut]
    total: int = Field(description="self-checks matching the filters, over all pages")
    limit: int
    offset: int


class SelfCheckRequest(BaseModel):
    """Ask for a self-check of the node an alert's action drained."""

    alert_id: str = Field(min_length=1, max_length=255)
    by: str = Field(
        min_length=1, max_length=255, description="who asks (kept with the check's record)"
    )
    model_config = ConfigDict(extra="forbid")


class SelfCheckCancel(BaseModel):
    """Who cancels a self-check (kept with its record)."""

    by: str | None = Field(None, min_length=1, max_length=255)
    model_config = ConfigDict(extra="forbid")
