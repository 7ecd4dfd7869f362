"""``minder labels``: turn the verdicts on alerts into the labels ``minder train`` reads.

``labels export`` fetches the reviewed alerts from the service's API (an operator's verdict:
resolved, false positive; a self-check's: confirmed, cleared by self-check) and writes them with
:func:`detectors.alert_labels.export_labels`, whose docstring says which rows each alert gives
and why the false positives go to a file of their own.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from minder.cli.api_options import (
    ApiUrlOption,
    FormatOption,
    TimeoutOption,
    TokenOption,
    connect,
    parse_time,
)
from minder.cli.common import OutputFormat, err, fail, out, print_json, progress
from minder.client.api import (
    DEFAULT_API_URL,
    DEFAULT_TIMEOUT_S,
)

labels_app = typer.Typer(
    name="labels",
    help="Training labels from operators' verdicts on alerts (for minder train --labels).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@labels_app.callback()
def _labels() -> None:
    """Training labels from operators' verdicts on alerts (for minder train --labels)."""


class LabelEnd(StrEnum):
    """Where a confirmed fault's label ends: ``detectors.alert_labels.LabelEnd`` written out, so
    that --help need not import it (tests/minder/cli/test_cli_imports.py checks that they agree)."""

    resolved = "resolved"
    """When the verdict was given: the operator resolved the alert, or a self-check confirmed
    it (its ``updated_at``, wall time)."""
    last_seen = "last-seen"
    """The latest report of the fault (``last_seen_ts``, data time)."""


@labels_app.command("export")
def export_command(
    output: Annotated[
        Path,
        typer.Option("--out", "-o", help="labels file to write: .csv[.gz] (default) or .parquet"),
    ],
    job: Annotated[str | None, typer.Option(help="only this job")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="alerts detected at or after: unix s, ISO 8601 (UTC) or ago (7d)"),
    ] = None,
    until: Annotated[str | None, typer.Option(help="alerts detected before (as --since)")] = None,
    end: Annotated[
        LabelEnd,
        typer.Option(
            help="a fault's end_ts: when it was resolved or confirmed (live data), or its last "
            "report (data replayed later, whose timestamps are not wall time)"
        ),
    ] = LabelEnd.resolved,
    false_positives: Annotated[
        Path | None,
        typer.Option(
            "--false-positives",
            help="where the false positives go (not training rows)",
            show_default="<out>.false_positives.<ext>",
        ),
    ] = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Write the labels `minder train --labels` reads from reviewed alerts.

    Confirmed faults (alerts resolved by an operator, or confirmed by a failed self-check): one
    row each (per machine of a domain alert).

    False positives (marked so by an operator, or cleared by a passed self-check) go to a file
    beside it: training takes every --labels row as a fault.
    """
    from detectors import alert_labels  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    try:  # refused before anything is fetched
        fp_path, _, _ = alert_labels.check_destinations(output, false_positives)
    except MinderError as exc:
        raise fail(exc) from None
    filters: dict[str, Any] = {
        "job": job,
        "statuses": list(alert_labels.REVIEWED_STATUSES),
        "since": None if since is None else parse_time(since, "--since"),
        "until": None if until is None else parse_time(until, "--until"),
    }
    with connect(api, token, timeout) as client, progress() as bar:
        task = bar.add_task("fetching reviewed alerts", total=None)
        alerts = list(
            client.iter_alerts(
                on_page=lambda done, total: bar.update(task, completed=done, total=total),
                **filters,
            )
        )
    try:
        done = alert_labels.export_labels(alerts, output, fp_path, alert_labels.LabelEnd(end.value))
    except MinderError as exc:
        raise fail(exc) from None
    if done.resolved_long_after:
        err.print(
            f"warning: {done.resolved_long_after} confirmed fault(s) were resolved more than a "
            "day after their last report, so their labels span that long (data replayed "
            "later?); --end last-seen ends them at the last report",
            soft_wrap=True,
        )
    if output_format is OutputFormat.json:
        print_json(done.summary())
        return
    out.print(
        f"wrote {done.rows} label row(s) to {escape(str(output))}: "
        f"{done.confirmed_faults} confirmed fault(s) ({done.confirmed_by_selfcheck} by a "
        "self-check, the others resolved by an operator)",
        soft_wrap=True,
    )
    out.print(
        f"wrote {done.false_positive_rows} row(s) to {escape(str(fp_path))}: "
        f"{done.false_positives} false positive(s) ({done.cleared_by_selfcheck} cleared by a "
        "self-check; not training rows: minder train takes every --labels row as a fault)",
        soft_wrap=True,
    )
