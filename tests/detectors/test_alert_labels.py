"""Training labels from reviewed alerts: which alerts give rows (the export itself runs in
tests/minder/cli/test_cli_operator.py against a real API)."""

from __future__ import annotations

from typing import Any

from detectors.alert_labels import LabelEnd, label_rows


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
