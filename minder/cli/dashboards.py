"""``minder dashboards``: list Minder's Grafana dashboards and push them to a Grafana server.

The dashboards are the generated JSON files of ``dashboards/json`` in the source tree (not part
of the installed package): ``--dir`` points elsewhere. ``push`` uses Grafana's HTTP API through
``grafana-client``: it finds or creates the folder, then saves each dashboard with
``overwrite: true`` unless Grafana already holds the same content in that folder.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.common import OutputFormat, fail, out, print_json

if TYPE_CHECKING:
    from grafana_client import GrafanaApi

logger = logging.getLogger(__name__)

dashboards_app = typer.Typer(
    help="Minder's Grafana dashboards (dashboards/json): list them, push them to Grafana.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_DIR = Path("dashboards") / "json"
"""Where the generated dashboards are, relative to the repository root."""

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help="folder of dashboard JSON files (default: dashboards/json of the current directory "
        "or of Minder's source tree)",
        show_default=False,
    ),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json")]


@dataclass(frozen=True)
class BundledDashboard:
    """One dashboard JSON file."""

    path: Path
    data: dict[str, Any]

    @property
    def uid(self) -> str:
        return str(self.data["uid"])

    @property
    def title(self) -> str:
        return str(self.data["title"])

    @property
    def panels(self) -> int:
        """Panels other than rows, those inside collapsed rows included."""
        count = 0
        for panel in self.data.get("panels") or []:
            count += panel.get("type") != "row"
            count += sum(p.get("type") != "row" for p in panel.get("panels") or [])
        return count


def dashboards_dir(explicit: Path | None) -> Path:
    """``explicit``, or ``dashboards/json`` of the current directory or of the source tree."""
    if explicit is not None:
        if not explicit.is_dir():
            raise fail(f"--dir {explicit}: no such folder")
        return explicit
    source_tree = Path(__file__).resolve().parents[2] / DEFAULT_DIR
    for candidate in (Path.cwd() / DEFAULT_DIR, source_tree):
        if candidate.is_dir() and any(candidate.glob("*.json")):
            return candidate
    raise fail(
        f"no dashboards in ./{DEFAULT_DIR} or {source_tree}: run from the repository root "
        "or pass --dir DIR (generate them with `python -m dashboards.build`)"
    )


def load_dashboards(directory: Path) -> list[BundledDashboard]:
    """Every ``*.json`` dashboard of ``directory``; a file that is not one exits 2 naming it."""
    result = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise fail(f"{path}: not readable JSON ({exc})") from None
        if not isinstance(data, dict) or not data.get("uid") or not data.get("title"):
            raise fail(f"{path}: not a Grafana dashboard (needs a uid and a title)")
        result.append(BundledDashboard(path, data))
    if not result:
        raise fail(f"{directory}: no *.json dashboards")
    uids = [d.uid for d in result]
    duplicates = sorted({uid for uid in uids if uids.count(uid) > 1})
    if duplicates:
        raise fail(f"{directory}: several dashboards have the uid {', '.join(duplicates)}")
    return result


@dashboards_app.command("list")
def list_command(
    directory: DirOption = None, output_format: FormatOption = OutputFormat.table
) -> None:
    """List the bundled dashboards: uid, title, panels."""
    folder = dashboards_dir(directory)
    bundle = load_dashboards(folder)
    if output_format is OutputFormat.json:
        print_json(
            [
                {"uid": d.uid, "title": d.title, "panels": d.panels, "file": str(d.path)}
                for d in bundle
            ]
        )
        return
    table = Table(title=f"Dashboards in {escape(str(folder))}")
    for column in ("uid", "title", "panels", "file"):
        table.add_column(column, justify="right" if column == "panels" else "left")
    for d in bundle:
        table.add_row(escape(d.uid), escape(d.title), str(d.panels), escape(d.path.name))
    out.print(table)


# --- push -----------------------------------------------------------------------------------


class PushError(Exception):
    """A push that cannot go on; the message is one line for the operator."""


@dataclass
class PushReport:
    """What a push did."""

    grafana: str
    folder_uid: str
    folder_title: str
    folder_created: bool
    dashboards: list[dict[str, Any]] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(d["status"] == status for d in self.dashboards)

    def as_json(self) -> dict[str, Any]:
        return {
            "grafana": self.grafana,
            "folder": {
                "uid": self.folder_uid,
                "title": self.folder_title,
                "created": self.folder_created,
            },
            "dashboards": self.dashboards,
        }


@dataclass(frozen=True)
class GrafanaTarget:
    """Where Grafana is: the parts of ``--grafana-url`` the client needs, credentials apart."""

    protocol: str
    host: str
    port: int | None
    path_prefix: str
    url_user: str | None
    url_password: str | None

    @property
    def display(self) -> str:
        """The URL without credentials (safe to print)."""
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.protocol}://{self.host}{port}/{self.path_prefix}".rstrip("/")


def parse_grafana_url(url: str) -> GrafanaTarget:
    """Split ``http(s)://[user:password@]host[:port][/path]``; raise ``ValueError`` otherwise."""
    expected = "expected http(s)://host[:port][/path]"
    shown = re.sub(r"//[^/@]*@", "//***@", url)  # never echo a password
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"--grafana-url {shown!r}: {exc}; {expected}") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"--grafana-url {shown!r}: {expected}")
    host = parts.hostname
    if ":" in host:  # an IPv6 literal goes back into brackets in the client's URL
        host = f"[{host}]"
    prefix = parts.path.strip("/")
    return GrafanaTarget(
        protocol=parts.scheme,
        host=host,
        port=port,
        path_prefix=f"{prefix}/" if prefix else "",
        url_user=parts.username,
        url_password=parts.password,
    )


