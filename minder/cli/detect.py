"""``minder detect``: offline detection over a canonical metric table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from minder.cli.common import (
    OutputFormat,
    alerts_table,
    fail,
    job_reporter,
    load_settings,
    out,
    print_json,
    progress,
)


def detect_command(
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
    """Detect faulty machines in a canonical metric table (docs/architecture.md §3.3)."""
    from detectors.offline import detect_table  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415
    from minder.core.table import read_table  # noqa: PLC0415

    settings = load_settings()
    try:
        factory = settings.detection.detector_factory(method, model)
        frame = read_table(table_file)
    except (MinderError, ValueError, FileNotFoundError) as exc:
        raise fail(exc) from None
    with progress() as bar:
        run = detect_table(frame, factory, progress=job_reporter(bar))
    if output_format is OutputFormat.json:
        print_json({"alerts": [a.summary() for a in run.alerts], "summary": run.summary()})
        return
    out.print(alerts_table(run.alerts, title=f"Alerts in {table_file}"))
    machines = {a.machine for a in run.alerts}
    out.print(f"{len(run.alerts)} alert(s) on {len(machines)} machine(s)/domain(s).")
