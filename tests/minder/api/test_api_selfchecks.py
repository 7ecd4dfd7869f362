"""Self-check endpoints: list and get, an operator's request and cancel (the API token), and a
node's report (the check's own token): 401 for a missing, wrong or forged token, 409 for a
replay, 413 for a body too large, 422 for a bad report; the token never in the logs."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from api_testing import TOKEN, uvicorn_serving
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from minder.api import create_app
from minder.api.routes.selfchecks import MAX_REPORT_BYTES
from minder.core.alert import Alert, AlertKind
from minder.core.selfcheck import CheckResult, CheckStatus, SelfCheckReport, SelfCheckState
from minder.storage import SessionFactory, record_alert
from minder.storage.actions import audit
from minder.storage.selfchecks import (
    get_selfcheck,
    mark_launching,
    request_selfcheck,
    token_digest,
)

CHECK_TOKEN = "check-token-5f0c1e9a7b"
"""The one-time secret of the running check (never the API token)."""
T0 = 1_763_700_000.0


def _alert(machine: str, first_ts: float, *, job: str = "j1") -> Alert:
    return Alert(
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


def _drained(sessions: SessionFactory, alert: Alert, node: str, *, at: float) -> None:
    """Store ``alert`` and the audit row of Minder draining its node (an applied, enforced
    drain), as the actions executor writes it."""
    with sessions.begin() as session:
        record_alert(session, alert)
        audit(
            session,
            target="slurm",
            operation="drain",
            mode="enforce",
            outcome="applied",
            detail=f"scontrol update NodeName={node} State=DRAIN",
            alert_id=alert.id,
            job=alert.job,
            machine=alert.machine,
            node=node,
            now=at,
        )


@pytest.fixture
def alerts(sessions: SessionFactory) -> dict[str, Alert]:
    """``a`` and ``b``: drained by Minder; ``c``: alerted, never drained."""
    stored = {
        "a": _alert("m1", T0),
        "b": _alert("m2", T0 + 100, job="j2"),
        "c": _alert("m3", T0 + 200),
    }
    _drained(sessions, stored["a"], "n1", at=T0 + 10)
    _drained(sessions, stored["b"], "n2", at=T0 + 110)
    with sessions.begin() as session:
        record_alert(session, stored["c"])
    return stored


def _requested(sessions: SessionFactory, alert: Alert, *, now: float = T0 + 20) -> str:
    with sessions.begin() as session:
        return request_selfcheck(session, alert.id, by="ana", now=now).id


def _running(sessions: SessionFactory, alert: Alert, token: str = CHECK_TOKEN) -> str:
    """A check of ``alert``'s node launched with ``token`` (what the service does)."""
    check_id = _requested(sessions, alert)
    with sessions.begin() as session:
        assert mark_launching(
            session, check_id, token_sha256=token_digest(token), partners=["n7", "n8"], now=T0 + 30
        )
    return check_id


def _report(
    check_id: str | None, node: str, status: CheckStatus = CheckStatus.PASS
) -> dict[str, Any]:
    checks = [
        CheckResult("gpu.matmul", status, "0.95 of the H100 baseline", {"tflops": 612.5}, 2.1),
        CheckResult(
            "collective.allreduce", CheckStatus.PASS, "1.02x the partners' median", {"ms": 41}
        ),
        CheckResult("gpu.dcgm", CheckStatus.SKIPPED, "dcgmi is not installed"),
    ]
    return SelfCheckReport.of(node, T0 + 31, T0 + 45, checks, check_id).to_dict()


def _post_report(
    client: TestClient, check_id: str, body: Any, token: str | None = CHECK_TOKEN, **kwargs: Any
) -> Any:
    """POST ``body`` (or ``content=``) as check ``check_id``'s report with ``token`` (none:
    no Authorization, not even the client's API token); ``headers=`` override."""
    headers = {"Authorization": f"Bearer {token}" if token is not None else ""}
    headers.update(kwargs.pop("headers", {}))
    if "content" not in kwargs:
        kwargs["json"] = body
    return client.post(f"/api/v1/selfchecks/{check_id}/report", headers=headers, **kwargs)


