"""Alert endpoints: filters, pagination, 404s, bad values, status changes, auth."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from minder.api import create_app
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.storage import SessionFactory, get_alert, record_alert, set_alert_status

ALL_STATUSES = (
    "'open', 'acknowledged', 'resolved', 'false_positive', 'confirmed' or 'cleared_by_selfcheck'"
)


def alert(
    machine: str,
    first_ts: float,
    *,
    job: str = "j1",
    kind: AlertKind = AlertKind.SIMILARITY,
    metric: str = "gpu_util_ratio",
) -> Alert:
    return Alert(
        job=job,
        machine=machine,
        kind=kind,
        metric=metric,
        score=first_ts / 10,
        first_ts=first_ts,
        detected_ts=first_ts + 10,
        devices=("gpu1",),
        evidence={"rule": "peer", "window": [0.1, None, 0.3], "peers": {"median": 0.9}},
    )


@pytest.fixture
def seeded(sessions: SessionFactory) -> dict[str, Alert]:
    alerts = {
        "a": alert("m1", 100.0),
        "b": alert("m2", 200.0, kind=AlertKind.RULE, metric="gpu_xid_count"),
        "c": alert("m1", 300.0, metric="gpu_power_watts"),
        "d": alert("m3", 400.0, job="j2", kind=AlertKind.SILENCE, metric="silence"),
    }
    with sessions.begin() as session:
        for a in alerts.values():
            record_alert(session, a)
        record_alert(session, alerts["a"], seen_ts=150.0)  # a second report of a
        set_alert_status(session, alerts["b"].id, AlertStatus.RESOLVED)
    return alerts


def listed(client: TestClient, **params: Any) -> tuple[list[str], dict[str, Any]]:
    response = client.get("/api/v1/alerts", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    return [item["id"] for item in body["items"]], body


def test_alert_list_filters(client: TestClient, seeded: dict[str, Alert]) -> None:
    i = {k: a.id for k, a in seeded.items()}
    assert listed(client)[0] == [i["d"], i["c"], i["b"], i["a"]]
    assert listed(client, job="j1")[0] == [i["c"], i["b"], i["a"]]
    assert listed(client, machine="m1")[0] == [i["c"], i["a"]]
    assert listed(client, kind="rule")[0] == [i["b"]]
    assert listed(client, kind=["rule", "silence"])[0] == [i["d"], i["b"]]
    assert listed(client, status="resolved")[0] == [i["b"]]
    assert listed(client, status=["open", "acknowledged"])[0] == [i["d"], i["c"], i["a"]]
    assert listed(client, since=210.0)[0] == [i["d"], i["c"], i["b"]]
    assert listed(client, since=210.0, until=410.0)[0] == [i["c"], i["b"]]
    assert listed(client, job="nobody") == ([], {"items": [], "total": 0, "limit": 50, "offset": 0})


def test_alert_list_pagination(client: TestClient, seeded: dict[str, Alert]) -> None:
    everything, _ = listed(client)
    first, body = listed(client, limit=3)
    assert (body["total"], body["limit"], body["offset"]) == (4, 3, 0)
    second, body = listed(client, limit=3, offset=3)
    assert (body["total"], body["offset"]) == (4, 3)
    assert first + second == everything
    assert listed(client, limit=3, offset=30)[0] == []


def test_alert_items_carry_every_field(client: TestClient, seeded: dict[str, Alert]) -> None:
    a = seeded["a"]
    item = client.get(f"/api/v1/alerts/{a.id}").json()
    assert item["id"] == a.id
    assert item["key"] == "j1/m1/similarity/gpu_util_ratio"
    assert (item["job"], item["machine"], item["kind"], item["metric"]) == (
        "j1",
        "m1",
        "similarity",
        "gpu_util_ratio",
    )
    assert item["devices"] == ["gpu1"]
    assert (item["first_ts"], item["detected_ts"], item["last_seen_ts"]) == (100.0, 110.0, 150.0)
    assert (item["occurrences"], item["status"], item["score"]) == (2, "open", 10.0)
    assert item["evidence"] == {
        "rule": "peer",
        "window": [0.1, None, 0.3],
        "peers": {"median": 0.9},
    }
    assert item["created_at"] <= item["updated_at"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"kind": "bogus"},
            "'rule', 'similarity', 'straggler', 'silence', 'hang' or 'suspicious_source'",
        ),
        ({"status": "closed"}, ALL_STATUSES),
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": 501}, "less than or equal to 500"),
        ({"offset": -1}, "greater than or equal to 0"),
        ({"since": "yesterday"}, "valid number"),
        ({"since": 5, "until": 1}, "since (5.0) is after until (1.0)"),
    ],
)
def test_bad_filters_are_422_naming_what_is_allowed(
    client: TestClient, params: dict[str, Any], expected: str
) -> None:
    response = client.get("/api/v1/alerts", params=params)
    assert response.status_code == 422
    assert expected in response.text


def test_missing_alert_is_404_naming_the_id(client: TestClient) -> None:
    response = client.get("/api/v1/alerts/deadbeef")
    assert response.status_code == 404
    assert response.json() == {"detail": "no alert with id 'deadbeef'"}
    response = client.patch("/api/v1/alerts/deadbeef", json={"status": "resolved"})
    assert response.status_code == 404


def test_patch_walks_the_life_cycle(
    client: TestClient, sessions: SessionFactory, seeded: dict[str, Alert]
) -> None:
    a = seeded["a"]
    response = client.patch(f"/api/v1/alerts/{a.id}", json={"status": "acknowledged"})
    assert response.status_code == 200
    assert response.json()["status"] == "acknowledged"
    with sessions() as session:
        assert get_alert(session, a.id).status is AlertStatus.ACKNOWLEDGED  # committed
    response = client.patch(f"/api/v1/alerts/{a.id}", json={"status": "open"})
    assert response.status_code == 409
    assert response.json() == {
        "detail": response.json()["detail"],
        "current": "acknowledged",
        "requested": "open",
        "allowed": ["resolved", "false_positive"],
    }
    assert a.id in response.json()["detail"]
    assert (
        client.patch(f"/api/v1/alerts/{a.id}", json={"status": "false_positive"}).status_code == 200
    )
    final = client.patch(f"/api/v1/alerts/{a.id}", json={"status": "resolved"})
    assert final.status_code == 409 and final.json()["allowed"] == []
    with sessions() as session:
        assert get_alert(session, a.id).status is AlertStatus.FALSE_POSITIVE


@pytest.mark.parametrize("body", [{"status": "done"}, {}, {"state": "resolved"}])
def test_patch_refuses_bad_bodies(
    client: TestClient, seeded: dict[str, Alert], body: dict[str, str]
) -> None:
    response = client.patch(f"/api/v1/alerts/{seeded['a'].id}", json=body)
    assert response.status_code == 422
    if body.get("status") == "done":
        assert ALL_STATUSES in response.text


@pytest.mark.parametrize("status", ["confirmed", "cleared_by_selfcheck"])
def test_a_person_cannot_set_a_self_check_verdict(
    client: TestClient, sessions: SessionFactory, seeded: dict[str, Alert], status: str
) -> None:
    """Only the self-check service reaches these statuses, from an authenticated verdict."""
    a = seeded["a"]
    response = client.patch(f"/api/v1/alerts/{a.id}", json={"status": status})
    assert response.status_code == 409
    assert status not in response.json()["allowed"]
    assert "resolved" in response.json()["allowed"]
    with sessions() as session:
        assert get_alert(session, a.id).status is AlertStatus.OPEN


def test_token_guards_mutations_and_reads(
    sessions: SessionFactory, seeded: dict[str, Alert]
) -> None:
    app = create_app(sessions, registry=CollectorRegistry(), api_token="s3cret")
    a = seeded["a"]
    with TestClient(app) as client:
        assert client.get("/api/v1/alerts").status_code == 401  # reads need it too
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get(f"/api/v1/alerts/{a.id}", headers=auth).status_code == 200
        missing = client.patch(f"/api/v1/alerts/{a.id}", json={"status": "resolved"})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = client.patch(
            f"/api/v1/alerts/{a.id}",
            json={"status": "resolved"},
            headers={"Authorization": "Bearer nope"},
        )
        assert wrong.status_code == 401
        basic = client.patch(
            f"/api/v1/alerts/{a.id}",
            json={"status": "resolved"},
            headers={"Authorization": "Basic czNjcmV0"},
        )
        assert basic.status_code == 401
        with sessions() as session:
            assert get_alert(session, a.id).status is AlertStatus.OPEN
        ok = client.patch(
            f"/api/v1/alerts/{a.id}",
            json={"status": "resolved"},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200 and ok.json()["status"] == "resolved"
    doc = app.openapi()
    assert doc["paths"]["/api/v1/alerts/{alert_id}"]["patch"]["security"]
