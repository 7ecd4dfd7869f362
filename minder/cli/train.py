"""``minder train``: fit the per-metric denoisers and the priority tree into a model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from minder.cli.common import (
    OutputFormat,
    fail,
    job_reporter,
    load_settings,
    out,
    print_json,
    progress,
)
from minder.core.errors import MinderError


def train_command(
    table_file: Annotated[Path, typer.Argument(help="canonical metric table (.parquet/.csv[.gz])")],
    labels_file: Annotated[
        Path,
        typer.Option("--labels", help="CSV (or Parquet) of job, machine, start_ts, end_ts, fault"),
    ],
    output: Annotated[Path, typer.Option("--out", "-o", help="model directory to write")],
    denoiser: Annotated[
        str, typer.Option(help="mean, median, ewma, raw, pca or lstm_vae (needs minder[deep])")
    ] = "mean",
    step_s: Annotated[int, typer.Option(min=1, help="seconds between sampled windows")] = 4,
    max_windows: Annotated[int, typer.Option(min=100, help="normal windows per metric")] = 20_000,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table or json")
    ] = OutputFormat.table,
) -> None:
    """Train a detector model (denoisers, metric priorities) from a labelled metric table.

    `minder detect --model DIR` and the service (MINDER_DETECTION__MODEL_DIR) load it.
    """
    import pandas as pd  # noqa: PLC0415

    from detectors.training import train_model  # noqa: PLC0415
    from minder.core.table import read_table, table_format  # noqa: PLC0415

    settings = load_settings()
    try:
        cfg = settings.detection.detector_config()
        frame = read_table(table_file)
        if not labels_file.exists():
            raise FileNotFoundError(f"labels file {str(labels_file)!r} does not exist")
        labels = (
            pd.read_parquet(labels_file)
            if table_format(labels_file) == "parquet"
            else pd.read_csv(labels_file)
        )
    except (MinderError, FileNotFoundError, ValueError) as exc:
        raise fail(exc) from None
    with progress() as bar:
        try:
            model = train_model(
                frame,
                labels,
                denoiser=denoiser,
                config=cfg,
                step_s=step_s,
                max_windows=max_windows,
                progress=job_reporter(bar),
            )
        except (MinderError, ValueError) as exc:
            raise fail(exc) from None
    model.save(output)
    order = model.priority.order if model.priority is not None else []
    if output_format is OutputFormat.json:
        print_json(
            {
                "model": str(output),
                "denoiser": model.denoiser,
                "metrics": sorted(model.denoisers),
                "priority": order,
                "info": model.info,
            }
        )
        return
    table = Table(title=f"Model {output} ({model.denoiser} denoisers)")
    table.add_column("priority", justify="right")
    table.add_column("metric")
    table.add_column("importance", justify="right")
    importances = model.priority.importances if model.priority is not None else {}
    for rank, metric in enumerate(order, start=1):
        table.add_row(str(rank), metric, f"{importances.get(metric, 0.0):.3f}")
    out.print(table)
    out.print(
        f"{len(model.denoisers)} metric denoiser(s), trained in {model.info['train_seconds']} s "
        f"on {model.info['rows']} rows and {model.info['labels']} label row(s)."
    )
