"""``minder alerts``: list, inspect and review the alerts stored by the service, over its API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.api_options import (
    ApiUrlOption,
    FormatOption,
    TimeoutOption,
    TokenOption,
    connect,
    parse_time,
    short_json,
    when,
)
from minder.cli.common import OutputFormat, clock, fail, out, print_json, progress
from minder.client.api import (
    DEFAULT_API_URL,
    DEFAULT_TIMEOUT_S,
    MAX_PAGE,
    ApiConflictError,
    one_line,
)
from minder.core.alert import AlertKind, AlertStatus

if TYPE_CHECKING:
    from minder.client.api import AlertOut, AuditOut, DeliveryOut, MinderApi, SelfCheckOut

alerts_app = typer.Typer(
    name="alerts",
    help="List, inspect and review the service's alerts (over its HTTP API).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

STATUS_STYLE = {
    "open": "bold red",
    "acknowledged": "yellow",
    "resolved": "green",
    "false_positive": "dim",
    "confirmed": "bold magenta",
    "cleared_by_selfcheck": "green",
}
SHOWN_EVIDENCE = 20
"""Evidence keys ``alerts show`` prints (the JSON output has them all)."""
SHOWN_SELFCHECKS = 100
"""Self-checks of one alert ``alerts show`` fetches (newest first)."""
CHECK_STYLE = {
    "pass": "green",
    "passed": "green",
    "fail": "bold red",
    "failed": "bold red",
    "error": "yellow",
    "inconclusive": "yellow",
    "timed_out": "yellow",
    "skipped": "dim",
    "cancelled": "dim",
}
"""Colours of self-check states, verdicts and check statuses."""

ByOption = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar=["USER", "USERNAME"],
        help="who decides (kept with the change)",
        show_default="$USER",
    ),
]


def _status(value: str) -> str:
    style = STATUS_STYLE.get(value)
    return f"[{style}]{escape(value)}[/]" if style else escape(value)


def _alerts_table(alerts: list[AlertOut], title: str) -> Table:
    table = Table(title=title)
    for column in ("id", "job", "machine", "kind", "metric", "devices", "score", "status"):
        table.add_column(column, justify="right" if column == "score" else "left")
    table.add_column("onset (UTC)")
    table.add_column("detected")
    for a in alerts:
        table.add_row(
            escape(a["id"]),
            escape(a["job"]),
            escape(a["machine"]),
            escape(a["kind"]),
            escape(a["metric"]),
            escape(",".join(a["devices"])) or "-",
            f"{a['score']:.2f}",
            _status(a["status"]),
            when(a["first_ts"]),
            f"{clock(a['detected_ts'])} (+{a['detected_ts'] - a['first_ts']:.0f}s)",
        )
    return table


@alerts_app.command("list")
def list_command(
    job: Annotated[str | None, typer.Option(help="only this job")] = None,
    machine: Annotated[str | None, typer.Option(help="only this machine (or domain)")] = None,
    kind: Annotated[
        list[AlertKind] | None, typer.Option("--kind", help="repeat for several")
    ] = None,
    status: Annotated[
        list[AlertStatus] | None, typer.Option("--status", help="repeat for several")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="detected at or after: unix s, ISO 8601 (UTC) or ago (30m, 2h, 7d)"),
    ] = None,
    until: Annotated[str | None, typer.Option(help="detected before (as --since)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="alerts per page")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="skip this many (newest first)")] = 0,
    all_pages: Annotated[
        bool, typer.Option("--all", help="page through every matching alert")
    ] = False,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Alerts matching every filter, newest detected first."""
    filters: dict[str, Any] = {
        "job": job,
        "machine": machine,
        "kinds": [k.value for k in kind or ()],
        "statuses": [s.value for s in status or ()],
        "since": None if since is None else parse_time(since, "--since"),
        "until": None if until is None else parse_time(until, "--until"),
    }
    with connect(api, token, timeout) as client:
        if all_pages:
            items, total = _all_alerts(client, filters, offset=offset)
            page_limit, page_offset = len(items), offset
        else:
            page = client.alerts(limit=limit, offset=offset, **filters)
            items, total, page_limit, page_offset = (
                page["items"],
                page["total"],
                page["limit"],
                page["offset"],
            )
    if output_format is OutputFormat.json:
        print_json({"items": items, "total": total, "limit": page_limit, "offset": page_offset})
        return
    out.print(_alerts_table(items, "Alerts"))
    shown = f"{len(items)} of {total} alert(s)"
    if page_offset + len(items) < total:
        shown += f" (--offset {page_offset + len(items)} or --all for more)"
    out.print(shown)


