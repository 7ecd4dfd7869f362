"""``minder selfcheck``: run a node's self-check, and follow the service's checks over its API.

``selfcheck run`` runs on the node (docs/selfcheck.md, "The command"): it runs the checks of
:mod:`collectors.selfcheck`, prints a table (or the JSON report) and a one-line verdict, posts
the report when the service launched it, and exits 0 (pass), 1 (fail), 2 (bad usage or an
error) or 3 (inconclusive). ``status``, ``list``, ``request`` and ``cancel`` talk to the
service's API like ``minder alerts``.

Nothing of the checks is imported for ``--help``: the check names and states are written out
here (tests/minder/cli/test_cli_selfcheck.py checks that they agree).
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
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
    when,
)
from minder.cli.common import OutputFormat, err, fail, out, print_json, progress
from minder.client.api import (
    DEFAULT_API_URL,
    DEFAULT_TIMEOUT_S,
    MAX_PAGE,
    ApiConflictError,
    one_line,
)

if TYPE_CHECKING:
    from minder.client.api import SelfCheckOut
    from minder.client.selfcheck import ReportTarget
    from minder.core.selfcheck import SelfCheckReport

selfcheck_app = typer.Typer(
    name="selfcheck",
    help="Self-checks of drained nodes: run one here, or follow the service's (over its API).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_ERROR = 2
"""Bad usage, or an error (the report could not be posted): as every command's errors."""
EXIT_INCONCLUSIVE = 3


class CheckName(StrEnum):
    """The checks (``collectors.selfcheck.base.CHECK_NAMES``, written out for ``--help``)."""

    collective_allreduce = "collective.allreduce"
    gpu_matmul = "gpu.matmul"
    gpu_nvml = "gpu.nvml"
    gpu_dcgm = "gpu.dcgm"
    network_rdma = "network.rdma"
    network_ib_write_bw = "network.ib_write_bw"
    host_clock = "host.clock"
    host_disk = "host.disk"
    host_memory_ecc = "host.memory_ecc"


class CheckState(StrEnum):
    """Where a scheduled check stands (``minder.core.selfcheck.SelfCheckState`` written out)."""

    pending = "pending"
    running = "running"
    passed = "passed"
    failed = "failed"
    inconclusive = "inconclusive"
    timed_out = "timed_out"
    cancelled = "cancelled"


STYLE = {
    "pass": "green",
    "passed": "green",
    "fail": "bold red",
    "failed": "bold red",
    "error": "yellow",
    "inconclusive": "yellow",
    "timed_out": "yellow",
    "skipped": "dim",
    "cancelled": "dim",
    "running": "cyan",
    "pending": "cyan",
}
SHOWN_MEASUREMENTS = 6
"""Measurements per check that the table shows (``--format json`` has them all)."""

ByOption = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar=["USER", "USERNAME"],
        help="who decides (kept with the check)",
        show_default="$USER",
    ),
]


@selfcheck_app.callback()
def _selfcheck() -> None:
    """Self-checks of drained nodes: run one here, or follow the service's (over its API)."""


def _styled(value: str | None) -> str:
    if value is None:
        return "-"
    style = STYLE.get(value)
    return f"[{style}]{escape(value)}[/]" if style else escape(value)


# -- run -------------------------------------------------------------------------------------


