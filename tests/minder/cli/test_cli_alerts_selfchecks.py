"""Self-checks on the operator's surfaces over a real API: ``minder alerts show`` gives the
checks of the alert's drained node and the latest report's checks; ``minder labels export``
takes a self-check's verdict (``confirmed``, ``cleared_by_selfcheck``) as it takes an
operator's.

The API (``create_app`` on a migrated SQLite file) is served by uvicorn on a loopback port in a
thread; the checks are stored and reported the way the service and the node do it (storage
functions for the service's side, the report through the API with the check's token).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from typer.testing import CliRunner

from detectors.training import validate_labels
from minder.api import create_app
from minder.cli import app
from minder.client.api import MinderApi
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.selfcheck import CheckResult, CheckStatus, SelfCheckReport
from minder.storage import SessionFactory, record_alert, session_factory
from minder.storage.actions import audit
from minder.storage.outbox import AlertEvent, record_selfcheck_verdict
from minder.storage.selfchecks import mark_launching, request_selfcheck, token_digest
from minder.storage.testing import clear_tables, scratch_database

TOKEN = "t"
T0 = 1_763_700_000.0
CLEAN_ENV: dict[str, str | None] = {
    "MINDER_API_URL": None,
    "MINDER_API_TOKEN": TOKEN,
    "MINDER_API__TOKEN": None,
    "USER": "tester",
    "USERNAME": None,
    "COLUMNS": "250",
}

runner = CliRunner()


@dataclass
class Api:
    url: str
    sessions: SessionFactory

    def drained(self, machine: str, node: str, *, first_ts: float = T0, job: str = "j1") -> Alert:
        """An alert whose node Minder drained (the executor's applied, enforced drain)."""
        alert = Alert(
            job=job,
            machine=machine,
            kind=AlertKind.RULE,
            metric="gpu_xid_count",
            score=9.0,
            first_ts=first_ts,
            detected_ts=first_ts + 5,
            devices=("gpu3",),
            evidence={"rule": "xid", "xid": 79},
        )
        with self.sessions.begin() as session:
            stored, _ = record_alert(session, alert, seen_ts=first_ts + 30)
            audit(session, target="slurm", operation="drain", mode="enforce", outcome="applied",
                  detail="drained", alert_id=stored.id, job=job, machine=machine, node=node,
                  now=first_ts + 10)  # fmt: skip
        return stored

    def running_check(self, alert: Alert, token: str, partners: list[str]) -> str:
        with self.sessions.begin() as session:
            check_id = request_selfcheck(session, alert.id, by="ana", now=T0 + 20).id
        with self.sessions.begin() as session:
            launched = mark_launching(session, check_id, token_sha256=token_digest(token),
                                      partners=partners, now=T0 + 30)  # fmt: skip
            assert launched
        return check_id

    def verdict(self, alert: Alert, status: AlertStatus, check_id: str) -> None:
        """What the service does once it acted on the check's verdict."""
        event = (
            AlertEvent.CONFIRMED
            if status is AlertStatus.CONFIRMED
            else AlertEvent.CLEARED_BY_SELFCHECK
        )
        with self.sessions.begin() as session:
            record_selfcheck_verdict(session, alert.id, status, {"check_id": check_id}, [],
                                     event=event, now=T0 + 60)  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with scratch_database("sqlite", tmp_path_factory.mktemp("db")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[Api]:
    sessions = session_factory(engine)
    api_app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN)
    uv = uvicorn.Server(uvicorn.Config(api_app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = uv.servers[0].sockets[0].getsockname()[1]
    try:
        yield Api(f"http://127.0.0.1:{port}", sessions)
    finally:
        uv.should_exit = True
        thread.join(timeout=20)


@pytest.fixture
def api(server: Api, engine: Engine) -> Iterator[Api]:
    yield server
    clear_tables(engine)


def ok(args: list[str]) -> Any:
    result = runner.invoke(app, args, env=CLEAN_ENV)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 0, result.output
    return result


def _report(check_id: str, node: str, matmul: CheckStatus) -> dict[str, Any]:
    checks = [
        CheckResult("gpu.matmul", matmul, "gpu3: 212 TFLOP/s, 0.34 of the H100 baseline 620",
                    {"gpu3.tflops": 212.0, "baseline": 620.0}, 3.2),
        CheckResult("collective.allreduce", CheckStatus.PASS,
                    "round 1 (n1+n7) and round 2 (n1+n8): 1.04x the partners' median",
                    {"round1_ms": 41.5, "round2_ms": 40.9}, 6.0),
        CheckResult("gpu.dcgm", CheckStatus.SKIPPED, "dcgmi is not installed"),
    ]  # fmt: skip
    return SelfCheckReport.of(node, T0 + 31, T0 + 45, checks, check_id).to_dict()


def _post(api: Api, check_id: str, token: str, report: dict[str, Any]) -> None:
    """The node's report, as ``minder selfcheck run`` sends it: the check's token only."""
    with MinderApi(api.url, token=token) as node_client:
        assert node_client.report_selfcheck(check_id, report)["report"] == report


def test_alerts_show_gives_the_checks_and_the_failing_report(api: Api) -> None:
    alert = api.drained("m1", "n1")
    first = api.running_check(alert, "tok-1", ["n7", "n8"])
    failed = _report(first, "n1", CheckStatus.FAIL)
    _post(api, first, "tok-1", failed)
    api.verdict(alert, AlertStatus.CONFIRMED, first)
    with api.sessions.begin() as session:  # an operator asks again: pending
        second = request_selfcheck(session, alert.id, by="bo", now=T0 + 90).id

    shown = json.loads(
        ok(["alerts", "show", alert.id, "--api", api.url, "--format", "json"]).stdout
    )
    assert shown["alert"]["status"] == "confirmed"
    assert shown["selfchecks_total"] == 2
    assert [c["id"] for c in shown["selfchecks"]] == [second, first]  # newest first
    latest, done = shown["selfchecks"]
    assert (latest["state"], latest["attempt"], latest["verdict"]) == ("pending", 2, None)
    assert (done["state"], done["attempt"], done["verdict"]) == ("failed", 1, "fail")
    assert done["partners"] == ["n7", "n8"] and done["report"] == failed

    table = ok(["alerts", "show", alert.id, "--api", api.url]).stdout
    assert "Self-checks (2)" in table
    for text in (first, second, "failed: gpu.matmul", "n7,n8", "requested by bo", "pending"):
        assert text in table, text
    # the latest report's checks: what failed and what it measured
    assert f"Self-check {first} on n1: fail" in table
    assert "0.34 of the H100 baseline 620" in table and "dcgmi is not installed" in table
    assert "confirmed" in table


def test_alerts_show_without_checks_says_so(api: Api) -> None:
    alert = api.drained("m2", "n2")
    shown = json.loads(
        ok(["alerts", "show", alert.id, "--api", api.url, "--format", "json"]).stdout
    )
    assert shown["selfchecks"] == [] and shown["selfchecks_total"] == 0
    table = ok(["alerts", "show", alert.id, "--api", api.url]).stdout
    assert "Self-checks (0)" in table and "no self-check of this alert's node" in table


def test_labels_export_takes_the_self_checks_verdicts(api: Api, tmp_path: Path) -> None:
    """A check that failed confirms a fault (a label row); one that passed clears the alert (a
    false positive); an operator's verdicts count as before."""
    confirmed = api.drained("j1-n0001", "n1", first_ts=T0)
    cleared = api.drained("j1-n0002", "n2", first_ts=T0 + 100)
    by_person = api.drained("j1-n0003", "n3", first_ts=T0 + 200)
    still_open = api.drained("j1-n0004", "n4", first_ts=T0 + 300)
    for alert, status, matmul, token in (
        (confirmed, AlertStatus.CONFIRMED, CheckStatus.FAIL, "tok-a"),
        (cleared, AlertStatus.CLEARED_BY_SELFCHECK, CheckStatus.PASS, "tok-b"),
    ):
        check_id = api.running_check(alert, token, ["n9"])
        node = "n1" if alert is confirmed else "n2"
        _post(api, check_id, token, _report(check_id, node, matmul))
        api.verdict(alert, status, check_id)
    ok(["alerts", "resolve", by_person.id, "--api", api.url])

    labels = tmp_path / "labels.csv"
    result = ok(["labels", "export", "-o", str(labels), "--api", api.url, "--format", "json"])
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["confirmed_faults"], summary["confirmed_by_selfcheck"]) == (
        2,
        2,
        1,
    )
    assert (summary["false_positives"], summary["cleared_by_selfcheck"]) == (1, 1)
    rows = validate_labels(pd.read_csv(labels))  # what minder train --labels takes
    written = pd.read_csv(labels).sort_values("machine")
    assert written[["machine", "status", "alert_id"]].values.tolist() == [
        ["j1-n0001", "confirmed", confirmed.id],
        ["j1-n0003", "resolved", by_person.id],
    ]
    assert len(rows) == 2 and still_open.id not in set(written["alert_id"])
    side = pd.read_csv(tmp_path / "labels.false_positives.csv")
    assert side[["machine", "status", "alert_id"]].values.tolist() == [
        ["j1-n0002", "cleared_by_selfcheck", cleared.id]
    ]
    text = ok(["labels", "export", "-o", str(tmp_path / "again.csv"), "--api", api.url]).stdout
    assert "2 confirmed fault(s) (1 by a self-check" in text
    assert "1 false positive(s) (1 cleared by a self-check" in text
