"""``minder labels``: turn operators' verdicts on alerts into the labels ``minder train`` reads.

A *resolved* alert is a confirmed fault; a *false-positive* one marks a healthy machine.

``minder train --labels`` (``detectors.training``) takes every row of its labels file as a fault
of ``machine`` in ``job`` from ``start_ts`` to ``end_ts``: there is no value of ``fault`` it treats
as "no fault" (``fault`` is only a name, listed in the model's info), and time no row covers is
normal data. So a false positive cannot be a row of that file without teaching the model the
opposite of the operator's verdict. ``labels export`` therefore writes:

* the labels file (``-o``): one row per confirmed fault, columns ``job, machine, start_ts,
  end_ts, fault`` and, after them, columns training ignores (``device, domain, alert_id, kind,
  metric, score, status, detected_ts, resolved_at``);
* the false positives beside it (``--false-positives``, by default ``<name>.false_positives
  <ext>``), in the same columns with ``status`` ``false_positive``: not training input today
  (their time stays normal data), kept for evaluation and for a trainer that learns from them.

``fault`` names the fault as ``minder simulate --labels`` does where the alert says it
(:data:`RULE_FAULTS`, silence → ``machine_unreachable``, hang → ``hang``), else
``<kind>:<metric>`` (e.g. ``similarity:gpu_power_w``). A domain alert (``machine`` is the
domain, ``evidence.domain_members`` its machines) gives one row per member machine, as simulated
labels do for a switch reboot, because training matches labels to machines by name. An alert
that names no machine (a job-level ``hang`` alert) gives none.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from minder.cli.api_client import (
    DEFAULT_API_URL,
    DEFAULT_TIMEOUT_S,
    ApiUrlOption,
    FormatOption,
    TimeoutOption,
    TokenOption,
    connect,
    parse_time,
)
from minder.cli.common import OutputFormat, err, fail, out, print_json, progress

if TYPE_CHECKING:
    import pandas as pd

    from minder.cli.api_client import AlertOut

labels_app = typer.Typer(
    name="labels",
    help="Training labels from operators' verdicts on alerts (for minder train --labels).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

TRAIN_COLUMNS = ("job", "machine", "start_ts", "end_ts", "fault")
"""What ``minder train --labels`` requires (``detectors.training.LABEL_COLUMNS``)."""
EXTRA_COLUMNS = (
    "device",
    "domain",
    "alert_id",
    "kind",
    "metric",
    "score",
    "status",
    "detected_ts",
    "resolved_at",
)
"""Written after :data:`TRAIN_COLUMNS`; training ignores them."""
COLUMNS = TRAIN_COLUMNS + EXTRA_COLUMNS
FLOAT_COLUMNS = ("start_ts", "end_ts", "score", "detected_ts", "resolved_at")

LONG_LABEL_S = 86_400.0
"""A fault label longer than this after its last report is worth a warning (see ``--end``)."""

RESOLVED = "resolved"
FALSE_POSITIVE = "false_positive"

RULE_FAULTS: dict[str, str] = {
    "gpu_xid_count": "gpu_xid",
    "gpu_ecc_dbe_count": "ecc_error",
    "gpu_lost": "gpu_lost",
    "rdma_port_up": "nic_down",
    "rdma_link_downed_count": "nic_down",
    "gpu_pcie_link_width": "pcie_downgrade",
    "gpu_pcie_link_gen": "pcie_downgrade",
    "gpu_nvlink_error_count": "nvlink_error",
    "rdma_symbol_error_count": "aoc_error",
}
"""Rule metrics that name the fault, as the simulator's fault types (``collectors.sim.kinds``)."""


@labels_app.callback()
def _labels() -> None:
    """Training labels from operators' verdicts on alerts (for minder train --labels)."""


class LabelEnd(StrEnum):
    """Where a confirmed fault's label ends."""

    resolved = "resolved"
    """When the operator resolved the alert (its ``updated_at``, wall time)."""
    last_seen = "last-seen"
    """The latest report of the fault (``last_seen_ts``, data time)."""


def fault_name(alert: AlertOut) -> str:
    """The ``fault`` of an alert's label: a fault type where the alert names one, else
    ``<kind>:<metric>``."""
    if alert["kind"] == "rule" and alert["metric"] in RULE_FAULTS:
        return RULE_FAULTS[alert["metric"]]
    if alert["kind"] == "silence":
        return "machine_unreachable"
    if alert["kind"] == "hang":
        return "hang"
    return f"{alert['kind']}:{alert['metric']}"


