"""A real Alertmanager for tests, and a webhook receiver that records its notifications.

``alertmanager_server()`` starts ``prometheus-alertmanager`` (Debian package, installed by
``.ci/install-alertmanager.sh``; or set ``ALERTMANAGER_BINARY``) on a free loopback port with a
throw-away config and storage, clustering off (``--cluster.listen-address=``: a single node), and
kills it on exit. The calling test is skipped, saying why, when the binary is absent. The route
groups each alert on its own (``group_by: ['...']``) and notifies at once (``group_wait: 0s``,
``group_interval: 1s``, ``repeat_interval: 1h``)::

    with WebhookReceiver() as hook, alertmanager_server(webhook_url=hook.url) as am:
        httpx.post(am.url + "/api/v2/alerts", json=[...])
        hook.wait_for(lambda n: n["status"] == "resolved", timeout=10)

Without ``webhook_url`` the route ends at a receiver with no integration (a null receiver).
Other test folders can reuse it by putting this folder on ``sys.path`` (pytest's default
``prepend`` import mode does so only for the folder of the test file itself).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from server_process import find_binary, log_tail, stop_process, wait_http_ready

from minder.stream.broker import free_port

DEFAULT_BINARY = "/usr/bin/prometheus-alertmanager"


def alertmanager_binary() -> str | None:
    """``$ALERTMANAGER_BINARY``, ``/usr/bin/prometheus-alertmanager``, or ``alertmanager`` /
    ``prometheus-alertmanager`` on the PATH; None when there is none."""
    return find_binary(
        "ALERTMANAGER_BINARY", DEFAULT_BINARY, "prometheus-alertmanager", "alertmanager"
    )


@dataclass
class AlertmanagerServer:
    """A running Alertmanager; :attr:`url` is ``http://127.0.0.1:<port>``."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    config_path: Path

    def alerts(self, **params: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (query parameters as given), decoded."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=10) as response:
            answer: list[dict[str, Any]] = json.loads(response.read())
        return answer

    def stop(self) -> None:
        """Stop the server now (a test of an unreachable Alertmanager)."""
        stop_process(self.process)

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log (for assertion messages)."""
        return log_tail(self.log_path, lines)


def alertmanager_config(
    webhook_url: str | None = None, *, resolve_timeout: str = "5m"
) -> dict[str, Any]:
    """The test config: one route, each alert its own group, notified without delay."""
    receiver: dict[str, Any] = {"name": "minder-test"}
    if webhook_url is not None:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    return {
        "global": {"resolve_timeout": resolve_timeout},
        "route": {
            "receiver": "minder-test",
            "group_by": ["..."],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [receiver],
    }


@contextlib.contextmanager
def alertmanager_server(
    directory: Path | None = None,
    *,
    webhook_url: str | None = None,
    resolve_timeout: str = "5m",
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30,
) -> Iterator[AlertmanagerServer]:
    """Run Alertmanager on 127.0.0.1 with config and storage under ``directory`` (a temporary
    folder when None); skip the calling test when the binary is absent; kill it on exit.

    ``webhook_url``: where the route's receiver posts its notifications (``send_resolved``
    on); none when None.
    """
    binary = alertmanager_binary()
    if binary is None:
        pytest.skip(
            "Alertmanager is not installed: apt-get install prometheus-alertmanager "
            f"({DEFAULT_BINARY}; see .ci/install-alertmanager.sh) or set ALERTMANAGER_BINARY"
        )
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="am-")))
        directory.mkdir(parents=True, exist_ok=True)
        config_path = directory / "alertmanager.yml"
        config = alertmanager_config(webhook_url, resolve_timeout=resolve_timeout)
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = directory / "alertmanager.log"
        port = free_port()
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=debug",
            *extra_args,
        ]
        log = stack.enter_context(log_path.open("wb"))
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        stack.callback(stop_process, process)
        server = AlertmanagerServer(f"http://127.0.0.1:{port}", process, log_path, config_path)
        wait_http_ready(process, server.url + "/-/ready", "alertmanager", log_path, ready_timeout)
        yield server


class WebhookReceiver:
    """A stdlib HTTP server on 127.0.0.1 (a free port) that records the JSON bodies posted to it
    (Alertmanager's webhook notifications: ``{"status": "firing"|"resolved", "alerts": [...],
    ...}``) in :attr:`notifications`. Use as a context manager."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except json.JSONDecodeError:
                    payload = {"_invalid": body.decode(errors="replace")}
                with receiver._changed:
                    receiver.notifications.append(payload)
                    receiver._changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-receiver", daemon=True
        )

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15
    ) -> dict[str, Any]:
        """The first notification that satisfies ``predicate``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for notification in self.notifications:
                    if predicate(notification):
                        return notification
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no matching webhook notification within {timeout:g} s; got "
                        f"{json.dumps(self.notifications)[:2000]}"
                    )
                self._changed.wait(left)

    def matching(self, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The notifications so far that satisfy ``predicate``."""
        with self._changed:
            return [n for n in self.notifications if predicate(n)]
