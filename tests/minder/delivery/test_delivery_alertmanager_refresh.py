"""The Alertmanager sender's refresh keeps open alerts alive and never revives a closed one."""

from __future__ import annotations

import time
from pathlib import Path

from alertmanager_server import alertmanager_server

from minder.core.alert import Alert, AlertKind
from minder.delivery.alertmanager import AlertmanagerClient, AlertmanagerSender


def _alert(machine: str) -> Alert:
    return Alert(job="j", machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                 first_ts=time.time() - 60, detected_ts=time.time() - 58)  # fmt: skip


def test_refresh_keeps_open_alerts_and_ends_closed_ones(tmp_path: Path) -> None:
    with alertmanager_server(tmp_path) as am:
        sender = AlertmanagerSender(AlertmanagerClient(am.url), refresh_s=5.0)
        assert sender.valid_for_s == 20.0
        open_one, closed_one = _alert("n1"), _alert("n2")
        # a refresh that read n2 as open just before it was resolved …
        sender.refresh([open_one, closed_one])
        active = {a["labels"]["machine"] for a in am.alerts(active="true")}
        assert active == {"n1", "n2"}
        # … is followed by one that sends its end: it does not stay (or come back) active
        sender.refresh([open_one], recently_closed=[(closed_one, time.time())])
        active = {a["labels"]["machine"] for a in am.alerts(active="true")}
        assert active == {"n1"}
        [kept] = am.alerts(active="true")
        ends = kept["endsAt"]
        assert ends > time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 10))
        sender.close()
