"""The ``minder`` command line."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from minder.config import Settings
from minder.core.alert import Alert
from minder.core.errors import MinderError
from minder.logging_setup import configure_logging

app = typer.Typer(
    name="minder",
    help="Keeps very large GPU training jobs healthy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output gets a wide console so tables stay readable in logs and files.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)
logger = logging.getLogger(__name__)


class OutputFormat(StrEnum):
    """How results are printed."""

    table = "table"
    json = "json"


@app.callback()
def _root(
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "WARNING",
) -> None:
    """Minder: faulty-machine detection and straggler analysis for GPU training jobs."""
    configure_logging(log_level)


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(code=2)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def job_reporter(progress: Progress) -> Callable[[str, int, int], None]:
    """``report(job, seconds_done, seconds_total)`` that keeps one bar per job."""
    tasks: dict[str, TaskID] = {}

    def report(job: str, done: int, total: int) -> None:
        if job not in tasks:
            tasks[job] = progress.add_task(f"job {job}", total=total)
        progress.update(tasks[job], completed=done)

    return report


def alerts_table(alerts: list[Alert], title: str = "Alerts") -> Table:
    """A readable table of alerts."""
    table = Table(title=title, show_lines=False)
    for column in ("job", "machine", "kind", "metric", "devices", "score", "onset", "detected"):
        table.add_column(column, justify="right" if column == "score" else "left")
    for a in alerts:
        table.add_row(
            a.job,
            a.machine,
            a.kind.value,
            a.metric,
            ",".join(a.devices) or "-",
            f"{a.score:.2f}",
            _clock(a.first_ts),
            f"{_clock(a.detected_ts)} (+{a.detected_ts - a.first_ts:.0f}s)",
        )
    return table


def _clock(ts: float) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S")


def _print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


@app.command()
def detect(
    table_file: Annotated[Path, typer.Argument(help="canonical metric table (.parquet/.csv[.gz])")],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table or json")
    ] = OutputFormat.table,
    method: Annotated[
        str | None,
        typer.Option(help="minder (default), pairwise, mahalanobis, iforest, ecod, copod, lof"),
    ] = None,
    model: Annotated[
        Path | None, typer.Option("--model", help="trained model directory (minder train)")
    ] = None,
) -> None:
    """Detect faulty machines in a canonical metric table (DESIGN.md §3.3)."""
    from detectors.offline import detect_table  # noqa: PLC0415
    from minder.core.table import read_table  # noqa: PLC0415

    settings = Settings()
    try:
        factory = settings.detection.detector_factory(method, model)
        frame = read_table(table_file)
    except (MinderError, ValueError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    with _progress() as progress:
        run = detect_table(frame, factory, progress=job_reporter(progress))
    if output_format is OutputFormat.json:
        _print_json({"alerts": [a.summary() for a in run.alerts], "summary": run.summary()})
        return
    out.print(alerts_table(run.alerts, title=f"Alerts in {table_file}"))
    machines = {a.machine for a in run.alerts}
    out.print(f"{len(run.alerts)} alert(s) on {len(machines)} machine(s)/domain(s).")


@app.command()
def simulate(
    scenario_file: Annotated[
        str, typer.Argument(help="scenario YAML, or the name of a bundled one (e.g. 'demo')")
    ],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write the canonical table here")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="write the ground truth (job, machine, start/end, fault)")
    ] = None,
    kafka: Annotated[
        str | None, typer.Option(help="publish batches to this Kafka bootstrap instead")
    ] = None,
    realtime: Annotated[
        bool, typer.Option(help="with --kafka: publish at wall-clock pace, timestamps from now")
    ] = False,
) -> None:
    """Simulate a cluster from a scenario file: write the metric table or publish to Kafka."""
    from collectors.sim.labels import write_scenario_labels  # noqa: PLC0415
    from collectors.sim.output import write_scenario_table  # noqa: PLC0415

    scenario = _load_scenario(scenario_file)
    if output is None and kafka is None:
        raise _fail(ValueError("nothing to do: give -o FILE and/or --kafka BOOTSTRAP"))
    try:
        if output is not None:
            with err.status(
                f"simulating {scenario.duration_s} s of {_machines(scenario)} machines"
            ):
                path = write_scenario_table(scenario, output)
            out.print(f"wrote {path}")
        if labels is not None:
            out.print(f"wrote {write_scenario_labels(scenario, labels)}")
        if kafka is not None:
            sent = _publish(scenario, kafka, realtime)
            out.print(f"published {sent} batches to {kafka}")
    except (MinderError, OSError) as exc:
        raise _fail(exc) from None


def _machines(scenario: Any) -> int:
    return sum(job.machines for job in scenario.jobs)


def _load_scenario(name: str) -> Any:
    from collectors.sim.scenario import bundled_scenario, load_scenario  # noqa: PLC0415

    path = Path(name)
    try:
        if not path.exists() and not name.endswith((".yaml", ".yml")):
            path = bundled_scenario(name)
        return load_scenario(path)
    except (MinderError, FileNotFoundError) as exc:
        raise _fail(exc) from None


def _publish(scenario: Any, bootstrap: str, realtime: bool) -> int:
    import time  # noqa: PLC0415

    from collectors.sim.output import iter_batches  # noqa: PLC0415
    from minder.stream.producer import BatchProducer  # noqa: PLC0415
    from minder.stream.topics import ensure_topics  # noqa: PLC0415

    settings = Settings()
    ensure_topics(bootstrap, {settings.kafka.metrics_topic: settings.kafka.partitions})
    sent = 0
    start = time.time() + 1.0 if realtime else None
    with (
        BatchProducer(bootstrap, topic=settings.kafka.metrics_topic) as producer,
        _progress() as bar,
    ):
        task = bar.add_task("publishing", total=scenario.duration_s)
        for ts, batches in iter_batches(scenario, start_ts=start):
            if realtime and ts > time.time():
                time.sleep(ts - time.time())
            for batch in batches:
                producer.send(batch)
            sent += len(batches)
            bar.advance(task)
        producer.flush()
    return sent


@app.command()
def serve() -> None:
    """Run the detection service and its HTTP API (settings from MINDER_* variables)."""
    import threading  # noqa: PLC0415

    from minder.service.stack import build_stack  # noqa: PLC0415

    settings = Settings()
    configure_logging(settings.log_level)
    try:
        stack = build_stack(settings)
    except MinderError as exc:
        raise _fail(exc) from None
    try:
        stack.start()
    except MinderError as exc:
        stack.stop()
        raise _fail(exc) from None
    err.print(f"Minder is serving on {stack.api_url} (API /api/v1, metrics /metrics); Ctrl-C stops")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        err.print("stopping")
    finally:
        stack.stop()


@app.command()
def demo(
    duration: Annotated[
        float, typer.Option("--duration", help="seconds to run before stopping by itself")
    ] = 90.0,
    scenario_file: Annotated[
        str, typer.Option("--scenario", help="scenario YAML or bundled name")
    ] = "demo",
    port: Annotated[int | None, typer.Option(help="API port (default: a free one)")] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="print a machine-readable summary at the end")
    ] = False,
) -> None:
    """Run broker, service, API and a simulated 64-machine job with an injected fault."""
    from minder.demo import run_demo  # noqa: PLC0415

    scenario = _load_scenario(scenario_file)
    faults = ", ".join(f"{f.type.value} on machine {f.machine} at +{f.start_s:g}s"
                       for f in scenario.faults)  # fmt: skip
    err.print(
        f"[bold]Minder demo[/]: {_machines(scenario)} simulated machines, 1 batch/machine/s "
        f"through an embedded Kafka broker (Tansu). Injected: {faults or 'nothing'}."
    )
    with _progress() as bar:
        task = bar.add_task("job running", total=min(duration, scenario.duration_s))

        def ready(api: str, metrics: str) -> None:
            bar.console.print(f"API: [link]{api}[/]   metrics: [link]{metrics}[/]")

        def tick(second: int, batches: int, alerts: int) -> None:
            bar.update(task, completed=second, description=f"{batches} batches, {alerts} alert(s)")

        def alert(a: Alert, url: str) -> None:
            bar.console.print(
                f"[bold red]ALERT[/] {a.kind.value} on [bold]{a.machine}[/] "
                f"{','.join(a.devices)} ({a.metric}, score {a.score:.1f}), "
                f"onset {_clock(a.first_ts)}, detected {_clock(a.detected_ts)}\n"
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
            raise _fail(exc) from None
    summary = result.to_dict()
    if json_output:
        _print_json(summary)
        return
    out.print(alerts_table(result.alerts, title="Alerts raised during the demo"))
    verdict = summary["result"]
    out.print(
        f"injected machines named: {verdict['injected_named'] or 'none'}; missed: "
        f"{verdict['injected_missed'] or 'none'}; onset→alert: {verdict['onset_to_alert_s']}; "
        f"alerts on healthy machines: {verdict['alerts_on_healthy_machines'] or 'none'}"
    )


def _register_subcommands() -> None:
    from minder.cli_agent import agent_command  # noqa: PLC0415
    from minder.cli_bench import bench_app  # noqa: PLC0415
    from minder.cli_train import train_command  # noqa: PLC0415
    from minder.cli_whatif import whatif_app  # noqa: PLC0415

    app.add_typer(whatif_app, name="whatif")
    app.add_typer(bench_app, name="bench")
    app.command(name="train")(train_command)
    app.command(name="agent")(agent_command)


_register_subcommands()


def main() -> None:
    """Console-script entry point."""
    app()
