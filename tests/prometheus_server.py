"""A real Prometheus server for tests: started on a free loopback port, stopped afterwards.

``promtool`` has no command that only parses a PromQL expression, so the dashboards' queries are
checked by a Prometheus server instead: ``GET /api/v1/query`` answers a parse error with
``{"status": "error", "errorType": "bad_data"}``. With ``scrape_configs`` the same server can
scrape live targets (an end-to-end test running every panel's query against real data)::

    with prometheus_server(tmp_path, scrape_configs=[{"job_name": "minder", "static_configs":
                           [{"targets": ["127.0.0.1:8080"]}]}]) as prom:
        answer = prom.query("sum(minder_jobs)")

Stored history instead of live scrapes: write it as OpenMetrics (:func:`write_openmetrics`),
turn it into TSDB blocks with ``promtool`` (:func:`create_blocks`) and start the server on them
with a retention long enough to keep them::

    write_openmetrics(path, families)
    create_blocks(path, tmp_path)
    with prometheus_server(tmp_path, retention="100y") as prom: ...

The test is skipped, saying why, when the ``prometheus`` or ``promtool`` binary is absent (Debian
package ``prometheus``, installed by ``.ci/install-deploy-tools.sh``; or set
``PROMETHEUS_BINARY`` / ``PROMTOOL_BINARY``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from server_process import find_binary, log_tail, stop_process, wait_http_ready

from minder.stream.broker import free_port


def prometheus_binary() -> str | None:
    """``$PROMETHEUS_BINARY``, ``prometheus`` on the PATH or ``/usr/bin/prometheus``."""
    return find_binary("PROMETHEUS_BINARY", "prometheus", "/usr/bin/prometheus")


def promtool_binary() -> str | None:
    """``$PROMTOOL_BINARY``, ``promtool`` on the PATH or ``/usr/bin/promtool``."""
    return find_binary("PROMTOOL_BINARY", "promtool", "/usr/bin/promtool")


@dataclass
class Family:
    """One OpenMetrics metric family: ``series`` are ``(labels, timestamps, values)``.

    For a counter, ``name`` is the family name and its samples are written as ``<name>_total``.
    """

    name: str
    type: str
    series: list[tuple[dict[str, str], Sequence[float], Sequence[float]]]
    help: str = ""


def write_openmetrics(path: Path, families: Sequence[Family]) -> int:
    """Write ``families`` as an OpenMetrics text file with timestamps (seconds) for
    ``promtool tsdb create-blocks-from openmetrics``; returns the number of samples."""
    samples = 0
    with path.open("w", encoding="utf-8") as out:
        for family in families:
            out.write(f"# TYPE {family.name} {family.type}\n")
            if family.help:
                out.write(f"# HELP {family.name} {family.help}\n")
            sample_name = f"{family.name}_total" if family.type == "counter" else family.name
            for labels, stamps, values in family.series:
                body = ",".join(f'{key}="{value}"' for key, value in labels.items())
                prefix = f"{sample_name}{{{body}}} " if body else f"{sample_name} "
                out.writelines(
                    f"{prefix}{float(value)!r} {float(stamp):.3f}\n"
                    for stamp, value in zip(stamps, values, strict=True)
                )
                samples += len(stamps)
        out.write("# EOF\n")
    return samples


def create_blocks(openmetrics: Path, directory: Path, timeout: float = 300) -> None:
    """Turn an OpenMetrics file into TSDB blocks under ``directory / "data"``, where
    :func:`prometheus_server` with the same ``directory`` keeps its TSDB; skip when ``promtool``
    is absent."""
    binary = promtool_binary()
    if binary is None:
        pytest.skip(
            "promtool is not installed: apt-get install prometheus (/usr/bin/promtool) "
            "or set PROMTOOL_BINARY"
        )
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [binary, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"promtool create-blocks-from failed ({result.returncode}): "
            f"{(result.stderr or result.stdout)[-2000:]}"
        )


@dataclass
class PrometheusServer:
    """A running Prometheus; :attr:`url` is ``http://127.0.0.1:<port>``."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def get(self, path: str, params: dict[str, Any] | None = None, timeout: float = 10) -> Any:
        """GET ``path`` and decode the JSON answer, also of an error status (400, 422 …)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(self.url + path + query, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return json.loads(body)
            except json.JSONDecodeError:
                raise AssertionError(f"GET {path}: {exc.code} {body[:200]!r}") from None

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """Instant query: ``{"status": "success", "data": …}`` or ``{"status": "error", …}``."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        answer: dict[str, Any] = self.get("/api/v1/query", params)
        return answer

    def query_range(self, expr: str, start: float, end: float, step: str = "15s") -> dict[str, Any]:
        """Range query, as a dashboard's time series panel runs it."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        answer: dict[str, Any] = self.get("/api/v1/query_range", params)
        return answer

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log (for assertion messages)."""
        return log_tail(self.log_path, lines)


@contextlib.contextmanager
def prometheus_server(
    directory: Path | None = None,
    *,
    scrape_configs: Sequence[dict[str, Any]] = (),
    scrape_interval: str = "1s",
    rule_files: Sequence[Path] = (),
    extra_args: Sequence[str] = (),
    ready_timeout: float = 60,
    retention: str | None = None,
) -> Iterator[PrometheusServer]:
    """Run Prometheus on 127.0.0.1 with its config and TSDB under ``directory`` (a temporary
    folder when None); skip the calling test when the binary is absent; kill it on exit.

    ``retention`` (e.g. ``"100y"``) keeps blocks of stored history that the default (15 d)
    would delete at start-up."""
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(
            "Prometheus is not installed: apt-get install prometheus (/usr/bin/prometheus) "
            "or set PROMETHEUS_BINARY"
        )
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="prom-")))
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": list(scrape_configs),
        }
        config_path = directory / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = directory / "prometheus.log"
        port = free_port()
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *([f"--storage.tsdb.retention.time={retention}"] if retention else []),
            *extra_args,
        ]
        log = stack.enter_context(log_path.open("wb"))
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        stack.callback(stop_process, process)
        server = PrometheusServer(f"http://127.0.0.1:{port}", process, log_path)
        wait_http_ready(process, server.url + "/-/ready", "prometheus", log_path, ready_timeout)
        yield server


class FlakyTransport(httpx.BaseTransport):
    """The real network, failing to connect for the first ``failures`` requests."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.failures > 0:
            self.failures -= 1
            raise httpx.ConnectError("connection refused", request=request)
        return self.inner.handle_request(request)
