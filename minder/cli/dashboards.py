"""``minder dashboards``: list Minder's Grafana dashboards and push them to a Grafana server.

The dashboards are the JSON files shipped with Minder (``dashboards/json``, package data of the
wheel and the image); ``--dir`` points elsewhere. The Grafana client is
:mod:`dashboards.grafana`; this module only parses options, calls it and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.common import OutputFormat, fail, out, print_json

dashboards_app = typer.Typer(
    help="Minder's Grafana dashboards (dashboards/json): list them, push them to Grafana.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help="folder of dashboard JSON files (default: the dashboards shipped with Minder)",
        show_default=False,
    ),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json")]


@dashboards_app.command("list")
def list_command(
    directory: DirOption = None, output_format: FormatOption = OutputFormat.table
) -> None:
    """List the bundled dashboards: uid, title, panels."""
    from dashboards.bundle import DashboardError, bundled_dashboards  # noqa: PLC0415

    try:
        folder, bundle = bundled_dashboards(directory)
    except DashboardError as exc:
        raise fail(exc) from None
    if output_format is OutputFormat.json:
        print_json([d.summary() for d in bundle])
        return
    table = Table(title=f"Dashboards in {escape(str(folder))}")
    for column in ("uid", "title", "panels", "file"):
        table.add_column(column, justify="right" if column == "panels" else "left")
    for d in bundle:
        table.add_row(escape(d.uid), escape(d.title), str(d.panels), escape(d.path.name))
    out.print(table)


@dashboards_app.command("push")
def push_command(
    grafana_url: Annotated[
        str,
        typer.Option(
            "--grafana-url",
            envvar="GRAFANA_URL",
            help="Grafana's base URL, e.g. http://grafana:3000",
            show_default=False,
        ),
    ],
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="GRAFANA_TOKEN",
            help="service account token",
            show_default=False,
        ),
    ] = None,
    basic_auth: Annotated[
        str | None,
        typer.Option("--basic-auth", help="USER:PASSWORD instead of a token", show_default=False),
    ] = None,
    folder: Annotated[str, typer.Option("--folder", help="folder title")] = "Minder",
    directory: DirOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="seconds to wait for each answer")
    ] = 10.0,
    output_format: FormatOption = OutputFormat.table,
) -> None:
    """Upload the dashboards into a Grafana folder (created if missing); idempotent.

    Needs the grafana extra: pip install 'minder[grafana]'.
    """
    from dashboards.bundle import DashboardError  # noqa: PLC0415
    from dashboards.grafana import push_to_grafana  # noqa: PLC0415

    try:
        report = push_to_grafana(
            grafana_url,
            token=token,
            basic_auth=basic_auth,
            folder=folder,
            directory=directory,
            timeout=timeout,
        )
    except DashboardError as exc:
        raise fail(exc) from None
    if output_format is OutputFormat.json:
        print_json(report.as_json())
        return
    table = Table(title=f"Dashboards pushed to {escape(report.grafana)}")
    for column in ("uid", "title", "status", "version", "url"):
        table.add_column(column)
    for d in report.dashboards:
        table.add_row(
            escape(d["uid"]),
            escape(d["title"]),
            d["status"],
            str(d["version"] if d["version"] is not None else "-"),
            escape(str(d["url"] or "-")),
        )
    out.print(table)
    out.print(
        f"folder {escape(report.folder_title)} (uid {escape(report.folder_uid)}) "
        f"{'created' if report.folder_created else 'found'}; "
        f"{report.count('created')} created, {report.count('updated')} updated, "
        f"{report.count('unchanged')} unchanged"
    )
