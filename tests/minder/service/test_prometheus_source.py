"""Live mode: the Prometheus poller feeds a DetectionService from a real Prometheus.

The Prometheus holds stored history (OpenMetrics → ``promtool`` → TSDB blocks, the harness of
``tests/prometheus_server.py``); the poller's clock is one the test moves over that
history, or, for ``minder serve``, the real clock with a lag that reaches back into it. Skipped,
saying why, when ``prometheus`` or ``promtool`` is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import prometheus_server
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from collectors.prometheus import PrometheusReader
from minder.cli import app
from minder.config import DetectionSettings
from minder.service.engine import DetectionService
from minder.service.prometheus_source import PrometheusPoller
from minder.service.telemetry import ServiceMetrics
from minder.stream.broker import free_port

MACHINES = 6
GPUS = 2
STEP = 15.0
STEPS = 41  # ten minutes
JOB = "5150"
T0 = float((int(time.time()) - 3 * 3600) // 15 * 15)
TS = T0 + STEP * np.arange(STEPS)
LAG = 30.0


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    h = prometheus_server
    rng = np.random.default_rng(3)
    util, power, tx = [], [], []
    for m in range(MACHINES):
        for g in range(GPUS):
            labels = {"Hostname": f"n{m}", "gpu": str(g), "slurm_job_id": JOB}
            util.append((labels, TS, 90 + rng.normal(0, 2, STEPS)))
            power.append((labels, TS, 600 + rng.normal(0, 10, STEPS)))
        ib = {"instance": f"n{m}:9100", "device": "mlx5_0", "port": "1"}
        tx.append((ib, TS, 1e12 + np.cumsum(np.full(STEPS, 20e9 * STEP))))
    families = [
        h.Family("DCGM_FI_DEV_GPU_UTIL", "gauge", util),
        h.Family("DCGM_FI_DEV_POWER_USAGE", "gauge", power),
        h.Family("node_infiniband_port_data_transmitted_bytes", "counter", tx),
    ]
    directory = tmp_path_factory.mktemp("prom-live")
    path = directory / "live.om"
    h.write_openmetrics(path, families)
    h.create_blocks(path, directory)
    with h.prometheus_server(directory, retention="100y") as server:
        yield server


class Clock:
    """Wall-clock time the test moves: ``LAG`` after the step it stands on."""

    def __init__(self, step: int) -> None:
        self.now = T0 + STEP * step + LAG

    def __call__(self) -> float:
        return self.now


def service() -> DetectionService:
    factory = DetectionSettings().detector_factory()
    return DetectionService(factory, metrics=ServiceMetrics(CollectorRegistry()))


def poller(
    url: str, target: DetectionService, clock: Callable[[], float], **kwargs: Any
) -> PrometheusPoller:
    transport = kwargs.pop("transport", None)
    reader = PrometheusReader(url, step_s=STEP, retry_wait_s=0.01, transport=transport)
    return PrometheusPoller(reader, target, lag_s=LAG, clock=clock, **kwargs)


def sample(target: DetectionService, name: str, **labels: str) -> float:
    value = target.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_every_step_reaches_the_detection_service(prom: Any) -> None:
    target = service()
    clock = Clock(0)
    source = poller(prom.url, target, clock)
    handed = []
    for step in range(STEPS):
        clock.now = T0 + STEP * step + LAG
        handed.append(source.poll_once())
    assert handed == [MACHINES] * STEPS  # one batch per machine and step
    assert source.ready and source.next_step == TS[-1] + STEP
    window = target.jobs[JOB].window
    assert window.n_machines == MACHINES
    assert int(window.machine_last_seen().max()) == int(TS[-1])
    assert sample(target, "minder_batches_consumed_total") == MACHINES * STEPS
    # GPU util and power per GPU, and the IB rate from the second step on
    expected = MACHINES * (2 * GPUS * STEPS + (STEPS - 1))
    assert sample(target, "minder_samples_consumed_total") == expected
    assert sample(target, "minder_source_batches_total", source="prometheus") == MACHINES * STEPS
    assert sample(target, "minder_source_last_timestamp_seconds", source="prometheus") == TS[-1]
    # nothing new: the poll reads nothing and still ticks
    assert source.poll_once() == 0
    source.stop()


def test_a_failed_poll_is_read_again_with_the_next_one(prom: Any) -> None:
    target = service()
    clock = Clock(0)
    # every failed poll makes 4 attempts; three polls fail, then the network is back
    source = poller(prom.url, target, clock, transport=prometheus_server.FlakyTransport(3 * 4))
    handed = []
    for step in range(6):
        clock.now = T0 + STEP * step + LAG
        handed.append(source.poll_once())
        if step < 3:
            assert not source.ready
    assert handed == [0, 0, 0, 4 * MACHINES, MACHINES, MACHINES]
    assert source.ready
    errors = sample(target, "minder_source_errors_total", source="prometheus", reason="unreachable")
    assert errors == 3
    assert sample(target, "minder_batches_consumed_total") == 6 * MACHINES  # no step lost
    assert sample(target, "minder_source_skipped_seconds_total", source="prometheus") == 0
    source.stop()


def test_steps_beyond_the_catch_up_bound_are_skipped_and_counted(prom: Any) -> None:
    target = service()
    clock = Clock(0)
    source = poller(
        prom.url,
        target,
        clock,
        transport=prometheus_server.FlakyTransport(4 * 4),
        max_catchup_s=2 * STEP,
    )
    handed = []
    for step in range(6):
        clock.now = T0 + STEP * step + LAG
        handed.append(source.poll_once())
    # steps 0..4 were due at the fifth poll; only the last two are read back
    assert handed == [0, 0, 0, 0, 2 * MACHINES, MACHINES]
    skipped = sample(target, "minder_source_skipped_seconds_total", source="prometheus")
    assert skipped == 3 * STEP
    assert sample(target, "minder_batches_consumed_total") == 3 * MACHINES
    source.stop()


# -- minder serve ----------------------------------------------------------------------------------


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env.update(extra)
    env["COLUMNS"] = "400"
    return env


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.kafka
def test_serve_with_the_prometheus_source_polls_it(prom: Any, broker: Any, tmp_path: Path) -> None:
    # Alerts are also published on Kafka when asked to.
    _serve_and_check(
        prom,
        tmp_path,
        {"MINDER_KAFKA__BOOTSTRAP": broker.bootstrap, "MINDER_KAFKA__PUBLISH_ALERTS": "true"},
    )


def test_serve_with_only_the_prometheus_source_needs_no_broker(prom: Any, tmp_path: Path) -> None:
    output = _serve_and_check(
        prom, tmp_path, {"MINDER_KAFKA__BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    )
    assert "Kafka" not in output.split("Minder is serving on", 1)[1].splitlines()[0]


def _serve_and_check(prom: Any, tmp_path: Path, extra: dict[str, str]) -> str:
    """``minder serve --source prometheus`` reads the stored history; returns its output."""
    port = free_port()
    # The lag reaches back into the stored history, so the real clock reads it.
    lag = time.time() - (T0 + STEP * 20)
    env = _env(
        {
            **extra,
            "MINDER_PROMETHEUS__URL": prom.url,
            "MINDER_PROMETHEUS__LAG_S": f"{lag:.0f}",
            "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'minder.db'}",
            "MINDER_API__PORT": str(port),
        }
    )
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "minder.cli", "serve", "--source", "prometheus"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        status, body = 0, b""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/ready")
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.3)
        output = (tmp_path / "serve.log").read_text(errors="replace")
        assert status == 200, f"{status} {body[:300]!r}\n{output[-3000:]}"
        checks = json.loads(body)["checks"]
        assert checks.get("prometheus_polled") is True and "kafka_group_joined" not in checks
        _status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        text = metrics.decode()
        assert f'minder_source_batches_total{{source="prometheus"}} {MACHINES}.0' in text
        assert "minder_batches_consumed_total 6.0" in text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    output = (tmp_path / "serve.log").read_text(errors="replace")
    assert process.returncode == 0, output[-3000:]
    assert f"metrics from Prometheus {prom.url} every 15 s" in output
    return output


def _one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


def test_serve_source_prometheus_without_a_url_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MINDER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "400")
    result = CliRunner().invoke(app, ["serve", "--source", "both"])
    assert result.exit_code == 2
    assert "--source both needs MINDER_PROMETHEUS__URL" in _one_line_error(result.output)


def test_the_default_source_is_prometheus_only_when_kafka_is_not_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from minder.config import Settings
    from minder.service.source import resolve_source

    for name in list(os.environ):
        if name.startswith("MINDER_"):
            monkeypatch.delenv(name)
    assert resolve_source(Settings.load(), None) == "kafka"
    monkeypatch.setenv("MINDER_PROMETHEUS__URL", "http://prometheus:9090")
    assert resolve_source(Settings.load(), None) == "prometheus"
    monkeypatch.setenv("MINDER_KAFKA__BOOTSTRAP", "broker:9092")
    assert resolve_source(Settings.load(), None) == "kafka"
    assert resolve_source(Settings.load(), "both") == "both"


@pytest.mark.kafka
def test_serve_with_an_unreachable_prometheus_stops_in_one_line(
    broker: Any, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "minder.cli", "serve", "--source", "prometheus"],
        env=_env(
            {
                "MINDER_KAFKA__BOOTSTRAP": broker.bootstrap,
                "MINDER_PROMETHEUS__URL": url,
                "MINDER_LOG_LEVEL": "WARNING",  # no start-up INFO lines around the error
                "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'minder.db'}",
                "MINDER_API__PORT": str(free_port()),
            }
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    line = _one_line_error(result.stderr)
    assert url in line and "unreachable" in line
