"""Minder's Grafana client: push the shipped dashboards into a Grafana folder, idempotently.

Uses Grafana's HTTP API through ``grafana-client`` (the ``grafana`` extra:
``pip install 'minder[grafana]'``): finds or creates the folder, then saves each dashboard with
``overwrite: true`` unless Grafana already holds the same content in that folder. Every failure
an operator can meet (a bad URL, an unreachable Grafana, refused credentials, missing
permissions, a missing package) ends in one :class:`DashboardError` line.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dashboards.bundle import BundledDashboard, DashboardError, bundled_dashboards

if TYPE_CHECKING:
    from grafana_client import GrafanaApi

logger = logging.getLogger(__name__)

MISSING_CLIENT = (
    "grafana-client is not installed, which minder dashboards push needs: "
    "pip install 'minder[grafana]'"
)
"""The error when the ``grafana`` extra is missing."""


class PushError(DashboardError):
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


def credential(
    token: str | None, basic_auth: str | None, target: GrafanaTarget
) -> str | tuple[str, str] | None:
    """The token, ``(user, password)`` of ``--basic-auth`` or of the URL, or none."""
    if token and basic_auth:
        raise DashboardError("give --token (GRAFANA_TOKEN) or --basic-auth, not both")
    if token:
        return token.strip()
    if basic_auth:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise DashboardError("--basic-auth: expected USER:PASSWORD")
        return (user, password)
    if target.url_user is not None:
        return (target.url_user, target.url_password or "")
    return None


def push_to_grafana(
    grafana_url: str,
    *,
    token: str | None = None,
    basic_auth: str | None = None,
    folder: str = "Minder",
    directory: Path | None = None,
    timeout: float = 10.0,
) -> PushReport:
    """Push the dashboards of ``directory`` (default: the shipped ones) into the Grafana folder
    ``folder`` (created if missing) at ``grafana_url``; any failure raises
    :class:`DashboardError` with one line for the operator."""
    try:
        target = parse_grafana_url(grafana_url)
    except ValueError as exc:
        raise DashboardError(str(exc)) from None
    if not folder.strip():
        raise DashboardError("--folder: give a folder title")
    _, bundle = bundled_dashboards(directory)
    auth = credential(token, basic_auth, target)
    try:
        from grafana_client import GrafanaApi  # noqa: PLC0415
        from grafana_client.client import GrafanaException  # noqa: PLC0415
    except ImportError:
        raise DashboardError(MISSING_CLIENT) from None

    api = GrafanaApi(
        auth=auth,
        host=target.host,
        port=target.port,
        url_path_prefix=target.path_prefix,
        protocol=target.protocol,
        timeout=timeout,
    )
    try:
        return push(api, bundle, folder.strip(), target)
    except (GrafanaException, PushError, OSError, ValueError) as exc:
        # Client, server and transport failures end in one line; anything else is a bug.
        logger.debug("push failed", exc_info=True)
        raise DashboardError(explain(exc, target, timeout)) from None
    finally:
        api.client.s.close()
