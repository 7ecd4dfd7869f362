"""``GET /api/v1/jobs/{job}/hang``: the latest hang analysis and the open hang alerts."""

from __future__ import annotations

from fastapi.testclient import TestClient

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.hang import Culprit, CulpritReason, GroupVerdict, HangAnalysis, Mismatch
from minder.storage import (
    MachineInfo,
    SessionFactory,
    record_alert,
    save_hang_analysis,
    set_alert_status,
    upsert_job_machines,
)

ANALYSIS = HangAnalysis(
    hung=True,
    culprits=(
        Culprit(2, CulpritReason.NOT_JOINED, "n24", "0", "default_pg", "gloo:all_reduce", 4, "x"),
        Culprit(5, CulpritReason.NO_DUMP, "n25", "0", "default_pg", "gloo:all_reduce", 4),
    ),
    mismatches=(Mismatch("1", 9, "input_dtypes", {"['Float']": (0, 1), "['Half']": (3,)}),),
    groups=(GroupVerdict("0", "default_pg", 8, True, 4, "gloo:all_reduce", 6, (2, 5)),),
    ranks_seen=7,
    ranks_expected=8,
    versions=("2.10",),
    analysed_ts=1_700_000_050.0,
    notes=("rank 5 wrote no dump",),
)


def _alert(machine: str) -> Alert:
    return Alert(job="j1", machine=machine, kind=AlertKind.HANG, metric="hang", score=1.0,
                 first_ts=1_700_000_000.0, detected_ts=1_700_000_060.0,
                 evidence={"analysis": ANALYSIS.to_dict()} if not machine else {})  # fmt: skip


def test_the_latest_analysis_with_its_open_alerts(
    client: TestClient, sessions: SessionFactory
) -> None:
    with sessions.begin() as session:
        save_hang_analysis(session, "j1", ANALYSIS, 1_700_000_055.0)
        job_level, _ = record_alert(session, _alert(""))
        n24, _ = record_alert(session, _alert("n24"))
        n25, _ = record_alert(session, _alert("n25"))
        set_alert_status(session, n25.id, AlertStatus.ACKNOWLEDGED)  # still open
    response = client.get("/api/v1/jobs/j1/hang")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body == {
        "job": "j1",
        "hung": True,
        "analysis": ANALYSIS.to_dict(),
        "analysed_ts": 1_700_000_050.0,
        "updated_ts": 1_700_000_055.0,
        "job_alert_id": job_level.id,
        "machine_alert_ids": {"n24": n24.id, "n25": n25.id},
    }
    assert HangAnalysis.from_dict(body["analysis"]) == ANALYSIS  # the wire form reads back

    with sessions.begin() as session:  # resolved alerts are not listed; the analysis stays
        set_alert_status(session, job_level.id, AlertStatus.RESOLVED)
        set_alert_status(session, n24.id, AlertStatus.FALSE_POSITIVE)
    body = client.get("/api/v1/jobs/j1/hang").json()
    assert body["job_alert_id"] is None and body["machine_alert_ids"] == {"n25": n25.id}
    assert body["hung"] is True


def test_an_analysis_that_says_the_hang_is_over_replaces_it(
    client: TestClient, sessions: SessionFactory
) -> None:
    with sessions.begin() as session:
        save_hang_analysis(session, "j1", ANALYSIS, 1_700_000_055.0)
        over = HangAnalysis(hung=False, ranks_seen=8, ranks_expected=8, analysed_ts=1_700_000_200)
        save_hang_analysis(session, "j1", over, 1_700_000_201.0)
    body = client.get("/api/v1/jobs/j1/hang").json()
    assert body["hung"] is False and body["analysis"]["culprits"] == []
    assert (body["analysed_ts"], body["updated_ts"]) == (1_700_000_200.0, 1_700_000_201.0)


def test_an_unknown_job_or_one_without_analysis_is_404_with_one_line(
    client: TestClient, sessions: SessionFactory
) -> None:
    response = client.get("/api/v1/jobs/ghost/hang")
    assert (response.status_code, response.json()) == (404, {"detail": "no job 'ghost'"})
    with sessions.begin() as session:
        upsert_job_machines(session, "quiet", [MachineInfo("n1")], 10.0)
    response = client.get("/api/v1/jobs/quiet/hang")
    assert response.status_code == 404
    assert response.json() == {"detail": "no hang analysis of job 'quiet': none was made for it"}


def test_the_route_needs_the_token(client: TestClient, sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        save_hang_analysis(session, "j1", ANALYSIS, 1.0)
    response = client.get("/api/v1/jobs/j1/hang", headers={"authorization": "Bearer wrong"})
    assert response.status_code == 401


def test_the_openapi_document_describes_the_analysis(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    operation = doc["paths"]["/api/v1/jobs/{job}/hang"]["get"]
    assert {"200", "401", "404"} <= set(operation["responses"])
    schemas = doc["components"]["schemas"]
    assert set(schemas["HangAnalysisOut"]["properties"]) == set(ANALYSIS.to_dict())
    assert set(schemas["CulpritOut"]["properties"]) == set(ANALYSIS.culprits[0].to_dict())
    assert set(schemas["GroupVerdictOut"]["properties"]) == set(ANALYSIS.groups[0].to_dict())
    assert set(schemas["MismatchOut"]["properties"]) == set(ANALYSIS.mismatches[0].to_dict())
    assert set(schemas["CulpritReason"]["enum"]) == {r.value for r in CulpritReason}
