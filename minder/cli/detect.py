"""``minder detect``: offline detection over a canonical metric table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

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

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from detectors.offline import DetectionRun

_STAGES = {"scan": "scanning", "read": "replaying"}


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
    """Detect faulty machines in a canonical metric table (docs/architecture.md §3.3).

    The table is read in pieces and replayed in time order with bounded memory, whatever its
    size or row order; rows out of time order and repeated samples are counted in the summary.
    """
    from detectors.offline import detect_file  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    settings = load_settings()
    try:
        factory = settings.detection.detector_factory(method, model)
        with progress() as bar:
            run = detect_file(
                table_file,
                factory,
                progress=job_reporter(bar),
                reading=_read_reporter(bar, table_file),
            )
    except (MinderError, ValueError, OSError) as exc:
        raise fail(exc) from None
    if output_format is OutputFormat.json:
        print_json({"alerts": [a.summary() for a in run.alerts], "summary": run.summary()})
        return
    out.print(alerts_table(run.alerts, title=f"Alerts in {table_file}"))
    machines = {a.machine for a in run.alerts}
    out.print(f"{len(run.alerts)} alert(s) on {len(machines)} machine(s)/domain(s).")
    out.print(_input_line(run))
    intervals = sorted({int(job.get("interval_s", 1)) for job in run.jobs.values()})
    if intervals:
        out.print(f"Sampling interval followed: {', '.join(f'{i} s' for i in intervals)}.")
    for finding in run.findings:
        out.print(
            f"Job finding: job {escape(str(finding['job']))}: {escape(finding_line(finding))}"
        )
    for change in run.membership:
        names = ", ".join(change.machines[:6]) + (" …" if len(change.machines) > 6 else "")
        out.print(
            f"Membership (not a fault): job {escape(change.job)} {change.change.replace('_', ' ')}"
            f" {escape(names) or '(job-wide)'} at {change.ts:.0f}"
            + (f" — {escape(change.reason)}" if change.reason else "")
        )


def finding_line(finding: dict[str, object]) -> str:
    """One line on a job-level finding (``DetectionRun.findings``)."""
    if finding.get("finding") == "not_peer_comparable":
        return (
            f"machines are not alike on {finding['metric']} (coherence {finding['coherence']}: "
            f"{finding['outliers']} outlier events among {finding['machines']} machines, at "
            f"most {finding['allowance']} for peers) from {float(str(finding['since_ts'])):.0f}"
            + (f" to {float(str(finding['until_ts'])):.0f}" if "until_ts" in finding else "")
            + "; no similarity alerts on it meanwhile"
        )
    if finding.get("finding") == "too_few_machines":
        return (
            f"{finding['machines']} machine(s): no peers to compare, only the hard-fault rules run"
        )
    return str(finding.get("detail", finding.get("finding")))


def _input_line(run: DetectionRun) -> str:
    """One line on the rows read and the bad ones: nothing is dropped without a count."""
    n = run.input_counts()
    return (
        f"Input: {n['samples']:,} row(s); {n['out_of_order']:,} out of time order "
        f"({n['backwards']:,} by the detector's horizon or more), replayed in time order; "
        f"{n['duplicates']:,} repeated sample(s) (the later row wins); "
        f"{n['too_old']:,} too old for the window."
    )


def _read_reporter(bar: Progress, table_file: Path) -> Callable[[str, int, int | None], None]:
    """``reading(stage, rows_done, rows_total)`` that keeps one bar per pass over the file."""
    tasks: dict[str, TaskID] = {}

    def report(stage: str, done: int, total: int | None) -> None:
        if stage not in tasks:
            label = f"{_STAGES.get(stage, stage)} {escape(table_file.name)}"
            tasks[stage] = bar.add_task(label, total=total)
        bar.update(tasks[stage], completed=done)

    return report