@selfcheck_app.command("run")
def run_command(
    check: Annotated[
        list[CheckName] | None,
        typer.Option("--check", help="run only this check (repeat for several)"),
    ] = None,
    skip: Annotated[
        list[CheckName] | None,
        typer.Option("--skip", help="do not run this check (repeat for several)"),
    ] = None,
    baseline_file: Annotated[
        Path | None,
        typer.Option(
            "--baseline-file",
            help='gpu.matmul baselines: JSON of device model -> TFLOP/s, e.g. {"NVIDIA H100 '
            'PCIe": 600} (MINDER_SELFCHECK_BASELINE_<MODEL> variables win)',
            show_default=False,
        ),
    ] = None,
    output_format: FormatOption = OutputFormat.table,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="also write the JSON report to this file"),
    ] = None,
    report_url: Annotated[
        str | None,
        typer.Option(
            "--report-url",
            help="Minder's API to post the report to (MINDER_SELFCHECK_REPORT_URL); the "
            "token only from MINDER_SELFCHECK_TOKEN",
            show_default=False,
        ),
    ] = None,
    check_id: Annotated[
        str | None,
        typer.Option(
            "--check-id",
            help="the service's id of this check (MINDER_SELFCHECK_CHECK_ID)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check this node: a table and a one-line verdict; exit 0 pass, 1 fail, 3 inconclusive.

    Exit 2: bad usage, or an error such as a report that could not be posted. A partner node
    (MINDER_SELFCHECK_SUSPECT names another) runs the collective check only and exits 0 once it
    ran, whatever it found: the verdict is the suspect's, which posts its report when a report
    URL and check id are set (docs/selfcheck.md, "The command").
    """
    from collectors.selfcheck.runner import (  # noqa: PLC0415 - the checks, when they run
        build_context,
        load_check,
        plan_from_environ,
        run_checks,
        select_checks,
    )
    from minder.client.selfcheck import ReportTarget  # noqa: PLC0415
    from minder.core.errors import ValidationError  # noqa: PLC0415

    environ = dict(os.environ)
    try:
        plan = plan_from_environ(environ, check_id=check_id)
        context = build_context(environ, baseline_file=baseline_file)
        names = select_checks(
            [c.value for c in check or ()], [s.value for s in skip or ()], partner=plan.is_partner
        )
        target = (
            ReportTarget.from_environ(environ, url=report_url, check_id=plan.check_id)
            if plan.is_suspect
            else None
        )
    except ValidationError as exc:
        raise fail(exc) from None
    if not names:
        raise fail("--check and --skip leave no check to run: expected at least one")
    checks = [load_check(name) for name in names]
    with progress() as bar:
        task = bar.add_task("self-check", total=len(checks))

        def shown(name: str, result: Any) -> None:
            if result is None:
                bar.update(task, description=f"checking {name}")
            else:
                bar.advance(task)

        report = run_checks(
            checks,
            context,
            node=plan.node,
            check_id=plan.check_id,
            timeout_s=plan.timeout_s,
            progress=shown,
        )
    if output is not None:
        _write(output, report.to_dict())
    if output_format is OutputFormat.json:
        print_json(report.to_dict())
        err.print(_verdict_line(report), soft_wrap=True)
    else:
        out.print(_report_table(report))
        out.print(_verdict_line(report), soft_wrap=True)
    if plan.is_partner:
        err.print(
            f"partner of {escape(plan.suspect or '?')}: ran {', '.join(names)} only; the suspect "
            "reports the verdict"
        )
        # The collective's verdict is about the suspect, and the suspect reports it: a partner
        # that exited with it would end the job (srun --kill-on-bad-exit, a failed Kubernetes
        # Job) before the suspect posted, and a straggler would never be confirmed.
        raise typer.Exit(EXIT_PASS)
    if target is not None:
        _post(target, report)
    raise typer.Exit(_exit_status(report))


def _post(target: ReportTarget, report: SelfCheckReport) -> None:
    from minder.client.api import ApiError  # noqa: PLC0415
    from minder.client.selfcheck import post_report  # noqa: PLC0415

    try:
        record = post_report(target, report)
    except ApiError as exc:
        raise fail(f"the report was not posted: {exc}") from None
    err.print(
        f"report posted to {escape(target.url)}: self-check {escape(record['id'])} is "
        f"{_styled(record['state'])}"
    )


def _exit_status(report: SelfCheckReport) -> int:
    verdict = report.verdict.value
    if verdict == "pass":
        return EXIT_PASS
    if verdict == "fail":
        return EXIT_FAIL
    return EXIT_INCONCLUSIVE


def _verdict_line(report: SelfCheckReport) -> str:
    return _verdict_text(report.verdict.value, report.reason, report.failing())


def _verdict_text(verdict: str, reason: str, failing: list[str]) -> str:
    """``pass``, ``fail: <failed checks>`` or ``inconclusive: <reason>``."""
    if verdict == "pass":
        return _styled("pass")
    if verdict == "fail":
        return f"{_styled('fail')}: {escape(', '.join(failing))}"
    return f"{_styled(verdict)}: {escape(one_line(reason, 300))}"


def _write(path: Path, data: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise fail(
            f"--output {path}: cannot be written ({exc.strerror or exc}): expected a writable file"
        ) from None


def _report_table(report: SelfCheckReport) -> Table:
    return _checks_table(
        [c.to_dict() for c in report.checks], f"Self-check of {escape(report.node)}"
    )


def _checks_table(checks: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("check", "status", "s", "summary", "measurements"):
        table.add_column(column, justify="right" if column == "s" else "left")
    for c in checks:
        measurements = c.get("measurements") or {}
        shown = [
            f"{escape(str(k))}={escape(_measurement(v))}"
            for k, v in list(measurements.items())[:SHOWN_MEASUREMENTS]
        ]
        if len(measurements) > SHOWN_MEASUREMENTS:
            shown.append(f"… {len(measurements) - SHOWN_MEASUREMENTS} more (--format json)")
        table.add_row(
            escape(str(c.get("name", "?"))),
            _styled(str(c.get("status"))),
            f"{float(c.get('duration_s') or 0.0):.1f}",
            escape(one_line(str(c.get("summary", "")), 200)),
            "\n".join(shown) or "-",
        )
    return table


def _measurement(value: Any) -> str:
    return one_line(value if isinstance(value, str) else json.dumps(value), 40)


# -- the service's checks --------------------------------------------------------------------


def _drain_to_return(c: SelfCheckOut) -> str:
    if c["returned_ts"] is None or c["drained_ts"] is None:
        return "-"
    return f"{c['returned_ts'] - c['drained_ts']:.0f}s"


def _list_table(items: list[SelfCheckOut], title: str) -> Table:
    table = Table(title=title)
    columns = ("id", "alert", "node", "target", "state", "try", "verdict", "created (UTC)")
    for column in (*columns, "drain→return", "detail"):
        table.add_column(column, justify="right" if column == "try" else "left")
    for c in items:
        table.add_row(
            escape(c["id"]),
            escape(c["alert_id"]),
            escape(c["node"]),
            escape(c["target"]),
            _styled(c["state"]),
            str(c["attempt"]),
            _styled(c["verdict"]),
            when(c["created_ts"]),
            _drain_to_return(c),
            escape(one_line(c["detail"], 80)) or "-",
        )
    return table


@selfcheck_app.command("list")
def list_command(
    state: Annotated[
        list[CheckState] | None, typer.Option("--state", help="repeat for several")
    ] = None,
    node: Annotated[str | None, typer.Option(help="only this node (scheduler name)")] = None,
    alert: Annotated[str | None, typer.Option("--alert", help="only this alert's checks")] = None,
    job: Annotated[str | None, typer.Option(help="only this job's checks")] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="checks per page")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="skip this many (newest first)")] = 0,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """The service's self-checks matching every filter, newest first."""
    with connect(api, token, timeout) as client:
        page = client.selfchecks(
            states=[s.value for s in state or ()],
            node=node,
            alert_id=alert,
            job=job,
            limit=limit,
            offset=offset,
        )
    if output_format is OutputFormat.json:
        print_json(page)
        return
    items = page["items"]
    out.print(_list_table(items, "Self-checks"))
    shown = f"{len(items)} of {page['total']} self-check(s)"
    if page["offset"] + len(items) < page["total"]:
        shown += f" (--offset {page['offset'] + len(items)} for more)"
    out.print(shown)


@selfcheck_app.command("status")
def status_command(
    check_id: Annotated[str, typer.Argument(metavar="ID", help="the self-check's id")],
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """One self-check: where it stands and, once it came, the node's report."""
    with connect(api, token, timeout) as client:
        record = client.selfcheck(check_id)
    if output_format is OutputFormat.json:
        print_json(record)
        return
    out.print(_details(record))
    report = record["report"]
    if report is not None:
        checks: list[dict[str, Any]] = [dict(c) for c in report["checks"]]
        out.print(_checks_table(checks, f"Report of {escape(report['node'])}"))
        failing = [str(c["name"]) for c in checks if c.get("status") == "fail"]
        out.print(_verdict_text(report["verdict"], report["reason"], failing), soft_wrap=True)


def _details(c: SelfCheckOut) -> Table:
    table = Table(title=f"Self-check {escape(c['id'])}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("state", _styled(c["state"])),
        ("verdict", _styled(c["verdict"])),
        ("detail", escape(c["detail"]) or "-"),
        ("alert", escape(c["alert_id"])),
        ("job / machine", f"{escape(c['job'])} / {escape(c['machine'])}"),
        ("node", f"{escape(c['node'])} ({escape(c['target'])})"),
        ("partners", escape(", ".join(c["partners"])) or "-"),
        ("attempt", str(c["attempt"])),
        ("scheduler", escape(c["scheduler_ref"] or "-")),
        ("drained", f"{when(c['drained_ts'])} UTC"),
        ("decided", f"{when(c['created_ts'])} UTC"),
        ("launched", f"{when(c['started_ts'])} UTC"),
        ("finished", f"{when(c['finished_ts'])} UTC"),
        ("returned", f"{when(c['returned_ts'])} UTC (drain→return {_drain_to_return(c)})"),
    ]
    for field, value in rows:
        table.add_row(field, value)
    return table


@selfcheck_app.command("request")
def request_command(
    alert_id: Annotated[str, typer.Argument(metavar="ALERT_ID", help="the alert's id")],
    by: ByOption = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Ask the service to check the node an alert's action drained (it acts on the verdict)."""
    with connect(api, token, timeout) as client:
        try:
            record = client.request_selfcheck(alert_id, by or "minder-cli")
        except ApiConflictError as exc:
            raise fail(f"alert {alert_id}: {exc}") from None
    if output_format is OutputFormat.json:
        print_json(record)
        return
    out.print(
        f"self-check {escape(record['id'])} of node {escape(record['node'])} (alert "
        f"{escape(record['alert_id'])}): {_styled(record['state'])}, "
        f"{escape(one_line(record['detail'], 160))}"
    )


@selfcheck_app.command("cancel")
def cancel_command(
    check_id: Annotated[str, typer.Argument(metavar="ID", help="the self-check's id")],
    by: ByOption = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Stop a pending or running self-check: the node stays out, for a person to decide."""
    with connect(api, token, timeout) as client:
        try:
            record = client.cancel_selfcheck(check_id, by or None)
        except ApiConflictError as exc:
            raise fail(f"self-check {check_id}: {exc}") from None
    if output_format is OutputFormat.json:
        print_json(record)
        return
    out.print(
        f"self-check {escape(record['id'])} of node {escape(record['node'])}: "
        f"{_styled(record['state'])}"
    )
