"""``minder demo``'s table and summary give the same onset→alert: from the injected fault's
start to the alert reaching the demo, to a tenth of a second."""

from __future__ import annotations

from rich.console import Console

from minder.cli.common import alerts_table
from minder.core.alert import Alert, AlertKind
from minder.service.demo import DemoResult

START = 1_800_000_000.0


def _result() -> DemoResult:
    injected = [
        {"job": "demo", "machine": "demo-n0006", "fault": "gpu_xid", "device": "gpu5",
         "domain": "leaf-0", "start_ts": START},
    ]  # fmt: skip
    # the detector dates the fault from its first sample, and detects it in the same second
    alert = Alert(job="demo", machine="demo-n0006", kind=AlertKind.RULE, metric="gpu_xid_count",
                  score=1.0, first_ts=START + 1, detected_ts=START + 1, devices=("gpu5",))  # fmt: skip
    healthy = Alert(job="demo", machine="demo-n0002", kind=AlertKind.SIMILARITY,
                    metric="gpu_power_watts", score=7.5, first_ts=START + 10,
                    detected_ts=START + 14)  # fmt: skip
    result = DemoResult("http://api", "http://metrics", 30.0, 30, 480, injected)
    result.alerts = [alert, healthy]
    # end to end: the alert left the service 2.04 s after its data second
    result.seen_at = {alert.id: START + 3.04, healthy.id: START + 15.5}
    return result


def _rendered(result: DemoResult) -> str:
    console = Console(record=True, width=200)
    console.print(alerts_table(result.alerts, title="demo", times=result.timing()))
    return console.export_text()


def test_the_table_and_the_summary_give_the_same_onset_to_alert() -> None:
    result = _result()
    summary = result.to_dict()["result"]
    assert summary["onset_to_alert_s"] == {"demo-n0006": 3.0}
    table = _rendered(result)
    row = next(line for line in table.splitlines() if "demo-n0006" in line)
    # the onset is the injected fault's start, the alert its arrival: +3.0 s, not +0 s
    assert "08:00:00" in row and "08:00:03 (+3.0s)" in row and "(+0s)" not in row
    assert "alerted" in table
    # an alert on a healthy machine: from its own onset estimate to its arrival
    other = next(line for line in table.splitlines() if "demo-n0002" in line)
    assert "08:00:10" in other and "08:00:15 (+5.5s)" in other
    assert summary["alerts_on_healthy_machines"] == ["demo-n0002"]


def test_detect_keeps_its_data_time_view() -> None:
    """Without the demo's times the table is ``minder detect``'s: detected in data time."""
    alert = _result().alerts[1]
    console = Console(record=True, width=200)
    console.print(alerts_table([alert]))
    text = console.export_text()
    assert "detected" in text and "08:00:14 (+4s)" in text
