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
from service_settings import cluster_keys
from typer.testing import CliRunner

from minder.cli import app
from minder.stream.broker import free_port

runner = CliRunner()
KEYS_FILE = cluster_keys()
MINDER = [sys.executable, "-m", "minder.cli"]


def _one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    full_env["MINDER_AUTH__KEYS_FILE"] = str(KEYS_FILE)
    full_env.update(env)
    # a wide terminal, so the one error line is not wrapped by rich
    full_env["COLUMNS"] = "400"
    return subprocess.run(
        [*MINDER, *args], check=False, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_serve_without_signing_keys_says_so_in_one_line(tmp_path: Path) -> None:
    result = _run(
        ["serve"],
        {"MINDER_AUTH__KEYS_FILE": "", "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'm.db'}"},
    )
    line = _one_line_error(result.stderr)
    assert result.returncode != 0
    assert "MINDER_AUTH__KEYS_FILE" in line and "minder keys init" in line
    assert "MINDER_AUTH__MODE=permissive" in line


def test_serve_with_a_bad_key_file_names_it_without_the_secret(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.keys"
    bad.write_text("k1 not-a-secret-of-32-bytes\n")
    bad.chmod(0o600)
    result = _run(
        ["serve"],
        {
            "MINDER_AUTH__KEYS_FILE": str(bad),
            "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'm.db'}",
        },
    )
    line = _one_line_error(result.stderr)
    assert str(bad) in line and "not-a-secret" not in line


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
    env["MINDER_AUTH__KEYS_FILE"] = str(KEYS_FILE)
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


@pytest.mark.kafka
@pytest.mark.slow
def test_serve_exits_non_zero_when_its_api_stops_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API thread ending (out of files, a crash of its loop) with the rest running: one
    line saying so and a non-zero status, so that systemd or Kubernetes restarts the service."""
    import threading

    from minder.service import stack as stack_module

    built = stack_module.build_stack

    def build_then_stop_its_api(*args: object, **kwargs: object) -> stack_module.Stack:
        stack = built(*args, **kwargs)  # type: ignore[arg-type]

        def stop_the_server_alone() -> None:
            while stack.server is None or not stack.server.started:
                time.sleep(0.05)
            time.sleep(0.5)
            stack.server.should_exit = True  # as if its loop had ended

        threading.Thread(target=stop_the_server_alone, daemon=True).start()
        return stack

    monkeypatch.setattr(stack_module, "build_stack", build_then_stop_its_api)
    for name in [n for n in os.environ if n.startswith("MINDER_")]:
        monkeypatch.delenv(name)
    env = {
        "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'm.db'}",
        "MINDER_AUTH__KEYS_FILE": str(KEYS_FILE),
        "COLUMNS": "400",
    }
    args = ["serve", "--embedded-broker", "--broker-port", str(free_port())]
    began = time.monotonic()
    result = runner.invoke(app, [*args, "--port", str(free_port())], env=env)
    assert result.exit_code == 2, result.output
    assert time.monotonic() - began < 60
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: the API stopped serving (its server stopped on its own); exiting so that it "
        "restarts"
    ], result.output