def _all_alerts(
    client: MinderApi, filters: dict[str, Any], *, offset: int
) -> tuple[list[AlertOut], int]:
    total = 0
    with progress() as bar:
        task = bar.add_task("fetching alerts", total=None)

        def report(fetched: int, expected: int) -> None:
            nonlocal total
            total = expected + offset
            bar.update(task, completed=fetched, total=expected)

        items = list(client.iter_alerts(offset=offset, on_page=report, **filters))
    return items, total


@alerts_app.command("show")
def show_command(
    alert_id: Annotated[str, typer.Argument(metavar="ID", help="the alert's id")],
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """One alert: its fields, evidence, deliveries (outbox), scheduler actions and the
    self-checks of its drained node (with the latest report's checks)."""
    with connect(api, token, timeout) as client:
        alert = client.alert(alert_id)
        deliveries = client.deliveries(alert_id=alert["id"], limit=100)
        actions = client.actions(alert_id=alert["id"], limit=100)
        checks = client.selfchecks(alert_id=alert["id"], limit=SHOWN_SELFCHECKS)
    if output_format is OutputFormat.json:
        print_json(
            {
                "alert": alert,
                "deliveries": deliveries["items"],
                "deliveries_total": deliveries["total"],
                "actions": actions["items"],
                "actions_total": actions["total"],
                "selfchecks": checks["items"],
                "selfchecks_total": checks["total"],
            }
        )
        return
    out.print(_details(alert))
    out.print(_evidence(alert["evidence"]))
    out.print(_deliveries_table(deliveries["items"], deliveries["total"]))
    out.print(_actions_table(actions["items"], actions["total"]))
    out.print(_selfchecks_table(checks["items"], checks["total"]))
    reported = [c for c in checks["items"] if c["report"] is not None]
    if reported:
        out.print(_report_table(reported[0]))


def _details(a: AlertOut) -> Table:
    table = Table(title=f"Alert {escape(a['id'])}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("status", _status(a["status"])),
        ("job", escape(a["job"])),
        ("machine", escape(a["machine"])),
        ("domain", escape(a["domain"]) or "-"),
        ("devices", escape(", ".join(a["devices"])) or "-"),
        ("kind", escape(a["kind"])),
        ("metric", escape(a["metric"])),
        ("score", f"{a['score']:.3f}"),
        ("onset", f"{when(a['first_ts'])} UTC"),
        ("detected", f"{when(a['detected_ts'])} UTC (+{a['detected_ts'] - a['first_ts']:.0f}s)"),
        ("last seen", f"{when(a['last_seen_ts'])} UTC ({a['occurrences']} report(s))"),
        ("stored", f"{when(a['created_at'])} UTC"),
        ("changed", f"{when(a['updated_at'])} UTC"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    return table


def _evidence(evidence: dict[str, Any]) -> Table:
    table = Table(title="Evidence", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key in sorted(evidence)[:SHOWN_EVIDENCE]:
        table.add_row(escape(one_line(key, 40)), escape(short_json(evidence[key])))
    if len(evidence) > SHOWN_EVIDENCE:
        table.add_row("…", f"{len(evidence) - SHOWN_EVIDENCE} more (--format json)")
    if not evidence:
        table.add_row("-", "none")
    return table


def _deliveries_table(rows: list[DeliveryOut], total: int) -> Table:
    table = Table(title=f"Deliveries ({total})")
    for column in ("destination", "event", "status", "attempts", "created", "delivered", "error"):
        table.add_column(column, justify="right" if column == "attempts" else "left")
    for d in rows:
        table.add_row(
            escape(d["destination"]),
            escape(d["event"]),
            escape(d["status"]),
            str(d["attempts"]),
            when(d["created_at"]),
            when(d["delivered_at"]),
            escape(one_line(d["last_error"] or "", 60)) or "-",
        )
    return table


def _actions_table(rows: list[AuditOut], total: int) -> Table:
    table = Table(title=f"Scheduler actions ({total})")
    for column in ("when", "target", "operation", "node", "mode", "outcome", "detail"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            when(r["created_at"]),
            escape(r["target"]),
            escape(r["operation"]),
            escape(r["node"] or "-"),
            escape(r["mode"]),
            escape(r["outcome"]),
            escape(one_line(r["detail"], 60)),
        )
    return table


def _styled(value: str | None) -> str:
    if value is None:
        return "-"
    style = CHECK_STYLE.get(value)
    return f"[{style}]{escape(value)}[/]" if style else escape(value)


def _selfchecks_table(rows: list[SelfCheckOut], total: int) -> Table:
    table = Table(title=f"Self-checks ({total})")
    for column in ("id", "attempt", "state", "verdict", "reason", "partners"):
        table.add_column(column, justify="right" if column == "attempt" else "left")
    for column in ("decided", "started", "finished", "returned"):
        table.add_column(column)
    for c in rows:
        report = c["report"]
        reason = report["reason"] if report is not None else c["detail"]
        table.add_row(
            escape(c["id"]),
            str(c["attempt"]),
            _styled(c["state"]),
            _styled(c["verdict"]),
            escape(one_line(reason, 60)) or "-",
            escape(one_line(",".join(c["partners"]), 40)) or "-",
            when(c["created_ts"]),
            when(c["started_ts"]),
            when(c["finished_ts"]),
            when(c["returned_ts"]),
        )
    if not rows:
        table.add_row("-", "", "none", "", "no self-check of this alert's node", "", "", "", "", "")
    return table


def _report_table(check: SelfCheckOut) -> Table:
    """The checks of a self-check's report: what each measured, and why one failed."""
    report = check["report"]
    assert report is not None
    table = Table(
        title=f"Self-check {escape(check['id'])} on {escape(report['node'])}: "
        f"{_styled(report['verdict'])}"
    )
    for column in ("check", "status", "summary", "took"):
        table.add_column(column, justify="right" if column == "took" else "left")
    for result in report["checks"]:
        table.add_row(
            escape(result["name"]),
            _styled(result["status"]),
            escape(one_line(result["summary"], 100)) or "-",
            f"{result['duration_s']:.1f}s",
        )
    return table


def _change(
    alert_id: str,
    status: AlertStatus,
    by: str | None,
    api: str,
    token: str | None,
    timeout: float,
    output_format: OutputFormat,
) -> None:
    with connect(api, token, timeout) as client:
        before = client.alert(alert_id)
        try:
            after = client.change_alert_status(before["id"], status.value, by or None)
        except ApiConflictError as exc:
            allowed = ", ".join(exc.allowed) or "none (final status)"
            current = exc.current or before["status"]
            raise fail(
                f"alert {alert_id} is {current}: it cannot become {status.value}; "
                f"allowed: {allowed}"
            ) from None
    if output_format is OutputFormat.json:
        print_json(after)
        return
    what = (
        f"{escape(after['job'])}/{escape(after['machine'])} {escape(after['kind'])} "
        f"{escape(after['metric'])}"
    )
    who = f" by {escape(by)}" if by else ""
    if before["status"] == after["status"]:
        out.print(f"alert {escape(after['id'])} ({what}) already {_status(after['status'])}")
        return
    out.print(
        f"alert {escape(after['id'])} ({what}): {_status(before['status'])} → "
        f"{_status(after['status'])}{who}"
    )


@alerts_app.command("ack")
def ack_command(
    alert_id: Annotated[str, typer.Argument(metavar="ID", help="the alert's id")],
    by: ByOption = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Acknowledge an alert: someone looks at it."""
    _change(alert_id, AlertStatus.ACKNOWLEDGED, by, api, token, timeout, output_format)


@alerts_app.command("resolve")
def resolve_command(
    alert_id: Annotated[str, typer.Argument(metavar="ID", help="the alert's id")],
    by: ByOption = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Resolve an alert: the fault was real and is dealt with (a confirmed fault label)."""
    _change(alert_id, AlertStatus.RESOLVED, by, api, token, timeout, output_format)


@alerts_app.command("false-positive")
def false_positive_command(
    alert_id: Annotated[str, typer.Argument(metavar="ID", help="the alert's id")],
    by: ByOption = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Mark an alert a false positive: the machine was healthy."""
    _change(alert_id, AlertStatus.FALSE_POSITIVE, by, api, token, timeout, output_format)
