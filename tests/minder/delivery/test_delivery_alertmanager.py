"""minder.delivery.alertmanager: the payload, the client's error classes, and a real Alertmanager
(``/usr/bin/prometheus-alertmanager``, started by alertmanager_server.py; those tests skip,
saying so, without it)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import pytest
from alertmanager_server import AlertmanagerServer, WebhookReceiver, alertmanager_server

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.delivery.alertmanager import (
    ANNOTATION_CHARS,
    DEFAULT_VALID_FOR_S,
    DESCRIPTION_CHARS,
    ERROR_TEXT_CHARS,
    AlertmanagerClient,
    DeliveryError,
    alert_labels,
    rfc3339,
    still_open_payload,
    to_alertmanager,
)

URL = "https://minder.example.com/"


def make_alert(**overrides: Any) -> Alert:
    fields: dict[str, Any] = {
        "job": "job-a",
        "machine": "node-017",
        "kind": AlertKind.SIMILARITY,
        "metric": "gpu_temp_c",
        "score": 6.2,
        "first_ts": 1_714_564_800.25,
        "detected_ts": 1_714_564_830.0,
        "devices": ("gpu3",),
        "domain": "leaf-2",
        "evidence": {
            "rule": None,
            "peers": 63,
            "machine_window": [80.0, 91.23456, None],
            "peer_median_window": [65.0, 65.5, None],
            "z": 6.2,
            "direction": "above",
            "threshold": 3.0,
            "missing_samples": 0,
        },
    }
    fields.update(overrides)
    return Alert(**fields)


def parse(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


# -- payload --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "alertname", "severity"),
    [
        (AlertKind.RULE, "MinderRule", "critical"),
        (AlertKind.SILENCE, "MinderSilence", "critical"),
        (AlertKind.SIMILARITY, "MinderSimilarity", "warning"),
        (AlertKind.STRAGGLER, "MinderStraggler", "info"),
    ],
)
def test_labels_name_the_kind_and_its_severity(
    kind: AlertKind, alertname: str, severity: str
) -> None:
    alert = make_alert(kind=kind)
    labels = to_alertmanager(alert, ended_at=None, external_url=URL)["labels"]
    assert labels == {
        "alertname": alertname,
        "job_id": "job-a",
        "machine": "node-017",
        "kind": kind.value,
        "metric": "gpu_temp_c",
        "severity": severity,
        "alert_id": alert.id,
    }


def test_labels_stay_the_same_over_the_alerts_life() -> None:
    """Score, status, devices, domain, evidence and the end change; the labels must not, else
    Alertmanager would see another alert and the end would not end the first."""
    first = make_alert(devices=("gpu3",), domain="", score=4.1)
    labels = to_alertmanager(first, ended_at=None, external_url=URL)["labels"]
    later = [
        make_alert(id=first.id, devices=("gpu3", "gpu5"), domain="leaf-2", score=9.9),
        make_alert(id=first.id, evidence={"z": -3.5, "message": "other"}, detected_ts=2e9),
        first.with_status(AlertStatus.ACKNOWLEDGED),
    ]
    for alert in later:
        assert to_alertmanager(alert, ended_at=None, external_url=URL)["labels"] == labels
    for status in (AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE):
        ended = to_alertmanager(
            first.with_status(status), ended_at=first.first_ts + 60, external_url=None
        )
        assert ended["labels"] == labels
    assert still_open_payload(first, URL, now=first.first_ts)["labels"] == labels
    assert not {"score", "status", "minder_status", "devices"} & set(labels)


def test_a_domain_alert_carries_its_domain_label() -> None:
    alert = make_alert(
        machine="leaf-1",
        domain="leaf-1",
        kind=AlertKind.RULE,
        metric="link_down",
        devices=(),
        evidence={
            "rule": "domain",
            "domain_members": [f"m{i}" for i in range(8)],
            "domain_size": 16,
            "member_rules": ["port_down"],
        },
    )
    payload = to_alertmanager(alert, ended_at=None, external_url=None)
    assert payload["labels"]["domain"] == "leaf-1"
    assert payload["labels"]["machine"] == "leaf-1"
    assert (
        "8 of 16 machines of the domain: m0, m1, m2, m3, m4…"
        in (payload["annotations"]["description"])
    )
    # a machine's domain is an annotation, not a label
    assert "domain" not in alert_labels(make_alert())
    assert to_alertmanager(make_alert(), ended_at=None, external_url=None)["annotations"][
        "domain"
    ] == ("leaf-2")


def test_annotations_carry_the_evidence_and_links() -> None:
    alert = make_alert()
    payload = to_alertmanager(alert, ended_at=None, external_url=URL)
    notes = payload["annotations"]
    link = f"https://minder.example.com/api/v1/alerts/{alert.id}"
    assert notes["minder_url"] == payload["generatorURL"] == link
    assert notes["summary"] == "[job-a] node-017: gpu_temp_c of gpu3 deviates from its peers"
    assert notes["description"] == (
        "score 6.2; onset 2024-05-01T12:00:00.250Z; devices gpu3; domain leaf-2; "
        "gpu_temp_c 91.23 vs peers' median 65.5; z 6.2 (direction above, threshold 3); "
        "missing samples 0; peers 63"
    )
    assert notes["score"] == "6.2"
    assert notes["devices"] == "gpu3"
    assert notes["minder_status"] == "open"
    assert notes["onset"] == "2024-05-01T12:00:00.250Z"
    assert notes["detected"] == "2024-05-01T12:00:30.000Z"
    assert all(isinstance(v, str) for v in notes.values())
    without = to_alertmanager(alert, ended_at=None, external_url=None)
    assert "generatorURL" not in without and "minder_url" not in without["annotations"]


def test_rule_and_silence_descriptions() -> None:
    rule = make_alert(
        kind=AlertKind.RULE,
        metric="xid_errors",
        score=3.0,
        evidence={"rule": "repeated_errors", "errors": 3.0, "seconds_with_errors": 3},
    )
    notes = to_alertmanager(rule, ended_at=None, external_url=None)["annotations"]
    assert notes["summary"] == "[job-a] node-017: xid_errors fault on gpu3 (rule repeated_errors)"
    assert "rule repeated_errors; errors 3; seconds with errors 3" in notes["description"]
    pcie = make_alert(
        kind=AlertKind.RULE, evidence={"rule": "pcie_downgrade", "value": 3.0, "peers": 4.0}
    )
    assert (
        "value 3 vs peers 4"
        in to_alertmanager(pcie, ended_at=None, external_url=None)["annotations"]["description"]
    )
    silence = make_alert(
        kind=AlertKind.SILENCE,
        metric="silence",
        devices=(),
        evidence={"rule": "silence", "silent_s": 42, "peers_reporting": 511},
    )
    notes = to_alertmanager(silence, ended_at=None, external_url=None)["annotations"]
    assert notes["summary"] == "[job-a] node-017: stopped reporting while its peers go on"
    assert "silent s 42; peers reporting 511" in notes["description"]


def test_times_are_rfc3339_utc() -> None:
    alert = make_alert(status=AlertStatus.RESOLVED)
    payload = to_alertmanager(alert, ended_at=1_714_568_400.5, external_url=None)
    assert payload["startsAt"] == "2024-05-01T12:00:00.250Z"
    assert payload["endsAt"] == "2024-05-01T13:00:00.500Z"
    assert parse(payload["startsAt"]) == alert.first_ts
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    with pytest.raises(ValidationError, match="finite"):
        rfc3339(math.nan)


def test_an_end_before_the_onset_is_sent_as_the_onset() -> None:
    alert = make_alert(status=AlertStatus.RESOLVED)
    payload = to_alertmanager(alert, ended_at=alert.first_ts - 5, external_url=None)
    assert payload["endsAt"] == payload["startsAt"]


def test_an_ended_alert_needs_its_end() -> None:
    for status in (AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE):
        alert = make_alert(status=status)
        with pytest.raises(ValidationError, match="give ended_at"):
            to_alertmanager(alert, ended_at=None, external_url=None)
        with pytest.raises(ValidationError, match="not open"):
            still_open_payload(alert, None)


def test_still_open_payload_sets_an_explicit_end() -> None:
    alert = make_alert()
    now = alert.first_ts + 100
    payload = still_open_payload(alert, URL, now=now)
    assert parse(payload["endsAt"]) == now + DEFAULT_VALID_FOR_S
    assert parse(still_open_payload(alert, URL, now=now, valid_for_s=30)["endsAt"]) == now + 30
    assert "endsAt" not in still_open_payload(alert, URL, valid_for_s=None)
    with pytest.raises(ValidationError, match="valid_for_s"):
        still_open_payload(alert, URL, valid_for_s=0)


def test_annotations_are_truncated_and_json_safe() -> None:
    alert = make_alert(
        kind=AlertKind.RULE,
        score=np.float64(np.nan),
        devices=tuple(f"gpu{i}" for i in range(200)),
        evidence={
            "rule": "event:xid",
            "code": np.int64(79),
            "message": "fell off the bus " * 100 + "\ud800",
            "value": np.float32(2.5),
            "errors": math.inf,
            "other_metrics": [f"metric_{i}" for i in range(300)],
        },
    )
    payload = to_alertmanager(alert, ended_at=None, external_url=URL)
    notes = payload["annotations"]
    text = json.dumps(payload, allow_nan=False)
    text.encode("utf-8")  # no lone surrogate left
    assert len(notes["description"]) <= DESCRIPTION_CHARS
    assert all(len(v) <= ANNOTATION_CHARS for k, v in notes.items() if k != "description")
    assert notes["devices"].endswith("…") and len(notes["devices"]) == ANNOTATION_CHARS
    assert notes["score"] == "nan"
    assert "devices gpu0,gpu1,gpu2,gpu3,gpu4,gpu5,gpu6,gpu7… (200 devices)" in notes["description"]
    assert "code 79" in notes["description"] and "errors inf" in notes["description"]
    assert "message 'fell off the bus fell" in notes["description"]
    assert "value 2.5" in notes["description"]
    long = make_alert(evidence={"other_metrics": ["m" * 50] * 100, "message": "x" * 5000})
    assert (
        len(to_alertmanager(long, ended_at=None, external_url=None)["annotations"]["description"])
        <= DESCRIPTION_CHARS
    )


def test_extra_labels() -> None:
    alert = make_alert()
    labels = alert_labels(alert, {"cluster": "a3", "team": ""})
    assert labels["cluster"] == "a3" and "team" not in labels
    with pytest.raises(ValidationError, match="invalid"):
        alert_labels(alert, {"bad-name": "x"})
    with pytest.raises(ValidationError, match="override"):
        to_alertmanager(alert, ended_at=None, external_url=None, extra_labels={"severity": "x"})


# -- client, without a server ---------------------------------------------------------------


def mock_client(handler: Any, **kwargs: Any) -> AlertmanagerClient:
    return AlertmanagerClient(
        "http://am.invalid:9093/", transport=httpx.MockTransport(handler), **kwargs
    )


@pytest.mark.parametrize(
    ("status", "transient"),
    [(500, True), (503, True), (429, True), (408, True), (400, False), (401, False), (404, False)],
)
def test_http_status_classes(status: int, transient: bool) -> None:
    client = mock_client(lambda request: httpx.Response(status, json="reason " * 100))
    with pytest.raises(DeliveryError) as caught:
        client.push([{"labels": {"alertname": "x"}}])
    assert caught.value.transient is transient
    assert caught.value.status == status
    assert f"answered {status}: reason reason" in str(caught.value)
    reason = str(caught.value).split(f"answered {status}: ", 1)[1]
    assert len(reason) <= ERROR_TEXT_CHARS


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("x")],
)
def test_network_failures_are_transient(error: Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with pytest.raises(DeliveryError) as caught:
        mock_client(handler).push([{"labels": {"alertname": "x"}}])
    assert caught.value.transient is True and caught.value.status is None


def test_push_and_active_requests() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=[] if request.method == "GET" else None)

    with mock_client(handler, bearer_token="tok", headers={"X-Scope-OrgID": "t1"}) as client:
        client.push([])
        assert seen == []
        payload = to_alertmanager(make_alert(), ended_at=None, external_url=None)
        client.push([payload])
        assert client.active({"job_id": 'a"b\\c'}) == []
    post, get = seen
    assert post.method == "POST" and post.url.path == "/api/v2/alerts"
    assert json.loads(post.content) == [payload]
    assert post.headers["Authorization"] == "Bearer tok"
    assert post.headers["X-Scope-OrgID"] == "t1"
    assert post.headers["Content-Type"] == "application/json"
    assert get.url.params.get_list("filter") == ['job_id="a\\"b\\\\c"']
    assert get.url.params["active"] == "true"

    basic = mock_client(handler, basic_auth=("u", "p"))
    basic.push([payload])
    assert seen[-1].headers["Authorization"].startswith("Basic ")


def test_client_refuses_bad_settings() -> None:
    with pytest.raises(ValidationError, match="http"):
        AlertmanagerClient("am:9093")
    with pytest.raises(ValidationError, match="not both"):
        AlertmanagerClient("http://am:9093", basic_auth=("u", "p"), bearer_token="t")


# -- a real Alertmanager --------------------------------------------------------------------


@pytest.fixture(scope="module")
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def am(hook: WebhookReceiver) -> Iterator[AlertmanagerServer]:
    with alertmanager_server(webhook_url=hook.url) as server:
        yield server


def notified(alert_id: str, status: str) -> Any:
    return lambda n: (
        n.get("status") == status
        and any(a["labels"].get("alert_id") == alert_id for a in n.get("alerts", []))
    )


@pytest.mark.slow
def test_open_refresh_and_end_in_alertmanager(
    am: AlertmanagerServer, hook: WebhookReceiver
) -> None:
    now = time.time()
    alert = make_alert(job="job-lifecycle", first_ts=round(now - 120, 3), detected_ts=now - 90)
    with AlertmanagerClient(am.url) as client:
        assert "versionInfo" in client.status()
        client.push([still_open_payload(alert, URL)])
        [active] = client.active({"alert_id": alert.id})
        expected = to_alertmanager(alert, ended_at=None, external_url=URL)
        assert active["labels"] == expected["labels"]
        assert active["annotations"] == expected["annotations"]
        assert active["startsAt"] == expected["startsAt"]
        assert parse(active["startsAt"]) == alert.first_ts
        assert active["generatorURL"] == expected["generatorURL"]
        assert active["status"]["state"] in ("active", "unprocessed")
        firing = hook.wait_for(notified(alert.id, "firing"))
        assert firing["alerts"][0]["labels"] == expected["labels"]

        # a re-send with a new score, status and devices: the same alert, updated
        later = make_alert(
            id=alert.id,
            job="job-lifecycle",
            first_ts=alert.first_ts,
            detected_ts=now - 90,
            score=9.5,
            devices=("gpu3", "gpu5"),
            status=AlertStatus.ACKNOWLEDGED,
        )
        client.push([still_open_payload(later, URL)])
        [active] = client.active({"job_id": "job-lifecycle"})
        assert active["annotations"]["score"] == "9.5"
        assert active["annotations"]["minder_status"] == "acknowledged"
        assert active["annotations"]["devices"] == "gpu3,gpu5"
        assert active["startsAt"] == expected["startsAt"]

        # the end
        ended = later.with_status(AlertStatus.RESOLVED)
        client.push([to_alertmanager(ended, ended_at=time.time(), external_url=URL)])
        assert client.active({"alert_id": alert.id}) == []
        assert am.alerts(filter=f'alert_id="{alert.id}"') == []
        resolved = hook.wait_for(notified(alert.id, "resolved"))
        [sent] = resolved["alerts"]
        assert sent["status"] == "resolved"
        assert sent["labels"] == expected["labels"]
        assert sent["annotations"]["minder_status"] == "resolved"
        # one firing notification: the re-send did not notify again
        assert len(hook.matching(notified(alert.id, "firing"))) == 1, am.log_tail()


@pytest.mark.slow
def test_an_open_alert_that_is_not_refreshed_ends_by_itself(
    am: AlertmanagerServer, hook: WebhookReceiver
) -> None:
    alert = make_alert(job="job-expiry", first_ts=round(time.time() - 10, 3))
    with AlertmanagerClient(am.url) as client:
        client.push([still_open_payload(alert, None, valid_for_s=1.5)])
        assert len(client.active({"alert_id": alert.id})) == 1
        hook.wait_for(notified(alert.id, "resolved"), timeout=15)
        assert client.active({"alert_id": alert.id}) == []


@pytest.mark.slow
def test_alertmanager_refuses_an_invalid_alert(am: AlertmanagerServer) -> None:
    start = time.time() - 60
    backwards = {
        "labels": {"alertname": "MinderRule", "job_id": "job-invalid"},
        "startsAt": rfc3339(start),
        "endsAt": rfc3339(start - 30),
    }
    bad_label = {"labels": {"alertname": "MinderRule", "bad-name": "x"}, "startsAt": rfc3339(start)}
    with AlertmanagerClient(am.url) as client:
        for payload, reason in (
            (backwards, "start time must be before end time"),
            (bad_label, 'invalid label set: invalid name "bad-name"'),
        ):
            with pytest.raises(DeliveryError) as caught:
                client.push([payload])
            assert caught.value.transient is False
            assert caught.value.status == 400
            assert reason in str(caught.value)
        assert client.active({"job_id": "job-invalid"}) == []


@pytest.mark.slow
def test_a_stopped_alertmanager_is_a_transient_error() -> None:
    with alertmanager_server() as server, AlertmanagerClient(server.url, timeout_s=2) as client:
        payload = still_open_payload(make_alert(job="job-stopped", first_ts=time.time()), None)
        client.push([payload])
        server.stop()
        with pytest.raises(DeliveryError) as caught:
            client.push([payload])
        assert caught.value.transient is True
        assert caught.value.status is None
        assert "ConnectError" in str(caught.value)
