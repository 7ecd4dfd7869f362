"""``minder serve`` logs for machines: stderr that is not a terminal (journald, ``kubectl logs``,
a file) gets one line per record with an ISO 8601 time, ``MINDER_LOG__FORMAT=json`` one JSON
object per record; ``--broker-port 0`` picks a free port and says which; a Ctrl-C stops it
without a traceback or a storm of reconnect errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_settings import cluster_keys

MINDER_SERVE = [sys.executable, "-m", "minder.cli", "serve", "--embedded-broker"]
ISO_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S"
)


def _serve_until_ready(tmp_path: Path, log_format: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``minder serve --embedded-broker --broker-port 0 --port 0``, stdout and stderr into one
    file (as systemd hands them to journald), in a process group of its own."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("MINDER_")}
    env.update(
        MINDER_DATABASE__URL=f"sqlite:///{tmp_path / 'm.db'}",
        MINDER_AUTH__KEYS_FILE=str(cluster_keys()),
        MINDER_LOG__FORMAT=log_format,
        COLUMNS="80",  # rich would wrap at 80: these formats must not
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*MINDER_SERVE, "--broker-port", "0", "--port", "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 90
    while "Minder is serving on" not in log.read_text() and process.poll() is None:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.3)
    assert process.poll() is None, log.read_text()
    time.sleep(2)  # the consumer joins its group: a stop now leaves it, through the broker
    return process, log


def _stop(process: subprocess.Popen[bytes], sig: signal.Signals, group: bool) -> None:
    try:
        if group:  # as a Ctrl-C at a terminal: the whole foreground process group
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.kafka
@pytest.mark.slow
def test_piped_serve_logs_one_plain_line_per_record_and_a_ctrl_c_stops_it_quietly(
    tmp_path: Path,
) -> None:
    process, log = _serve_until_ready(tmp_path, "auto")
    _stop(process, signal.SIGINT, group=True)
    lines = log.read_text().splitlines()
    for line in lines:
        assert ISO_LINE.match(line), line
    text = "\n".join(lines)
    broker = re.search(r"INFO minder: embedded Kafka broker \(Tansu, in memory\) on "
                       r"127\.0\.0\.1:(\d+)$", text, re.M)  # fmt: skip
    assert broker is not None and int(broker.group(1)) > 0, text
    serving = re.search(r"INFO minder: Minder is serving on http://127\.0\.0\.1:(\d+) ", text)
    assert serving is not None and int(serving.group(1)) > 0, text  # the port chosen for 0
    assert f"Kafka 127.0.0.1:{broker.group(1)} (PLAINTEXT)" in text
    assert lines[-1].endswith(f"Tansu broker on 127.0.0.1:{broker.group(1)} stopped (exit 0)")
    # the broker outlives Minder's clients: none of them logs a lost connection
    assert "Traceback" not in text and " kafka." not in text, text


@pytest.mark.kafka
@pytest.mark.slow
def test_json_serve_logs_one_object_per_record(tmp_path: Path) -> None:
    process, log = _serve_until_ready(tmp_path, "json")
    _stop(process, signal.SIGTERM, group=False)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) >= 8
    for record in records:
        assert set(record) >= {"time", "level", "logger", "message"}, record
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
    messages = [record["message"] for record in records]
    assert any(m.startswith("Minder is serving on http://127.0.0.1:") for m in messages)
    assert messages[-1].startswith("Tansu broker on 127.0.0.1:")