class Wakes:
    """The service's wake-up hooks, counted."""

    def __init__(self) -> None:
        self.selfcheck = 0
        self.outbox = 0

    def wake(self) -> None:
        self.selfcheck += 1

    def enqueued(self) -> None:
        self.outbox += 1


@pytest.fixture
def wakes() -> Wakes:
    return Wakes()


@pytest.fixture
def woken(sessions: SessionFactory, wakes: Wakes) -> Iterator[TestClient]:
    """The API with the token and the service's wake-up hooks."""
    app = create_app(
        sessions,
        registry=CollectorRegistry(),
        api_token=TOKEN,
        on_enqueued=wakes.enqueued,
        selfcheck_wake=wakes.wake,
    )
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as test_client:
        yield test_client


# -- reads ------------------------------------------------------------------------------------


def test_list_filters_pages_and_gets(
    client: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    first = _requested(sessions, alerts["a"], now=T0 + 20)
    second = _running(sessions, alerts["b"])  # created at T0 + 20 too: the id breaks the tie
    body = client.get("/api/v1/selfchecks").json()
    assert body["total"] == 2 and (body["limit"], body["offset"]) == (50, 0)
    assert {item["id"] for item in body["items"]} == {first, second}

    def ids(**params: Any) -> list[str]:
        response = client.get("/api/v1/selfchecks", params=params)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    assert ids(state="pending") == [first]
    assert ids(state="running") == [second]
    assert sorted(ids(state=["pending", "running"])) == sorted([first, second])
    assert ids(state="passed") == []
    assert ids(node="n2") == [second] and ids(alert_id=alerts["a"].id) == [first]
    assert ids(job="j2") == [second] and ids(job="nobody") == []
    assert len(ids(limit=1)) == 1 and ids(limit=1) + ids(limit=1, offset=1) == ids()

    item = client.get(f"/api/v1/selfchecks/{second}").json()
    assert (item["alert_id"], item["job"], item["machine"], item["node"]) == (
        alerts["b"].id,
        "j2",
        "m2",
        "n2",
    )
    assert (item["target"], item["state"], item["attempt"]) == ("slurm", "running", 1)
    assert item["partners"] == ["n7", "n8"] and item["drained_ts"] == T0 + 110
    assert (item["created_ts"], item["started_ts"]) == (T0 + 20, T0 + 30)
    assert item["finished_ts"] is None and item["returned_ts"] is None
    assert item["verdict"] is None and item["report"] is None
    assert "token" not in json.dumps(item).lower()  # neither the token nor its digest


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"state": "done"}, "'pending', 'running', 'passed'"),
        ({"limit": 0}, "greater than or equal to 1"),
        ({"limit": 501}, "less than or equal to 500"),
        ({"offset": -1}, "greater than or equal to 0"),
    ],
)
def test_bad_list_filters_are_422(
    client: TestClient, params: dict[str, Any], expected: str
) -> None:
    response = client.get("/api/v1/selfchecks", params=params)
    assert response.status_code == 422 and expected in response.text


def test_an_unknown_check_is_404_naming_it(client: TestClient) -> None:
    response = client.get("/api/v1/selfchecks/deadbeef")
    assert response.status_code == 404
    assert response.json() == {"detail": "no self-check with id 'deadbeef'"}
    assert client.post("/api/v1/selfchecks/deadbeef/cancel").status_code == 404
    assert _post_report(client, "deadbeef", _report("deadbeef", "n1")).status_code == 404


def test_reads_need_the_api_token(sessions: SessionFactory, alerts: dict[str, Alert]) -> None:
    check_id = _requested(sessions, alerts["a"])
    app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN)
    with TestClient(app) as anonymous:
        assert anonymous.get("/api/v1/selfchecks").status_code == 401
        assert anonymous.get(f"/api/v1/selfchecks/{check_id}").status_code == 401
        check_token = {"Authorization": f"Bearer {CHECK_TOKEN}"}
        assert anonymous.get("/api/v1/selfchecks", headers=check_token).status_code == 401