def label_rows(alert: AlertOut, end: LabelEnd) -> list[dict[str, Any]]:
    """The label rows of one reviewed alert (one per member machine of a domain alert).

    ``end_ts`` is never before ``start_ts`` nor before the fault's last report. A
    ``suspicious_source`` alert has none: it says a report came from outside its job, not that
    the machine was faulty; nor has an alert that names no machine (the job-level ``hang``
    alert: the machines its hang waited on have alerts, and rows, of their own).
    """
    if alert["kind"] == "suspicious_source" or not alert["machine"]:
        return []
    start = float(alert["first_ts"])
    last_seen = max(float(alert["last_seen_ts"]), start)
    end_ts = max(float(alert["updated_at"]), last_seen) if end is LabelEnd.resolved else last_seen
    members = alert["evidence"].get("domain_members") if alert["domain"] else None
    machines = (
        [str(m) for m in members]
        if isinstance(members, list) and members and alert["machine"] == alert["domain"]
        else [alert["machine"]]
    )
    return [
        {
            "job": alert["job"],
            "machine": machine,
            "start_ts": start,
            "end_ts": end_ts,
            "fault": fault_name(alert),
            "device": ",".join(alert["devices"]),
            "domain": alert["domain"],
            "alert_id": alert["id"],
            "kind": alert["kind"],
            "metric": alert["metric"],
            "score": float(alert["score"]),
            "status": alert["status"],
            "detected_ts": float(alert["detected_ts"]),
            "resolved_at": float(alert["updated_at"]),
        }
        for machine in machines
    ]


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd  # noqa: PLC0415

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame = frame.astype({c: "float64" for c in FLOAT_COLUMNS})
    frame = frame.astype({c: "str" for c in COLUMNS if c not in FLOAT_COLUMNS})
    return frame.sort_values(["job", "start_ts", "machine"], kind="stable").reset_index(drop=True)


def _write(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, float_format="%.3f")


def sidecar_path(path: Path) -> Path:
    """``labels.csv`` → ``labels.false_positives.csv`` (``.csv.gz`` and ``.parquet`` alike)."""
    name = path.name
    for suffix in (".csv.gz", ".csv", ".parquet", ".pq"):
        if name.lower().endswith(suffix):
            stem = name[: -len(suffix)]
            return path.with_name(f"{stem}.false_positives{name[len(stem) :]}")
    return path.with_name(f"{name}.false_positives")


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
            help="a fault's end_ts: when it was resolved (live data), or its last report "
            "(data replayed later, whose timestamps are not wall time)"
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

    Resolved alerts are confirmed faults: one row each (per machine of a domain alert).

    False positives go to a file beside it: training takes every --labels row as a fault.
    """
    from minder.core.errors import TableError  # noqa: PLC0415
    from minder.core.table import table_format  # noqa: PLC0415

    fp_path = false_positives or sidecar_path(output)
    try:
        fmt, fp_fmt = table_format(output), table_format(fp_path)
    except TableError as exc:
        raise fail(exc) from None
    if fp_path.resolve() == output.resolve():
        raise fail(f"--false-positives {str(fp_path)!r} is the labels file: give another path")
    filters: dict[str, Any] = {
        "job": job,
        "statuses": [RESOLVED, FALSE_POSITIVE],
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
    faults = [a for a in alerts if a["status"] == RESOLVED]
    wrong = [a for a in alerts if a["status"] == FALSE_POSITIVE]
    fault_rows = [row for a in faults for row in label_rows(a, end)]
    fp_rows = [row for a in wrong for row in label_rows(a, LabelEnd.last_seen)]
    try:
        _write(_frame(fault_rows), output, fmt)
        _write(_frame(fp_rows), fp_path, fp_fmt)
    except (OSError, ValueError, ImportError) as exc:
        raise fail(f"cannot write the labels: {exc}") from None
    long_after = {
        a["id"]
        for a in faults
        if a["updated_at"] - max(a["last_seen_ts"], a["first_ts"]) > LONG_LABEL_S
    }
    if end is LabelEnd.resolved and long_after:
        err.print(
            f"warning: {len(long_after)} confirmed fault(s) were resolved more than a day after "
            "their last report, so their labels span that long (data replayed later?); "
            "--end last-seen ends them at the last report",
            soft_wrap=True,
        )
    summary = {
        "labels": str(output),
        "false_positives_file": str(fp_path),
        "rows": len(fault_rows),
        "confirmed_faults": len(faults),
        "false_positives": len(wrong),
        "false_positive_rows": len(fp_rows),
        "faults": sorted({row["fault"] for row in fault_rows}),
    }
    if output_format is OutputFormat.json:
        print_json(summary)
        return
    out.print(
        f"wrote {len(fault_rows)} label row(s) to {escape(str(output))}: "
        f"{len(faults)} confirmed fault(s) (resolved alerts)",
        soft_wrap=True,
    )
    out.print(
        f"wrote {len(fp_rows)} row(s) to {escape(str(fp_path))}: {len(wrong)} false positive(s) "
        "(not training rows: minder train takes every --labels row as a fault)",
        soft_wrap=True,
    )
