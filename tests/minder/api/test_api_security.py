"""The API secure by default: tokens, open mode, reads behind the token (or loopback), Host,
CORS, timeouts, paths."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from api_testing import AUTH, TOKEN, uvicorn_serving
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from minder.api import create_app
from minder.client.api import ApiError, ApiForbiddenError, MinderApi
from minder.config import ApiSettings, Settings, SettingsError
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.service.demo import _demo_access
from minder.service.whatif_inputs import relative_to_roots
from minder.storage import SessionFactory, get_alert, record_alert

BOUNDARY = "minder-security-boundary"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
EVIL = "https://evil.example"
LOOPBACK = ("127.0.0.1", 50000)
REMOTE = ("203.0.113.7", 50000)


def multipart(name: str = "trace.parquet", data: bytes = b"x", *, closed: bool = True) -> bytes:
    """A one-file multipart body, with or without its closing boundary."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + data + (f"\r\n--{BOUNDARY}--\r\n".encode() if closed else b"")


@pytest.fixture
def alert_id(sessions: SessionFactory) -> str:
    alert = Alert(
        job="j1",
        machine="m1",
        kind=AlertKind.RULE,
        metric="gpu_xid_count",
        score=1.0,
        first_ts=100.0,
        detected_ts=101.0,
    )
    with sessions.begin() as session:
        record_alert(session, alert)
    return alert.id


def status_of(sessions: SessionFactory, alert_id: str) -> AlertStatus:
    with sessions() as session:
        return get_alert(session, alert_id).status


def serve(
    sessions: SessionFactory, *, client: tuple[str, int] = LOOPBACK, **options: Any
) -> TestClient:
    """A test client of ``create_app(**options)``, its requests coming from ``client``."""
    return TestClient(create_app(sessions, registry=CollectorRegistry(), **options), client=client)


# -- changes need a token, or open mode ---------------------------------------------------------


def test_without_a_token_changes_are_refused_and_reads_served(
    sessions: SessionFactory, alert_id: str, tmp_path: Path
) -> None:
    with serve(sessions, whatif_workdir=tmp_path / "work") as client:
        changes = [
            client.patch(f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}),
            client.post("/api/v1/whatif", content=multipart(), headers=MULTIPART),
            client.post("/api/v1/whatif", json={"path": "st"}),
            client.post("/api/v1/breaker/reset", json={"by": "ops"}),
            client.put("/api/v1/jobs/j1/settings", json={"actions_enabled": False}),
            # a token the server does not have changes nothing
            client.patch(f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}, headers=AUTH),
        ]
        for response in changes:
            assert response.status_code == 403, (response.request.url, response.text)
            detail = response.json()["detail"]
            assert "changes are disabled on this server: it has no API token" in detail
            assert "MINDER_API__TOKEN" in detail and "MINDER_API__OPEN=true" in detail
        assert client.get(f"/api/v1/alerts/{alert_id}").status_code == 200
        assert client.get("/api/v1/whatif").json()["total"] == 0
        assert client.get("/api/v1/jobs/j1/settings").json()["actions_enabled"] is True
    assert status_of(sessions, alert_id) is AlertStatus.OPEN
    assert not any((tmp_path / "work").glob("*/*"))  # the upload was never read


