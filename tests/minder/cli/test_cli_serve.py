"""``minder serve`` and ``minder demo`` start like a service: one-line errors, range checks,
an embedded broker for a one-machine trial, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minder.cli import app
from minder.stream.broker import free_port

runner = CliRunner()
MINDER = [sys.executable, "-m", "minder.cli"]


def _one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    full_env.update(env)
    # a wide terminal, so the one error line is not wrapped by rich
    full_env["COLUMNS"] = "400"
    return subprocess.run(
        [*MINDER, *args], check=False, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_serve_without_a_broker_says_so_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    began = time.monotonic()
    result = _run(
        ["serve"],
        {
            "MINDER_KAFKA__BOOTSTRAP": f"127.0.0.1:{port}",
            "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'm.db'}",
        },
    )
    took = time.monotonic() - began
    assert result.returncode == 2
    line = _one_line_error(result.stderr)
    assert f"127.0.0.1:{port}" in line
    assert "--embedded-broker" in line and "MINDER_KAFKA__BOOTSTRAP" in line
    assert took < 30, (
        f"took {took:.1f} s"
    )  # kafka-python's own retries took ~30 s and 15 tracebacks


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("MINDER_API__PORT", "http", "MINDER_API__PORT='http'"),
        ("MINDER_API__PORT", "99999", "less than or equal to 65535"),
        ("MINDER_DETECTION__THRESHOLD", "-1", "MINDER_DETECTION__THRESHOLD='-1'"),
        ("MINDER_WEBHOOK__URLS", "http://x", "MINDER_WEBHOOK__URLS='http://x': expected JSON"),
        ("MINDER_KAFKA__PARTITIONS", "0", "greater than or equal to 1"),
    ],
)
def test_a_bad_setting_is_one_line_naming_variable_and_value(
    variable: str, value: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("COLUMNS", "400")
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2
    line = _one_line_error(result.output)
    assert expected in line, line


def test_an_unreachable_database_is_one_line_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv(
        "MINDER_DATABASE__URL", f"postgresql://minder:s3cret@127.0.0.1:{free_port()}/x"
    )
    from minder.config import Settings
    from minder.core.errors import StorageError
    from minder.service.stack import build_stack

    settings = Settings.load()
    settings.kafka.bootstrap = "127.0.0.1:1"
    with pytest.raises(StorageError) as caught:
        from minder.storage.migrate import upgrade_database

        upgrade_database(settings.database.url)
    message = str(caught.value)
    assert "\n" not in message and "s3cret" not in message
    assert "Connection refused" in message and "MINDER_DATABASE__URL" in message
    assert build_stack  # the stack reaches the same error after the broker check


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--port", "-1"], "--port"),
        (["demo", "--duration", "-5"], "--duration"),
        (["demo", "--duration", "0"], "--duration"),
        (["demo", "--port", "0"], "--port"),
        (["--log-level", "LOUD", "detect", "x.parquet"], "--log-level"),
    ],
)
def test_out_of_range_options_are_refused(args: list[str], expected: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert expected in result.output


def test_demo_shorter_than_its_fault_is_refused_before_starting() -> None:
    result = runner.invoke(app, ["demo", "--duration", "10"], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    line = _one_line_error(result.output)
    assert "--duration 10" in line and "+45" in line


@pytest.mark.kafka
@pytest.mark.slow
def test_serve_with_an_embedded_broker_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    api_port, broker_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env["MINDER_DATABASE__URL"] = f"sqlite:///{tmp_path / 'm.db'}"
    process = subprocess.Popen(
        [
            *MINDER,
            "serve",
            "--embedded-broker",
            "--broker-port",
            str(broker_port),
            "--port",
            str(api_port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        ready = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/ready", timeout=2) as r:
                    ready = r.status
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        assert ready == 200, process.stderr.read() if process.poll() is not None else "not ready"
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/docs", timeout=5) as r:
            assert b"swagger" in r.read().lower()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        assert f"127.0.0.1:{broker_port}" in stderr and "stopping" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
