"""The operator loop over a real API: ``minder alerts|actions|breaker|labels``.

The API (``create_app`` on a migrated SQLite file) is served by uvicorn on a loopback port in a
thread, so every command goes through the CLI's real HTTP path.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import uvicorn
import yaml
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from typer.testing import CliRunner

from detectors.alert_labels import LabelEnd, fault_name, label_rows, sidecar_path
from detectors.training import validate_labels
from minder.api import create_app
from minder.cli import app
from minder.client.api import ApiError, MinderApi
from minder.core.alert import Alert, AlertKind
from minder.storage import SessionFactory, session_factory
from minder.storage.actions import audit, trip_breaker
from minder.storage.outbox import Destination, list_deliveries, record_alert_with_events
from minder.storage.testing import clear_tables, scratch_database

TOKEN = "t"
EVENTS = frozenset({"alert.opened", "alert.acknowledged", "alert.resolved", "alert.false_positive"})
DESTINATIONS = [Destination("webhook:ops", EVENTS)]
T0 = 1_763_700_000.0
# no operator variables of the caller's shell leak into the commands
CLEAN_ENV: dict[str, str | None] = {
    "MINDER_API_URL": None,
    "MINDER_API_TOKEN": None,
    "MINDER_API__TOKEN": None,
    "USER": "tester",
    "USERNAME": None,
}

runner = CliRunner()


@dataclass
class Api:
    url: str
    sessions: SessionFactory

    def seed(self, **fields: Any) -> Alert:
        values: dict[str, Any] = {
            "job": "j1",
            "machine": "j1-n0001",
            "kind": AlertKind.SIMILARITY,
            "metric": "gpu_power_w",
            "score": 7.5,
            "first_ts": T0 + 40,
            "detected_ts": T0 + 52,
            "devices": ("gpu3",),
            "domain": "leaf-1",
            "evidence": {"z": 7.5, "peers": 15, "note": "[bold]not markup[/]"},
        }
        values.update(fields)
        with self.sessions() as session:
            stored, _ = record_alert_with_events(session, Alert(**values), DESTINATIONS)
            session.commit()
        return stored


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with scratch_database("sqlite", tmp_path_factory.mktemp("db")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[Api]:
    sessions = session_factory(engine)
    api_app = create_app(
        sessions, registry=CollectorRegistry(), api_token=TOKEN, destinations=DESTINATIONS
    )
    sock = _socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(api_app, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Api(f"http://127.0.0.1:{port}", sessions)
    finally:
        uv.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture
def api(server: Api, engine: Engine) -> Iterator[Api]:
    yield server
    clear_tables(engine)


def cli(args: list[str], **env: str | None) -> Any:
    """``args`` run, with the server's token unless ``env`` says otherwise (the server has a
    token: reads need it too)."""
    if "MINDER_API__TOKEN" not in env:
        env = {"MINDER_API_TOKEN": TOKEN, **env}
    result = runner.invoke(app, args, env={**CLEAN_ENV, **env})
    assert "Traceback" not in result.output, result.output
    return result


def ok(args: list[str], **env: str | None) -> Any:
    result = cli(args, **env)
    assert result.exit_code == 0, result.output
    return result


def one_line_error(args: list[str], **env: str | None) -> str:
    result = cli(args, **env)
    assert result.exit_code == 2, result.output
    assert result.stdout == "", result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def as_json(args: list[str], **env: str | None) -> Any:
    return json.loads(ok([*args, "--format", "json"], **env).stdout)


# -- alerts ------------------------------------------------------------------------------------


def test_list_filters_and_json_shape(api: Api) -> None:
    a = api.seed()
    b = api.seed(machine="j1-n0002", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                 first_ts=T0 + 60, detected_ts=T0 + 60)  # fmt: skip
    c = api.seed(job="j2", machine="j2-n0007", detected_ts=T0 + 90, first_ts=T0 + 80)
    base = ["alerts", "list", "--api", api.url]

    page = as_json(base)
    assert page["total"] == 3 and page["limit"] == 50 and page["offset"] == 0
    assert [item["id"] for item in page["items"]] == [c.id, b.id, a.id]  # newest detected first
    assert set(page["items"][0]) == {
        "id", "key", "job", "machine", "devices", "kind", "metric", "score", "first_ts",
        "detected_ts", "last_seen_ts", "occurrences", "domain", "status", "evidence",
        "created_at", "updated_at",
    }  # fmt: skip
    assert page["items"][2]["evidence"]["peers"] == 15

    assert [i["id"] for i in as_json([*base, "--job", "j1"])["items"]] == [b.id, a.id]
    assert [i["id"] for i in as_json([*base, "--machine", "j2-n0007"])["items"]] == [c.id]
    assert [i["id"] for i in as_json([*base, "--kind", "rule"])["items"]] == [b.id]
    both = as_json([*base, "--kind", "rule", "--kind", "similarity", "--job", "j1"])
    assert both["total"] == 2
    assert as_json([*base, "--status", "resolved"])["items"] == []
    assert as_json([*base, "--status", "open", "--status", "resolved"])["total"] == 3
    assert [i["id"] for i in as_json([*base, "--since", str(T0 + 60)])["items"]] == [c.id, b.id]
    iso = as_json([*base, "--since", "2025-11-21T04:41:00Z"])  # T0 + 60
    assert [i["id"] for i in iso["items"]] == [c.id, b.id]
    assert as_json([*base, "--until", str(T0 + 60)])["total"] == 1
    limited = as_json([*base, "--limit", "1", "--offset", "1"])
    assert [i["id"] for i in limited["items"]] == [b.id] and limited["total"] == 3
    every = as_json([*base, "--all"])
    assert every["total"] == 3 and len(every["items"]) == 3

    table = ok([*base, "--limit", "2"]).stdout
    assert c.id in table and b.id in table and a.id not in table
    assert "2 of 3 alert(s)" in table and "--offset 2" in table
    assert "similarity" in table and "gpu_xid_count" in table and "open" in table

    line = one_line_error([*base, "--since", "yesterday-ish"])
    assert "--since 'yesterday-ish'" in line
    line = one_line_error([*base, "--since", str(T0 + 100), "--until", str(T0)])
    assert "expected since <= until" in line


def test_paging_through_every_page(api: Api) -> None:
    ids = {api.seed(machine=f"j1-n{i:04d}", detected_ts=T0 + 50 + i).id for i in range(7)}
    pages: list[tuple[int, int]] = []
    with MinderApi(api.url, token=TOKEN) as client:
        got = list(client.iter_alerts(page_size=3, on_page=lambda *p: pages.append(p), job="j1"))
        assert {a["id"] for a in got} == ids and len(got) == 7
        assert pages == [(3, 7), (6, 7), (7, 7)]
        tail = list(client.iter_alerts(offset=5, page_size=3))
        assert len(tail) == 2


def test_show_gives_evidence_deliveries_and_actions(api: Api) -> None:
    a = api.seed()
    with api.sessions() as session:
        audit(session, target="slurm", operation="drain", mode="dry_run", outcome="dry_run",
              detail="would drain j1-n0001", alert_id=a.id, job="j1", machine="j1-n0001",
              node="node17")  # fmt: skip
        session.commit()
    shown = as_json(["alerts", "show", a.id, "--api", api.url])
    assert shown["alert"]["id"] == a.id and shown["alert"]["evidence"]["z"] == 7.5
    assert [(d["destination"], d["event"]) for d in shown["deliveries"]] == [
        ("webhook:ops", "alert.opened")
    ]
    assert shown["deliveries_total"] == 1
    assert [(r["operation"], r["outcome"], r["node"]) for r in shown["actions"]] == [
        ("drain", "dry_run", "node17")
    ]

    table = ok(["alerts", "show", a.id, "--api", api.url]).stdout
    assert f"Alert {a.id}" in table and "Evidence" in table and "peers" in table
    assert "[bold]not markup[/]" in table  # untrusted text is escaped, not rendered
    assert "webhook:ops" in table and "alert.opened" in table
    assert "drain" in table and "node17" in table

    line = one_line_error(["alerts", "show", "no-such-id", "--api", api.url])
    assert line == "error: no alert with id 'no-such-id'"
    # an id cannot reach another endpoint
    line = one_line_error(["alerts", "show", "../breaker", "--api", api.url])
    assert "no alert with id '../breaker'" in line


def test_ack_then_resolve_and_a_forbidden_transition(api: Api) -> None:
    a = api.seed()
    base = ["--api", api.url, "--token", TOKEN]
    out = ok(["alerts", "ack", a.id, "--by", "alice", *base]).stdout
    assert f"alert {a.id}" in out and "open → acknowledged by alice" in out
    again = ok(["alerts", "ack", a.id, *base]).stdout
    assert "already acknowledged" in again

    resolved = as_json(["alerts", "resolve", a.id, *base], USER="bob")
    assert resolved["id"] == a.id and resolved["status"] == "resolved"
    assert as_json(["alerts", "list", "--api", api.url, "--status", "resolved"])["total"] == 1

    line = one_line_error(["alerts", "ack", a.id, *base])
    assert line == (
        f"error: alert {a.id} is resolved: it cannot become acknowledged; "
        "allowed: none (final status)"
    )
    b = api.seed(machine="j1-n0009")
    ok(["alerts", "ack", b.id, *base])
    # acknowledged → open is not a status the CLI offers; resolved → false_positive is refused
    ok(["alerts", "resolve", b.id, *base])
    line = one_line_error(["alerts", "false-positive", b.id, *base])
    assert "cannot become false_positive" in line

    # who decided travels with the events (--by, else $USER)
    with api.sessions() as session:
        rows, _ = list_deliveries(session, alert_id=a.id)
    by_event = {row.event: row.payload["data"].get("changed_by") for row in rows}
    assert by_event["alert.acknowledged"] == "alice"
    assert by_event["alert.resolved"] == "bob"

    line = one_line_error(["alerts", "resolve", "nope", *base])
    assert line == "error: no alert with id 'nope'"


def test_false_positive_from_open(api: Api) -> None:
    a = api.seed()
    out = ok(["alerts", "false-positive", a.id, "--api", api.url, "--token", TOKEN]).stdout
    assert "open → false_positive by tester" in out


def test_changes_without_or_with_a_wrong_token_say_so_in_one_line(api: Api) -> None:
    a = api.seed()
    line = one_line_error(["alerts", "ack", a.id, "--api", api.url], MINDER_API_TOKEN=None)
    assert "needs --token / MINDER_API_TOKEN" in line
    line = one_line_error(["alerts", "ack", a.id, "--api", api.url, "--token", "wrong"])
    assert "refused the token" in line and "MINDER_API_TOKEN" in line and "wrong" not in line
    # the token from the environment, the CLI's or the server's own variable
    ok(["alerts", "ack", a.id, "--api", api.url], MINDER_API_TOKEN=TOKEN)
    ok(["alerts", "resolve", a.id], MINDER_API_URL=api.url, MINDER_API__TOKEN=TOKEN)
    line = one_line_error(
        ["breaker", "reset", "--by", "ops", "--api", api.url], MINDER_API_TOKEN=None
    )
    assert "needs --token / MINDER_API_TOKEN" in line
    reads = one_line_error(["alerts", "list", "--api", api.url], MINDER_API_TOKEN=None)
    assert "GET" in reads and "needs --token / MINDER_API_TOKEN" in reads  # reads need it too


# -- breaker and actions -----------------------------------------------------------------------


def test_breaker_status_and_reset(api: Api) -> None:
    base = ["--api", api.url]
    assert as_json(["breaker", "status", *base])["tripped"] is False
    assert "closed" in ok(["breaker", "status", *base]).stdout
    with api.sessions() as session:
        trip_breaker(session, "actions", "drained 9 nodes in 60 s (bound 8)")
        session.commit()

    state = as_json(["breaker", "status", *base])
    assert state["tripped"] is True and state["reason"].startswith("drained 9 nodes")
    text = ok(["breaker", "status", *base]).stdout
    assert "TRIPPED" in text and "drained 9 nodes in 60 s (bound 8)" in text

    out = ok(["breaker", "reset", "--by", "ops", *base, "--token", TOKEN]).stdout
    assert "breaker actions reset by ops" in out
    state = as_json(["breaker", "status", *base])
    assert state["tripped"] is False and state["reset_by"] == "ops"
    assert "last reset at" in ok(["breaker", "status", *base]).stdout
    out = ok(["breaker", "reset", *base, "--token", TOKEN]).stdout  # --by from $USER
    assert "was not tripped" in out
    line = one_line_error(["breaker", "reset", *base, "--token", TOKEN], USER=None)
    assert "--by NAME is needed" in line


def test_actions_list_is_the_audit_trail(api: Api) -> None:
    a = api.seed()
    with api.sessions() as session:
        for i, outcome in enumerate(("dry_run", "applied", "failed")):
            audit(session, target="slurm", operation="drain", mode="enforce", outcome=outcome,
                  detail=f"attempt {i}", alert_id=a.id if i < 2 else "other", job="j1",
                  machine="j1-n0001" if i < 2 else "j1-n0005", node=f"node{i}",
                  now=T0 + i)  # fmt: skip
        session.commit()
    base = ["actions", "list", "--api", api.url]
    page = as_json(base)
    assert page["total"] == 3 and [e["detail"] for e in page["items"]] == [
        "attempt 2",
        "attempt 1",
        "attempt 0",
    ]
    assert set(page["items"][0]) == {
        "id", "created_at", "alert_id", "job", "machine", "node", "target", "operation", "mode",
        "outcome", "detail", "delivery_id",
    }  # fmt: skip
    assert [e["detail"] for e in as_json([*base, "--alert", a.id])["items"]] == [
        "attempt 1",
        "attempt 0",
    ]
    assert [e["node"] for e in as_json([*base, "--outcome", "failed"])["items"]] == ["node2"]
    assert as_json([*base, "--machine", "j1-n0005"])["total"] == 1
    assert as_json([*base, "--job", "nope"])["total"] == 0
    assert len(as_json([*base, "--limit", "1"])["items"]) == 1

    table = ok([*base, "--limit", "2"]).stdout
    assert "attempt 2" in table and "failed" in table and "2 of 3 entries" in table
    line = one_line_error([*base, "--outcome", "exploded"])
    assert line.startswith("error: the API refused the request: query.outcome:")


# -- labels ------------------------------------------------------------------------------------

SCENARIO = {
    "seed": 5,
    "duration_s": 150,
    "jobs": [{"name": "t", "machines": 16, "machines_per_domain": 8, "step_time_s": 4.0}],
    "faults": [{"type": "cuda_execution_error", "machine": 6, "start_s": 40}],
}


def test_labels_export_round_trips_into_minder_train(api: Api, tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    table, truth = tmp_path / "m.parquet", tmp_path / "truth.csv"
    ok(["simulate", str(scenario), "-o", str(table), "--labels", str(truth)])
    fault = pd.read_csv(truth).iloc[0]

    real = api.seed(job="t", machine=fault["machine"], metric="gpu_sm_active",
                    first_ts=float(fault["start_ts"]), detected_ts=float(fault["start_ts"]) + 12,
                    devices=(), domain="")  # fmt: skip
    wrong = api.seed(job="t", machine="t-n0002", kind=AlertKind.RULE, metric="rdma_port_up",
                     first_ts=T0 + 100, detected_ts=T0 + 100, devices=("mlx5_1",))  # fmt: skip
    still_open = api.seed(job="t", machine="t-n0011", first_ts=T0 + 120, detected_ts=T0 + 125)
    other_job = api.seed(job="elsewhere", machine="e-n0001")
    base = ["--api", api.url, "--token", TOKEN]
    ok(["alerts", "resolve", real.id, *base])
    ok(["alerts", "false-positive", wrong.id, *base])
    ok(["alerts", "resolve", other_job.id, *base])

    labels = tmp_path / "out" / "labels.csv"
    summary = as_json(["labels", "export", "-o", str(labels), "--job", "t", "--api", api.url])
    assert summary["rows"] == 1 and summary["confirmed_faults"] == 1
    assert summary["false_positives"] == 1 and summary["faults"] == ["similarity:gpu_sm_active"]
    written = pd.read_csv(labels)
    assert list(written.columns[:5]) == ["job", "machine", "start_ts", "end_ts", "fault"]
    row = written.iloc[0]
    assert (row["job"], row["machine"], row["fault"]) == (
        "t",
        fault["machine"],
        summary["faults"][0],
    )
    assert row["start_ts"] == pytest.approx(fault["start_ts"], abs=1e-3)
    assert row["end_ts"] >= row["start_ts"] and row["alert_id"] == real.id
    assert still_open.id not in set(written["alert_id"])

    side = pd.read_csv(sidecar_path(labels))
    assert sidecar_path(labels).name == "labels.false_positives.csv"
    assert side[["machine", "fault", "status", "alert_id"]].values.tolist() == [
        ["t-n0002", "nic_down", "false_positive", wrong.id]
    ]

    model = tmp_path / "model"
    trained = as_json(["train", str(table), "--labels", str(labels), "--out", str(model)])
    assert trained["info"]["labels"] == 1
    assert trained["info"]["faults"] == ["similarity:gpu_sm_active"]
    assert trained["priority"] and (model / "model.json").exists()

    result = ok(["labels", "export", "-o", str(tmp_path / "all.parquet"), "--api", api.url])
    text = result.stdout
    # resolved now, a year after the simulated data: the CLI says so and names the way out
    assert "--end last-seen" in result.stderr
    assert "wrote 2 label row(s)" in text and "2 confirmed fault(s)" in text
    assert "1 false positive(s)" in text and "all.false_positives.parquet" in text
    both = validate_labels(pd.read_parquet(tmp_path / "all.parquet"))
    assert sorted(both["job"]) == ["elsewhere", "t"]
    assert len(pd.read_parquet(tmp_path / "all.false_positives.parquet")) == 1

    ended = tmp_path / "ended.csv"
    ok(["labels", "export", "-o", str(ended), "--end", "last-seen", "--job", "t", "--api", api.url])
    assert pd.read_csv(ended)["end_ts"].tolist() == [pytest.approx(real.detected_ts, abs=1e-3)]

    since = as_json(["labels", "export", "-o", str(tmp_path / "none.csv"), "--api", api.url,
                     "--since", str(T0 + 10_000)])  # fmt: skip
    assert since["rows"] == 0 and since["false_positives"] == 0
    assert validate_labels(pd.read_csv(tmp_path / "none.csv")).empty

    line = one_line_error(["labels", "export", "-o", str(tmp_path / "x.txt"), "--api", api.url])
    assert "unknown extension" in line


def test_label_rows_name_faults_and_expand_domain_alerts() -> None:
    alert: Any = {
        "id": "a1", "job": "j", "machine": "leaf-2", "domain": "leaf-2", "devices": [],
        "kind": "similarity", "metric": "rdma_rx_bytes", "score": 4.0, "status": "resolved",
        "first_ts": 100.0, "detected_ts": 110.0, "last_seen_ts": 130.0, "updated_at": 90.0,
        "evidence": {"domain_members": ["j-n0008", "j-n0009"]},
    }  # fmt: skip
    rows = label_rows(alert, LabelEnd.resolved)
    assert [r["machine"] for r in rows] == ["j-n0008", "j-n0009"]
    # a resolution stamped before the last report (other clocks) never cuts the fault short
    assert {(r["start_ts"], r["end_ts"]) for r in rows} == {(100.0, 130.0)}
    alert["updated_at"] = 500.0
    assert label_rows(alert, LabelEnd.resolved)[0]["end_ts"] == 500.0
    assert label_rows(alert, LabelEnd.last_seen)[0]["end_ts"] == 130.0
    assert fault_name(alert) == "similarity:rdma_rx_bytes"
    rule: Any = {**alert, "kind": "rule", "metric": "gpu_ecc_dbe_count"}
    silence: Any = {**alert, "kind": "silence", "metric": "silence"}
    assert fault_name(rule) == "ecc_error"
    assert fault_name(silence) == "machine_unreachable"
    assert sidecar_path(Path("d/l.csv.gz")) == Path("d/l.false_positives.csv.gz")


# -- a missing or broken API -------------------------------------------------------------------


def test_an_unreachable_api_is_one_line_naming_it() -> None:
    sock = _socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}"
    for args in (
        ["alerts", "list"],
        ["alerts", "show", "x"],
        ["alerts", "ack", "x", "--token", TOKEN],
        ["actions", "list"],
        ["breaker", "status"],
        ["labels", "export", "-o", "/nonexistent/l.csv"],
    ):
        line = one_line_error([*args, "--api", url])
        assert f"cannot reach the Minder API at {url}" in line, args
    line = one_line_error(["alerts", "list"], MINDER_API_URL=url)
    assert url in line
    line = one_line_error(["alerts", "list", "--api", "ftp://example"])
    assert "is not an http(s) URL" in line


class _Broken(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/api/v1/breaker"):
            body, status, kind = (
                b"<html>\n<h1>502 Bad Gateway</h1>\n" + b"x" * 500,
                502,
                "text/html",
            )
        else:
            body, status, kind = b"hello, not json", 200, "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def test_a_broken_answer_is_one_line_with_its_status_and_text() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        line = one_line_error(["breaker", "status", "--api", url])
        assert "HTTP 502 from GET" in line and "502 Bad Gateway" in line
        assert len(line) < 400
        line = one_line_error(["alerts", "list", "--api", url + "/api/v1/"])
        assert "HTTP 200" in line and "is not JSON: hello, not json" in line
    finally:
        httpd.shutdown()
        thread.join(timeout=10)


def test_the_client_turns_every_failure_into_one_line() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/breaker"):
            return httpx.Response(503, text="upstream\nconnect error")
        if "Authorization" in request.headers:
            return httpx.Response(401, json={"detail": "the bearer token is not valid"})
        return httpx.Response(404, json={"detail": "Not Found"})

    transport = httpx.MockTransport(answer)
    with MinderApi("http://api:8080/api/v1/", transport=transport) as client:
        assert client.url == "http://api:8080"
        with pytest.raises(ApiError, match=r"HTTP 503 from GET .*: upstream connect error"):
            client.breaker()
        with pytest.raises(ApiError, match=r"is http://api:8080 Minder's API \(--api\)\?"):
            client.alert("x")
    with MinderApi("http://api:8080", token="s3cret", transport=transport) as client:
        with pytest.raises(ApiError) as raised:
            client.reset_breaker("ops")
        assert "s3cret" not in str(raised.value) and raised.value.status == 401