def test_with_a_token_changes_without_it_get_401(
    sessions: SessionFactory, alert_id: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with serve(sessions, api_token=TOKEN, whatif_workdir=tmp_path) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            patch = client.patch(
                f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}, headers=headers
            )
            upload = client.post(
                "/api/v1/whatif", content=multipart(), headers={**MULTIPART, **headers}
            )
            for response in (patch, upload):
                assert response.status_code == 401, response.text
                assert response.headers["www-authenticate"].startswith("Bearer")
        assert status_of(sessions, alert_id) is AlertStatus.OPEN
        ok = client.patch(f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["status"] == "resolved"
        assert client.get(f"/api/v1/alerts/{alert_id}").status_code == 401  # reads too, loopback
        assert client.get(f"/api/v1/alerts/{alert_id}", headers=AUTH).status_code == 200
    assert "changes and reads need the bearer token" in caplog.text
    assert TOKEN not in caplog.text  # the token is never logged


def test_open_mode_allows_changes_and_says_so_in_a_warning(
    sessions: SessionFactory, alert_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="minder.api.app"):
        client = serve(sessions, open_access=True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "MINDER_API__OPEN=true" in warnings[0].getMessage()
    with client:
        response = client.patch(f"/api/v1/alerts/{alert_id}", json={"status": "acknowledged"})
        assert response.status_code == 200, response.text
    assert status_of(sessions, alert_id) is AlertStatus.ACKNOWLEDGED


def test_contradictory_access_options_are_refused(sessions: SessionFactory) -> None:
    registry = CollectorRegistry()
    with pytest.raises(ValidationError, match="token and open access were both given"):
        create_app(sessions, registry=registry, api_token=TOKEN, open_access=True)
    with pytest.raises(ValidationError, match="token and open reads were both given"):
        create_app(sessions, registry=registry, api_token=TOKEN, open_reads=True)
    with pytest.raises(ValidationError, match=re.escape("allowed host 'a.*.org'")):
        create_app(sessions, registry=registry, allowed_hosts=["a.*.org"])
    with pytest.raises(ValidationError, match="body timeout 0 s"):
        create_app(sessions, registry=registry, body_timeout_s=0)


# -- reads: the token, or loopback -------------------------------------------------------------

OPEN_PATHS = ("/health", "/ready", "/metrics", "/api/v1/health", "/api/v1/ready")


def read_paths(alert_id: str) -> list[str]:
    return [
        "/api/v1/alerts",
        f"/api/v1/alerts/{alert_id}",
        "/api/v1/jobs",
        "/api/v1/jobs/j1/settings",
        "/api/v1/deliveries",
        "/api/v1/actions",
        "/api/v1/breaker",
        "/api/v1/whatif",
    ]


def assert_probes_metrics_and_docs_are_open(client: TestClient) -> None:
    for path in (*OPEN_PATHS, "/api/v1/metrics", "/openapi.json", "/docs"):
        assert client.get(path).status_code == 200, path


@pytest.mark.parametrize("client", [LOOPBACK, REMOTE], ids=["loopback", "remote"])
def test_with_a_token_every_read_needs_it_but_probes_and_metrics_do_not(
    sessions: SessionFactory, alert_id: str, client: tuple[str, int]
) -> None:
    with serve(sessions, client=client, api_token=TOKEN) as test_client:
        for path in read_paths(alert_id):
            refused = test_client.get(path)
            assert refused.status_code == 401, path
            assert refused.headers["www-authenticate"] == "Bearer"
            wrong = test_client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            assert test_client.get(path, headers=AUTH).status_code == 200, path
        assert_probes_metrics_and_docs_are_open(test_client)


def test_without_a_token_a_remote_client_reads_nothing_and_is_told_which_setting(
    sessions: SessionFactory, alert_id: str
) -> None:
    with serve(sessions, client=REMOTE) as client:
        for path in read_paths(alert_id):
            refused = client.get(path)
            assert refused.status_code == 403, path
            assert refused.headers["content-type"] == "application/json"
            assert b"\n" not in refused.content
            detail = refused.json()["detail"]
            assert detail.startswith("reads from other hosts are disabled on this server")
            assert "MINDER_API__OPEN_READS=true" in detail and "MINDER_API__TOKEN" in detail
        assert_probes_metrics_and_docs_are_open(client)


@pytest.mark.parametrize(
    ("host", "reads"),
    [
        ("127.0.0.1", 200),
        ("127.8.9.10", 200),
        ("::1", 200),
        ("::ffff:127.0.0.1", 200),
        ("10.0.0.1", 403),
        ("::ffff:10.0.0.1", 403),
        ("fe80::1", 403),
        ("testclient", 403),  # not an address: not loopback
    ],
)
def test_without_a_token_only_loopback_addresses_read(
    sessions: SessionFactory, host: str, reads: int
) -> None:
    with serve(sessions, client=(host, 50000)) as client:
        assert client.get("/api/v1/alerts").status_code == reads


def test_open_reads_serve_any_client_and_still_refuse_changes(
    sessions: SessionFactory, alert_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="minder.api.app"):
        client = serve(sessions, client=REMOTE, open_reads=True)
    assert "reads to any client (MINDER_API__OPEN_READS=true)" in caplog.text
    with client:
        for path in read_paths(alert_id):
            assert client.get(path).status_code == 200, path
        change = client.patch(f"/api/v1/alerts/{alert_id}", json={"status": "resolved"})
        assert change.status_code == 403
    assert status_of(sessions, alert_id) is AlertStatus.OPEN


def test_open_mode_serves_reads_to_any_client_too(sessions: SessionFactory, alert_id: str) -> None:
    with serve(sessions, client=REMOTE, open_access=True) as client:
        for path in read_paths(alert_id):
            assert client.get(path).status_code == 200, path


def test_a_client_forwarded_by_a_local_proxy_is_not_loopback(sessions: SessionFactory) -> None:
    """uvicorn takes ``X-Forwarded-For`` from a proxy on loopback: the client it names reads
    only with the token or open reads."""
    app = create_app(sessions, registry=CollectorRegistry(), allowed_hosts=["127.0.0.1"])
    with uvicorn_serving(app) as port:
        url = f"http://127.0.0.1:{port}/api/v1/alerts"
        assert httpx.get(url, timeout=10).status_code == 200
        forwarded = httpx.get(url, headers={"X-Forwarded-For": "203.0.113.7"}, timeout=10)
        assert forwarded.status_code == 403, forwarded.text
        assert "MINDER_API__OPEN_READS" in forwarded.json()["detail"]


# -- Host allow-list and CORS -------------------------------------------------------------------


def test_a_host_not_allowed_gets_400(sessions: SessionFactory) -> None:
    hosts = ApiSettings(host="127.0.0.1").effective_allowed_hosts()
    with serve(sessions, allowed_hosts=hosts) as client:
        for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST"):
            assert client.get("/health", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8080", "127.0.0.2", "localhost.evil.example"):
            response = client.get("/api/v1/alerts", headers={"host": host})
            assert response.status_code == 400, host
            assert response.text == "Invalid host header"
    with serve(sessions, allowed_hosts=["*.example.org"]) as client:
        assert client.get("/health", headers={"host": "minder.example.org"}).status_code == 200
        assert client.get("/health", headers={"host": "example.com"}).status_code == 400


def test_the_default_hosts_follow_the_bind_address() -> None:
    loopback = ["localhost", "127.0.0.1", "[::1]"]
    assert ApiSettings().effective_allowed_hosts() == loopback
    assert ApiSettings(host="::1").effective_allowed_hosts() == loopback
    assert ApiSettings(host="localhost").effective_allowed_hosts() == loopback
    assert ApiSettings(host="0.0.0.0").effective_allowed_hosts() == ["*"]
    assert ApiSettings(host="10.0.0.5").effective_allowed_hosts() == ["*"]
    chosen = ApiSettings(host="0.0.0.0", allowed_hosts=["minder.example.org", "10.0.0.5"])
    assert chosen.effective_allowed_hosts() == ["minder.example.org", "10.0.0.5"]


def test_a_preflight_from_an_unknown_origin_gets_no_allow_header(sessions: SessionFactory) -> None:
    preflight = {
        "origin": EVIL,
        "access-control-request-method": "PATCH",
        "access-control-request-headers": "authorization, content-type",
    }
    with serve(sessions, api_token=TOKEN) as client:
        response = client.options("/api/v1/alerts/x", headers=preflight)
        assert response.status_code == 400
        assert "access-control-allow-origin" not in response.headers
        read = client.get("/api/v1/alerts", headers={"origin": EVIL, **AUTH})
        assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
    grafana = "https://grafana.example.org"
    with serve(sessions, api_token=TOKEN, cors_origins=[grafana]) as client:
        allowed = client.options("/api/v1/alerts/x", headers={**preflight, "origin": grafana})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == grafana
        assert "PATCH" in allowed.headers["access-control-allow-methods"]
        refused = client.options("/api/v1/alerts/x", headers=preflight)
        assert "access-control-allow-origin" not in refused.headers


def test_a_cross_origin_multipart_post_is_refused(
    sessions: SessionFactory, alert_id: str, tmp_path: Path
) -> None:
    """What a web page's form can send to the API: refused with or without a server token, and
    in open mode too (the Origin is checked on every change)."""
    browser = {**MULTIPART, "origin": EVIL}
    for options in ({}, {"api_token": TOKEN}, {"open_access": True}):
        with serve(sessions, whatif_workdir=tmp_path, **options) as client:
            response = client.post("/api/v1/whatif", content=multipart(), headers=browser)
            assert response.status_code == 403, (options, response.text)
            assert "access-control-allow-origin" not in response.headers
            assert client.get("/api/v1/whatif", headers=AUTH).json()["total"] == 0
    with serve(sessions, open_access=True) as client:
        foreign = client.patch(
            f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}, headers={"origin": EVIL}
        )
        assert foreign.status_code == 403
        assert f"cross-origin change from origin {EVIL!r} refused" in foreign.json()["detail"]
        null = client.patch(
            f"/api/v1/alerts/{alert_id}", json={"status": "resolved"}, headers={"origin": "null"}
        )
        assert null.status_code == 403
        # the API's own pages (/docs) send their own origin
        own = client.patch(
            f"/api/v1/alerts/{alert_id}",
            json={"status": "resolved"},
            headers={"origin": "http://testserver"},
        )
        assert own.status_code == 200, own.text


# -- timeouts and truncated bodies --------------------------------------------------------------


def stalled_exchange(port: int, head: bytes, partial: bytes) -> tuple[float, bytes]:
    """Send a request's head and part of its body, then wait: the answer, and the seconds until
    the server closed the connection (a socket timeout fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + partial)
        started = time.monotonic()
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return time.monotonic() - started, answer


@pytest.mark.parametrize("endpoint", ["upload", "patch"])
def test_a_stalled_body_gets_408_and_the_connection_closed(
    sessions: SessionFactory, alert_id: str, tmp_path: Path, endpoint: str
) -> None:
    workdir = tmp_path / "work"
    app = create_app(
        sessions,
        registry=CollectorRegistry(),
        api_token=TOKEN,
        body_timeout_s=1.0,
        whatif_workdir=workdir,
    )
    if endpoint == "upload":
        body = multipart(data=b"\0" * 4096)
        head = (
            "POST /api/v1/whatif HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: {MULTIPART['content-type']}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
    else:
        body = json.dumps({"status": "resolved", "by": "x" * 100}).encode()
        head = (
            f"PATCH /api/v1/alerts/{alert_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
    with uvicorn_serving(app) as port:
        elapsed, answer = stalled_exchange(port, head, body[: len(body) // 2])
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower()
        assert b"the request body stalled: no data for 1 s" in answer
        assert 0.9 <= elapsed < 4.0, elapsed
        # the server goes on serving
        health = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        assert stalled_exchange(port, health, b"")[1].startswith(b"HTTP/1.1 200 ")
    assert status_of(sessions, alert_id) is AlertStatus.OPEN
    assert not any(workdir.glob("*/*"))  # the partial upload was removed


def trickled_exchange(
    port: int, head: bytes, body: bytes, chunk: int, every_s: float
) -> tuple[float, bytes]:
    """Send a request's head, then its body ``chunk`` bytes every ``every_s`` seconds (while
    the server lets it): the answer, and the seconds from the head to the server's close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        sock.settimeout(every_s)
        answer = b""
        for offset in range(0, len(body), chunk):
            try:
                sock.sendall(body[offset : offset + chunk])
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if answer:
                break
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            while part := sock.recv(65536):
                answer += part
        return time.monotonic() - started, answer


def patch_head(
    alert_id: str, length: int, authorization: str = f"Authorization: Bearer {TOKEN}\r\n"
) -> bytes:
    return (
        f"PATCH /api/v1/alerts/{alert_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def rate_bound_app(sessions: SessionFactory) -> Any:
    """An app whose bodies may stall 1 s and must average 100 bytes/s after it."""
    return create_app(
        sessions,
        registry=CollectorRegistry(),
        api_token=TOKEN,
        body_timeout_s=1.0,
        body_min_rate=100,
    )


def test_a_body_trickled_below_the_minimum_rate_gets_408(
    sessions: SessionFactory, alert_id: str
) -> None:
    """Each chunk within the stall timeout is not enough: 5 bytes/s against 100 bytes/s."""
    app = rate_bound_app(sessions)
    body = json.dumps({"status": "resolved", "by": "x" * 400}).encode()
    with uvicorn_serving(app) as port:
        elapsed, answer = trickled_exchange(port, patch_head(alert_id, len(body)), body, 1, 0.2)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"the request body came too slowly" in answer
    assert b"MINDER_API__BODY_MIN_RATE" in answer
    assert 0.9 <= elapsed < 3.0, elapsed
    assert status_of(sessions, alert_id) is AlertStatus.OPEN


def test_a_body_at_the_minimum_rate_may_take_longer_than_the_stall_timeout(
    sessions: SessionFactory, alert_id: str
) -> None:
    app = rate_bound_app(sessions)
    body = json.dumps({"status": "resolved", "by": "ops"}).encode() + b" " * 500
    with uvicorn_serving(app) as port:
        # 100 bytes every 0.4 s (250 bytes/s): about 2 s in all, twice the stall timeout
        elapsed, answer = trickled_exchange(port, patch_head(alert_id, len(body)), body, 100, 0.4)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert elapsed > 1.5
    assert status_of(sessions, alert_id) is AlertStatus.RESOLVED


def test_a_truncated_multipart_body_gets_422(client: TestClient, tmp_path: Path) -> None:
    body = multipart(data=b"PAR1" + b"\0" * 2048, closed=False)
    response = client.post("/api/v1/whatif", content=body, headers=MULTIPART)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail == (
        f"the multipart body ends after {len(body)} bytes without its closing boundary "
        f"'--{BOUNDARY}--': the upload was cut short (expected the complete body)"
    )
    assert client.get("/api/v1/whatif").json()["total"] == 0  # nothing queued


# -- paths relative to the roots ----------------------------------------------------------------


@pytest.fixture
def aliased_root(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``(alias, real)``: the configured root is a symbolic link to the real directory."""
    real = tmp_path / "disks" / "real"
    (real / "st").mkdir(parents=True)
    (real / "st" / "rank-0.json").write_text("{not json")
    pd.DataFrame({"rank": [0, 1], "duration": [1.0, 2.0]}).to_parquet(real / "bad.parquet")
    (tmp_path / "secret.parquet").write_bytes(b"x")
    (real / "link.parquet").symlink_to(tmp_path / "secret.parquet")
    alias = tmp_path / "traces"
    alias.symlink_to(real)
    yield alias, real
    shutil.rmtree(tmp_path / "disks", ignore_errors=True)


def poll(client: TestClient, report_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        body: dict[str, Any] = client.get(f"/api/v1/whatif/{report_id}").json()
        if body["status"] in ("done", "failed"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.02)


def test_error_messages_name_server_files_relative_to_the_roots(
    sessions: SessionFactory, aliased_root: tuple[Path, Path], tmp_path: Path
) -> None:
    alias, real = aliased_root
    with serve(sessions, api_token=TOKEN, whatif_roots=[alias]) as client:
        client.headers.update(AUTH)
        submitted = client.post("/api/v1/whatif", json={"path": "st"})
        assert submitted.status_code == 202, submitted.text
        failed = poll(client, submitted.json()["id"])
        assert failed["status"] == "failed"
        assert failed["error"].startswith("st/rank-0.json: cannot read a Kineto JSON trace")
        assert failed["source"] == "path: st/rank-0.json"
        absolute = client.post("/api/v1/whatif", json={"path": str(real / "bad.parquet")})
        assert poll(client, absolute.json()["id"])["status"] == "failed"
        for path in ("link.parquet", "link*", str(tmp_path / "secret.parquet"), "../../x"):
            refused = client.post("/api/v1/whatif", json={"path": path})
            assert refused.status_code == 403, (path, refused.text)
            assert "outside the directories this server may read" in refused.json()["detail"]
            shown = refused.json()["detail"].replace(repr(path), "")
            assert str(tmp_path) not in shown, shown
        reports = client.get("/api/v1/whatif").json()["items"]
        for report in reports:
            assert str(tmp_path) not in json.dumps(report)


def test_relative_to_roots_rewrites_only_paths_under_a_root() -> None:
    roots = [Path("/srv/traces"), Path("/mnt/nfs/traces")]
    text = (
        "/srv/traces/st/a.json: bad; '/mnt/nfs/traces/b.parquet' and /srv/traces2/c, "
        "root /srv/traces, other /etc/passwd"
    )
    assert relative_to_roots(text, roots) == (
        "st/a.json: bad; 'b.parquet' and /srv/traces2/c, root ., other /etc/passwd"
    )
    assert relative_to_roots("/x/y", [Path("/")]) == "/x/y"


# -- settings and the commands' wording ---------------------------------------------------------


def test_contradictory_settings_stop_the_service_in_one_line(
    no_api_variables: pytest.MonkeyPatch,
) -> None:
    monkeypatch = no_api_variables
    monkeypatch.setenv("MINDER_API__TOKEN", "sup3r-secret-value")
    monkeypatch.setenv("MINDER_API__OPEN", "true")
    with pytest.raises(SettingsError) as both:
        Settings.load()
    assert "open mode (MINDER_API__OPEN=true) and a token (MINDER_API__TOKEN) are both set" in str(
        both.value
    )
    assert "sup3r-secret-value" not in str(both.value) and "\n" not in str(both.value)
    monkeypatch.delenv("MINDER_API__OPEN")
    monkeypatch.setenv("MINDER_API__TOKEN", "")
    monkeypatch.setenv("MINDER_API__PROTECT_READS", "true")
    with pytest.raises(
        SettingsError, match="PROTECT_READS=true, deprecated\\) need a token: expected MINDER_API"
    ):
        Settings.load()
    monkeypatch.setenv("MINDER_API__TOKEN", "sup3r-secret-value")
    assert Settings.load().api.protect_reads is True  # deprecated, still accepted with a token
    monkeypatch.delenv("MINDER_API__PROTECT_READS")
    monkeypatch.setenv("MINDER_API__OPEN_READS", "true")
    with pytest.raises(SettingsError) as reads:
        Settings.load()
    assert "open reads (MINDER_API__OPEN_READS=true) and a token (MINDER_API__TOKEN)" in str(
        reads.value
    )
    assert "sup3r-secret-value" not in str(reads.value)
    monkeypatch.delenv("MINDER_API__OPEN_READS")
    monkeypatch.setenv("MINDER_API__TOKEN", "")
    assert Settings.load().api.token is None  # an empty token is no token
    monkeypatch.setenv("MINDER_API__ALLOWED_HOSTS", '["minder.*.org"]')
    with pytest.raises(
        SettingsError, match=re.escape("host 'minder.*.org' of MINDER_API__ALLOWED_HOSTS")
    ):
        Settings.load()


@pytest.fixture
def no_api_variables(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The environment without the API's settings (the tests set those they need)."""
    for name in list(os.environ):
        if name.startswith("MINDER_API__"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_serve_and_demo_say_how_changes_are_made(no_api_variables: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.api.describe_access() == (
        "API reads from loopback, changes refused until MINDER_API__TOKEN is set"
    )
    assert (
        "reads from any client (MINDER_API__OPEN_READS=true)"
        in Settings(api=ApiSettings(open_reads=True)).api.describe_access()
    )
    access = _demo_access(settings)  # the demo makes a token for its run
    assert settings.api.token is not None and len(settings.api.token) >= 24
    assert access == f"reads and changes: --token {settings.api.token} (this run's token)"
    assert settings.api.describe_access() == "API changes and reads need the token"
    assert settings.api.token not in settings.api.describe_access()
    chosen = Settings(api=ApiSettings(token="mine"))
    assert _demo_access(chosen) == "reads and changes: with the token of MINDER_API__TOKEN"
    assert chosen.api.token == "mine"
    open_settings = Settings(api=ApiSettings(open=True))
    assert _demo_access(open_settings).startswith("reads and changes: open to anyone")
    assert open_settings.api.token is None
    assert "open to reads and changes by anyone" in open_settings.api.describe_access()


# -- what schemathesis found --------------------------------------------------------------------


def test_a_json_body_that_is_not_utf8_gets_422_not_500(client: TestClient) -> None:
    response = client.post(
        "/api/v1/whatif", content=b"a\x8d", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["type"] == "json_invalid" and error["input"] == "a\ufffd"
    patch = client.patch(
        "/api/v1/alerts/x", content=b"\xef\x8d", headers={"content-type": "application/json"}
    )
    # FastAPI's own parsing of a JSON body: 400, documented in the OpenAPI document
    assert patch.status_code == 400
    assert patch.json() == {"detail": "There was an error parsing the body"}


@pytest.mark.parametrize("path", ["/api/v1/alerts", "/api/v1/deliveries", "/api/v1/actions"])
def test_offsets_beyond_a_64_bit_integer_get_422_not_500(client: TestClient, path: str) -> None:
    assert client.get(path, params={"offset": 2**63 - 1}).json()["items"] == []
    response = client.get(path, params={"offset": 2**63})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "offset"]


def test_the_cli_client_says_why_a_change_is_refused(
    sessions: SessionFactory, alert_id: str
) -> None:
    """``minder alerts ack`` against a server without a token, and one with a Host check."""
    app = create_app(sessions, registry=CollectorRegistry(), allowed_hosts=["127.0.0.1"])
    with uvicorn_serving(app) as port, MinderApi(f"http://127.0.0.1:{port}") as api:
        assert api.alert(alert_id)["status"] == "open"  # reads are served
        with pytest.raises(ApiForbiddenError) as refused:
            api.change_alert_status(alert_id, "acknowledged", by="ana")
        assert str(refused.value).startswith(
            f"the API refused PATCH http://127.0.0.1:{port}/api/v1/alerts/{alert_id} (HTTP 403): "
            "changes are disabled on this server: it has no API token"
        )
        with MinderApi(f"http://localhost:{port}") as other_name, pytest.raises(ApiError) as host:
            other_name.alerts()
        assert "refused the host name of" in str(host.value)
        assert "MINDER_API__ALLOWED_HOSTS" in str(host.value)
    assert status_of(sessions, alert_id) is AlertStatus.OPEN


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("", b"this endpoint needs 'Authorization: Bearer <token>'"),
        ("Authorization: Bearer wrong\r\n", b"the bearer token is not valid"),
        ("Authorization: Basic dXNlcjpwYXNz\r\n", b"this endpoint needs"),
    ],
)
def test_a_change_without_the_token_is_refused_before_its_body_is_read(
    sessions: SessionFactory, alert_id: str, authorization: str, expected: bytes
) -> None:
    """A client without the token cannot hold a connection by trickling a body: 401 at once."""
    app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN, body_timeout_s=30)
    body = json.dumps({"status": "resolved", "by": "x" * 400}).encode()
    head = patch_head(alert_id, len(body), authorization)
    with uvicorn_serving(app) as port:
        elapsed, answer = trickled_exchange(port, head, body, 5, 0.2)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
    assert expected in answer and b"www-authenticate: bearer" in answer.lower()
    assert elapsed < 1.0, elapsed  # the 400-byte body would take 16 s at this pace
    assert status_of(sessions, alert_id) is AlertStatus.OPEN


def test_without_a_token_a_change_is_refused_before_its_body_is_read(
    sessions: SessionFactory, alert_id: str
) -> None:
    app = create_app(sessions, registry=CollectorRegistry(), body_timeout_s=30)
    body = json.dumps({"status": "resolved", "by": "x" * 400}).encode()
    head = patch_head(alert_id, len(body), authorization="")
    with uvicorn_serving(app) as port:
        elapsed, answer = trickled_exchange(port, head, body, 5, 0.2)
    assert answer.startswith(b"HTTP/1.1 403 ") and b"MINDER_API__TOKEN" in answer, answer[:300]
    assert elapsed < 1.0, elapsed
