"""``minder demo``: the whole system on one machine, end to end.

An embedded Kafka-protocol broker (Tansu), the detection service with its HTTP API, and a
simulated 64-machine job publishing one batch per machine per second in real time, with one
injected fault. The alert is printed when it fires; the summary says whether the injected machine
was named and whether any healthy machine was.
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
from typing import TYPE_CHECKING, Annotated, Any

import typer

from minder.cli.common import (
    alerts_table,
    clock,
    err,
    fail,
    load_scenario,
    load_settings,
    out,
    print_json,
    progress,
    scenario_machines,
)
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

    def judged(self) -> dict[str, Any]:
        """Which injected machines were named, how fast, and which alerts named healthy ones."""
        faulty = {i["machine"] for i in self.injected} | {i["domain"] for i in self.injected}
        named = {a.machine for a in self.alerts}
        latencies = {}
        for fault in self.injected:
            hits = [a for a in self.alerts if a.machine in (fault["machine"], fault["domain"])]
            if hits:
                # End to end: from the fault's onset to the alert leaving the service.
                seen = min(self.seen_at.get(a.id, a.detected_ts + 1.0) for a in hits)
                latencies[fault["machine"]] = round(seen - fault["start_ts"], 1)
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
    *,
    duration_s: float,
    port: int | None = None,
    database_url: str | None = None,
    on_tick: Callable[[int, int, int], None] | None = None,
    on_alert: Callable[[Alert, str], None] | None = None,
    on_ready: Callable[[str, str, str], None] | None = None,
) -> DemoResult:
    """Run the demo for ``duration_s`` seconds of wall clock (Ctrl-C ends it early).

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
        settings = load_settings()
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


def demo_command(
    duration: Annotated[
        float,
        typer.Option(
            "--duration", min=1.0, max=86_400.0, help="seconds to run before stopping by itself"
        ),
    ] = 90.0,
    scenario_file: Annotated[
        str, typer.Option("--scenario", help="scenario YAML or bundled name")
    ] = "demo",
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="API port (default: a free one)")
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="print a machine-readable summary at the end")
    ] = False,
) -> None:
    """Run broker, service, API and a simulated 64-machine job with an injected fault."""
    from minder.core.errors import MinderError  # noqa: PLC0415

    scenario = load_scenario(scenario_file)
    first_fault = min((f.start_s for f in scenario.faults), default=None)
    if first_fault is not None and duration <= first_fault:
        raise fail(
            f"--duration {duration:g} ends before the first injected fault at +{first_fault:g} s: "
            f"expected more than {first_fault:g} (about {first_fault + 45:g} to see it alerted)"
        )
    faults = ", ".join(f"{f.type.value} on machine {f.machine} at +{f.start_s:g}s"
                       for f in scenario.faults)  # fmt: skip
    err.print(
        f"[bold]Minder demo[/]: {scenario_machines(scenario)} simulated machines, "
        f"1 batch/machine/s through an embedded Kafka broker (Tansu). "
        f"Injected: {faults or 'nothing'}."
    )
    with progress() as bar:
        task = bar.add_task("job running", total=min(duration, scenario.duration_s))

        def ready(api: str, metrics: str, access: str) -> None:
            bar.console.print(f"API: [link]{api}[/]   metrics: [link]{metrics}[/]   {access}")

        def tick(second: int, batches: int, alerts: int) -> None:
            bar.update(task, completed=second, description=f"{batches} batches, {alerts} alert(s)")

        def alert(a: Alert, url: str) -> None:
            bar.console.print(
                f"[bold red]ALERT[/] {a.kind.value} on [bold]{a.machine}[/] "
                f"{','.join(a.devices)} ({a.metric}, score {a.score:.1f}), "
                f"onset {clock(a.first_ts)}, detected {clock(a.detected_ts)}\n"
                f"      details: {url}"
            )

        try:
            result = run_demo(
                scenario,
                duration_s=duration,
                port=port,
                on_ready=ready,
                on_tick=tick,
                on_alert=alert,
            )
        except MinderError as exc:
            raise fail(exc) from None
    summary = result.to_dict()
    if json_output:
        print_json(summary)
        return
    out.print(alerts_table(result.alerts, title="Alerts raised during the demo"))
    verdict = summary["result"]
    out.print(
        f"injected machines named: {verdict['injected_named'] or 'none'}; missed: "
        f"{verdict['injected_missed'] or 'none'}; onset→alert: {verdict['onset_to_alert_s']}; "
        f"alerts on healthy machines: {verdict['alerts_on_healthy_machines'] or 'none'}"
    )
