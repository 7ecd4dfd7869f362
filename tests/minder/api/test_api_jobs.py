"""Jobs, machines and scores endpoints."""

from __future__ import annotations

from fastapi.testclient import TestClient

from minder.core.alert import Alert, AlertKind
from minder.storage import (
    MachineInfo,
    ScoreRow,
    SessionFactory,
    record_alert,
    save_job_findings,
    save_scores,
    set_job_status,
    upsert_job_machines,
)


def seed(sessions: SessionFactory) -> None:
    with sessions.begin() as session:
        upsert_job_machines(
            session,
            "j1",
            [
                MachineInfo("n1", "pp0", "leaf-1"),
                MachineInfo("n2", "pp0", "leaf-1"),
                MachineInfo("n3", "pp1", "leaf-2"),
            ],
            100.0,
        )
        upsert_job_machines(session, "j0", [MachineInfo("a")], 50.0)
        set_job_status(session, "j0", "ended", "its last machine said goodbye")
        save_scores(
            session,
            "j1",
            [
                ScoreRow("n1", "gpu_util_ratio", 1.0, "gpu0"),
                ScoreRow("n2", "gpu_util_ratio", 9.0, "gpu3"),
                ScoreRow("n2", "gpu_power_watts", 4.0, "gpu3"),
                ScoreRow("n2", "cpu_util_ratio", 6.0, ""),
            ],
            101.0,
        )
        record_alert(
            session,
            Alert(
                job="j1",
                machine="n2",
                kind=AlertKind.SIMILARITY,
                metric="gpu_util_ratio",
                score=9.0,
                first_ts=90.0,
                detected_ts=101.0,
                devices=("gpu3",),
            ),
        )


def test_list_and_get_jobs(client: TestClient, sessions: SessionFactory) -> None:
    seed(sessions)
    response = client.get("/api/v1/jobs")
    assert response.status_code == 200
    jobs = response.json()
    assert [(j["id"], j["status"], j["machine_count"], j["open_alerts"]) for j in jobs] == [
        ("j1", "active", 3, 1),
        ("j0", "ended", 1, 0),
    ]
    assert (jobs[1]["active_machines"], jobs[1]["status_reason"]) == (
        0,
        "its last machine said goodbye",
    )
    assert [j["id"] for j in client.get("/api/v1/jobs", params={"status": "ended"}).json()] == [
        "j0"
    ]
    job = client.get("/api/v1/jobs/j1").json()
    assert (job["first_seen_ts"], job["last_seen_ts"]) == (100.0, 101.0)


def test_empty_store_lists_no_jobs(client: TestClient) -> None:
    assert client.get("/api/v1/jobs").json() == []


def test_bad_job_status_names_the_allowed_values(client: TestClient) -> None:
    response = client.get("/api/v1/jobs", params={"status": "gone"})
    assert response.status_code == 422
    assert "'active', 'idle' or 'ended'" in response.text


def test_machines_of_a_job(client: TestClient, sessions: SessionFactory) -> None:
    seed(sessions)
    machines = client.get("/api/v1/jobs/j1/machines").json()
    assert [m["name"] for m in machines] == ["n1", "n2", "n3"]
    n2 = machines[1]
    assert (n2["group"], n2["domain"], n2["top_score"], n2["top_metric"], n2["top_device"]) == (
        "pp0",
        "leaf-1",
        9.0,
        "gpu_util_ratio",
        "gpu3",
    )
    assert machines[2]["top_score"] is None


def test_scores_of_a_job_most_anomalous_first(client: TestClient, sessions: SessionFactory) -> None:
    seed(sessions)
    body = client.get("/api/v1/jobs/j1/scores").json()
    assert body["job"] == "j1"
    assert [m["machine"] for m in body["machines"]] == ["n2", "n1"]  # n3 has no scores
    n2 = body["machines"][0]
    assert (n2["top_score"], n2["top_metric"], n2["top_device"], n2["group"], n2["score_ts"]) == (
        9.0,
        "gpu_util_ratio",
        "gpu3",
        "pp0",
        101.0,
    )
    assert [(m["metric"], m["score"], m["device"]) for m in n2["metrics"]] == [
        ("gpu_util_ratio", 9.0, "gpu3"),
        ("cpu_util_ratio", 6.0, ""),
        ("gpu_power_watts", 4.0, "gpu3"),
    ]


def test_unknown_job_is_404_naming_it(client: TestClient) -> None:
    for path in ("/api/v1/jobs/ghost", "/api/v1/jobs/ghost/machines", "/api/v1/jobs/ghost/scores"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json() == {"detail": "no job 'ghost'"}


def test_a_job_lists_its_current_findings_and_the_list_counts_them(
    client: TestClient, sessions: SessionFactory
) -> None:
    seed(sessions)
    not_peers = {
        "finding": "not_peer_comparable",
        "metric": "gpu_util_ratio",
        "coherence": 0.62,
        "outliers": 55,
        "allowance": 8,
        "machines": 144,
        "since_ts": 95.0,
        "detail": "55 distinct machines were outliers on gpu_util_ratio",
    }
    too_few = {"finding": "too_few_machines", "metric": None, "machines": 3, "since_ts": 90.0,
               "detail": "fewer than 4 machines"}  # fmt: skip
    with sessions.begin() as session:
        save_job_findings(session, "j1", [too_few, not_peers], 102.0)
    job = client.get("/api/v1/jobs/j1").json()
    assert job["finding_count"] == 2
    assert job["findings"] == [
        {**not_peers, "updated_ts": 102.0},
        {**too_few, "coherence": None, "outliers": None, "allowance": None, "updated_ts": 102.0},
    ]
    counts = {j["id"]: j["finding_count"] for j in client.get("/api/v1/jobs").json()}
    assert counts == {"j1": 2, "j0": 0}
    assert "findings" not in client.get("/api/v1/jobs").json()[0]  # the list only counts
    assert client.get("/api/v1/jobs/j0").json()["findings"] == []

    with sessions.begin() as session:  # the finding ended: the service writes the new set
        save_job_findings(session, "j1", [too_few], 103.0)
    job = client.get("/api/v1/jobs/j1").json()
    assert [f["finding"] for f in job["findings"]] == ["too_few_machines"]
    assert job["finding_count"] == 1


def test_the_openapi_document_describes_a_jobs_findings(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    get_job = doc["paths"]["/api/v1/jobs/{job}"]["get"]
    ref = get_job["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    detail = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"findings", "finding_count", "machine_count"} <= set(detail["properties"])
    finding = doc["components"]["schemas"]["JobFindingOut"]
    assert set(finding["properties"]) == {
        "finding", "metric", "coherence", "outliers", "allowance", "machines", "since_ts",
        "updated_ts", "detail",
    }  # fmt: skip
    assert "finding_count" in doc["components"]["schemas"]["JobOut"]["properties"]
