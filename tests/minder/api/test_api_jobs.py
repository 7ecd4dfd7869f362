"""Jobs, machines and scores endpoints."""

from __future__ import annotations

from fastapi.testclient import TestClient

from minder.core.alert import Alert, AlertKind
from minder.storage import (
    MachineInfo,
    ScoreRow,
    SessionFactory,
    record_alert,
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
        set_job_status(session, "j0", "finished")
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
        ("j0", "finished", 1, 0),
    ]
    assert [j["id"] for j in client.get("/api/v1/jobs", params={"status": "finished"}).json()] == [
        "j0"
    ]
    job = client.get("/api/v1/jobs/j1").json()
    assert (job["first_seen_ts"], job["last_seen_ts"]) == (100.0, 101.0)


def test_empty_store_lists_no_jobs(client: TestClient) -> None:
    assert client.get("/api/v1/jobs").json() == []


def test_bad_job_status_names_the_allowed_values(client: TestClient) -> None:
    response = client.get("/api/v1/jobs", params={"status": "gone"})
    assert response.status_code == 422
    assert "'active' or 'finished'" in response.text


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
