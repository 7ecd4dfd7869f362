"""``minder demo``'s run: the whole system on one machine, end to end.

An embedded Kafka-protocol broker (Tansu), the detection service with its HTTP API, and a
simulated job publishing one batch per machine per second in real time, with its injected
faults. :func:`run_demo` reports through callbacks (the CLI prints) and returns a
:class:`DemoResult` that says whether the injected machines were named and whether any healthy
machine was.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minder.core.alert import Alert

if TYPE_CHECKING:
    from collectors.sim.scenario import Scenario
    from minder.config import Settings
    from minder.service.stack import Stack

logger = logging.getLogger(__name__)


@dataclass
class DemoResult:
    """What a demo run did and found."""

    api_url: str
    metrics_url: str
    duration_s: float
    seconds_published: int
    batches_published: int
    injected: list[dict[str, Any]]
    alerts: list[Alert] = field(default_factory=list)
    interrupted: bool = False
    seen_at: dict[str, float] = field(default_factory=dict)
    """Wall-clock time each alert reached the demo, by id (timestamps are wall-clock too)."""

    def timing(self) -> dict[str, tuple[float, float]]:
        """``(onset, alerted)`` of each alert, by id, as the demo's table and summary both
        show them: ``onset`` is the start of the injected fault the alert names (its machine or
        its domain; the earliest when several), else the alert's own estimated onset;
        ``alerted`` the wall time the alert reached the demo (else one second after its
        ``detected_ts``). Onset→alert is end to end: ``alerted - onset``."""
        out = {}
        for a in self.alerts:
            starts = [
                float(f["start_ts"])
                for f in self.injected
                if a.machine in (f["machine"], f["domain"])
            ]
            onset = min(starts) if starts else a.first_ts
            out[a.id] = (onset, self.seen_at.get(a.id, a.detected_ts + 1.0))
        return out

    def judged(self) -> dict[str, Any]:
        """Which injected machines were named, how fast, and which alerts named healthy ones."""
        faulty = {i["machine"] for i in self.injected} | {i["domain"] for i in self.injected}
        named = {a.machine for a in self.alerts}
        latencies = {}
        timing = self.timing()
        for fault in self.injected:
            hits = [a for a in self.alerts if a.machine in (fault["machine"], fault["domain"])]
            if hits:
                # End to end: from the fault's onset to the alert reaching the demo.
                seen = min(timing[a.id][1] for a in hits)
                latencies[fault["machine"]] = onset_to_alert(fault["start_ts"], seen)
        return {
            "injected_named": sorted(m for m in latencies),
            "injected_missed": sorted(
                f["machine"] for f in self.injected if f["machine"] not in latencies
            ),
            "onset_to_alert_s": latencies,
            "alerts_on_healthy_machines": sorted(named - faulty),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "api_url": self.api_url,
            "metrics_url": self.metrics_url,
            "duration_s": round(self.duration_s, 1),
            "seconds_published": self.seconds_published,
            "batches_published": self.batches_published,
            "interrupted": self.interrupted,
            "injected": self.injected,
            "alerts": [a.summary() for a in self.alerts],
            "result": self.judged(),
        }


def run_demo(
    scenario: Scenario,
    settings: Settings,
    *,
    duration_s: float,
    port: int | None = None,
    database_url: str | None = None,
    on_tick: Callable[[int, int, int], None] | None = None,
    on_alert: Callable[[Alert, str], None] | None = None,
    on_ready: Callable[[str, str, str], None] | None = None,
) -> DemoResult:
    """Run the demo for ``duration_s`` seconds of wall clock (Ctrl-C ends it early).

    ``settings`` (from ``MINDER_*``) are changed for the run: its broker, database, port, and
    cluster key file and API token when none is set.

    Callbacks: ``on_ready(api_url, metrics_url, access)`` (``access``: how to make changes
    through the API), ``on_tick(second, batches_so_far, alerts)`` after each published second,
    ``on_alert(alert, alert_url)`` for each new alert.

    The API is secure by default here too: without MINDER_API__TOKEN (or MINDER_API__OPEN=true)
    the demo makes a random token for its run, which ``access`` gives.
    """
    from collectors.sim.labels import scenario_labels  # noqa: PLC0415
    from collectors.sim.output import iter_batches  # noqa: PLC0415
    from minder.core.signing import FleetSigner, init_cluster_keys, load_cluster_keys  # noqa: PLC0415
    from minder.service.stack import build_stack  # noqa: PLC0415
    from minder.stream.broker import EmbeddedBroker, free_port  # noqa: PLC0415
    from minder.stream.producer import BatchProducer  # noqa: PLC0415

    with contextlib.ExitStack() as cleanup:
        workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="minder-demo-")))
        broker = cleanup.enter_context(EmbeddedBroker(log_path=workdir / "tansu.log"))
        settings.kafka.bootstrap = broker.bootstrap
        settings.kafka.group_id = "minder-demo"
        settings.database.url = database_url or f"sqlite:///{workdir / 'minder.db'}"
        settings.api.port = port or free_port()
        access = _demo_access(settings)
        # Signed as real agents sign (docs/security.md): this run's cluster key, each simulated
        # node's key derived from it.
        if settings.auth.keys_file is None:
            settings.auth.keys_file = workdir / "cluster.keys"
            init_cluster_keys(settings.auth.keys_file, "demo")
        signer = FleetSigner(load_cluster_keys(settings.auth.keys_file)[-1])
        stack: Stack = build_stack(settings)
        cleanup.callback(stack.stop)  # also when the start fails half-way
        stack.start()
        api_url = f"{stack.api_url}/api/v1"
        metrics_url = f"{stack.api_url}/metrics"
        if on_ready is not None:
            on_ready(api_url, metrics_url, access)

        producer = cleanup.enter_context(BatchProducer(broker.bootstrap, signer=signer))
        origin = time.time() + 1.0
        labels = scenario_labels(scenario, start_ts=origin)
        columns = ["job", "machine", "fault", "device", "domain", "start_ts"]
        injected = [
            {str(k): v for k, v in row.items()}
            for row in labels.drop_duplicates(["job", "machine", "fault_index"])[columns].to_dict(
                "records"
            )
        ]
        result = DemoResult(api_url, metrics_url, 0.0, 0, 0, injected)
        started = time.monotonic()
        seen = 0
        try:
            for second, (ts, batches) in enumerate(iter_batches(scenario, start_ts=origin)):
                if time.monotonic() - started >= duration_s:
                    break
                delay = ts - time.time()
                if delay > 0:
                    time.sleep(delay)
                for batch in batches:
                    producer.send(batch)
                producer.flush()
                result.seconds_published = second + 1
                result.batches_published += len(batches)
                seen = _report_new(stack, seen, result, api_url, on_alert)
                if on_tick is not None:
                    on_tick(second + 1, result.batches_published, seen)
            # Let the last seconds through the grace period before judging.
            time.sleep(min(5.0, settings.detection.grace_s + 2.0))
        except KeyboardInterrupt:
            result.interrupted = True
        _report_new(stack, seen, result, api_url, on_alert)
        result.alerts = list(stack.service.alerts)
        result.duration_s = time.monotonic() - started
        return result


def onset_to_alert(onset: float, alerted: float) -> float:
    """Seconds from onset to alert as the demo shows them (one decimal), in its table and its
    summary alike."""
    return round(alerted - onset, 1)


def _demo_access(settings: Settings) -> str:
    """Give the demo's API a random token unless the operator chose one or open mode; say how
    to read and make changes (a token guards both)."""
    if settings.api.open:
        return "reads and changes: open to anyone (MINDER_API__OPEN=true)"
    if settings.api.token is not None:
        return "reads and changes: with the token of MINDER_API__TOKEN"
    settings.api.token = secrets.token_urlsafe(24)
    return f"reads and changes: --token {settings.api.token} (this run's token)"


def _report_new(
    stack: Stack,
    seen: int,
    result: DemoResult,
    api_url: str,
    on_alert: Callable[[Alert, str], None] | None,
) -> int:
    alerts = list(stack.service.alerts)
    for alert in alerts[seen:]:
        result.seen_at.setdefault(alert.id, time.time())
        if on_alert is not None:
            on_alert(alert, f"{api_url}/alerts/{alert.id}")
    return len(alerts)
