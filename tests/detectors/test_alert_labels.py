"""Training labels from reviewed alerts: which alerts give rows (the export itself runs in
tests/minder/cli/test_cli_operator.py against a real API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from detectors.alert_labels import (
    CLEARED_BY_SELFCHECK,
    CONFIRMED,
    FALSE_POSITIVE_STATUSES,
    FAULT_STATUSES,
    REVIEWED_STATUSES,
    LabelEnd,
    export_labels,
    label_rows,
    sidecar_path,
)
from detectors.training import validate_labels
from minder.core.alert import AlertStatus


def _alert(kind: str, metric: str) -> Any:
    return {
        "id": "a1", "job": "j", "machine": "j-n0007", "domain": "", "devices": ["gpu5"],
        "kind": kind, "metric": metric, "score": 1.0, "status": "resolved",
        "first_ts": 100.0, "detected_ts": 110.0, "last_seen_ts": 130.0, "updated_at": 200.0,
        "evidence": {},
    }  # fmt: skip


def test_a_suspicious_source_alert_is_no_fault_label() -> None:
    # it says a report came from outside its job: the machine was not faulty
    assert label_rows(_alert("suspicious_source", "gpu_xid_count"), LabelEnd.resolved) == []
    [row] = label_rows(_alert("rule", "gpu_xid_count"), LabelEnd.resolved)
    assert (row["machine"], row["kind"], row["end_ts"]) == ("j-n0007", "rule", 200.0)


def test_a_hang_labels_its_culprits_machines_not_the_job() -> None:
    # the job-level alert names no machine: its culprits' own alerts give the rows
    job_level: Any = {**_alert("hang", "hang"), "machine": "", "devices": []}
    assert label_rows(job_level, LabelEnd.resolved) == []
    [row] = label_rows(_alert("hang", "hang"), LabelEnd.last_seen)
    assert (row["machine"], row["fault"], row["end_ts"]) == ("j-n0007", "hang", 130.0)


def _reviewed(alert_id: str, machine: str, status: str, updated_at: float = 200.0) -> Any:
    return {**_alert("rule", "gpu_xid_count"), "id": alert_id, "machine": machine,
            "status": status, "updated_at": updated_at}  # fmt: skip


def test_self_check_verdicts_are_labels_like_an_operators(tmp_path: Path) -> None:
    """``confirmed`` (a failed self-check) is a fault row like ``resolved``;
    ``cleared_by_selfcheck`` (a passed one) a false positive like ``false_positive``; an alert
    without a verdict gives no row."""
    alerts = [
        _reviewed("by-person", "j-n0001", "resolved"),
        _reviewed("by-check", "j-n0002", "confirmed", updated_at=260.0),
        _reviewed("fp-person", "j-n0003", "false_positive"),
        _reviewed("fp-check", "j-n0004", "cleared_by_selfcheck"),
        _reviewed("open", "j-n0005", "open"),
        _reviewed("acknowledged", "j-n0006", "acknowledged"),
    ]
    labels = tmp_path / "labels.csv"
    done = export_labels(alerts, labels)

    assert (done.rows, done.confirmed_faults, done.confirmed_by_selfcheck) == (2, 2, 1)
    assert (done.false_positive_rows, done.false_positives, done.cleared_by_selfcheck) == (2, 2, 1)
    summary = done.summary()
    assert (summary["confirmed_by_selfcheck"], summary["cleared_by_selfcheck"]) == (1, 1)
    written = validate_labels(pd.read_csv(labels))  # what minder train --labels takes
    rows = pd.read_csv(labels).sort_values("alert_id")
    assert rows[["alert_id", "machine", "status", "fault"]].values.tolist() == [
        ["by-check", "j-n0002", "confirmed", "gpu_xid"],
        ["by-person", "j-n0001", "resolved", "gpu_xid"],
    ]
    assert len(written) == 2
    # the label of a confirmed fault ends when the check confirmed it (the verdict's time)
    assert rows.set_index("alert_id").loc["by-check", "end_ts"] == 260.0
    side = pd.read_csv(sidecar_path(labels)).sort_values("alert_id")
    assert side[["alert_id", "status"]].values.tolist() == [
        ["fp-check", "cleared_by_selfcheck"],
        ["fp-person", "false_positive"],
    ]
    # a cleared alert's row ends at its last report, as an operator's false positive's does
    assert side["end_ts"].tolist() == [130.0, 130.0]


def test_the_exported_statuses_are_alert_statuses() -> None:
    """What ``minder labels export`` asks the API for exists in the alert life cycle."""
    statuses = {s.value for s in AlertStatus}
    assert set(REVIEWED_STATUSES) <= statuses, set(REVIEWED_STATUSES) - statuses
    assert set(FAULT_STATUSES).isdisjoint(FALSE_POSITIVE_STATUSES)
    assert {CONFIRMED, CLEARED_BY_SELFCHECK} <= set(REVIEWED_STATUSES)
