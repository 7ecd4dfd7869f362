"""A small stand-in for Grafana's HTTP API, for testing ``minder dashboards push``.

No Grafana server can run in this environment, so this fake follows Grafana's documented HTTP API
(the Folder API and the Dashboard API of Grafana 11) for the endpoints that grafana-client calls
during a push, and checks the requests the way those documents describe them:

- ``GET /api/health`` (no authentication), ``GET /api/frontend/settings`` (``buildInfo``);
- ``GET /api/folders`` (a list of ``{id, uid, title, url}``), ``GET /api/folders/:uid`` (404
  ``{"message": "folder not found"}`` when missing), ``POST /api/folders`` with ``{"title",
  "uid"?}`` (400 without a title or with a uid over 40 characters, 409 for a uid in use);
- ``GET /api/dashboards/uid/:uid``: ``{"dashboard": {..., "id", "uid", "version"}, "meta":
  {"folderUid", "folderTitle", "url", "slug", ...}}``, 404 ``{"message": "Dashboard not found"}``;
- ``POST /api/dashboards/db`` with ``{"dashboard", "folderUid"?, "folderId"?, "message"?,
  "overwrite"?}`` (any other key is refused): the dashboard needs a non-empty ``title``; ``id``
  must be null for a new dashboard and name an existing one otherwise (404); a ``folderUid``
  must exist (400); without ``overwrite`` a stored dashboard of another ``version`` gives 412
  ``{"status": "version-mismatch"}`` and another dashboard of the same title in the folder 412
  ``{"status": "name-exists"}``. A save increments the version and answers ``{"id", "uid",
  "url", "status": "success", "version", "slug"}``.

Every ``/api`` request but the health check needs ``Authorization: Bearer <token>`` (or basic
auth) with a known credential, else 401 ``{"message": "Unauthorized"}``; a viewer credential
may read but gets 403 ``{"message": "Access denied"}`` on writes. Requests are recorded in
:attr:`FakeGrafana.requests` for the tests to inspect.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DASHBOARD_BODY_KEYS = {"dashboard", "folderId", "folderUid", "message", "overwrite"}
FOLDER_BODY_KEYS = {"uid", "title", "parentUid", "description"}


@dataclass
class Recorded:
    """One request the fake answered."""

    method: str
    path: str
    authorization: str | None
    body: Any
    status: int


@dataclass
class FakeGrafana:
    """The fake's state; :meth:`start` serves it on 127.0.0.1 (a free port) from a thread."""

    token: str = "editor-token"
    viewer_token: str = "viewer-token"
    basic_users: dict[str, str] = field(default_factory=lambda: {"admin": "admin"})
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboard_folders: dict[str, str] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    _next_id: int = 1
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeGrafana:
        fake = self

        class Handler(_Handler):
            grafana = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGrafana:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers for tests -----------------------------------------------------------------

    def new_id(self) -> int:
        with self._lock:
            value = self._next_id
            self._next_id += 1
            return value

    def add_folder(self, title: str, uid: str) -> dict[str, Any]:
        folder = {
            "id": self.new_id(),
            "uid": uid,
            "title": title,
            "url": f"/dashboards/f/{uid}/{_slug(title)}",
            "version": 1,
        }
        self.folders[uid] = folder
        return folder

    def calls(self, method: str, pattern: str) -> list[Recorded]:
        """Recorded requests of ``method`` whose path matches the regex ``pattern``."""
        return [r for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    # -- the API ---------------------------------------------------------------------------

    def role(self, authorization: str | None) -> str | None:
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme == "Bearer":
            return {self.token: "editor", self.viewer_token: "viewer"}.get(value)
        if scheme == "Basic":
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return "editor" if self.basic_users.get(user) == password else None
        return None

    def handle(
        self, method: str, path: str, authorization: str | None, body: Any
    ) -> tuple[int, Any]:
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "fake", "database": "ok", "version": "11.3.0"}
        role = self.role(authorization)
        if role is None:
            return 401, {"message": "Unauthorized"}
        if method != "GET" and role != "editor":
            return 403, {"message": "Access denied"}
        if method == "GET" and path == "/api/frontend/settings":
            return 200, {"buildInfo": {"version": "11.3.0", "commit": "fake"}}
        if method == "GET" and path == "/api/folders":
            return 200, [
                {"id": f["id"], "uid": f["uid"], "title": f["title"], "url": f["url"]}
                for f in self.folders.values()
            ]
        if method == "POST" and path == "/api/folders":
            return self.create_folder(body)
        match = re.fullmatch(r"/api/folders/([^/]+)", path)
        if method == "GET" and match:
            folder = self.folders.get(match.group(1))
            return (200, folder) if folder else (404, {"message": "folder not found"})
        match = re.fullmatch(r"/api/dashboards/uid/([^/]+)", path)
        if method == "GET" and match:
            return self.get_dashboard(match.group(1))
        if method == "POST" and path == "/api/dashboards/db":
            return self.save_dashboard(body)
        return 404, {"message": "Not found"}

    def create_folder(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or set(body) - FOLDER_BODY_KEYS:
            return 400, {"message": "bad request data"}
        title = body.get("title")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "folder title cannot be empty"}
        uid = body.get("uid") or f"f{self._next_id:09d}"
        if not isinstance(uid, str) or len(uid) > 40:
            return 400, {"message": "uid too long, max 40 characters"}
        if uid in self.folders:
            return 409, {"message": "a folder with the same uid already exists"}
        return 200, self.add_folder(title, uid)

    def get_dashboard(self, uid: str) -> tuple[int, Any]:
        stored = self.dashboards.get(uid)
        if stored is None:
            return 404, {"message": "Dashboard not found"}
        folder_uid = self.dashboard_folders.get(uid, "")
        folder = self.folders.get(folder_uid, {})
        return 200, {
            "dashboard": copy.deepcopy(stored),
            "meta": {
                "type": "db",
                "canSave": True,
                "canEdit": True,
                "slug": _slug(stored["title"]),
                "url": f"/d/{uid}/{_slug(stored['title'])}",
                "version": stored["version"],
                "folderId": folder.get("id", 0),
                "folderUid": folder_uid,
                "folderTitle": folder.get("title", "General"),
                "provisioned": False,
            },
        }

    def save_dashboard(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or set(body) - DASHBOARD_BODY_KEYS:
            return 400, {"message": "bad request data"}
        dashboard = body.get("dashboard")
        if not isinstance(dashboard, dict):
            return 400, {"message": "Dashboard is required"}
        title = dashboard.get("title")
        if not isinstance(title, str) or not title.strip():
            return 400, {"message": "Dashboard title cannot be empty"}
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            return 400, {"message": "bad request data"}
        if "message" in body and not isinstance(body["message"], str):
            return 400, {"message": "bad request data"}
        folder_uid = body.get("folderUid") or ""
        if folder_uid and folder_uid not in self.folders:
            return 400, {"message": "folder not found"}
        uid = dashboard.get("uid") or f"d{self._next_id:09d}"
        if not isinstance(uid, str) or len(uid) > 40:
            return 400, {"message": "uid too long, max 40 characters"}
        dash_id = dashboard.get("id")
        existing = self.dashboards.get(uid)
        if dash_id is not None:
            by_id = [d for d in self.dashboards.values() if d["id"] == dash_id]
            if not by_id:
                return 404, {"message": "Dashboard not found"}
            if existing is not None and existing["id"] != dash_id:
                return 400, {"message": "A dashboard with the same uid already exists"}
        if (
            existing is not None
            and not overwrite
            and dashboard.get("version") != existing["version"]
        ):
            return 412, {
                "message": "The dashboard has been changed by someone else",
                "status": "version-mismatch",
            }
        same_title = [
            d
            for u, d in self.dashboards.items()
            if u != uid and d["title"] == title and self.dashboard_folders.get(u, "") == folder_uid
        ]
        if same_title and not overwrite:
            return 412, {
                "message": "A dashboard with the same name in the folder already exists",
                "status": "name-exists",
            }
        stored = copy.deepcopy(dashboard)
        stored["uid"] = uid
        stored["id"] = existing["id"] if existing is not None else self.new_id()
        stored["version"] = existing["version"] + 1 if existing is not None else 1
        self.dashboards[uid] = stored
        self.dashboard_folders[uid] = folder_uid
        slug = _slug(title)
        return 200, {
            "id": stored["id"],
            "uid": uid,
            "url": f"/d/{uid}/{slug}",
            "status": "success",
            "version": stored["version"],
            "slug": slug,
        }


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


class _Handler(BaseHTTPRequestHandler):
    grafana: FakeGrafana
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out at once (no 40 ms delayed ACKs)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read :attr:`FakeGrafana.requests` instead."""

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        status: int
        answer: Any
        if raw:
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                status, answer = 400, {"message": "bad request data"}
                self._answer(status, answer, body)
                return
        if raw and not (self.headers.get("Content-Type") or "").startswith("application/json"):
            status, answer = 415, {"message": "Unsupported Media Type"}
        else:
            path = self.path.split("?", 1)[0]
            status, answer = self.grafana.handle(
                self.command, path, self.headers.get("Authorization"), body
            )
        self._answer(status, answer, body)

    def _answer(self, status: int, answer: Any, body: Any) -> None:
        self.grafana.requests.append(
            Recorded(
                self.command,
                self.path.split("?", 1)[0],
                self.headers.get("Authorization"),
                body,
                status,
            )
        )
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _serve  # noqa: N815 - http.server's naming
    do_POST = _serve  # noqa: N815
    do_PUT = _serve  # noqa: N815
    do_DELETE = _serve  # noqa: N815