# -- an operator's request and cancel ---------------------------------------------------------


def test_an_operator_asks_for_a_check_of_a_drained_node(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert], wakes: Wakes
) -> None:
    a = alerts["a"]
    response = woken.post("/api/v1/selfchecks", json={"alert_id": a.id, "by": "ana"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["alert_id"], body["node"], body["state"], body["attempt"]) == (
        a.id,
        "n1",
        "pending",
        1,
    )
    assert body["drained_ts"] == T0 + 10 and "requested by ana" in body["detail"]
    assert response.headers["location"] == f"/api/v1/selfchecks/{body['id']}"
    assert (wakes.selfcheck, wakes.outbox) == (1, 0)  # the service writes the events
    with sessions() as session:  # committed
        assert get_selfcheck(session, body["id"]).state is SelfCheckState.PENDING

    again = woken.post("/api/v1/selfchecks", json={"alert_id": a.id, "by": "bo"})
    assert again.status_code == 409
    assert again.json() == {
        "detail": f"alert {a.id!r} has self-check {body['id']!r} pending already"
    }
    never_drained = woken.post("/api/v1/selfchecks", json={"alert_id": alerts["c"].id, "by": "x"})
    assert never_drained.status_code == 422
    assert "Minder did not take its node out" in never_drained.json()["detail"]
    unknown = woken.post("/api/v1/selfchecks", json={"alert_id": "nope", "by": "x"})
    assert unknown.status_code == 404 and unknown.json() == {"detail": "no alert with id 'nope'"}
    assert wakes.selfcheck == 1  # refusals wake nothing


@pytest.mark.parametrize(
    "body",
    [
        {"alert_id": "x"},
        {"by": "ana"},
        {"alert_id": "", "by": "a"},
        {"alert_id": "x", "by": "a", "n": 1},
    ],
)
def test_a_request_without_alert_or_author_is_422(client: TestClient, body: dict[str, Any]) -> None:
    assert client.post("/api/v1/selfchecks", json=body).status_code == 422


def test_request_and_cancel_need_the_api_token_not_a_check_token(
    sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    check_id = _running(sessions, alerts["a"])
    app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN)
    with TestClient(app) as anonymous:
        for token in (None, CHECK_TOKEN, "wrong"):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            asked = anonymous.post(
                "/api/v1/selfchecks", json={"alert_id": alerts["b"].id, "by": "x"}, headers=headers
            )
            assert asked.status_code == 401, token
            cancelled = anonymous.post(f"/api/v1/selfchecks/{check_id}/cancel", headers=headers)
            assert cancelled.status_code == 401, token
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING


def test_cancel_stops_a_check_once(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert], wakes: Wakes
) -> None:
    running = _running(sessions, alerts["a"])
    pending = _requested(sessions, alerts["b"])
    response = woken.post(f"/api/v1/selfchecks/{running}/cancel", json={"by": "ana"})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancelled"
    assert response.json()["detail"] == "cancelled by ana"
    no_body = woken.post(f"/api/v1/selfchecks/{pending}/cancel")
    assert no_body.status_code == 200 and no_body.json()["detail"] == "cancelled by api"
    assert wakes.selfcheck == 2
    again = woken.post(f"/api/v1/selfchecks/{running}/cancel")
    assert again.status_code == 409
    assert again.json() == {
        "detail": f"self-check {running!r} is cancelled already: nothing to cancel"
    }
    # a report after the cancel is refused: the check takes none any more
    late = _post_report(woken, running, _report(running, "n1"))
    assert late.status_code == 409 and "is cancelled: it takes no report" in late.json()["detail"]
    assert wakes.selfcheck == 2


