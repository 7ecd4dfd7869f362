"""``minder import``: canonical metric tables from the systems a cluster already has.

``minder import prometheus`` reads dcgm-exporter, node_exporter and Minder agent series from a
Prometheus server (``collectors.prometheus``, docs/sources.md §8) into a metric table that
``minder detect`` and ``minder train`` take. The reader is imported only when the command runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from minder.cli.common import OutputFormat, fail, out, print_json, progress

if TYPE_CHECKING:
    import pandas as pd

    from collectors.prometheus import ReadStats

import_app = typer.Typer(
    name="import",
    help="Import canonical metric tables from other systems (Prometheus).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@import_app.callback()
def _import() -> None:
    """Import canonical metric tables from other systems (Prometheus)."""


@import_app.command("prometheus")
def prometheus_command(
    url: Annotated[
        str, typer.Option("--url", help="Prometheus base URL, e.g. http://prometheus:9090")
    ],
    start: Annotated[
        str,
        typer.Option(
            help="start: RFC 3339 (2025-01-31T12:00:00Z), unix seconds, or relative (-6h, now-1d)"
        ),
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="metric table to write (.parquet, .csv, .csv.gz)"),
    ],
    end: Annotated[str, typer.Option(help="end, in the same forms as --start")] = "now",
    step: Annotated[
        str, typer.Option(help="sampling interval of the table: set it to the scrape interval")
    ] = "15s",
    match: Annotated[
        list[str] | None,
        typer.Option(
            "--match",
            help="PromQL label matchers added to every selector, e.g. '{cluster=\"a\"}' "
            "(repeatable; all apply)",
        ),
    ] = None,
    job_label: Annotated[
        list[str] | None,
        typer.Option(
            "--job-label",
            help="label naming the job, first present wins (repeatable; 'a+b' joins two); "
            "default: slurm_job_id, job_id, SLURM_JOB_ID, hpc_job",
        ),
    ] = None,
    machine_label: Annotated[
        list[str] | None,
        typer.Option(
            "--machine-label",
            help="label naming the machine, first present wins (repeatable); default: machine, "
            "Hostname, hostname, node, instance (port stripped)",
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(help="job of series whose machine carries no job label at all"),
    ] = None,
    rate_window: Annotated[
        str | None, typer.Option(help="range of rate() for counters (default: twice the step)")
    ] = None,
    timeout: Annotated[str, typer.Option(help="timeout of each HTTP request")] = "30s",
    bearer_token: Annotated[
        str | None,
        typer.Option(
            envvar="MINDER_PROMETHEUS__BEARER_TOKEN",
            help="bearer token for a Prometheus behind authentication",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="summary as a table or json")
    ] = OutputFormat.table,
) -> None:
    """Read dcgm-exporter, node_exporter and Minder agent series from Prometheus into a
    canonical metric table (docs/sources.md §8).

    Counters become rates (or counts per step) on the server; gauges are the last scrape in
    each step. Long ranges are read in chunks; a chunk Prometheus finds too big is halved. An
    unreachable server, a refused query or partial data stops the import without writing the
    table.
    """
    from collectors.prometheus import (  # noqa: PLC0415
        PrometheusReader,
        parse_duration,
        parse_time,
    )
    from minder.core.errors import MinderError  # noqa: PLC0415
    from minder.core.table import table_format  # noqa: PLC0415

    try:
        table_format(output)
        now = datetime.now(UTC).timestamp()
        first, last = parse_time(start, now), parse_time(end, now)
        reader = PrometheusReader(
            url,
            step_s=parse_duration(step),
            matchers=match or (),
            job_labels=job_label or None,
            machine_labels=machine_label or None,
            default_job=job,
            rate_window_s=parse_duration(rate_window) if rate_window else None,
            timeout_s=parse_duration(timeout),
            bearer_token=bearer_token,
        )
    except MinderError as exc:
        raise fail(exc) from None
    with reader:
        try:
            first, last = reader.grid(first, last)
            with progress() as bar:
                task = bar.add_task("reading Prometheus", total=None)

                def report(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                result = reader.read(first, last, progress=report)
        except MinderError as exc:
            raise fail(exc) from None
    frame = result.frame
    if frame.empty:
        raise fail(
            f"no sample of a known metric in {url} between {_iso(first)} and {_iso(last)}"
            f"{' matching ' + ', '.join(match) if match else ''}: expected dcgm-exporter "
            "(DCGM_FI_*), node_exporter (node_*) or Minder agent (minder_node_*) series with a "
            f"machine label; {_skipped_hint(result.stats)}nothing written"
        )
    from minder.core.table import write_table_atomically  # noqa: PLC0415

    try:
        write_table_atomically(frame, output)
    except (MinderError, OSError) as exc:
        raise fail(exc) from None
    summary = _summary(frame, result.stats, output, first, last, reader.step_s)
    if output_format is OutputFormat.json:
        print_json(summary)
        return
    _print_summary(summary)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _skipped_hint(stats: ReadStats) -> str:
    reasons = sorted({reason for reason, _name in stats.skipped_series})
    reasons += sorted({reason for reason, _metric in stats.dropped_samples})
    if not reasons:
        return ""
    return f"series were left out ({', '.join(reasons)}: see --job-label, --machine-label, --job); "


def _summary(
    frame: pd.DataFrame, stats: ReadStats, output: Path, first: float, last: float, step: float
) -> dict[str, Any]:
    per_metric = frame["metric"].value_counts()
    return {
        "output": str(output),
        "start": _iso(first),
        "end": _iso(last),
        "step_s": step,
        "rows": len(frame),
        "jobs": sorted(str(j) for j in frame["job"].unique()),
        "machines": int(frame["machine"].nunique()),
        "metrics": {str(k): int(v) for k, v in sorted(per_metric.items()) if v},
        **stats.as_dict(),
    }


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"Imported {escape(summary['output'])}")
    table.add_column("metric")
    table.add_column("rows", justify="right")
    for metric, rows in summary["metrics"].items():
        table.add_row(metric, str(rows))
    out.print(table)
    jobs = ", ".join(escape(j[:60]) for j in summary["jobs"][:10])
    more = f" and {len(summary['jobs']) - 10} more" if len(summary["jobs"]) > 10 else ""
    out.print(
        f"{summary['rows']} rows, {summary['machines']} machine(s), job(s) {jobs}{more}, "
        f"{summary['start']} .. {summary['end']} every {summary['step_s']:g} s "
        f"({summary['queries']} queries, {summary['splits']} chunk(s) split)"
    )
    unknown = summary["unknown_series"]
    if unknown:
        listed = ", ".join(f"{escape(name[:80])} ({count})" for name, count in unknown.items())
        out.print(f"series that map to no canonical metric (ignored): {listed}")
    for key, label in (
        ("skipped_series", "series left out"),
        ("dropped_samples", "samples left out"),
    ):
        for reason, counts in summary[key].items():
            listed = ", ".join(f"{escape(name[:80])} ({count})" for name, count in counts.items())
            out.print(f"{label}, {reason}: {listed}")
