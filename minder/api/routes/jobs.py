"""Jobs, their machines and their current scores."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter

from minder.api.deps import DbSession
from minder.api.schemas import (
    HangOut,
    JobDetailOut,
    JobFindingOut,
    JobOut,
    JobScoresOut,
    MachineOut,
    MachineScoresOut,
    MetricScoreOut,
    Problem,
)
from minder.storage import (
    JobStatus,
    MachineScore,
    current_scores,
    get_hang_analysis,
    get_job,
    list_job_findings,
    list_jobs,
    list_machines,
    open_hang_alerts,
)

router = APIRouter(prefix="/jobs", tags=["jobs"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such job"}
}


@router.get("", response_model=list[JobOut], summary="List jobs")
def jobs(session: DbSession, status: JobStatus | None = None) -> list[JobOut]:
    """Every job (optionally in one status), most recently seen first."""
    return [JobOut.of(job) for job in list_jobs(session, status=status)]


@router.get("/{job}", response_model=JobDetailOut, responses=_NOT_FOUND, summary="Get a job")
def job(job: str, session: DbSession) -> JobDetailOut:
    """One job with its machine count, open-alert count and current job-level findings (a
    metric on which its machines are not peers, a job too small to have peers)."""
    info = JobOut.of(get_job(session, job)).model_dump()
    findings = [JobFindingOut.of(finding) for finding in list_job_findings(session, job)]
    info["finding_count"] = len(findings)  # the list read, should a write fall in between
    return JobDetailOut(**info, findings=findings)


@router.get(
    "/{job}/machines",
    response_model=list[MachineOut],
    responses=_NOT_FOUND,
    summary="List a job's machines",
)
def machines(job: str, session: DbSession) -> list[MachineOut]:
    """The machines of a job by name, with their current top score."""
    return [MachineOut.of(machine) for machine in list_machines(session, job)]


@router.get(
    "/{job}/scores",
    response_model=JobScoresOut,
    responses=_NOT_FOUND,
    summary="Current scores of a job",
)
def scores(job: str, session: DbSession) -> JobScoresOut:
    """Per machine that has scores: its top score, metric and device, and every metric's score.

    Most anomalous machine first.
    """
    by_machine: dict[str, list[MachineScore]] = defaultdict(list)
    for score in current_scores(session, job):
        by_machine[score.machine].append(score)
    registered = {machine.name: machine for machine in list_machines(session, job)}
    out = []
    for name, rows in by_machine.items():
        rows.sort(key=lambda row: (-row.score, row.metric))
        top = rows[0]
        machine = registered.get(name)
        out.append(
            MachineScoresOut(
                machine=name,
                group=machine.group if machine else "",
                domain=machine.domain if machine else "",
                top_score=top.score,
                top_metric=top.metric,
                top_device=top.device,
                score_ts=top.ts,
                metrics=[MetricScoreOut.of(row) for row in rows],
            )
        )
    out.sort(key=lambda machine: (-machine.top_score, machine.machine))
    return JobScoresOut(job=job, machines=out)


@router.get(
    "/{job}/hang",
    response_model=HangOut,
    responses={404: {"model": Problem, "description": "no such job, or no hang analysis of it"}},
    summary="The latest hang analysis of a job",
)
def hang(job: str, session: DbSession) -> HangOut:
    """The job's latest hang analysis (docs/hangs.md): whether it is hung, the ranks it waits
    on (culprits) with their machines, process groups and reasons, the collectives entered
    differently, the stuck groups; with the ids of its open hang alerts (the job-level one and
    each culprit machine's own).

    404 when the job is unknown or no analysis was made for it (its ranks wrote no
    flight-recorder dumps, or none reached Minder).
    """
    record = get_hang_analysis(session, job)
    return HangOut.of(record, open_hang_alerts(session, job))