# -- the node's report ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "state", "verdict"),
    [(CheckStatus.PASS, "passed", "pass"), (CheckStatus.FAIL, "failed", "fail"),
     (CheckStatus.ERROR, "inconclusive", "inconclusive")],
)  # fmt: skip
def test_a_report_with_the_checks_token_sets_the_state_by_its_verdict(
    woken: TestClient,
    sessions: SessionFactory,
    alerts: dict[str, Alert],
    wakes: Wakes,
    status: CheckStatus,
    state: str,
    verdict: str,
) -> None:
    check_id = _running(sessions, alerts["a"])
    report = _report(check_id, "n1", status)
    response = _post_report(woken, check_id, report)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["verdict"]) == (state, verdict)
    assert body["report"] == report and body["finished_ts"] is not None
    assert wakes.selfcheck == 1
    with sessions() as session:  # committed, with the report
        stored = get_selfcheck(session, check_id)
    assert stored.state.value == state and stored.report is not None
    assert stored.report.to_dict() == report
    assert woken.get(f"/api/v1/selfchecks/{check_id}").json() == body


def test_a_forged_or_missing_token_is_401_and_changes_nothing(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert], wakes: Wakes
) -> None:
    check_id = _running(sessions, alerts["a"])
    other = _running(sessions, alerts["b"], token="the-other-checks-token")
    report = _report(check_id, "n1", CheckStatus.PASS)
    for token in ("forged", TOKEN, "the-other-checks-token"):  # the API token is not it either
        refused = _post_report(woken, check_id, report, token=token)
        assert refused.status_code == 401, token
        assert refused.json() == {"detail": f"self-check {check_id!r}: wrong token"}
        assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    missing = _post_report(woken, check_id, report, token=None)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "the check's token" in missing.json()["detail"]
    basic = _post_report(woken, check_id, report, token=None,
                         headers={"Authorization": "Basic Zm9vOmJhcg=="})  # fmt: skip
    assert basic.status_code == 401
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING
        assert get_selfcheck(session, other).state is SelfCheckState.RUNNING
    assert wakes.selfcheck == 0


def test_a_replayed_report_is_409(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert], wakes: Wakes
) -> None:
    check_id = _running(sessions, alerts["a"])
    failed = _report(check_id, "n1", CheckStatus.FAIL)
    assert _post_report(woken, check_id, failed).status_code == 200
    for body in (failed, _report(check_id, "n1", CheckStatus.PASS)):  # a replay, a change of mind
        replay = _post_report(woken, check_id, body)
        assert replay.status_code == 409
        assert replay.json() == {
            "detail": f"self-check {check_id!r} is failed: it takes no report (a replay, or a "
            "report after its end)"
        }
    with sessions() as session:
        stored = get_selfcheck(session, check_id)
    assert stored.state is SelfCheckState.FAILED and stored.report is not None
    assert stored.report.to_dict() == failed
    assert wakes.selfcheck == 1


