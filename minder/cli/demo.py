"""``minder demo``: the whole system on one machine, end to end (:mod:`minder.service.demo`).

An embedded Kafka-protocol broker (Tansu), the detection service with its HTTP API, and a
simulated 64-machine job publishing one batch per machine per second in real time, with one
injected fault. The alert is printed when it fires; the summary says whether the injected machine
was named and whether any healthy machine was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

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
)

if TYPE_CHECKING:
    from minder.core.alert import Alert


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
    from minder.service.demo import run_demo  # noqa: PLC0415

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
        f"[bold]Minder demo[/]: {scenario.machines} simulated machines, "
        f"1 batch/machine/s through an embedded Kafka broker (Tansu). "
        f"Injected: {faults or 'nothing'}."
    )
    settings = load_settings()
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
                settings,
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
    out.print(
        alerts_table(result.alerts, title="Alerts raised during the demo", times=result.timing())
    )
    verdict = summary["result"]
    out.print(
        f"injected machines named: {verdict['injected_named'] or 'none'}; missed: "
        f"{verdict['injected_missed'] or 'none'}; onset→alert: {verdict['onset_to_alert_s']}; "
        f"alerts on healthy machines: {verdict['alerts_on_healthy_machines'] or 'none'}"
    )