def folder_uid_for(title: str) -> str:
    """The folder uid Minder uses for a folder title (``Minder`` → ``minder``), ≤ 40 chars."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return (slug or "minder")[:40]


def _comparable(dashboard: dict[str, Any]) -> dict[str, Any]:
    """A dashboard without what Grafana sets on save (``id``, ``version``)."""
    return {k: v for k, v in dashboard.items() if k not in {"id", "version"}}


def _as_dict(answer: Any, what: str, target: GrafanaTarget) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise PushError(
            f"{target.display} does not look like Grafana's HTTP API: {what} answered "
            f"{type(answer).__name__} instead of a JSON object"
        )
    return answer


def _status(exc: BaseException) -> int:
    return int(getattr(exc, "status_code", 0) or 0)


def ensure_folder(api: GrafanaApi, title: str, target: GrafanaTarget) -> tuple[str, str, bool]:
    """``(uid, title, created)`` of the folder: by uid, else by title, else newly created."""
    from grafana_client.client import GrafanaClientError  # noqa: PLC0415

    uid = folder_uid_for(title)
    try:
        found = _as_dict(api.folder.get_folder(uid), "GET /api/folders/{uid}", target)
        logger.debug("folder %s found by uid", uid)
        return str(found.get("uid", uid)), str(found.get("title", title)), False
    except GrafanaClientError as exc:
        if _status(exc) != 404:
            raise
    folders = api.folder.get_all_folders()
    if not isinstance(folders, list):
        raise PushError(
            f"{target.display} does not look like Grafana's HTTP API (GET /api/folders)"
        )
    for folder in folders:
        if isinstance(folder, dict) and folder.get("title") == title and folder.get("uid"):
            logger.debug("folder %r found by title: uid %s", title, folder["uid"])
            return str(folder["uid"]), title, False
    created = _as_dict(api.folder.create_folder(title, uid=uid), "POST /api/folders", target)
    logger.info("created folder %r (uid %s)", title, created.get("uid", uid))
    return str(created.get("uid", uid)), str(created.get("title", title)), True


def push_dashboard(
    api: GrafanaApi,
    dashboard: BundledDashboard,
    folder_uid: str,
    message: str,
    target: GrafanaTarget,
) -> dict[str, Any]:
    """Save one dashboard in the folder unless Grafana holds it unchanged there already."""
    from grafana_client.client import GrafanaClientError  # noqa: PLC0415

    existing: dict[str, Any] | None
    try:
        existing = _as_dict(
            api.dashboard.get_dashboard(dashboard.uid), "GET /api/dashboards/uid/{uid}", target
        )
    except GrafanaClientError as exc:
        if _status(exc) != 404:
            raise
        existing = None
    row = {"uid": dashboard.uid, "title": dashboard.title, "file": dashboard.path.name}
    if existing is not None:
        current = existing.get("dashboard") or {}
        meta = existing.get("meta") or {}
        if (
            _comparable(current) == _comparable(dashboard.data)
            and meta.get("folderUid") == folder_uid
        ):
            return {
                **row,
                "status": "unchanged",
                "version": current.get("version"),
                "url": meta.get("url"),
            }
    # A new dashboard goes with id null (Grafana's API); an existing one keeps its id.
    known_id = (existing.get("dashboard") or {}).get("id") if existing is not None else None
    payload = {**dashboard.data, "id": known_id, "uid": dashboard.uid}
    payload.pop("version", None)  # overwrite: true saves over whatever version Grafana holds
    body = {
        "dashboard": payload,
        "folderUid": folder_uid,
        "overwrite": True,
        "message": message,
    }
    saved = _as_dict(api.dashboard.update_dashboard(body), "POST /api/dashboards/db", target)
    status = "created" if existing is None else "updated"
    logger.info("%s dashboard %s (version %s)", status, dashboard.uid, saved.get("version"))
    return {**row, "status": status, "version": saved.get("version"), "url": saved.get("url")}


def push(
    api: GrafanaApi, bundle: list[BundledDashboard], folder_title: str, target: GrafanaTarget
) -> PushReport:
    """Find or create the folder, then push every dashboard into it."""
    from minder import __version__  # noqa: PLC0415

    folder_uid, title, created = ensure_folder(api, folder_title, target)
    report = PushReport(target.display, folder_uid, title, created)
    message = f"minder dashboards push (minder {__version__})"
    for dashboard in bundle:
        report.dashboards.append(push_dashboard(api, dashboard, folder_uid, message, target))
    return report


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _connection_reason(exc: BaseException) -> str:
    """The root cause of a transport error, short (``Connection refused``, a DNS failure …)."""
    deepest, seen = exc, {id(exc)}
    while (cause := deepest.__cause__ or deepest.__context__) is not None and id(cause) not in seen:
        seen.add(id(cause))
        deepest = cause
    if isinstance(deepest, socket.gaierror):
        return f"cannot resolve the host name ({_one_line(deepest)})"
    if isinstance(deepest, OSError) and deepest.strerror:
        return str(deepest.strerror)
    match = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", _one_line(exc))
    if match:
        return match.group(1).strip().rstrip(".")
    return f"{type(deepest).__name__}: {_one_line(deepest)[:160]}"


def explain(exc: BaseException, target: GrafanaTarget, timeout: float) -> str:
    """One line for the operator from whatever the client raised."""
    from grafana_client.client import (  # noqa: PLC0415
        GrafanaClientError,
        GrafanaException,
        GrafanaServerError,
        GrafanaTimeoutError,
    )

    where = f"Grafana at {target.display}"
    if isinstance(exc, PushError):
        return str(exc)
    if isinstance(exc, GrafanaTimeoutError):
        return f"no answer from {where} within {timeout:g} s"
    status = _status(exc)
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("message"):
        message = _one_line(response["message"])  # Grafana's own words
    else:
        message = _one_line(getattr(exc, "message", "") or exc)[:300]
    if isinstance(exc, GrafanaClientError) and status == 401:
        return (
            f"{where} refused the credentials (401 Unauthorized): check --token (GRAFANA_TOKEN) "
            "or --basic-auth"
        )
    if isinstance(exc, GrafanaClientError) and status == 403:
        return (
            f"{where} denied access (403 Forbidden): the token or user needs the Editor role "
            "(folders:create, dashboards:write)"
        )
    if isinstance(exc, GrafanaClientError) and status == 404:
        return f"{where} has no such API endpoint (404): is the URL's path prefix right?"
    if isinstance(exc, (GrafanaClientError, GrafanaServerError)):
        return f"{where} answered {status}: {message}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{target.display} does not look like Grafana's HTTP API (answer is not JSON)"
    if isinstance(exc, (GrafanaException, OSError)):  # transport errors (niquests' are OSError)
        return f"cannot reach {where}: {_connection_reason(exc)}"
    return f"{where}: {message}"


def _credential(
    token: str | None, basic_auth: str | None, target: GrafanaTarget
) -> str | tuple[str, str] | None:
    if token and basic_auth:
        raise fail("give --token (GRAFANA_TOKEN) or --basic-auth, not both")
    if token:
        return token.strip()
    if basic_auth:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise fail("--basic-auth: expected USER:PASSWORD")
        return (user, password)
    if target.url_user is not None:
        return (target.url_user, target.url_password or "")
    return None


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
    """Upload the dashboards into a Grafana folder (created if missing); idempotent."""
    try:
        target = parse_grafana_url(grafana_url)
    except ValueError as exc:
        raise fail(exc) from None
    if not folder.strip():
        raise fail("--folder: give a folder title")
    bundle = load_dashboards(dashboards_dir(directory))
    credential = _credential(token, basic_auth, target)
    try:
        from grafana_client import GrafanaApi  # noqa: PLC0415
        from grafana_client.client import GrafanaException  # noqa: PLC0415
    except ImportError:
        raise fail("grafana-client is not installed: pip install grafana-client") from None

    api = GrafanaApi(
        auth=credential,
        host=target.host,
        port=target.port,
        url_path_prefix=target.path_prefix,
        protocol=target.protocol,
        timeout=timeout,
    )
    try:
        report = push(api, bundle, folder.strip(), target)
    except (GrafanaException, PushError, OSError, ValueError) as exc:
        # Client, server and transport failures end in one line; anything else is a bug.
        logger.debug("push failed", exc_info=True)
        raise fail(explain(exc, target, timeout)) from None
    finally:
        api.client.s.close()
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
