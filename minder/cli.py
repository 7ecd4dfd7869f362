"""The ``minder`` command line."""

from __future__ import annotations

import json
import logging
import sys
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
) -> None:
    """Detect faulty machines in a canonical metric table (DESIGN.md §3.3)."""
    from detectors.base import default_factory  # noqa: PLC0415
    from detectors.offline import detect_table  # noqa: PLC0415
    from minder.core.table import read_table  # noqa: PLC0415

    settings = Settings()
    try:
        frame = read_table(table_file)
    except (MinderError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    cfg = settings.detection.detector_config()
    tasks: dict[str, TaskID] = {}
    with _progress() as progress:

        def report(job: str, done: int, total: int) -> None:
            if job not in tasks:
                tasks[job] = progress.add_task(f"job {job}", total=total)
            progress.update(tasks[job], completed=done)

        run = detect_table(frame, default_factory(cfg), progress=report)
    if output_format is OutputFormat.json:
        _print_json({"alerts": [a.summary() for a in run.alerts], "summary": run.summary()})
        return
    out.print(alerts_table(run.alerts, title=f"Alerts in {table_file}"))
    machines = {a.machine for a in run.alerts}
    out.print(f"{len(run.alerts)} alert(s) on {len(machines)} machine(s)/domain(s).")


def main() -> None:
    """Console-script entry point."""
    app()
