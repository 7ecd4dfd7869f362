"""``minder actions`` (the scheduler-action audit trail) and ``minder breaker`` (the actions
circuit breaker), over the service's HTTP API."""

from __future__ import annotations

from typing import Annotated

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
from minder.cli.common import OutputFormat, fail, out, print_json
from minder.client.api import (
    DEFAULT_API_URL,
    DEFAULT_TIMEOUT_S,
    MAX_PAGE,
    BreakerOut,
    one_line,
)

actions_app = typer.Typer(
    name="actions",
    help="The audit trail of Minder's scheduler actions (drain, cordon, their undo).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

breaker_app = typer.Typer(
    name="breaker",
    help="The actions circuit breaker: whether Minder still acts on the scheduler.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

OUTCOME_STYLE = {"applied": "green", "failed": "bold red", "dry_run": "cyan"}


@actions_app.callback()
def _actions() -> None:
    """The audit trail of Minder's scheduler actions (drain, cordon, their undo)."""


@actions_app.command("list")
def list_command(
    alert: Annotated[
        str | None, typer.Option("--alert", metavar="ID", help="only this alert")
    ] = None,
    machine: Annotated[str | None, typer.Option(help="only this machine")] = None,
    job: Annotated[str | None, typer.Option(help="only this job")] = None,
    outcome: Annotated[
        str | None,
        typer.Option(
            help="applied, unchanged, dry_run, failed, skipped_policy, skipped_opt_out, "
            "skipped_breaker or skipped_not_in_job"
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="entries to show")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="skip this many (newest first)")] = 0,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Every attempt, result and undo of a scheduler action, and every decision not to act."""
    with connect(api, token, timeout) as client:
        page = client.actions(
            alert_id=alert, machine=machine, job=job, outcome=outcome, limit=limit, offset=offset
        )
    if output_format is OutputFormat.json:
        print_json(page)
        return
    table = Table(title="Scheduler actions")
    for column in ("id", "when (UTC)", "alert", "job", "machine", "node", "target"):
        table.add_column(column, justify="right" if column == "id" else "left")
    for column in ("operation", "mode", "outcome", "detail"):
        table.add_column(column)
    for r in page["items"]:
        style = OUTCOME_STYLE.get(r["outcome"])
        shown = escape(r["outcome"])
        table.add_row(
            str(r["id"]),
            when(r["created_at"]),
            escape(r["alert_id"] or "-"),
            escape(r["job"] or "-"),
            escape(r["machine"] or "-"),
            escape(r["node"] or "-"),
            escape(r["target"]),
            escape(r["operation"]),
            escape(r["mode"]),
            f"[{style}]{shown}[/]" if style else shown,
            escape(one_line(r["detail"], 60)),
        )
    out.print(table)
    shown_count = f"{len(page['items'])} of {page['total']} entries"
    if offset + len(page["items"]) < page["total"]:
        shown_count += f" (--offset {offset + len(page['items'])} for more)"
    out.print(shown_count)


def _breaker_line(state: BreakerOut) -> str:
    name = escape(state["name"])
    if state["tripped"]:
        reason = escape(one_line(state["reason"] or "no reason given", 160))
        return (
            f"breaker {name}: [bold red]TRIPPED[/] at {when(state['tripped_at'])} UTC: {reason}; "
            "Minder does not act on the scheduler until `minder breaker reset --by NAME`"
        )
    line = f"breaker {name}: [green]closed[/] (Minder may act on the scheduler)"
    if state["reset_at"] is not None:
        line += (
            f"; last reset at {when(state['reset_at'])} UTC by {escape(state['reset_by'] or '?')}"
        )
    return line


@breaker_app.command("status")
def status_command(
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Whether Minder still acts on the scheduler, and if not, why."""
    with connect(api, token, timeout) as client:
        state = client.breaker()
    if output_format is OutputFormat.json:
        print_json(state)
        return
    out.print(_breaker_line(state), soft_wrap=True)


@breaker_app.command("reset")
def reset_command(
    by: Annotated[
        str | None,
        typer.Option(
            "--by", envvar=["USER", "USERNAME"], help="who resets it", show_default="$USER"
        ),
    ] = None,
    api: ApiUrlOption = DEFAULT_API_URL,
    token: TokenOption = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Let Minder act again once you have checked why the breaker tripped (needs the token)."""
    if not by or not by.strip():
        raise fail("--by NAME is needed: who resets the breaker (kept in its audit)")
    with connect(api, token, timeout) as client:
        before = client.breaker()
        after = client.reset_breaker(by.strip())
    if output_format is OutputFormat.json:
        print_json(after)
        return
    if not before["tripped"]:
        out.print(f"breaker {escape(after['name'])} was not tripped: nothing to reset")
        return
    out.print(
        f"breaker {escape(after['name'])} reset by {escape(by.strip())}: Minder acts on the "
        "scheduler again",
        soft_wrap=True,
    )
