"""Health, readiness, /metrics and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, Gauge

import minder
from minder.api import create_app
from minder.storage import SessionFactory, create_engine_for, session_factory


@pytest.mark.parametrize("path", ["/api/v1/health", "/health"])
def test_health_is_always_ok_with_version(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "version": minder.__version__}


def test_probes_find_ready_at_the_root_too(client: TestClient) -> None:
    assert client.get("/ready").json() == client.get("/api/v1/ready").json()


def test_ready_when_database_and_checks_pass(sessions: SessionFactory) -> None:
    calls: list[int] = []

    def checks() -> Mapping[str, bool]:
        calls.append(1)
        return {"kafka": True, "detector": True}

    with TestClient(create_app(sessions, registry=CollectorRegistry(), readiness=checks)) as client:
        response = client.get("/api/v1/ready")
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "checks": {"database": True, "schema": True, "kafka": True, "detector": True},
        "failing": [],
    }
    assert calls


def test_not_ready_names_the_failing_checks(sessions: SessionFactory) -> None:
    app = create_app(sessions, registry=CollectorRegistry(), readiness=lambda: {"kafka": False})
    with TestClient(app) as client:
        response = client.get("/api/v1/ready")
    assert response.status_code == 503
    assert response.json()["failing"] == ["kafka"]
    assert response.json()["checks"]["database"] is True


def test_a_raising_readiness_check_is_not_ready(sessions: SessionFactory) -> None:
    def broken() -> Mapping[str, bool]:
        raise RuntimeError("consumer thread died")

    with TestClient(create_app(sessions, registry=CollectorRegistry(), readiness=broken)) as client:
        response = client.get("/api/v1/ready")
    assert response.status_code == 503
    assert response.json()["failing"] == ["readiness"]


def test_unmigrated_or_unreachable_database_is_not_ready(tmp_path: Path) -> None:
    unmigrated = create_engine_for(f"sqlite:///{tmp_path / 'empty.db'}")
    unreachable = create_engine_for(f"sqlite:///{tmp_path}")  # a directory: cannot open
    try:
        for engine, failing in ((unmigrated, ["schema"]), (unreachable, ["database", "schema"])):
            app = create_app(session_factory(engine), registry=CollectorRegistry())
            with TestClient(app) as client:
                response = client.get("/api/v1/ready")
                assert client.get("/api/v1/health").status_code == 200  # liveness regardless
            assert response.status_code == 503
            assert response.json()["failing"] == failing
    finally:
        unmigrated.dispose()
        unreachable.dispose()


@pytest.mark.parametrize("path", ["/metrics", "/api/v1/metrics"])
def test_metrics_expose_the_given_registry(
    client: TestClient, registry: CollectorRegistry, path: str
) -> None:
    Counter(
        "minder_test_alerts_total", "alerts raised in the test", ["kind"], registry=registry
    ).labels(kind="rule").inc(3)
    Gauge("minder_test_jobs", "jobs watched in the test", registry=registry).set(2)
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'minder_test_alerts_total{kind="rule"} 3.0' in response.text
    assert "minder_test_jobs 2.0" in response.text
    assert "# TYPE minder_test_alerts_total counter" in response.text


def test_metrics_negotiate_openmetrics(client: TestClient, registry: CollectorRegistry) -> None:
    Gauge("minder_test_up", "up", registry=registry).set(1)
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_openapi_lists_every_path(client: TestClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["info"]["version"] == minder.__version__
    assert set(document["paths"]) >= {
        "/api/v1/health",
        "/api/v1/ready",
        "/api/v1/jobs",
        "/api/v1/jobs/{job}",
        "/api/v1/jobs/{job}/machines",
        "/api/v1/jobs/{job}/scores",
        "/api/v1/alerts",
        "/api/v1/alerts/{alert_id}",
        "/metrics",
    }
    assert set(document["paths"]["/api/v1/alerts/{alert_id}"]) == {"get", "patch"}
    assert "AlertOut" in document["components"]["schemas"]
    assert client.get("/docs").status_code == 200
