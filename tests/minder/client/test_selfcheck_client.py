"""The client side of self-checks: :class:`~minder.client.api.MinderApi`'s self-check methods and
:func:`~minder.client.selfcheck.post_report` (retries, refusals, the token kept secret).

The API is an ``httpx.MockTransport`` answering as ``/api/v1/selfchecks`` does (its statuses and
bodies: 202 with the pending record, 401/404/409/422 with ``{"detail": ...}``), because what is
tested here is what the real server cannot be made to do on demand: fail transiently, then
answer. tests/minder/cli/test_cli_selfcheck.py runs the commands against the real API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from minder.client.api import ApiError, ApiNotFoundError, MinderApi
from minder.client.selfcheck import POST_ATTEMPTS, ReportTarget, post_report
from minder.core.errors import ValidationError
from minder.core.selfcheck import CheckResult, CheckStatus, SelfCheckReport

TOKEN = "check-token-7d41be0f"
URL = "http://minder.test:8080"
REPORT = SelfCheckReport.of(
    "n7",
    1_763_700_000.0,
    1_763_700_004.5,
    [CheckResult("gpu.matmul", CheckStatus.PASS, "0.93 of baseline", {"gpu0.tflops": 690.5}, 2.0)],
    check_id="c0ffee00c0ffee00",
)


def record(
    check_id: str = "c0ffee00c0ffee00", state: str = "running", **changes: Any
) -> dict[str, Any]:
    """A ``SelfCheckRecord.to_dict()`` as the API answers it."""
    data: dict[str, Any] = {
        "id": check_id,
        "alert_id": "a1",
        "job": "j1",
        "machine": "m7",
        "node": "n7",
        "target": "slurm",
        "state": state,
        "attempt": 1,
        "partners": ["n3", "n4"],
        "created_ts": 1_763_700_000.0,
        "started_ts": 1_763_700_001.0,
        "finished_ts": None,
        "drained_ts": 1_763_699_990.0,
        "returned_ts": None,
        "scheduler_ref": "job 41 / reservation minder-c0ffee00",
        "detail": "running on the scheduler as job 41",
        "verdict": None,
        "report": None,
    }
    data.update(changes)
    return data


class Api:
    """Answers requests in turn from ``answers`` (status, body), recording each request."""

    def __init__(self, answers: list[tuple[int, Any] | Exception]) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def _target() -> ReportTarget:
    return ReportTarget(URL, "c0ffee00c0ffee00", TOKEN)


def _post(api: Api, sleeps: list[float] | None = None) -> dict[str, Any]:
    waits = sleeps if sleeps is not None else []
    got = post_report(_target(), REPORT, transport=api.transport, sleep=waits.append)
    return dict(got)


# -- where the report goes -------------------------------------------------------------------


def test_the_target_comes_from_the_launchs_variables() -> None:
    env = {
        "MINDER_SELFCHECK_REPORT_URL": "http://minder:8080/api/v1/",
        "MINDER_SELFCHECK_CHECK_ID": "c1",
        "MINDER_SELFCHECK_TOKEN": TOKEN,
    }
    target = ReportTarget.from_environ(env)
    assert target == ReportTarget("http://minder:8080", "c1", TOKEN)
    assert TOKEN not in repr(target)
    given = ReportTarget.from_environ(env, url="https://other", check_id="c2")
    assert given is not None and (given.url, given.check_id) == ("https://other", "c2")
    assert ReportTarget.from_environ({"MINDER_SELFCHECK_TOKEN": TOKEN}) is None  # by hand


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"MINDER_SELFCHECK_CHECK_ID": "c1"},
            "a check id without --report-url or MINDER_SELFCHECK_REPORT_URL",
        ),
        (
            {"MINDER_SELFCHECK_REPORT_URL": URL},
            "a report URL without --check-id or MINDER_SELFCHECK_CHECK_ID",
        ),
        (
            {"MINDER_SELFCHECK_REPORT_URL": URL, "MINDER_SELFCHECK_CHECK_ID": "c1"},
            "MINDER_SELFCHECK_TOKEN is not set: expected the check's one-time token",
        ),
        (
            {"MINDER_SELFCHECK_REPORT_URL": "minder:8080", "MINDER_SELFCHECK_CHECK_ID": "c1"},
            "report URL: API URL 'minder:8080' is not an http(s) URL",
        ),
    ],
)
def test_a_half_given_target_is_refused_in_one_line(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ReportTarget.from_environ(env)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


# -- posting ---------------------------------------------------------------------------------


def test_a_report_is_posted_once_with_the_checks_token() -> None:
    api = Api([(200, record(state="passed", verdict="pass", report=REPORT.to_dict()))])
    got = _post(api)
    assert got["state"] == "passed"
    (sent,) = api.requests
    assert sent.method == "POST"
    assert str(sent.url) == f"{URL}/api/v1/selfchecks/c0ffee00c0ffee00/report"
    assert sent.headers["Authorization"] == f"Bearer {TOKEN}"
    assert json.loads(sent.content) == REPORT.to_dict()


def test_transient_failures_are_retried_with_back_off() -> None:
    api = Api(
        [
            httpx.ConnectError("connection refused"),
            (503, {"detail": "the database is unavailable"}),
            (200, record(state="failed", verdict="fail")),
        ]
    )
    sleeps: list[float] = []
    got = _post(api, sleeps)
    assert got["state"] == "failed"
    assert len(api.requests) == 3
    assert sleeps == [0.5, 1.0]


def test_a_service_that_stays_away_fails_after_the_last_try() -> None:
    api = Api([httpx.ConnectError("connection refused")] * POST_ATTEMPTS)
    sleeps: list[float] = []
    with pytest.raises(ApiError, match=r"cannot reach the Minder API at http://minder\.test:8080"):
        _post(api, sleeps)
    assert len(api.requests) == POST_ATTEMPTS
    assert sleeps == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    ("status", "detail", "expected"),
    [
        (401, "no valid check token", "the service refused the token of MINDER_SELFCHECK_TOKEN"),
        (404, "no self-check with id 'c0ffee00c0ffee00'", "no self-check with id"),
        (
            409,
            "self-check 'c0ffee00c0ffee00' is passed: it takes no report",
            "the service refused the report of self-check c0ffee00c0ffee00",
        ),
        (422, "report.checks[0].name 'GPU': expected a lowercase dotted name", "report.checks[0]"),
    ],
)
def test_final_refusals_are_not_retried_and_never_show_the_token(
    status: int, detail: str, expected: str
) -> None:
    api = Api([(status, {"detail": detail})])
    with pytest.raises(ApiError) as caught:
        _post(api)
    assert len(api.requests) == 1
    message = str(caught.value)
    assert expected in message and TOKEN not in message and "\n" not in message
    assert caught.value.status == status


def test_a_conflict_after_a_lost_answer_says_an_earlier_try_may_have_landed() -> None:
    api = Api(
        [
            httpx.ReadTimeout("timed out"),
            (409, {"detail": "self-check 'c0ffee00c0ffee00' is passed: it takes no report"}),
        ]
    )
    with pytest.raises(ApiError, match="an earlier try may have reached it"):
        _post(api)


# -- the operator's reads and requests -------------------------------------------------------


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> MinderApi:
    return MinderApi(URL, token="op-token", transport=httpx.MockTransport(handler))


def test_listing_filters_and_pages() -> None:
    seen: list[httpx.Request] = []
    checks = [record(f"{i:016x}", state="passed") for i in range(5)]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        limit = int(request.url.params["limit"])
        offset = int(request.url.params["offset"])
        page = checks[offset : offset + limit]
        return httpx.Response(
            200, json={"items": page, "total": len(checks), "limit": limit, "offset": offset}
        )

    with _client(handler) as api:
        page = api.selfchecks(states=["passed", "failed"], node="n7", alert_id="a1", limit=2)
        assert [c["id"] for c in page["items"]] == [checks[0]["id"], checks[1]["id"]]
        params = seen[0].url.params
        assert params.get_list("state") == ["passed", "failed"]
        assert (params["node"], params["alert_id"], params["limit"]) == ("n7", "a1", "2")
        assert "job" not in params
        every = list(api.iter_selfchecks(page_size=2, job="j1"))
    assert [c["id"] for c in every] == [c["id"] for c in checks]
    assert seen[-1].url.params["job"] == "j1"


def test_one_check_a_request_and_a_cancel() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if request.method == "GET" and path.endswith("/missing"):
            return httpx.Response(404, json={"detail": "no self-check with id 'missing'"})
        if request.method == "GET":
            return httpx.Response(200, json=record())
        if path.endswith("/cancel"):
            return httpx.Response(200, json=record(state="cancelled"))
        return httpx.Response(202, json=record(state="pending", started_ts=None))

    with _client(handler) as api:
        assert api.selfcheck("c0ffee00c0ffee00")["state"] == "running"
        with pytest.raises(ApiNotFoundError, match="no self-check with id 'missing'"):
            api.selfcheck("missing")
        with pytest.raises(ApiNotFoundError):
            api.selfcheck("../alerts")  # never another endpoint
        assert api.request_selfcheck("a1", "alice")["state"] == "pending"
        assert api.cancel_selfcheck("c0ffee00c0ffee00", "alice")["state"] == "cancelled"
        assert api.cancel_selfcheck("c0ffee00c0ffee00")["state"] == "cancelled"
    request, cancel, bare_cancel = seen[-3:]
    assert (request.method, request.url.path) == ("POST", "/api/v1/selfchecks")
    assert json.loads(request.content) == {"alert_id": "a1", "by": "alice"}
    assert request.headers["Authorization"] == "Bearer op-token"
    assert cancel.url.path == "/api/v1/selfchecks/c0ffee00c0ffee00/cancel"
    assert json.loads(cancel.content) == {"by": "alice"}
    assert bare_cancel.content == b""