def test_a_report_for_another_check_or_node_is_409(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    check_id = _running(sessions, alerts["a"])
    other_check = _post_report(woken, check_id, _report("someone-else", "n1"))
    assert other_check.status_code == 409
    assert "names check 'someone-else'" in other_check.json()["detail"]
    other_node = _post_report(woken, check_id, _report(check_id, "n9"))
    assert other_node.status_code == 409
    assert "comes from node 'n9': expected 'n1'" in other_node.json()["detail"]
    pending = _requested(sessions, alerts["b"])  # never launched: it has no token
    early = _post_report(woken, pending, _report(pending, "n2"))
    assert early.status_code == 401 and "never launched" in early.json()["detail"]
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"verdict": "pass", "reason": "fine"}, "report.verdict 'pass' disagrees with its checks"),
        ({"schema_version": 2}, "self-check report schema_version '2': expected 1"),
        ({"checks": "all good"}, "report.checks is str: expected a list of checks"),
        ({"node": ""}, "report.node is empty: expected the node's name"),
        ({"finished_ts": 1.0}, "report.finished_ts is 1.0: expected >= "),
    ],
)
def test_a_bad_report_is_422_in_one_line(
    woken: TestClient,
    sessions: SessionFactory,
    alerts: dict[str, Alert],
    change: dict[str, Any],
    expected: str,
) -> None:
    check_id = _running(sessions, alerts["a"])
    body = {**_report(check_id, "n1", CheckStatus.FAIL), **change}
    response = _post_report(woken, check_id, body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and expected in detail
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"node": "n1"', b"\xff\xfe{}", b"[" * 100_000, b"", b"1" * 5000, b"[1]"],
)
def test_a_body_that_is_not_json_is_422(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert], content: bytes
) -> None:
    check_id = _running(sessions, alerts["a"])
    response = _post_report(
        woken, check_id, None, content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail
    assert detail.startswith(("the self-check report is not UTF-8 JSON", "self-check report is"))


def test_a_report_over_the_size_bound_is_413(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    check_id = _running(sessions, alerts["a"])
    report = _report(check_id, "n1")
    report["padding"] = "x" * MAX_REPORT_BYTES
    declared = _post_report(woken, check_id, report)
    assert declared.status_code == 413
    assert f"expected at most {MAX_REPORT_BYTES}" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while it streams
        yield json.dumps(report).encode()

    streamed = _post_report(woken, check_id, None, content=chunks(),
                            headers={"content-type": "application/json"})  # fmt: skip
    assert streamed.status_code == 413
    # at the bound, the (unknown) extra field is ignored: accepted
    report["padding"] = ""
    report["padding"] = "x" * (MAX_REPORT_BYTES - len(json.dumps(report)))
    assert len(json.dumps(report)) == MAX_REPORT_BYTES
    assert _post_report(woken, check_id, report).status_code == 200


def test_the_token_is_never_logged(
    woken: TestClient,
    sessions: SessionFactory,
    alerts: dict[str, Alert],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    check_id = _running(sessions, alerts["a"])
    report = _report(check_id, "n1", CheckStatus.FAIL)
    _post_report(woken, check_id, report, token=CHECK_TOKEN[:-1] + "x")
    _post_report(woken, check_id, {"schema_version": 1}, token=CHECK_TOKEN)
    assert _post_report(woken, check_id, report).status_code == 200
    _post_report(woken, check_id, report)
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "report refused" in text and "accepted" in text  # the log says what happened
    assert CHECK_TOKEN not in text and CHECK_TOKEN[:-1] not in text
    assert token_digest(CHECK_TOKEN) not in text


def test_a_report_needs_no_api_token_even_where_changes_are_disabled(
    sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    """The check's token is the report's only credential: a server without an API token (which
    refuses every other change) still takes it, and still refuses a wrong one."""
    check_id = _running(sessions, alerts["a"])
    app = create_app(sessions, registry=CollectorRegistry())
    with TestClient(app) as client:
        assert client.post(f"/api/v1/selfchecks/{check_id}/cancel").status_code == 403
        report = _report(check_id, "n1")
        assert _post_report(client, check_id, report, token="forged").status_code == 401
        assert _post_report(client, check_id, report, token=None).status_code == 401
        accepted = _post_report(client, check_id, report)
        assert accepted.status_code == 200 and accepted.json()["state"] == "passed"


def test_a_cross_origin_report_is_refused(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    check_id = _running(sessions, alerts["a"])
    response = _post_report(woken, check_id, _report(check_id, "n1"),
                            headers={"Origin": "https://evil.example"})  # fmt: skip
    assert response.status_code == 403 and "cross-origin" in response.json()["detail"]
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING


def test_the_openapi_document_describes_the_report_route(sessions: SessionFactory) -> None:
    app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN)
    document = app.openapi()
    report = document["paths"]["/api/v1/selfchecks/{check_id}/report"]["post"]
    assert set(report["responses"]) >= {"200", "401", "403", "404", "409", "413", "422"}
    body = report["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/SelfCheckReportBody"}
    assert "SelfCheckReportBody" in document["components"]["schemas"]
    assert report["security"] == [{"SelfCheckToken": []}]  # not the API token: the check's own
    scheme = document["components"]["securitySchemes"]["SelfCheckToken"]
    assert scheme["scheme"] == "bearer" and "not the API token" in scheme["description"]
    listing = document["paths"]["/api/v1/selfchecks"]
    assert {"get", "post"} <= set(listing) and "401" in listing["get"]["responses"]


def test_the_answers_conform_to_the_openapi_document(
    woken: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    """A check with a report (measurements of every JSON type), as the list, the item and the
    report's answer give it, against the document the API publishes (schemathesis' checks)."""
    check_id = _running(sessions, alerts["a"])
    report = _report(check_id, "n1", CheckStatus.FAIL)
    report["checks"][0]["measurements"].update(
        {"devices": 8, "model": "NVIDIA H100 80GB HBM3", "throttled": False, "ecc": None}
    )
    answers = [
        ("/api/v1/selfchecks/{check_id}/report", "POST", _post_report(woken, check_id, report)),
        ("/api/v1/selfchecks", "GET", woken.get("/api/v1/selfchecks")),
        ("/api/v1/selfchecks/{check_id}", "GET", woken.get(f"/api/v1/selfchecks/{check_id}")),
        ("/api/v1/selfchecks/{check_id}", "GET", woken.get("/api/v1/selfchecks/nope")),
        ("/api/v1/selfchecks/{check_id}/report", "POST", _post_report(woken, check_id, report)),
    ]
    assert [response.status_code for _, _, response in answers] == [200, 200, 200, 404, 409]
    measured = answers[2][2].json()["report"]["checks"][0]["measurements"]
    assert measured == report["checks"][0]["measurements"]  # every type kept as it was
    checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
    schema = schemathesis.openapi.from_asgi("/openapi.json", woken.app)
    for path, method, response in answers:
        case = schema[path][method].Case(path_parameters={"check_id": check_id})
        case.validate_response(response, checks=checks)


@pytest.mark.parametrize(
    ("authorization", "length", "expected"),
    [
        ("", 2000, b"HTTP/1.1 401 "),  # no token: the middleware answers before the body
        # a wrong token: its digest is compared before the body is read and parsed
        ("Authorization: Bearer not-the-check-token\r\n", 2000, b"HTTP/1.1 401 "),
        (f"Authorization: Bearer {CHECK_TOKEN}\r\n", MAX_REPORT_BYTES + 1, b"HTTP/1.1 413 "),
    ],
)
def test_a_report_is_refused_before_its_body_is_read(
    sessions: SessionFactory,
    alerts: dict[str, Alert],
    authorization: str,
    length: int,
    expected: bytes,
) -> None:
    """Neither a client without a token nor a body declared too large can hold a connection:
    the answer comes before any of the body is sent."""
    check_id = _running(sessions, alerts["a"])
    app = create_app(sessions, registry=CollectorRegistry(), api_token=TOKEN, body_timeout_s=30)
    head = (
        f"POST /api/v1/selfchecks/{check_id}/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"{authorization}Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()
    with uvicorn_serving(app) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        sock.sendall(head)
        answer = sock.recv(65536)
        elapsed = time.monotonic() - started
    assert answer.startswith(expected), answer[:300]
    assert elapsed < 2.0, elapsed
    with sessions() as session:
        assert get_selfcheck(session, check_id).state is SelfCheckState.RUNNING


def test_a_request_is_refused_where_no_enforcing_service_runs(
    client: TestClient, sessions: SessionFactory, alerts: dict[str, Alert]
) -> None:
    # ``client`` has no self-check wake: self-checks are disabled, or in dry run (the stack
    # passes none then), and a pending check would wait forever
    response = client.post("/api/v1/selfchecks", json={"alert_id": alerts["a"].id, "by": "ana"})
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert "\n" not in detail and alerts["a"].id in detail
    assert "MINDER_SELFCHECK__ENABLED" in detail and "MINDER_ACTIONS__ENFORCE" in detail
    assert client.get("/api/v1/selfchecks").json()["total"] == 0
