"""Hang alerts in Alertmanager: ``MinderHang``, critical; the job-level alert has no ``machine``
label (it names none) and stays apart from its culprits' alerts by ``alert_id``, in a real
Alertmanager too (``/usr/bin/prometheus-alertmanager``; skipped, saying so, without it)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from alertmanager_server import AlertmanagerServer, WebhookReceiver, alertmanager_server

from minder.core.alert import Alert, AlertKind
from minder.delivery.alertmanager import (
    ALERTNAMES,
    SEVERITIES,
    AlertmanagerClient,
    still_open_payload,
    to_alertmanager,
)

URL = "https://minder.example.com/"
EVIDENCE = {"culprit_ranks": [2, 5], "culprit_machines": ["n24", "n25"], "analysis": {}}


def hang(machine: str, job: str = "job-h", first_ts: float = 1_714_564_800.0) -> Alert:
    return Alert(job=job, machine=machine, kind=AlertKind.HANG, metric="hang", score=1.0,
                 first_ts=first_ts, detected_ts=first_ts + 30, evidence=EVIDENCE)  # fmt: skip


def test_every_kind_has_an_alertname_and_a_severity() -> None:
    assert set(ALERTNAMES) == set(AlertKind) == set(SEVERITIES)
    assert (ALERTNAMES[AlertKind.HANG], SEVERITIES[AlertKind.HANG]) == ("MinderHang", "critical")


def test_the_job_level_alert_has_no_machine_label_and_says_what_it_waits_on() -> None:
    job_level = to_alertmanager(hang(""), ended_at=None, external_url=URL)
    assert job_level["labels"] == {
        "alertname": "MinderHang",
        "job_id": "job-h",
        "kind": "hang",
        "metric": "hang",
        "severity": "critical",
        "alert_id": hang("").id,
    }
    assert job_level["annotations"]["summary"] == "[job-h] the job is hung: it waits on ranks 2, 5"
    assert "culprit machines n24, n25" in job_level["annotations"]["description"]
    culprit = to_alertmanager(hang("n24"), ended_at=None, external_url=URL)
    assert culprit["labels"]["machine"] == "n24"
    assert (
        culprit["annotations"]["summary"] == "[job-h] n24: the job's hang waits on it (ranks 2, 5)"
    )


@pytest.fixture(scope="module")
def am() -> Iterator[AlertmanagerServer]:
    with WebhookReceiver() as hook, alertmanager_server(webhook_url=hook.url) as server:
        yield server


def test_a_real_alertmanager_keeps_the_job_level_and_culprit_alerts_apart(
    am: AlertmanagerServer,
) -> None:
    now = time.time()
    job_level, culprit = hang("", "job-am", now - 60), hang("n24", "job-am", now - 60)
    with AlertmanagerClient(am.url) as client:
        client.push([still_open_payload(job_level, URL), still_open_payload(culprit, URL)])
        active = client.active({"job_id": "job-am"})
    by_id = {a["labels"]["alert_id"]: a["labels"] for a in active}
    assert set(by_id) == {job_level.id, culprit.id}
    assert "machine" not in by_id[job_level.id]
    assert by_id[culprit.id]["machine"] == "n24"
